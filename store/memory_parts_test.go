package store_test

import (
	"bytes"
	"context"
	"runtime"
	"testing"

	"github.com/governor-project/governor/store"
)

// The memory store keeps a snapshot written in parts as those parts: it
// allocates about what it is given, once, however large the snapshot
// grows. Appended into one array it was copied again each time the array
// grew, about five times its size in all, in allocations the collector
// charged to the log writer (issue 27). A restart still loads it whole.
func TestMemorySnapshotPartsAreNotCopiedAgain(t *testing.T) {
	ctx := context.Background()
	m := store.NewMemory()
	if err := m.Append(ctx, []store.Record{{Seq: 1, Data: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	const parts, size = 64, 64 << 10
	part := make([]byte, size)
	var want bytes.Buffer
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range parts {
		part[0] = byte(i) // the caller reuses its buffer
		if err := m.WriteSnapshotPart(ctx, 1, int64(i*size), part); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	want.Grow(parts * size)
	for i := range parts {
		part[0] = byte(i)
		want.Write(part)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > parts*size*3/2 {
		t.Errorf("writing %d parts of %d bytes allocated %d bytes, want at most 1.5× the %d written", parts, size, got, parts*size)
	}
	if err := m.FinishSnapshot(ctx, 1, parts*size); err != nil {
		t.Fatal(err)
	}
	var loaded []byte
	err := m.Load(ctx, store.LoadFuncs{Snapshot: func(seq uint64, data []byte) error { loaded = data; return nil }})
	if err != nil || !bytes.Equal(loaded, want.Bytes()) {
		t.Fatalf("loaded %d bytes (%v), want the %d written, part by part", len(loaded), err, want.Len())
	}
}
