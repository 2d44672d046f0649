package server

import (
	"bytes"
	"encoding/json"
	"errors"
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

// snapshotArrays are the snapshot's fields that grow with the tree, as
// json.Marshal writes them when they are nil. encodeSnapshot writes them
// itself, item by item, in their place.
const snapshotArrays = `,"Nodes":null,"Sessions":null,"Leases":null,"Tombstones":null`

// snapshotEncodePause is how many items encodeSnapshot writes between two
// pauses: well under a millisecond of work.
const snapshotEncodePause = 256

// encodeSnapshot writes s as json.Marshal does, byte for byte, but item by
// item, calling pause (if not nil) after every snapshotEncodePause items,
// so that calls run meanwhile: a snapshot of a large tree took a few
// hundred milliseconds to encode in one piece (issue 27). sizeHint, the
// size of the last snapshot, sizes the buffer once instead of growing it
// by doubling, which copied it and left the copies to the collector.
func encodeSnapshot(s engine.Snapshot, sizeHint int, pause func()) ([]byte, error) {
	fixed := s
	fixed.Nodes, fixed.Sessions, fixed.Leases, fixed.Tombstones = nil, nil, nil, nil
	head, err := json.Marshal(fixed)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w", s.Seq, err)
	}
	// Only numbers come before the arrays, so the first match is theirs.
	at := bytes.Index(head, []byte(snapshotArrays))
	if at < 0 {
		return nil, fmt.Errorf("encode snapshot %d: its arrays are not where they were: %.120s", s.Seq, head)
	}
	e := &arrayEncoder{pause: pause}
	e.buf.Grow(max(0, sizeHint) + max(0, sizeHint)/8 + len(head))
	e.buf.Write(head[:at])
	e.enc = json.NewEncoder(&e.buf)
	err = errors.Join(encodeArray(e, "Nodes", s.Nodes), encodeArray(e, "Sessions", s.Sessions),
		encodeArray(e, "Leases", s.Leases), encodeArray(e, "Tombstones", s.Tombstones))
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w", s.Seq, err)
	}
	e.buf.Write(head[at+len(snapshotArrays):])
	return e.buf.Bytes(), nil
}

// arrayEncoder writes a snapshot's arrays into buf, pausing as it goes.
type arrayEncoder struct {
	buf   bytes.Buffer
	enc   *json.Encoder // writes into buf
	items int
	pause func()
}

// encodeArray writes `,"name":` and items as json.Marshal writes them.
func encodeArray[T any](e *arrayEncoder, name string, items []T) error {
	e.buf.WriteString(`,"` + name + `":`)
	if items == nil {
		e.buf.WriteString("null")
		return nil
	}
	e.buf.WriteByte('[')
	for i := range items {
		if i > 0 {
			e.buf.WriteByte(',')
		}
		if err := e.enc.Encode(&items[i]); err != nil {
			return fmt.Errorf("%s[%d]: %w", name, i, err)
		}
		e.buf.Truncate(e.buf.Len() - 1) // the newline Encode ends with
		if e.items++; e.pause != nil && e.items%snapshotEncodePause == 0 {
			e.pause()
		}
	}
	e.buf.WriteByte(']')
	return nil
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
