package govtest

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// module is the import path every package of the repository is under.
const module = "github.com/governor-project/governor"

var binaries struct {
	mu     sync.Mutex
	dir    string
	builds map[string]*binaryBuild
}

type binaryBuild struct {
	once sync.Once
	path string
	err  error
}

// Binary builds the main package pkg, named from the repository's root
// ("cmd/governord", "proxy/testdata/grpcprobe"), once per test process,
// and returns the executable's path: the one way tests run the binaries
// as processes. A test whose package uses it calls RemoveBinaries from its
// TestMain after m.Run.
func Binary(t testing.TB, pkg string) string {
	t.Helper()
	bin, err := Build(pkg)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func build(pkg string) (string, error) {
	binaries.mu.Lock()
	if binaries.dir == "" {
		dir, err := os.MkdirTemp("", "governor-test-bin-")
		if err != nil {
			binaries.mu.Unlock()
			return "", err
		}
		binaries.dir = dir
	}
	dir := binaries.dir
	binaries.mu.Unlock()
	bin := filepath.Join(dir, path.Base(pkg))
	if out, err := exec.Command(goTool(), "build", "-o", bin, module+"/"+pkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}

// Build is Binary for a TestMain, which has no test to fail: the path, or
// why the build failed.
func Build(pkg string) (string, error) {
	binaries.mu.Lock()
	if binaries.builds == nil {
		binaries.builds = map[string]*binaryBuild{}
	}
	b := binaries.builds[pkg]
	if b == nil {
		b = &binaryBuild{}
		binaries.builds[pkg] = b
	}
	binaries.mu.Unlock()
	b.once.Do(func() { b.path, b.err = build(pkg) })
	return b.path, b.err
}

// RemoveBinaries deletes what Binary built.
func RemoveBinaries() {
	binaries.mu.Lock()
	defer binaries.mu.Unlock()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
		binaries.dir, binaries.builds = "", nil
	}
}

// goTool is the go command of the toolchain running the tests.
func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
