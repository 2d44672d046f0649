package store_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/store"
)

// backend is one Store implementation under test.
type backend struct {
	name string
	// fresh makes a new, empty log and returns open, which returns a new
	// handle on that same log each time it is called, as a restarted process
	// would find it. The test closes each handle it opens.
	fresh func(t testing.TB) (open func() store.Store)
}

func backends() []backend {
	return []backend{
		{name: "memory", fresh: freshMemory},
		{name: "sqlite", fresh: freshSQLite},
		{name: "postgres", fresh: freshPostgres},
	}
}

func freshMemory(t testing.TB) func() store.Store {
	var last *store.Memory
	return func() store.Store {
		if last == nil {
			last = store.NewMemory()
		} else {
			last = last.Reopen()
		}
		return last
	}
}

func freshSQLite(t testing.TB) func() store.Store {
	path := filepath.Join(t.TempDir(), "governor.db")
	return func() store.Store {
		st, err := store.OpenSQLite(path)
		if err != nil {
			t.Fatalf("OpenSQLite: %v", err)
		}
		return st
	}
}

func freshPostgres(t testing.TB) func() store.Store {
	dsn := pgtest.Schema(t, "governor_test_")
	return func() store.Store {
		st, err := store.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatalf("OpenPostgres: %v", err)
		}
		return st
	}
}
