package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// fairProfile is what -profile takes of governord during the TTL run,
// through its debug.pprof endpoints: an execution trace (where the stalls
// are: GC, scheduling, a lock) and a CPU profile (what the CPU does), side
// by side for the same seconds, then a heap profile and governord's log.
type fairProfile struct {
	dir string        // where the files go; empty: no profile
	For time.Duration // how long the trace and the CPU profile run
}

// configLine is the line governord's config needs for the profile.
func (p fairProfile) configLine() string {
	if p.dir == "" {
		return ""
	}
	return "debug: {pprof: true}\n"
}

// take fetches the trace and the CPU profile of g at once, starting now,
// then the heap profile, into files named after the store. It returns
// when they are written; the first error is returned.
func (p fairProfile) take(ctx context.Context, g *governord, store string) error {
	if p.dir == "" {
		return nil
	}
	secs := max(1, int(p.For.Seconds()))
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, what := range []string{"trace", "profile"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.fetch(ctx, g, fmt.Sprintf("%s?seconds=%d", what, secs), store+"."+what)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	if err := p.fetch(ctx, g, "heap", store+".heap"); err != nil {
		return err
	}
	// governord's log so far: its snapshots, with what each took.
	return os.WriteFile(filepath.Join(p.dir, store+".log"), []byte(g.logText()), 0o644)
}

// fetch writes /debug/pprof/<what> of g into the file name in p.dir.
func (p fairProfile) fetch(ctx context.Context, g *governord, what, name string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.metrics+"/debug/pprof/"+what, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile %s: %w", what, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", what, resp.Status)
	}
	f, err := os.Create(filepath.Join(p.dir, name))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile %s: %w", what, err)
	}
	return f.Close()
}
