package netns_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestL7AccessLogReopen: `edgectl run` with l7.access_log writes one JSON
// line per request (route, decision, limit, status, duration); after the
// file is renamed (as logrotate does) and the daemon gets SIGUSR1, the next
// lines go to a new file at the configured path and none are lost. The
// per-route status classes reach /metrics.
func TestL7AccessLogReopen(t *testing.T) {
	h := newL7Daemon(t, 9202, 8083, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			w.WriteHeader(http.StatusNotFound)
		}
		io.WriteString(w, "ok")
	})
	proxyAddr := h.proxy
	logPath := filepath.Join(t.TempDir(), "access.log")
	client := h.httpClient(3*time.Second, 10*time.Second)
	get := func(path string) int {
		t.Helper()
		resp, err := client.Get("http://" + proxyAddr.String() + path)
		if err != nil {
			t.Fatalf("GET %s: %v\n%s", path, err, h.Logs())
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	h.run(l7Limited(proxyAddr, h.upstream, "access_log: "+logPath))

	for _, want := range []struct {
		path string
		code int
	}{{"/x", 200}, {"/missing", 404}, {"/limited", 200}, {"/limited", 429}} {
		if got := get(want.path); got != want.code {
			t.Fatalf("GET %s: %d, want %d", want.path, got, want.code)
		}
	}
	lines := waitLines(t, logPath, 4)
	if l := lines[3]; l["route"] != "api" || l["decision"] != "limited" || l["limit"] != "per-ip" || l["status"] != 429.0 {
		t.Errorf("line of the 429: %v", l)
	}
	if l := lines[1]; l["route"] != "(unmatched)" || l["status"] != 404.0 || l["path"] != "/missing" {
		t.Errorf("line of the 404: %v", l)
	}

	// logrotate: rename, then signal.
	rotated := logPath + ".1"
	if err := os.Rename(logPath, rotated); err != nil {
		t.Fatal(err)
	}
	pid, err := daemonPID(h.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(logPath); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new access log at %s 15s after SIGUSR1\n%s", logPath, h.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := get("/after"); got != 200 {
		t.Fatalf("GET /after: %d", got)
	}
	if l := waitLines(t, logPath, 1)[0]; l["path"] != "/after" {
		t.Errorf("first line of the reopened log: %v", l)
	}
	if old := waitLines(t, rotated, 4); len(old) != 4 {
		t.Errorf("rotated log: %d lines, want 4", len(old))
	}

	// The per-route status classes, from the daemon's /metrics.
	got := map[string]float64{}
	for _, m := range h.scrape()["edgeguard_l7_responses_total"].GetMetric() {
		var route, code string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "route":
				route = l.GetValue()
			case "code":
				code = l.GetValue()
			}
		}
		got[route+" "+code] = m.GetCounter().GetValue()
	}
	for k, n := range map[string]float64{"api 2xx": 1, "api 4xx": 1, "(unmatched) 2xx": 2, "(unmatched) 4xx": 1} {
		if got[k] != n {
			t.Errorf("edgeguard_l7_responses_total %s = %v, want %v (all: %v)", k, got[k], n, got)
		}
	}

	// A reopen that fails (the log's directory read-only) is in status
	// until one succeeds (issue 25).
	if err := os.Rename(logPath, logPath+".2"); err != nil {
		t.Fatal(err)
	}
	writable := readOnly(t, filepath.Dir(logPath))
	syscall.Kill(pid, syscall.SIGUSR1)
	testenv.WaitFor(t, "status to report the failed reopen", func() bool {
		st := h.status()
		return st.L7 != nil && st.L7.AccessLogReopenFailed != ""
	})
	if out, _ := h.ctl("status"); !strings.Contains(out, "REOPEN FAILED") {
		t.Errorf("status text does not report the failed reopen:\n%s", out)
	}
	writable()
	syscall.Kill(pid, syscall.SIGUSR1)
	testenv.WaitFor(t, "status to clear the failed reopen", func() bool {
		st := h.status()
		return st.L7 != nil && st.L7.AccessLogReopenFailed == ""
	})
}

// waitLines waits (up to 15s: lines are written within 200ms) until path
// holds at least n JSON lines and returns them.
func waitLines(t *testing.T, path string, n int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var lines []map[string]any
		if f, err := os.Open(path); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var m map[string]any
				if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
					f.Close()
					t.Fatalf("%s: line %q: %v", path, sc.Text(), err)
				}
				lines = append(lines, m)
			}
			f.Close()
		}
		if len(lines) >= n {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d lines after 15s, want %d", path, len(lines), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// daemonPID finds the test's daemon: the process whose command line names
// its control socket (a path in the test's own temporary directory).
func daemonPID(socket string) (int, error) {
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return 0, err
	}
	want := "--socket\x00" + socket + "\x00"
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), want) || !strings.Contains(string(b), "\x00run\x00") {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(p, "/proc/%d/cmdline", &pid); err == nil {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process runs with --socket %s", socket)
}
