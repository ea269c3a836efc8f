package netns_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/test/netns"
)

// The control-plane tests: what a failed start, a failed apply and a
// second daemon must leave alone. Each runs the real daemon in a private
// namespace with its own pin directory.

// secondDaemon is another daemon on the harness's namespace and config,
// with its own socket and state directory, and the pin directory given.
func secondDaemon(t *testing.T, h *daemonHarness, pinDir string, args ...string) *testbed.Daemon {
	dir := t.TempDir()
	d := &testbed.Daemon{Bin: h.Bin, NS: h.NS, Config: h.Config, PinDir: pinDir,
		Socket: filepath.Join(dir, "run", "edgeguard.sock"), Args: args}
	t.Cleanup(func() {
		d.Kill()
		if pinDir != h.PinDir {
			os.RemoveAll(pinDir)
		}
	})
	return d
}

func pinsPresent(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			out = append(out, strings.TrimPrefix(path, dir+"/"))
		}
		return nil
	})
	return out
}

// TestSecondDaemonOnSamePinsTouchesNothing: a daemon with its own socket
// and state directory but the pin directory of a running one refuses to
// start, and the first keeps its links, pins and enforcement.
func TestSecondDaemonOnSamePinsTouchesNothing(t *testing.T) {
	s, h := newStarDaemon(t, 1)
	h.start()
	st := h.status()
	prog := attachedProgID(t, s.Edge, "eg-c0")
	if prog == 0 || prog != st.ProgramID {
		t.Fatalf("eg-c0 carries program %d, daemon reports %d", prog, st.ProgramID)
	}
	pins := pinsPresent(t, h.PinDir)

	second := secondDaemon(t, h, h.PinDir, "--metrics-listen", "127.0.0.1:19470")
	err := second.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "another edgectl run holds "+h.PinDir) {
		t.Fatalf("second daemon on the same pin dir: %v; want a refusal naming the pin dir lock", err)
	}
	if got := attachedProgID(t, s.Edge, "eg-c0"); got != prog {
		t.Errorf("after the refused start eg-c0 carries program %d, want %d", got, prog)
	}
	if got := pinsPresent(t, h.PinDir); !slicesEqual(got, pins) {
		t.Errorf("pins after the refused start: %v, want %v", got, pins)
	}
	// Nor does detach --unpin pull the pins from under it.
	if out, err := exec.Command(h.Bin, "detach", "--unpin", "--pin-dir", h.PinDir).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "a daemon runs on") {
		t.Errorf("detach --unpin under a running daemon: %v %s; want a refusal", err, out)
	}
	if got := pinsPresent(t, h.PinDir); !slicesEqual(got, pins) {
		t.Errorf("pins after the refused detach: %v, want %v", got, pins)
	}
	if st := h.status(); len(st.Interfaces) != 1 || st.Generation != 1 {
		t.Errorf("first daemon after the refused start: %+v", st)
	}
	h.stop(syscall.SIGTERM)
}

func slicesEqual(a, b []string) bool {
	return strings.Join(a, "\n") == strings.Join(b, "\n")
}

// TestFailedStartRemovesOnlyWhatItMade: a start that fails after loading
// (an interface that does not exist, a taken metrics port) leaves no pinned
// maps of its own behind, and never detaches or unpins what an earlier
// run left enforcing with --keep.
func TestFailedStartRemovesOnlyWhatItMade(t *testing.T) {
	s := netns.New(t).Star(2)
	h := newDaemonHarness(t, s.Edge)

	// Fresh pins, an interface that does not exist: nothing stays.
	missing := strings.Replace(fmt.Sprintf(daemonPolicy, 100000, 100000), "eg-c1", "eg-gone9", 1)
	os.WriteFile(h.Config, []byte(missing), 0o644)
	if err := h.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "eg-gone9") {
		t.Fatalf("start with a missing interface: %v; want an error naming it", err)
	}
	if _, err := os.Stat(h.PinDir); !os.IsNotExist(err) {
		t.Errorf("failed start left its pins behind: %v %v", err, pinsPresent(t, h.PinDir))
	}
	if got := attachedProgID(t, s.Edge, "eg-c0"); got != 0 {
		t.Errorf("failed start left program %d attached to eg-c0", got)
	}

	// A daemon left enforcing with --keep; the next start fails on a
	// taken metrics port: the kept program and its pins stay.
	h.writePolicy(100000, 100000)
	h.Args = []string{"--keep"}
	h.start()
	att := openDaemonFlow(t, s, 0)
	if got := att.burst(t, 50); got != 50 {
		t.Fatalf("before: %d of 50 through", got)
	}
	if _, err := h.ctl("deny", "add", s.Clients[0].Src4.String(), "--reason", "kept"); err != nil {
		t.Fatal(err)
	}
	h.stop(syscall.SIGTERM)
	prog := attachedProgID(t, s.Edge, "eg-c0")
	pins := pinsPresent(t, h.PinDir)
	if prog == 0 || len(pins) == 0 {
		t.Fatalf("--keep stop: program %d, pins %v", prog, pins)
	}
	var ln net.Listener
	if err := s.Edge.Do(func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:19469"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	h.Args = nil
	if err := h.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "metrics listen on 127.0.0.1:19469") {
		t.Fatalf("start with the metrics port taken: %v; want an error naming the address", err)
	}
	if got := attachedProgID(t, s.Edge, "eg-c0"); got != prog {
		t.Errorf("failed start changed eg-c0's program: %d, want %d", got, prog)
	}
	if got := pinsPresent(t, h.PinDir); !slicesEqual(got, pins) {
		t.Errorf("pins after the failed start: %v, want %v", got, pins)
	}
	if got := att.burst(t, 50); got != 0 {
		t.Errorf("after the failed start %d of 50 denied packets passed: the kept program stopped enforcing", got)
	}
	ln.Close()
	h.start()
	h.stop(syscall.SIGTERM)
}

// TestApplyIsAllOrNothing: a policy naming a missing interface, or an
// l7.listen port that is taken, changes nothing: not the generation, the
// running policy, the data plane's live generation, the interfaces nor
// the limits packets meet; status says the change failed.
func TestApplyIsAllOrNothing(t *testing.T) {
	s, h := newStarDaemon(t, 2)
	h.start()
	before := h.status()
	att := openDaemonFlow(t, s, 0)
	shown, err := h.ctl("policy", "show", "--json")
	if err != nil {
		t.Fatal(err)
	}

	var taken net.Listener
	if err := s.Edge.Do(func() (err error) { taken, err = net.Listen("tcp", "127.0.0.1:18090"); return err }); err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tight := fmt.Sprintf(daemonPolicy, 10, 10)
	dir := t.TempDir()
	for _, tc := range []struct{ name, yaml, want string }{
		{"missing interface", strings.Replace(tight, "eg-c1", "eg-gone9", 1), "eg-gone9"},
		{"l7 port taken", tight + "l7:\n  listen: 127.0.0.1:18090\n  upstream: http://127.0.0.1:18091\n", "127.0.0.1:18090"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
		os.WriteFile(path, []byte(tc.yaml), 0o644)
		out, err := h.ctl("policy", "apply", path, "--yes")
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%s: apply succeeded or did not name %q: %v\n%s", tc.name, tc.want, err, out)
		}
		st := h.status()
		if st.Generation != before.Generation || st.DataGen != before.DataGen || st.Policy != before.Policy ||
			len(st.Interfaces) != len(before.Interfaces) || st.L7 != before.L7 {
			t.Errorf("%s: status changed by a failed apply:\nbefore %+v\nafter  %+v", tc.name, before, st)
		}
		if st.LastReload.OK || st.LastReload.Trigger != "api" || !strings.Contains(st.LastReload.Error, tc.want) {
			t.Errorf("%s: last reload %+v, want a failed api change naming %q", tc.name, st.LastReload, tc.want)
		}
		if now, _ := h.ctl("policy", "show", "--json"); now != shown {
			t.Errorf("%s: GET /v1/policy changed:\n%s", tc.name, now)
		}
		// The limits packets meet are the old ones (100000/s, not 10/s).
		if got := att.burst(t, 100); got != 100 {
			t.Errorf("%s: %d of 100 passed: the refused policy's limits are live", tc.name, got)
		}
	}
	if _, err := s.Edge.Netlink().LinkByName("eg-gone9"); err == nil {
		t.Fatal("eg-gone9 exists")
	}
	h.stop(syscall.SIGTERM)
}

// TestPinDirMustBeBPFFS: a --pin-dir on an ordinary directory is refused
// with the fix, and nothing is mounted there.
func TestPinDirMustBeBPFFS(t *testing.T) {
	s := netns.New(t).Star(1)
	h := newDaemonHarness(t, s.Edge)
	h.writePolicy(100000, 100000)
	plain := filepath.Join(t.TempDir(), "pins")
	d := secondDaemon(t, h, plain)
	err := d.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "not on a bpf filesystem") || !strings.Contains(err.Error(), "/sys/fs/bpf") {
		t.Fatalf("--pin-dir %s: %v; want a refusal with the fix", plain, err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mounts, []byte(filepath.Dir(plain))) {
		t.Errorf("something is mounted under %s:\n%s", filepath.Dir(plain), mounts)
	}
	if _, err := os.Stat(plain); !os.IsNotExist(err) {
		t.Errorf("refused start created %s", plain)
	}
}

// TestControlRequestBounds: an oversized body is refused at once with 413,
// and the daemon keeps answering.
func TestControlRequestBounds(t *testing.T) {
	_, h := newStarDaemon(t, 1)
	h.start()
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", h.Socket)
		}}}
	for _, tc := range []struct {
		path string
		size int
	}{
		{"/v1/lists/deny", 64 << 20},
		{"/v1/policy", 64 << 20},
		{"/v1/policy/diff", 17 << 20},
	} {
		body := bytes.Repeat([]byte(" "), tc.size)
		body[0] = '{'
		start := time.Now()
		resp, err := c.Post("http://edgeguard"+tc.path, "application/json", bytes.NewReader(body))
		if err != nil {
			// The server may close the connection before reading the
			// whole body; that is a refusal too.
			t.Logf("%s with %d bytes: %v after %v", tc.path, tc.size, err, time.Since(start))
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("%s with %d bytes: status %d, want 413", tc.path, tc.size, resp.StatusCode)
		}
	}
	// Chunked (no Content-Length): still bounded.
	pr, pw := io.Pipe()
	go func() {
		chunk := bytes.Repeat([]byte(" "), 1<<20)
		pw.Write([]byte("{"))
		for range 32 {
			if _, err := pw.Write(chunk); err != nil {
				break
			}
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", "http://edgeguard/v1/lists/deny", pr)
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("chunked 32 MiB list change: status %d, want 413", resp.StatusCode)
		}
	}
	if _, err := h.ctl("deny", "add", "198.18.200.1", "--reason", "after"); err != nil {
		t.Errorf("deny add after oversized requests: %v", err)
	}
	out, err := h.ctl("deny", "list", "--json")
	var e []control.ListEntry
	if err != nil || json.Unmarshal([]byte(out), &e) != nil || len(e) != 1 || e[0].Reason != "after" {
		t.Errorf("deny list after oversized requests: %v %v\n%s", e, err, out)
	}
	h.stop(syscall.SIGTERM)
}

// TestCorruptStateFileIsSetAside: a lists file that does not parse is
// reported, moved aside, and the daemon starts with the applied policy the
// state directory also keeps.
func TestCorruptStateFileIsSetAside(t *testing.T) {
	_, h := newStarDaemon(t, 2)
	h.start()
	next := filepath.Join(t.TempDir(), "next.yaml")
	os.WriteFile(next, []byte(fmt.Sprintf(daemonPolicy, 90000, 90000)), 0o644)
	if _, err := h.ctl("policy", "apply", next, "--yes"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.ctl("deny", "add", "198.18.200.1"); err != nil {
		t.Fatal(err)
	}
	h.stop(syscall.SIGTERM)
	state := filepath.Join(filepath.Dir(h.Socket), "state")
	lists := filepath.Join(state, "lists.json")
	if err := os.WriteFile(lists, []byte(`[{"list": "deny", "prefix": "198.18.`), 0o600); err != nil {
		t.Fatal(err)
	}
	h.start()
	if !strings.Contains(h.Logs(), "state file does not parse") {
		t.Errorf("no error about the corrupt file in the log:\n%s", h.Logs())
	}
	if _, err := os.Stat(lists + ".corrupt"); err != nil {
		t.Errorf("corrupt file not kept aside: %v", err)
	}
	if st := h.status(); st.Policy != next {
		t.Errorf("daemon runs %s (%s), want the applied %s", st.Policy, st.PolicyOrigin, next)
	}
	// Editing the config file supersedes the applied policy.
	h.writePolicy(80000, 80000)
	deadline := time.Now().Add(15 * time.Second)
	for h.status().Policy != h.Config && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if st := h.status(); st.Policy != h.Config || st.PolicyOrigin != "config file" {
		t.Errorf("after editing the config file: runs %s (%s), want %s", st.Policy, st.PolicyOrigin, h.Config)
	}
	h.stop(syscall.SIGTERM)
}

// TestClosedStdoutDoesNotKillTheDaemon: 'edgectl run | head -1' closes the
// daemon's stdout; the next counter line must not kill it (SIGPIPE).
func TestClosedStdoutDoesNotKillTheDaemon(t *testing.T) {
	_, h := newStarDaemon(t, 1)
	cmd := exec.Command("nsenter", "--net="+h.NS.Path(), h.Bin, "run", "--config", h.Config, "--pin-dir", h.PinDir,
		"--socket", h.Socket, "--state-dir", filepath.Join(filepath.Dir(h.Socket), "state"), "--interval", "1s")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	stdout.Close() // as head does after its line
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logs.String(), "counter lines stopped") {
		select {
		case <-exited:
			t.Fatalf("daemon exited after its stdout closed: %v\n%s", waitErr, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no counter line attempted within 20s\n%s", logs.String())
		}
	}
	if _, err := h.ctl("status"); err != nil {
		t.Errorf("daemon does not answer after its stdout closed: %v", err)
	}
}

// TestInterfaceRecreatedIsReattached: an interface deleted while the
// daemon runs is reported (/readyz 503, edgeguard_interfaces_unprotected)
// and, re-created under the same name, attached again.
func TestInterfaceRecreatedIsReattached(t *testing.T) {
	s := netns.New(t).Star(1)
	nl := s.Edge.Netlink()
	addDummy := func() int {
		t.Helper()
		// A veth pair inside the namespace (no dummy module needed).
		if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "egdum0"}, PeerName: "egdum0p"}); err != nil {
			t.Fatal(err)
		}
		l, err := nl.LinkByName("egdum0")
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Index
	}
	first := addDummy()
	h := newDaemonHarness(t, s.Edge)
	os.WriteFile(h.Config, []byte(strings.Replace(fmt.Sprintf(daemonPolicy, 100000, 100000),
		"  - {name: eg-c1, xdp_mode: native}\n", "  - {name: egdum0, xdp_mode: generic}\n", 1)), 0o644)
	h.start()
	prog := h.status().ProgramID
	if got := attachedProgID(t, s.Edge, "egdum0"); got != prog {
		t.Fatalf("egdum0 carries %d, want %d", got, prog)
	}
	if code, body := h.get("/readyz"); code != 200 {
		t.Fatalf("readyz before: %d %s", code, body)
	}
	l, _ := nl.LinkByName("egdum0")
	if err := nl.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "readyz to report egdum0 gone", func() bool {
		code, body := h.get("/readyz")
		return code == 503 && strings.Contains(body, "egdum0")
	})
	checkMetricPositive(t, h.scrape(), "edgeguard_interfaces_unprotected", nil)
	second := addDummy()
	if second == first {
		t.Fatalf("re-created egdum0 got the same ifindex %d", first)
	}
	testenv.WaitFor(t, "egdum0 re-attached", func() bool {
		for _, i := range h.status().Interfaces {
			if i.Name == "egdum0" && i.Ifindex == second {
				return true
			}
		}
		return false
	})
	if got := attachedProgID(t, s.Edge, "egdum0"); got != prog {
		t.Errorf("re-created egdum0 carries %d, want %d", got, prog)
	}
	if code, body := h.get("/readyz"); code != 200 {
		t.Errorf("readyz after re-attach: %d %s", code, body)
	}
	h.stop(syscall.SIGTERM)
}

// get fetches a path of the metrics listener from inside the namespace.
func (h *daemonHarness) get(path string) (int, string) {
	h.t.Helper()
	tr := nsTransport(h.edge, netip.Addr{}, 5*time.Second)
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://127.0.0.1:19469" + path)
	if err != nil {
		h.t.Fatalf("get %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestDeletedPinsAreLoud: a link pin deleted under a --keep daemon is put
// back at stop (the program keeps enforcing); a map pin deleted by hand
// refuses the next start, naming the map, instead of recreating it empty;
// a deleted counters map is recreated with a warning.
func TestDeletedPinsAreLoud(t *testing.T) {
	s, h := newStarDaemon(t, 1)
	h.Args = []string{"--keep"}
	h.start()
	prog := attachedProgID(t, s.Edge, "eg-c0")
	if err := os.Remove(filepath.Join(h.PinDir, "links", "eg-c0")); err != nil {
		t.Fatal(err)
	}
	h.stop(syscall.SIGTERM)
	if !strings.Contains(h.Logs(), "link pin was deleted; pinned it again") {
		t.Errorf("no word about the deleted link pin:\n%s", h.Logs())
	}
	if got := attachedProgID(t, s.Edge, "eg-c0"); got != prog {
		t.Fatalf("after a --keep stop with its link pin deleted eg-c0 carries %d, want %d", got, prog)
	}

	if err := os.Remove(filepath.Join(h.PinDir, "maps", "src_buckets")); err != nil {
		t.Fatal(err)
	}
	err := h.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "deleted by hand") || !strings.Contains(err.Error(), "src_buckets") {
		t.Fatalf("start with src_buckets' pin deleted: %v; want a refusal naming it", err)
	}
	if got := attachedProgID(t, s.Edge, "eg-c0"); got != prog {
		t.Errorf("refused start changed eg-c0's program: %d, want %d", got, prog)
	}
	// Start over on purpose, then lose only a counters map.
	if out, err := exec.Command(h.Bin, "detach", "--unpin", "--pin-dir", h.PinDir).CombinedOutput(); err != nil {
		t.Fatalf("detach --unpin: %v %s", err, out)
	}
	h.start()
	h.stop(syscall.SIGTERM)
	if err := os.Remove(filepath.Join(h.PinDir, "maps", "stats")); err != nil {
		t.Fatal(err)
	}
	h.Args = nil
	h.start()
	if !strings.Contains(h.Logs(), "recreated empty") {
		t.Errorf("no warning about the recreated stats map:\n%s", h.Logs())
	}
	h.stop(syscall.SIGTERM)
}

// TestStatusAnswersDuringASNLoad: while a policy change waits on its ASN
// data (here a FIFO nobody writes to, so the load blocks as long as the
// test wants), status, scrapes and deny add still answer: the daemon's
// state lock is not held while a policy is prepared.
func TestStatusAnswersDuringASNLoad(t *testing.T) {
	_, h := newStarDaemon(t, 1)
	base := oneLinkPolicy()
	h.start()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "asn.tsv")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	next := filepath.Join(dir, "next.yaml")
	os.WriteFile(next, []byte(base+"asn_data: {path: "+fifo+"}\n"), 0o644)
	done := make(chan error, 1)
	go func() { _, err := h.ctl("policy", "apply", next, "--yes"); done <- err }()
	// Wait until the daemon has the FIFO open (the load is under way).
	testenv.WaitFor(t, "the daemon to open the asn data", func() bool {
		f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return false // ENXIO: no reader yet
		}
		f.Close() // EOF for this read; the loader may open it again
		return true
	})
	for _, cmd := range [][]string{{"status"}, {"deny", "add", "198.18.200.9", "--reason", "during load"}, {"deny", "list"}} {
		start := time.Now()
		if out, err := h.ctl(cmd...); err != nil {
			t.Errorf("edgectl %v during an ASN load: %v\n%s", cmd, err, out)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("edgectl %v took %v during an ASN load", cmd, d)
		}
	}
	if code, _ := h.get("/metrics"); code != 200 {
		t.Errorf("scrape during an ASN load: %d", code)
	}
	// Let the load finish: every open of the FIFO gets garbage and EOF.
	for {
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("apply with garbage ASN data succeeded")
			}
			// The CLI's diff step (a dry run, never counted) refused it.
			if st := h.status(); st.Generation != 1 {
				t.Errorf("after the refused apply: generation %d", st.Generation)
			}
			h.stop(syscall.SIGTERM)
			return
		case <-time.After(50 * time.Millisecond):
		}
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Write([]byte("not\tan asn file\n"))
			f.Close()
		}
	}
}

// TestIPNetnsExecIsRefused: under 'ip netns exec' (a private /sys without
// the host's bpffs) the daemon refuses to start, with the nsenter fix,
// instead of pinning into a bpffs that vanishes with it.
func TestIPNetnsExecIsRefused(t *testing.T) {
	s := netns.New(t).Star(1)
	h := newDaemonHarness(t, s.Edge)
	h.writePolicy(100000, 100000)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", filepath.Base(h.NS.Path()), h.Bin, "run", "--keep",
		"--config", h.Config, "--pin-dir", h.PinDir, "--socket", h.Socket,
		"--state-dir", filepath.Join(filepath.Dir(h.Socket), "state")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not on a bpf filesystem") || !strings.Contains(string(out), "nsenter --net") {
		t.Fatalf("edgectl run --keep under ip netns exec: %v\n%s", err, out)
	}
	if got := attachedProgID(t, s.Edge, "eg-c0"); got != 0 {
		t.Errorf("refused start left program %d attached", got)
	}
}
