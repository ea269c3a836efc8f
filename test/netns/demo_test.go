package netns_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/test/netns"
)

var demoPrefix = regexp.MustCompile(`namespaces (eg-demo-\d+)-\*, pins (\S+)`)

// checkDemoCleanedUp fails t if the demo run that printed out left a
// namespace or its pin directory behind.
func checkDemoCleanedUp(t *testing.T, out string) {
	t.Helper()
	m := demoPrefix.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("demo did not print its namespace prefix and pin directory:\n%s", out)
	}
	left, _ := filepath.Glob("/run/netns/" + m[1] + "-*")
	if len(left) > 0 {
		t.Errorf("demo left namespaces behind: %v", left)
	}
	if _, err := os.Stat(m[2]); !os.IsNotExist(err) {
		t.Errorf("demo left its pin directory %s behind (%v)", m[2], err)
	}
	if !strings.Contains(out, "cleaned up:") {
		t.Errorf("demo did not report its cleanup:\n%s", out)
	}
}

// TestDemo runs `edgectl demo` for 3 seconds: it shows the table, stops by
// itself and removes everything it created.
func TestDemo(t *testing.T) {
	netns.RequireRoot(t)
	bin, err := edgectl()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "demo", "--duration", "3s", "--warmup", "1s", "--every", "1s").CombinedOutput()
	t.Logf("demo output:\n%s", out)
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	for _, want := range []string{"CLASS", "legit (8 addresses)", "attacker (1000 addresses)", "legit clients:", "program counters"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	checkDemoCleanedUp(t, string(out))
}

// TestDemoInterrupted sends SIGINT to a demo in the middle of its flood:
// it exits promptly and still removes everything.
func TestDemoInterrupted(t *testing.T) {
	netns.RequireRoot(t)
	bin, err := edgectl()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "demo", "--duration", "60s", "--warmup", "1s", "--every", "1s")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out strings.Builder
	flooding := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if strings.Contains(sc.Text(), "top dropped") {
				once.Do(func() { close(flooding) })
			}
		}
	}()
	select {
	case <-flooding:
	case <-time.After(40 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("demo showed no drops within 40s:\n%s", out.String())
	}
	cmd.Process.Signal(syscall.SIGINT)
	waited := make(chan error, 1)
	go func() { <-readDone; waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Errorf("interrupted demo exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("demo did not exit within 30s of SIGINT")
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("demo output:\n%s", out.String())
	checkDemoCleanedUp(t, out.String())
}
