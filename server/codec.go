package server

import (
	"encoding/json"
	"fmt"

	fastjson "github.com/goccy/go-json"

	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/store"
)

// Events and snapshots are stored as JSON: readable in the database, and the
// engine's replay test already round-trips them through it.
//
// A session's token hash is not stored in its event: it goes to the store's
// sessions table, which keeps it only while the session lives (see package
// store). Decoding puts it back from there.

func encodeEvent(ev engine.Event) (store.Record, error) {
	var rec store.Record
	switch ev.Kind {
	case engine.EvSessionOpened:
		if ev.Token != "" {
			rec.Opens = &store.Session{ID: uint64(ev.Session), TokenHash: ev.Token}
			ev.Token = ""
		}
	case engine.EvSessionEnded:
		rec.Ends = uint64(ev.Session)
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return store.Record{}, fmt.Errorf("encode event %d: %w", ev.Seq, err)
	}
	rec.Seq, rec.Data = ev.Seq, data
	return rec, nil
}

// decodeEvent decodes r. tokens holds the sessions table; the hash of a
// session r opens is taken from it.
func decodeEvent(r store.Record, tokens map[uint64]string) (engine.Event, error) {
	var ev engine.Event
	// Decoded by a faster decoder of the same JSON: a standby decodes
	// every event the leader commits, on the same machines, and
	// encoding/json's decoder was most of its cost (docs/ha.md).
	if err := fastjson.Unmarshal(r.Data, &ev); err != nil {
		return ev, fmt.Errorf("decode event %d: %w", r.Seq, err)
	}
	if ev.Seq != r.Seq {
		return ev, fmt.Errorf("event stored as %d says it is %d: %w", r.Seq, ev.Seq, engine.ErrCorrupt)
	}
	if ev.Kind == engine.EvSessionOpened && ev.Token == "" {
		ev.Token = tokens[uint64(ev.Session)]
	}
	return ev, nil
}

func encodeSnapshot(s engine.Snapshot) ([]byte, error) {
	data, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w", s.Seq, err)
	}
	return data, nil
}

func decodeSnapshot(seq uint64, data []byte) (engine.Snapshot, error) {
	var s engine.Snapshot
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("decode snapshot %d: %w", seq, err)
	}
	if s.Seq != seq {
		return s, fmt.Errorf("snapshot stored as %d says it is %d: %w", seq, s.Seq, engine.ErrCorrupt)
	}
	return s, nil
}
