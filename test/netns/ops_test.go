package netns_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/test/netns"
)

// The operations tests (issue 25): what an operator's first week finds.
// Each runs the real daemon in a private namespace.

// stateDir is the harness daemon's --state-dir (testbed.Daemon's default).
func (h *daemonHarness) stateDir() string {
	if h.StateDir != "" {
		return h.StateDir
	}
	return filepath.Join(filepath.Dir(h.Socket), "state")
}

// TestFailedStartTouchesNothing: a start that cannot succeed (a YAML
// error, an interface that does not exist) leaves the state directory as
// it was: the applied hotfix stays and runs at the next good start, and a
// corrupt lists file is not moved aside. A start under another --config
// says so, not that the file changed.
func TestFailedStartTouchesNothing(t *testing.T) {
	_, h := newStarDaemon(t, 2)
	good, _ := os.ReadFile(h.Config)
	h.start()
	hotfix := filepath.Join(t.TempDir(), "hotfix.yaml")
	os.WriteFile(hotfix, []byte(fmt.Sprintf(daemonPolicy, 90000, 90000)), 0o644)
	if _, err := h.ctl("policy", "apply", hotfix, "--yes"); err != nil {
		t.Fatal(err)
	}
	h.stop(syscall.SIGTERM)
	applied := filepath.Join(h.stateDir(), "applied-policy.json")
	lists := filepath.Join(h.stateDir(), "lists.json")
	savedApplied, err := os.ReadFile(applied)
	if err != nil {
		t.Fatal(err)
	}
	corrupt := []byte(`[{"list": "deny", "prefix": "198.18.`)
	os.WriteFile(lists, corrupt, 0o600)

	for _, tc := range []struct{ name, yaml, want string }{
		{"yaml error", "apiVersion: edgeguard/v1\ninterfaces: [\n", "yaml"},
		{"missing interface", strings.Replace(string(good), "eg-c1", "eg-gone9", 1), "eg-gone9"},
	} {
		os.WriteFile(h.Config, []byte(tc.yaml), 0o644)
		err := h.Start(context.Background())
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), tc.want) {
			t.Fatalf("%s: start: %v; want a failure naming %q", tc.name, err, tc.want)
		}
		if got, err := os.ReadFile(applied); err != nil || !bytes.Equal(got, savedApplied) {
			t.Errorf("%s: the failed start changed %s: %v", tc.name, applied, err)
		}
		if got, err := os.ReadFile(lists); err != nil || !bytes.Equal(got, corrupt) {
			t.Errorf("%s: the failed start moved or changed %s: %v", tc.name, lists, err)
		}
	}
	// The operator puts the file back: the applied hotfix runs.
	os.WriteFile(h.Config, good, 0o644)
	h.start()
	if st := h.status(); st.Policy != hotfix {
		t.Errorf("after the failed starts the daemon runs %s (%s), want the applied %s", st.Policy, st.PolicyOrigin, hotfix)
	}
	if _, err := os.Stat(lists + ".corrupt"); err != nil {
		t.Errorf("the good start did not set the corrupt lists file aside: %v", err)
	}
	h.stop(syscall.SIGTERM)

	// Another --config: the log names that, not a change of the file.
	other := filepath.Join(t.TempDir(), "other.yaml")
	os.WriteFile(other, good, 0o644)
	h.Config = other
	mark := len(h.Logs())
	h.start()
	if logs := h.Logs()[mark:]; strings.Contains(logs, "the config file changed since") ||
		!strings.Contains(logs, "this start names") {
		t.Errorf("start under another --config: log does not say so:\n%s", logs)
	}
	h.stop(syscall.SIGTERM)
}

// readOnly makes dir read-only for everyone, root included (a read-only
// bind mount over it), until the returned function or the test's end.
func readOnly(t *testing.T, dir string) (undo func()) {
	t.Helper()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount %s: %v", dir, err)
	}
	done := false
	undo = func() {
		if !done {
			done = true
			if err := unix.Unmount(dir, 0); err != nil {
				t.Errorf("unmount %s: %v", dir, err)
			}
		}
	}
	t.Cleanup(undo)
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
	return undo
}

// TestDenyUnsavedIsLoud: with the state directory read-only, 'deny add'
// and 'deny remove' take effect in the data plane at once (an operator
// under attack needs the drop now) but exit 1 saying the change is not
// saved; status and edgeguard_state_unsaved say so until a later save
// succeeds, which the daemon retries by itself.
func TestDenyUnsavedIsLoud(t *testing.T) {
	s, h := newStarDaemon(t, 2)
	h.start()
	att := openDaemonFlow(t, s, 0)
	if got := att.burst(t, 20); got != 20 {
		t.Fatalf("before: %d of 20 through", got)
	}
	writable := readOnly(t, h.stateDir())
	src := s.Clients[0].Src4.String()
	out, err := h.ctl("deny", "add", src, "--reason", "unsaved")
	if err == nil || !strings.Contains(out, "NOT saved") || !strings.Contains(out, "a restart forgets it") {
		t.Errorf("deny add with a read-only state dir: %v\n%s; want exit 1 saying it is not saved", err, out)
	}
	if got := att.burst(t, 20); got != 0 {
		t.Errorf("the unsaved deny is not in force: %d of 20 through", got)
	}
	if st := h.status(); !strings.Contains(st.StateNotSaved, "NOT saved") {
		t.Errorf("status after an unsaved deny: state_not_saved %q", st.StateNotSaved)
	}
	if text, _ := h.ctl("status"); !strings.Contains(text, "NOT SAVED") {
		t.Errorf("status text does not say the lists are not saved:\n%s", text)
	}
	fams := h.scrape()
	if v, _ := metricSum(fams, "edgeguard_state_unsaved", nil); v != 1 {
		t.Errorf("edgeguard_state_unsaved = %v, want 1", v)
	}
	checkMetricPositive(t, fams, "edgeguard_state_save_failures_total", map[string]string{"file": "lists.json"})
	out, err = h.ctl("deny", "remove", src)
	if err == nil || !strings.Contains(out, "NOT saved") || !strings.Contains(out, "a restart brings it back") {
		t.Errorf("deny remove with a read-only state dir: %v\n%s; want exit 1 saying it is not saved", err, out)
	}
	if _, err := h.ctl("deny", "add", "198.18.200.7", "--reason", "kept"); err == nil {
		t.Errorf("second deny add with a read-only state dir exited 0")
	}
	// Writable again: the daemon's retry saves what runs.
	writable()
	testenv.WaitFor(t, "the retried save", func() bool { return h.status().StateNotSaved == "" })
	if v, _ := metricSum(h.scrape(), "edgeguard_state_unsaved", nil); v != 0 {
		t.Errorf("edgeguard_state_unsaved after the save = %v, want 0", v)
	}
	h.stop(syscall.SIGTERM)
	h.start()
	out, err = h.ctl("deny", "list", "--json")
	if err != nil || !strings.Contains(out, "198.18.200.7") || strings.Contains(out, src+"/32") {
		t.Errorf("after the restart the deny list is not what ran: %v\n%s", err, out)
	}
	h.stop(syscall.SIGTERM)
}

// TestColdStartAttachesLast: on a cold start the program is attached only
// once its policy is live: a client sending all through the start sees no
// packet counted pass/no_policy.
func TestColdStartAttachesLast(t *testing.T) {
	s, h := newStarDaemon(t, 2)
	f := openDaemonFlow(t, s, 0)
	stop := make(chan struct{})
	sent := make(chan int)
	go func() {
		// Bounded: at most 60,000 datagrams, one per 250 µs, 15 s at most.
		n := 0
		deadline := time.Now().Add(15 * time.Second)
		for ; n < 60000 && time.Now().Before(deadline); n++ {
			select {
			case <-stop:
				sent <- n
				return
			default:
			}
			f.from.Write([]byte("eg-coldstart"))
			time.Sleep(250 * time.Microsecond)
		}
		sent <- n
	}()
	h.start()
	time.Sleep(200 * time.Millisecond) // packets after the start too
	close(stop)
	n := <-sent
	st, err := h.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := testbed.CountersOf(st)
	t.Logf("sent %d datagrams during the start; counters %v", n, c)
	if c["pass/ok"] == 0 {
		t.Fatalf("no packet counted pass/ok: the flow did not reach the program")
	}
	if got := c["pass/no_policy"]; got != 0 {
		t.Errorf("%d packets counted pass/no_policy: the program was attached before its policy was live", got)
	}
	h.stop(syscall.SIGTERM)
}

// TestKeepOnPrivateBPFFSIsRefused: under 'ip netns exec' with a bpffs
// mounted inside it (what the refusal of a missing bpffs used to suggest),
// the pins would vanish with the process: --keep is refused with the
// reason, and nothing stays attached.
func TestKeepOnPrivateBPFFSIsRefused(t *testing.T) {
	s, h := newStarDaemon(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	script := `mount -t bpf bpf /sys/fs/bpf && exec "$@"`
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", filepath.Base(h.NS.Path()), "sh", "-c", script, "sh",
		h.Bin, "run", "--keep", "--config", h.Config, "--pin-dir", h.PinDir, "--socket", h.Socket,
		"--state-dir", h.stateDir()).CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "vanish when the daemon exits") ||
		!strings.Contains(string(out), "--keep would keep nothing") {
		t.Fatalf("edgectl run --keep on a private bpffs: %v\n%s", err, out)
	}
	if got := attachedProgID(t, s.Edge, "eg-c0"); got != 0 {
		t.Errorf("refused start left program %d attached", got)
	}
}

// TestWatcherSeesContentNotStat: the policy file is a symlink (as a
// Kubernetes ConfigMap's ..data layout makes it); flipping it to a file of
// the same size and modification time reloads it, without SIGHUP; a
// dangling symlink is reported as a failed reload at once, and the running
// policy stays.
func TestWatcherSeesContentNotStat(t *testing.T) {
	s := netns.New(t).Star(2)
	h := newDaemonHarness(t, s.Edge)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	os.WriteFile(a, []byte(fmt.Sprintf(daemonPolicy, 100000, 100000)), 0o644)
	os.WriteFile(b, []byte(fmt.Sprintf(daemonPolicy, 900000, 900000)), 0o644)
	stamp := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, f := range []string{a, b} {
		if err := os.Chtimes(f, stamp, stamp); err != nil {
			t.Fatal(err)
		}
	}
	flip := func(target string) {
		t.Helper()
		tmp := h.Config + ".tmp"
		os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, h.Config); err != nil {
			t.Fatal(err)
		}
	}
	flip(a)
	h.start()
	flip(b)
	testenv.WaitFor(t, "the flipped symlink reloaded", func() bool { return h.status().Generation == 2 })
	if out, err := h.ctl("policy", "diff", b); err != nil {
		t.Errorf("policy diff against the flipped file: %v\n%s", err, out)
	}
	flip(filepath.Join(dir, "gone.yaml"))
	testenv.WaitFor(t, "the dangling symlink reported", func() bool {
		r := h.status().LastReload
		return !r.OK && strings.Contains(r.Error, "gone.yaml")
	})
	if st := h.status(); st.Generation != 2 {
		t.Errorf("a dangling symlink changed the generation: %d", st.Generation)
	}
	flip(b) // back to what runs: in sync again
	testenv.WaitFor(t, "status ok again", func() bool { return h.status().LastReload.OK })
	h.stop(syscall.SIGTERM)
}

// TestCorruptListsKeepPinnedEntries: a lists file that does not parse at
// all (truncated, or null) is set aside, and the run-time entries the
// pinned data plane still enforces are recovered, not removed; a file with
// one bad entry loads the others and names the bad one.
func TestCorruptListsKeepPinnedEntries(t *testing.T) {
	s, h := newStarDaemon(t, 2)
	h.Args = []string{"--keep"}
	h.start()
	att := openDaemonFlow(t, s, 0)
	src := s.Clients[0].Src4.String()
	for _, p := range []string{src, "198.18.200.0/24"} {
		if _, err := h.ctl("deny", "add", p, "--reason", "flood"); err != nil {
			t.Fatal(err)
		}
	}
	h.stop(syscall.SIGTERM)
	lists := filepath.Join(h.stateDir(), "lists.json")
	good, err := os.ReadFile(lists)
	if err != nil {
		t.Fatal(err)
	}
	denied := func(what string) {
		t.Helper()
		out, err := h.ctl("deny", "list", "--json")
		if err != nil || !strings.Contains(out, src+"/32") || !strings.Contains(out, "198.18.200.0/24") {
			t.Errorf("%s: the deny list lost run-time entries: %v\n%s", what, err, out)
		}
		if got := att.burst(t, 20); got != 0 {
			t.Errorf("%s: %d of 20 packets of the denied source passed", what, got)
		}
	}
	for _, tc := range []struct{ name, content string }{
		{"truncated", string(good[:len(good)/2])},
		{"null", "null\n"},
	} {
		os.WriteFile(lists, []byte(tc.content), 0o600)
		os.Remove(lists + ".corrupt")
		mark := len(h.Logs())
		h.start()
		if !strings.Contains(h.Logs()[mark:], "recovered from the pinned data plane") {
			t.Errorf("%s: no word of the recovery:\n%s", tc.name, h.Logs()[mark:])
		}
		if _, err := os.Stat(lists + ".corrupt"); err != nil {
			t.Errorf("%s: the file was not set aside: %v", tc.name, err)
		}
		denied(tc.name)
		if saved, err := os.ReadFile(lists); err != nil || !strings.Contains(string(saved), "198.18.200.0/24") {
			t.Errorf("%s: the recovered entries are not saved: %v\n%s", tc.name, err, saved)
		}
		h.stop(syscall.SIGTERM) // --keep: the pins stay for the next case
	}
	// One entry with a bad prefix among good ones.
	bad := strings.Replace(string(good), "198.18.200.0/24", "198.18.300.0/24", 1)
	if bad == string(good) {
		t.Fatalf("lists file does not hold 198.18.200.0/24:\n%s", good)
	}
	os.WriteFile(lists, []byte(bad), 0o600)
	mark := len(h.Logs())
	h.Args = nil
	h.start()
	logs := h.Logs()[mark:]
	if !strings.Contains(logs, "saved list entry skipped") || !strings.Contains(logs, "198.18.300.0/24") {
		t.Errorf("the bad entry is not named:\n%s", logs)
	}
	if out, err := h.ctl("deny", "list", "--json"); err != nil || !strings.Contains(out, src+"/32") {
		t.Errorf("the good entry did not load: %v\n%s", err, out)
	}
	if got := att.burst(t, 20); got != 0 {
		t.Errorf("%d of 20 packets of the denied source passed", got)
	}
	h.stop(syscall.SIGTERM)
}

// TestStopMidApplyAnswers: SIGTERM while a policy apply is in progress
// (here waiting on a list file that is a FIFO): the daemon finishes the
// change and its caller gets the answer (applied, generation 2) before the
// daemon exits; the next start runs what the caller was told. (The apply
// is sent as 'edgectl policy apply' sends it, without the CLI's diff step,
// which would read the FIFO first.)
func TestStopMidApplyAnswers(t *testing.T) {
	_, h := newStarDaemon(t, 2)
	h.start()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "deny.txt")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	next := filepath.Join(dir, "next.yaml")
	yaml := fmt.Sprintf(daemonPolicy, 90000, 90000) + "lists:\n  deny:\n    - {file: deny.txt}\n"
	os.WriteFile(next, []byte(yaml), 0o644)
	body, _ := json.Marshal(control.PolicyDoc{Source: next, YAML: yaml})
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", h.Socket)
		}}}
	type result struct {
		status int
		change control.PolicyChange
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := c.Post("http://edgeguard/v1/policy", "application/json", bytes.NewReader(body))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		var ch control.PolicyChange
		err = json.NewDecoder(resp.Body).Decode(&ch)
		done <- result{resp.StatusCode, ch, err}
	}()
	var f *os.File
	testenv.WaitFor(t, "the apply to read the list file", func() bool {
		var err error
		f, err = os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0)
		return err == nil // ENXIO: no reader yet
	})
	// The apply waits on the FIFO, holding the change: stop the daemon,
	// and let the apply go on only after the 2 s a stopping daemon used
	// to give its socket.
	if err := h.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	f.WriteString("198.18.202.0/24\n")
	f.Close()
	r := <-done
	if r.err != nil || r.status != http.StatusOK || !r.change.Applied || r.change.Generation != 2 {
		t.Errorf("apply interrupted by SIGTERM: %d %+v %v; want its answer (applied, generation 2)", r.status, r.change, r.err)
	}
	h.stop(syscall.SIGTERM) // waits for the exit already under way
	if !strings.Contains(h.Logs(), "waiting for the policy change in progress") {
		t.Errorf("the stop does not say it waits for the change:\n%s", h.Logs())
	}
	// The next start runs what the caller was told.
	os.Remove(fifo)
	os.WriteFile(fifo, []byte("198.18.202.0/24\n"), 0o644)
	h.start()
	if st := h.status(); st.Policy != next {
		t.Errorf("after the restart the daemon runs %s (%s), want the applied %s", st.Policy, st.PolicyOrigin, next)
	}
	h.stop(syscall.SIGTERM)
}

// TestDiffSaysWhatApplyDoes: on a daemon run with --iface, a file's
// interfaces: are not used, and diff and apply say so instead of showing
// an interface change that never happens; a file whose tables: differ from
// the loaded maps still gets its whole diff, with the reason an apply is
// refused.
func TestDiffSaysWhatApplyDoes(t *testing.T) {
	_, h := newStarDaemon(t, 2)
	h.Args = []string{"--iface", "eg-c0", "--xdp-mode", "native"}
	h.start()
	dir := t.TempDir()
	one := filepath.Join(dir, "one.yaml")
	os.WriteFile(one, []byte(strings.Replace(fmt.Sprintf(daemonPolicy, 90000, 90000),
		"  - {name: eg-c0, xdp_mode: native}\n", "", 1)), 0o644)
	out, err := h.ctl("policy", "diff", one)
	if err == nil || strings.Contains(out, "- interface") || strings.Contains(out, "+ interface") || !strings.Contains(out, "--iface eg-c0") ||
		!strings.Contains(out, "90k") {
		t.Errorf("policy diff of a file naming eg-c1 under --iface eg-c0: %v\n%s; want the rate change, no interface change, a word on --iface", err, out)
	}
	out, err = h.ctl("policy", "apply", one, "--yes")
	if err != nil || !strings.Contains(out, "--iface eg-c0") || !strings.Contains(out, "applied: generation 2") {
		t.Errorf("policy apply under --iface: %v\n%s; want it applied with a word on --iface", err, out)
	}
	if st := h.status(); len(st.Interfaces) != 1 || st.Interfaces[0].Name != "eg-c0" {
		t.Errorf("interfaces after the apply: %+v", st.Interfaces)
	}
	tables := filepath.Join(dir, "tables.yaml")
	os.WriteFile(tables, []byte(fmt.Sprintf(daemonPolicy, 80000, 80000)+"tables: {list_entries: 12345}\n"), 0o644)
	out, err = h.ctl("policy", "diff", tables)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, "80k") ||
		!strings.Contains(out, "tables.list_entries") || !strings.Contains(out, "applying it is refused") {
		t.Errorf("policy diff with other tables: %v\n%s; want exit 1, the whole diff and why an apply is refused", err, out)
	}
	if out, err := h.ctl("policy", "apply", tables, "--yes"); err == nil || !strings.Contains(out, "table sizes are fixed") {
		t.Errorf("policy apply with other tables: %v\n%s; want it refused", err, out)
	}
	if st := h.status(); st.Generation != 2 {
		t.Errorf("generation after the refused apply: %d, want 2", st.Generation)
	}
	h.stop(syscall.SIGTERM)
}

// TestStatusSaysWhatEnforces: status marks an interface renamed away (or
// deleted) as not protected, as /readyz does, instead of listing it as
// attached; after a --keep stop, status and stats say the program is
// attached and enforcing from the pins, not only that no daemon runs.
func TestStatusSaysWhatEnforces(t *testing.T) {
	s := netns.New(t).Star(1)
	nl := s.Edge.Netlink()
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "egdum0"}, PeerName: "egdum0p"}); err != nil {
		t.Fatal(err)
	}
	l, err := nl.LinkByName("egdum0")
	if err != nil {
		t.Fatal(err)
	}
	nl.LinkSetUp(l)
	h := newDaemonHarness(t, s.Edge)
	os.WriteFile(h.Config, []byte(strings.Replace(fmt.Sprintf(daemonPolicy, 100000, 100000),
		"  - {name: eg-c1, xdp_mode: native}\n", "  - {name: egdum0, xdp_mode: generic}\n", 1)), 0o644)
	h.Args = []string{"--keep"}
	h.start()
	nl.LinkSetDown(l)
	if err := nl.LinkSetName(l, "egren0"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "status to mark egdum0 not protected", func() bool {
		for _, i := range h.status().Interfaces {
			if i.Name == "egdum0" && i.Problem != "" {
				return true
			}
		}
		return false
	})
	if out, _ := h.ctl("status"); !strings.Contains(out, "egdum0: NOT PROTECTED") {
		t.Errorf("status text does not mark egdum0:\n%s", out)
	}
	h.stop(syscall.SIGTERM)
	for _, cmd := range []string{"status", "stats"} {
		out, err := h.ctl(cmd, "--pin-dir", h.PinDir)
		if err == nil || !strings.Contains(out, "not running") || !strings.Contains(out, "ATTACHED AND ENFORCING") ||
			!strings.Contains(out, "eg-c0") {
			t.Errorf("%s after a --keep stop: %v\n%s; want: not running, but enforcing from the pins on eg-c0", cmd, err, out)
		}
	}
	if out, err := exec.Command(h.Bin, "detach", "--unpin", "--pin-dir", h.PinDir).CombinedOutput(); err != nil {
		t.Fatalf("detach --unpin: %v %s", err, out)
	}
	if out, _ := h.ctl("status", "--pin-dir", h.PinDir); strings.Contains(out, "ENFORCING") {
		t.Errorf("status after detach --unpin still says enforcing:\n%s", out)
	}
}

// TestSynMPTCPListenerPassed: a protected service whose listener is MPTCP
// (Go's default for listeners since 1.24) gets its SYNs passed to the
// kernel, loudly (stats, metric, log), instead of cookie SYN-ACKs that
// reset each new MPTCP client's first connection: every new client
// connects at the first try. When the listener becomes plain TCP,
// protection turns on by itself.
func TestSynMPTCPListenerPassed(t *testing.T) {
	netns.RequireRoot(t)
	requireSyn(t)
	star := netns.New(t).Star(2)
	for _, c := range star.Clients {
		napiPeer(t, c.NS, "eg-up")
	}
	if b, err := os.ReadFile("/proc/sys/net/mptcp/enabled"); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Skipf("MPTCP is off on this kernel (net.mptcp.enabled: %q %v)", b, err)
	}
	serve := func(ln *net.TCPListener) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}
	ln, err := listenTCPProto(star.Edge, fmt.Sprintf("[::]:%d", synPort), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serve(ln)
	h := newDaemonHarness(t, star.Edge)
	os.WriteFile(h.Config, []byte(synDaemonHead+fmt.Sprintf(synDaemonSection, synPort, synPort, "always")), 0o644)
	h.start()
	svc := func() control.SYNServiceStat {
		t.Helper()
		st, err := h.Stats(context.Background())
		if err != nil || st.SYN == nil || len(st.SYN.Services) != 1 {
			t.Fatalf("stats: %+v %v", st.SYN, err)
		}
		return st.SYN.Services[0]
	}
	if s := svc(); !s.MPTCPListener || s.Active {
		t.Errorf("service with an MPTCP listener: %+v, want mptcp_listener and not active", s)
	}
	if v, _ := metricSum(h.scrape(), "edgeguard_syn_mptcp_listener", map[string]string{"service": "api"}); v != 1 {
		t.Errorf("edgeguard_syn_mptcp_listener = %v, want 1", v)
	}
	if !strings.Contains(h.Logs(), "syn protection OFF for a service whose listener is MPTCP") {
		t.Errorf("no warning in the log:\n%s", h.Logs())
	}
	c := star.Clients[0]
	connect := func(i int) error {
		return c.NS.Do(func() error {
			d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: c.Src4.AsSlice()}}
			d.SetMultipathTCP(true)
			conn, err := d.Dial("tcp", netip.AddrPortFrom(c.EdgeAddr4, synPort).String())
			if err != nil {
				return err
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 2)
			if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hi" {
				return fmt.Errorf("client %d read %q: %v", i, buf, err)
			}
			return nil
		})
	}
	for i := range 5 {
		if err := connect(i); err != nil {
			t.Errorf("new MPTCP client %d, first try: %v", i, err)
		}
	}
	// The server restarts as plain TCP: protection turns on by itself.
	ln.Close()
	plain, err := listenTCPProto(star.Edge, fmt.Sprintf("[::]:%d", synPort), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plain.Close() })
	go serve(plain)
	testenv.WaitFor(t, "protection on for the plain TCP listener", func() bool { s := svc(); return !s.MPTCPListener && s.Active })
	if err := connect(9); err != nil {
		t.Errorf("a client through the cookies of the plain TCP listener: %v", err)
	}
	h.stop(syscall.SIGTERM)
}
