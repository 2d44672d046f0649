package logline

import "testing"

func TestFind(t *testing.T) {
	text := `time=2026-12-01T00:00:00Z level=INFO msg="state recovered" seq=3
time=2026-12-01T00:00:00Z level=INFO msg="governord ready" listen=127.0.0.1:7600 metrics="127.0.0.1:7601"
{"time":"2026-12-01T00:00:00Z","level":"INFO","msg":"governor-proxy listening","http":"127.0.0.1:7700","pgwire":["127.0.0.1:6432"]}`
	m, ok := Find(text, "governord ready")
	if !ok || m["listen"] != "127.0.0.1:7600" || m["metrics"] != "127.0.0.1:7601" {
		t.Errorf("governord ready: %v %v", m, ok)
	}
	m, ok = Find(text, "governor-proxy listening")
	if pg, _ := m["pgwire"].([]any); !ok || m["http"] != "127.0.0.1:7700" || len(pg) != 1 {
		t.Errorf("governor-proxy listening: %v %v", m, ok)
	}
	if _, ok := Find(text, "nothing"); ok {
		t.Error("found a line that is not there")
	}
}
