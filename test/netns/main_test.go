package netns_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// edgectlDir holds the edgectl binary the tests build once (the first test
// that needs it builds it); TestMain removes it.
var edgectlDir string

var buildEdgectlOnce = sync.OnceValues(func() (string, error) {
	// EDGECTL_BIN names a prebuilt edgectl, for machines without a Go
	// toolchain (scripts/kernel-matrix.sh runs this binary in a VM).
	if bin := os.Getenv("EDGECTL_BIN"); bin != "" {
		return bin, nil
	}
	bin := filepath.Join(edgectlDir, "edgectl")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/edgeguard/edgeguard/cmd/edgectl").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build edgectl: %w\n%s", err, out)
	}
	return bin, nil
})

// edgectl returns the path of the real CLI, built for this test binary.
func edgectl() (string, error) { return buildEdgectlOnce() }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "edgectl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Readable by others: one test runs the CLI as nobody.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	edgectlDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
