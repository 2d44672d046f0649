// Command enginemutation measures how many small deliberate bugs in
// governor/engine its tests catch: its mutation score. It is run on
// demand (scripts/engine-mutation.sh), not in CI.
//
// Each mutant is one operator changed at one place in one non-test source
// file of the package: a comparison's boundary (< and <=, > and >=), a
// comparison negated (== and !=), an arithmetic operator (+ and -), an
// increment (++ and --) or a logical operator (&& and ||), the operators
// go-gremlins applies by default. The file is never touched: each mutant
// is built through go test -overlay. A mutant is killed when the tests
// fail, survives when they pass, and is left out of the score when it does
// not build (+ on strings, say).
//
// The randomized checker (TestRandomized, with the fair queue's scenarios)
// runs first; a mutant it misses is run against the whole package's tests
// (with -short, which leaves out TestMutantsAreCaught), so the report says
// which kills are the checker's own.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

type mutant struct {
	File   string
	Line   int
	Offset int
	Old    string
	New    string
	Func   string
	Result string // killed-by-checker, killed-by-suite, survived, timeout, not-viable
	Detail string
}

var swaps = map[token.Token]token.Token{
	token.LSS: token.LEQ, token.LEQ: token.LSS, token.GTR: token.GEQ, token.GEQ: token.GTR,
	token.EQL: token.NEQ, token.NEQ: token.EQL,
	token.ADD: token.SUB, token.SUB: token.ADD,
	token.INC: token.DEC, token.DEC: token.INC,
	token.LAND: token.LOR, token.LOR: token.LAND,
}

func main() {
	dir := flag.String("dir", "governor/engine", "the package to mutate")
	only := flag.String("files", "", "comma-separated file names to mutate (default: every non-test file)")
	seeds := flag.Int("seeds", 40, "seeds of TestRandomized per mutant")
	ops := flag.Int("ops", 1000, "operations per seed")
	parallel := flag.Int("parallel", 2, "mutants run at once")
	timeout := flag.Duration("timeout", 3*time.Minute, "longest run of one mutant's whole-package tests, once built (a mutant that hangs is killed)")
	checkerTimeout := flag.Duration("checker-timeout", 40*time.Second, "longest run of one mutant's randomized checker (its build is not timed; a mutant that hangs there is killed sooner)")
	skip := flag.Int("skip", 0, "leave out the first N mutants (to resume a run that stopped; they are listed in a fixed order)")
	out := flag.String("out", "", "write the results as JSON here")
	max := flag.Int("max", 0, "run at most this many mutants (0: all)")
	list := flag.Bool("list", false, "list the mutants by file and stop")
	flag.Parse()
	if err := run(*dir, *only, *seeds, *ops, *parallel, timeouts{*checkerTimeout, *timeout}, *out, *skip, *max, *list); err != nil {
		fmt.Fprintln(os.Stderr, "enginemutation:", err)
		os.Exit(1)
	}
}

// timeouts bound each stage of a mutant's run.
type timeouts struct{ checker, suite time.Duration }

func run(dir, only string, seeds, ops, parallel int, timeout timeouts, out string, skip, max int, list bool) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	mutants, err := findAll(abs, only)
	if err != nil {
		return err
	}
	if list {
		printByFile(mutants)
		return nil
	}
	if skip > 0 {
		mutants = mutants[min(skip, len(mutants)):]
	}
	if max > 0 && len(mutants) > max {
		mutants = mutants[:max]
	}
	tmp, err := os.MkdirTemp("", "enginemutation")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(os.Stderr, "%d mutants in %s\n", len(mutants), dir)
	took := tryAll(abs, tmp, mutants, seeds, ops, parallel, timeout)
	report(mutants, took)
	if out != "" {
		raw, err := json.MarshalIndent(mutants, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(out, raw, 0o644)
	}
	return nil
}

// findAll lists the mutants of the package in dir: of every non-test file,
// or of those only names (comma-separated base names), in a fixed order.
func findAll(dir, only string) ([]*mutant, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, f := range strings.Split(only, ",") {
		if f != "" {
			want[f] = true
		}
	}
	var mutants []*mutant
	for _, f := range files {
		base := filepath.Base(f)
		if strings.HasSuffix(base, "_test.go") || (len(want) > 0 && !want[base]) {
			continue
		}
		ms, err := find(f)
		if err != nil {
			return nil, err
		}
		mutants = append(mutants, ms...)
	}
	return mutants, nil
}

// printByFile is -list: how many mutants each file has, and the total.
func printByFile(mutants []*mutant) {
	byFile := map[string]int{}
	for _, m := range mutants {
		byFile[m.File]++
	}
	for f, n := range byFile {
		fmt.Printf("%s\t%d\n", f, n)
	}
	fmt.Printf("total\t%d\n", len(mutants))
}

// tryAll tries every mutant, parallel at once, each built in tmp, filling
// in its Result and Detail and printing a line of progress as each ends.
// It returns how long they took.
func tryAll(dir, tmp string, mutants []*mutant, seeds, ops, parallel int, timeout timeouts) time.Duration {
	start := time.Now()
	jobs := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				m := mutants[i]
				m.Result, m.Detail = try(dir, tmp, i, m, seeds, ops, timeout)
				mu.Lock()
				done++
				fmt.Fprintf(os.Stderr, "[%d/%d %v] %s:%d %s -> %s: %s\n", done, len(mutants), time.Since(start).Round(time.Second),
					m.File, m.Line, m.Old+" => "+m.New, m.Result, m.Detail)
				mu.Unlock()
			}
		}()
	}
	for i := range mutants {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return time.Since(start)
}

// find lists the mutants of one file: every swappable operator inside a
// function body.
func find(path string) ([]*mutant, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []*mutant
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			var pos token.Pos
			var op token.Token
			switch x := n.(type) {
			case *ast.BinaryExpr:
				pos, op = x.OpPos, x.Op
			case *ast.IncDecStmt:
				pos, op = x.TokPos, x.Tok
			default:
				return true
			}
			if to, ok := swaps[op]; ok {
				p := fset.Position(pos)
				out = append(out, &mutant{File: filepath.Base(path), Line: p.Line, Offset: p.Offset, Old: op.String(), New: to.String(), Func: fn.Name.Name})
			}
			return true
		})
	}
	return out, nil
}

func try(dir, tmp string, i int, m *mutant, seeds, ops int, timeout timeouts) (string, string) {
	src, err := os.ReadFile(filepath.Join(dir, m.File))
	if err != nil {
		return "not-viable", err.Error()
	}
	if !bytes.HasPrefix(src[m.Offset:], []byte(m.Old)) {
		return "not-viable", "the operator is not where it was found"
	}
	mutated := append(append(append([]byte{}, src[:m.Offset]...), m.New...), src[m.Offset+len(m.Old):]...)
	file := filepath.Join(tmp, fmt.Sprintf("m%d.go", i))
	if err := os.WriteFile(file, mutated, 0o644); err != nil {
		return "not-viable", err.Error()
	}
	overlay, _ := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(dir, m.File): file}})
	ov := filepath.Join(tmp, fmt.Sprintf("m%d.json", i))
	if err := os.WriteFile(ov, overlay, 0o644); err != nil {
		return "not-viable", err.Error()
	}
	// Build first, with no timeout: on a busy machine a build can take
	// longer than a run, and only a run that never ends is a hang.
	bin := filepath.Join(tmp, fmt.Sprintf("m%d.test", i))
	defer os.Remove(bin)
	build := exec.Command("go", "test", "-c", "-vet=off", "-overlay", ov, "-o", bin, ".")
	build.Dir = dir
	if msg, err := build.CombinedOutput(); err != nil {
		return "not-viable", firstLine(string(msg))
	}
	res, detail := runTest(dir, bin, timeout.checker, "-test.run", "TestRandomized|TestFairQueue", "-seeds", fmt.Sprint(seeds), "-ops", fmt.Sprint(ops))
	if res != "survived" {
		if res == "killed" {
			res = "killed-by-checker"
		}
		return res, detail
	}
	res, detail = runTest(dir, bin, timeout.suite, "-test.short")
	if res == "killed" {
		res = "killed-by-suite"
	}
	return res, detail
}

// runTest runs a built test binary in the package's folder. A run that
// outlives timeout is run again with twice as long before it counts as a
// hang, so that a busy machine does not pass for one.
func runTest(dir, bin string, timeout time.Duration, args ...string) (string, string) {
	res, detail := runTestOnce(dir, bin, timeout, args...)
	if res == "timeout" {
		res, detail = runTestOnce(dir, bin, 2*timeout, args...)
	}
	return res, detail
}

func runTestOnce(dir, bin string, timeout time.Duration, args ...string) (string, string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOVERNOR_MUTANT=1")
	msg, err := cmd.CombinedOutput()
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "timeout", "killed after " + timeout.String()
	case err == nil:
		return "survived", ""
	}
	for _, line := range strings.Split(string(msg), "\n") {
		if strings.Contains(line, "_test.go:") || strings.Contains(line, "panic:") {
			return "killed", strings.TrimSpace(line)
		}
	}
	return "killed", firstLine(string(msg))
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

func report(ms []*mutant, took time.Duration) {
	count := map[string]int{}
	for _, m := range ms {
		count[m.Result]++
	}
	viable := len(ms) - count["not-viable"]
	killed := count["killed-by-checker"] + count["killed-by-suite"] + count["timeout"]
	fmt.Printf("mutants: %d (%d not viable), killed %d of %d (%.1f%%): by the checker %d, by the rest of the suite %d, by a timeout %d; survived %d; in %v\n",
		len(ms), count["not-viable"], killed, viable, 100*float64(killed)/float64(max(viable, 1)),
		count["killed-by-checker"], count["killed-by-suite"], count["timeout"], count["survived"], took.Round(time.Second))
	sort.SliceStable(ms, func(i, j int) bool {
		return ms[i].File < ms[j].File || ms[i].File == ms[j].File && ms[i].Line < ms[j].Line
	})
	for _, m := range ms {
		if m.Result == "survived" {
			fmt.Printf("survived: %s:%d (%s) %s => %s\n", m.File, m.Line, m.Func, m.Old, m.New)
		}
	}
}
