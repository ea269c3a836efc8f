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

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/test/netns"
)

// The daemon test runs the real edgectl binary inside the edge namespace
// (nsenter --net: only the network namespace changes, so the daemon sees
// the host's bpffs and its pins survive a restart) and drives it with the
// real CLI over its control socket.

const daemonPort = 9100

const daemonPolicy = `apiVersion: edgeguard/v1
interfaces:
  - {name: eg-c0, xdp_mode: native}
  - {name: eg-c1, xdp_mode: native}
mode: enforce
defaults:
  per_source:
    key: {ipv4: 32, ipv6: 64}
    packets: {rate: %d/s, burst: %d}
  per_prefix: {}
  per_asn: {}
metrics:
  listen: 127.0.0.1:19469
`

// xdpHead is the XDP half of a daemon test's policy: the interfaces (YAML
// list items), per-source packet limits far above anything the tests send
// (100000/s and burst; every verdict they assert is another part's),
// /metrics on the edge's loopback. The test's sections follow it.
func xdpHead(burst int, ifaces ...string) string {
	return "apiVersion: edgeguard/v1\ninterfaces:\n" + strings.Join(ifaces, "\n") + fmt.Sprintf(`
defaults:
  per_source:
    key: {ipv4: 32, ipv6: 64}
    packets: {rate: 100000/s, burst: %d}
  per_prefix: {}
  per_asn: {}
metrics:
  listen: 127.0.0.1:19469
`, burst)
}

// daemonHarness runs the real daemon for one test (testbed.Daemon) and
// fails the test on any error.
type daemonHarness struct {
	*testbed.Daemon
	t    *testing.T
	edge *netns.Namespace
}

func newDaemonHarness(t *testing.T, edge *netns.Namespace) *daemonHarness {
	bin, err := edgectl()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	h := &daemonHarness{t: t, edge: edge, Daemon: &testbed.Daemon{
		Bin: bin, NS: edge,
		Config: filepath.Join(dir, "edgeguard.yaml"),
		Socket: filepath.Join(dir, "run", "edgeguard.sock"),
		PinDir: fmt.Sprintf("/sys/fs/bpf/eg-test-%d-daemon", os.Getpid()),
	}}
	t.Cleanup(func() {
		h.Kill()
		os.RemoveAll(h.PinDir)
	})
	return h
}

// newStarDaemon is the daemon tests' usual set-up: a star of n clients
// (1 or 2) and a daemonHarness on its edge with daemonPolicy at limits far
// above what the tests send, naming the star's links (eg-c0, and eg-c1
// for two clients); the test starts it.
func newStarDaemon(t *testing.T, n int) (*netns.Star, *daemonHarness) {
	t.Helper()
	s := netns.New(t).Star(n)
	h := newDaemonHarness(t, s.Edge)
	switch n {
	case 1:
		h.writeConfig(oneLinkPolicy())
	case 2:
		h.writePolicy(100000, 100000)
	default:
		t.Fatalf("newStarDaemon: daemonPolicy names 1 or 2 links, not %d", n)
	}
	return s, h
}

// oneLinkPolicy is daemonPolicy at 100000/s without eg-c1.
func oneLinkPolicy() string {
	return strings.Replace(fmt.Sprintf(daemonPolicy, 100000, 100000), "  - {name: eg-c1, xdp_mode: native}\n", "", 1)
}

func (h *daemonHarness) writePolicy(rate, burst int) {
	h.t.Helper()
	h.writeConfig(fmt.Sprintf(daemonPolicy, rate, burst))
}

// writeConfig replaces the policy file by a rename: a running daemon
// reloads it and never reads half a file.
func (h *daemonHarness) writeConfig(data string) {
	h.t.Helper()
	tmp := h.Config + ".new"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, h.Config); err != nil {
		h.t.Fatal(err)
	}
}

func (h *daemonHarness) start() {
	h.t.Helper()
	if err := h.Start(context.Background()); err != nil {
		h.t.Fatal(err)
	}
}

func (h *daemonHarness) stop(sig syscall.Signal) {
	h.t.Helper()
	if err := h.Stop(sig); err != nil {
		h.t.Errorf("%v\n%s", err, h.Logs())
	}
}

// ctl runs the real CLI against the daemon's socket.
func (h *daemonHarness) ctl(args ...string) (string, error) {
	out, err := h.Ctl(context.Background(), args...)
	return string(out), err
}

func (h *daemonHarness) status() control.Status {
	h.t.Helper()
	st, err := h.Status(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	return st
}

// stats is what the real CLI's 'edgectl stats --json' says.
func (h *daemonHarness) stats() control.Stats {
	h.t.Helper()
	out, err := h.ctl("stats", "--json")
	if err != nil {
		h.t.Fatal(err)
	}
	var st control.Stats
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		h.t.Fatal(err)
	}
	return st
}

// scrape fetches /metrics from inside the edge namespace.
func (h *daemonHarness) scrape() map[string]*dto.MetricFamily {
	h.t.Helper()
	tr := nsTransport(h.edge, netip.Addr{}, 5*time.Second)
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://127.0.0.1:19469/metrics")
	if err != nil {
		h.t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		h.t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// dflows are one client's sockets towards the edge.
type dflow struct {
	from, sentinel, to *net.UDPConn
}

func openDaemonFlow(t *testing.T, s *netns.Star, i int) dflow {
	t.Helper()
	c := s.Clients[i]
	dst := netip.AddrPortFrom(c.EdgeAddr4, daemonPort)
	to, err := s.Edge.ListenUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	from, err := c.NS.DialUDP(netip.AddrPortFrom(c.Src4, 0), dst)
	if err != nil {
		t.Fatal(err)
	}
	sentinel, err := c.NS.DialUDP(netip.AddrPortFrom(c.Alt4, 0), dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { to.Close(); from.Close(); sentinel.Close() })
	return dflow{from, sentinel, to}
}

// burst sends n datagrams in chunks of 50, each closed by a sentinel: a
// veth with native XDP queues at most 256 frames for its NAPI poll, and an
// unpaced burst can overflow that ring on a busy 2-core machine, which
// would look like drops the program never made.
func (f dflow) burst(t *testing.T, n int) int {
	t.Helper()
	got := 0
	for n > 0 {
		chunk := min(n, 50)
		c, err := netns.UDPBurst{From: f.from, Sentinel: f.sentinel, To: f.to, Count: chunk, Payload: 16}.Run()
		if err != nil {
			t.Fatal(err)
		}
		got += c
		n -= chunk
	}
	return got
}

// TestDaemonLifecycle runs the daemon on two veths and checks, with real
// traffic: a deny added with the CLI drops one source and not the other; a
// policy reload while the denied source keeps sending lets none of it
// through; a killed daemon leaves enforcement running from the pins and a
// restarted one takes over with its state; /metrics parses and counts.
func TestDaemonLifecycle(t *testing.T) {
	s, h := newStarDaemon(t, 2)
	h.start()
	attacker, legit := openDaemonFlow(t, s, 0), openDaemonFlow(t, s, 1)

	st := h.status()
	if len(st.Interfaces) != 2 || st.Generation != 1 || !st.LastReload.OK {
		t.Fatalf("status after start: %+v", st)
	}
	for _, i := range st.Interfaces {
		if i.XDPMode != "native" {
			t.Errorf("interface %s attached in %s mode, want native", i.Name, i.XDPMode)
		}
	}
	if got := attacker.burst(t, 200); got != 200 {
		t.Fatalf("before deny: attacker got %d of 200 through", got)
	}

	// A second daemon on the same state refuses to start.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	secondOut, err := exec.CommandContext(ctx, "nsenter", "--net="+h.NS.Path(), h.Bin, "run", "--config", h.Config,
		"--pin-dir", h.PinDir, "--socket", h.Socket).CombinedOutput()
	cancel()
	if err == nil || !strings.Contains(string(secondOut), "another edgectl run") {
		t.Errorf("second daemon on the same state: %v, output %q; want a refusal naming the lock", err, secondOut)
	}

	// Deny one source with the CLI: its packets drop, the other client's
	// do not, and the sentinel from a second address of the same client
	// still passes (so the deny is per source, not per link).
	if _, err := h.ctl("deny", "add", s.Clients[0].Src4.String(), "--ttl", "10m", "--reason", "test"); err != nil {
		t.Fatal(err)
	}
	if got := attacker.burst(t, 200); got != 0 {
		t.Errorf("after deny: %d of 200 denied packets got through", got)
	}
	if got := legit.burst(t, 200); got != 200 {
		t.Errorf("after deny: legit client got %d of 200 through", got)
	}
	list, err := h.ctl("deny", "list", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list, s.Clients[0].Src4.String()+"/32") || !strings.Contains(list, `"origin": "cli"`) {
		t.Errorf("deny list does not show the cli entry:\n%s", list)
	}

	// Reload mid-traffic: the denied source sends continuously while the
	// policy file changes twice (and a broken version in between is
	// rejected). Not one denied packet may pass at any moment.
	stopSend := make(chan struct{})
	sent := make(chan int, 1)
	go func() {
		n := 0
		// Bounded: at most 150,000 datagrams, about 20,000 per second.
		for n < 150000 {
			select {
			case <-stopSend:
				sent <- n
				return
			default:
			}
			attacker.from.Write([]byte("eg-flood"))
			n++
			if n%20 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		sent <- n
	}()
	h.writePolicy(50000, 50000)
	waitGeneration(t, h, 2)
	os.WriteFile(h.Config, []byte("apiVersion: edgeguard/v1\nbogus: [\n"), 0o644)
	waitReloadFailure(t, h)
	h.writePolicy(100000, 100000)
	waitGeneration(t, h, 3)
	close(stopSend)
	n := <-sent
	if got := drain(t, attacker.to, "eg-flood"); got != 0 {
		t.Errorf("during reloads: %d of %d denied packets got through", got, n)
	}
	t.Logf("reloads: %d denied packets sent during 3 reloads, 0 passed", n)
	if got := legit.burst(t, 200); got != 200 {
		t.Errorf("after reloads: legit client got %d of 200 through", got)
	}

	// The CLI's apply: shows the diff, applies without asking (--yes), and
	// keeps the applied policy in the state directory; the operator's
	// config file is left as it is.
	next := filepath.Join(t.TempDir(), "next.yaml")
	if err := os.WriteFile(next, []byte(fmt.Sprintf(daemonPolicy, 90000, 90000)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := h.ctl("policy", "apply", next, "--yes")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "~ rule default") || !strings.Contains(out, "applied: generation 4") {
		t.Errorf("policy apply output:\n%s", out)
	}
	if saved, _ := os.ReadFile(h.Config); strings.Contains(string(saved), "90000/s") {
		t.Errorf("policy apply rewrote the operator's config file:\n%s", saved)
	}
	if st := h.status(); st.Policy != next || !strings.Contains(st.PolicyOrigin, "policy apply") {
		t.Errorf("status after apply: policy %q (%s), want %s applied with policy apply", st.Policy, st.PolicyOrigin, next)
	}

	// Only root may use the control socket.
	nobody := exec.Command(h.Bin, "status", "--socket", h.Socket)
	nobody.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := nobody.CombinedOutput(); err == nil || !strings.Contains(string(out), "sudo") {
		t.Errorf("edgectl status as nobody: err %v, output %q; want a permission error that says to use sudo", err, out)
	}

	fams := h.scrape()
	checkMetricPositive(t, fams, "edgeguard_policy_generation", nil)
	checkMetricPositive(t, fams, "edgeguard_xdp_packets_total", map[string]string{"action": "drop", "reason": "deny_list"})
	checkMetricPositive(t, fams, "rate_limit_rejected_total", map[string]string{"layer": "xdp"})

	// Kill the daemon (no cleanup runs): the pinned program keeps dropping.
	h.stop(syscall.SIGKILL)
	if got := attacker.burst(t, 200); got != 0 {
		t.Errorf("daemon killed: %d of 200 denied packets got through", got)
	}
	// A new daemon takes over the pinned link and state, restores the
	// run-time deny entry, and runs the applied policy (the config file is
	// unchanged since the apply).
	h.start()
	if st := h.status(); st.Policy != next {
		t.Errorf("restarted daemon runs %q (%s), want the applied %s", st.Policy, st.PolicyOrigin, next)
	}
	if got := attacker.burst(t, 200); got != 0 {
		t.Errorf("daemon restarted: %d of 200 denied packets got through", got)
	}
	if got := legit.burst(t, 200); got != 200 {
		t.Errorf("daemon restarted: legit client got %d of 200 through", got)
	}
	cs := h.stats()
	var denied uint64
	for _, c := range cs.Totals {
		if c.Action == "drop" && c.Reason == "deny_list" {
			denied = c.Packets
		}
	}
	// Counters survived the restart (pinned maps): at least the 600
	// denied packets of the bursts, plus the flood.
	if denied < 600 {
		t.Errorf("deny_list drops after restart = %d, want ≥ 600 (counters must survive a restart)", denied)
	}

	// A clean stop detaches and removes the pins.
	h.stop(syscall.SIGTERM)
	if _, err := os.Stat(h.PinDir); !os.IsNotExist(err) {
		t.Errorf("pins still present after a clean stop: %v", err)
	}
	if got := attacker.burst(t, 200); got != 200 {
		t.Errorf("after detach: %d of 200 packets got through, want all", got)
	}
}

// drain counts datagrams with prefix waiting on c, reading until it has been
// quiet for 300ms.
func drain(t *testing.T, c *net.UDPConn, prefix string) int {
	t.Helper()
	buf := make([]byte, 2048)
	got := 0
	for {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := c.Read(buf)
		if err != nil {
			c.SetReadDeadline(time.Time{})
			return got
		}
		if strings.HasPrefix(string(buf[:n]), prefix) {
			got++
		}
	}
}

func waitGeneration(t *testing.T, h *daemonHarness, gen uint64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if st := h.status(); st.Generation >= gen {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("policy generation %d not reached within 15s\n%s", gen, h.Logs())
}

func waitReloadFailure(t *testing.T, h *daemonHarness) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if st := h.status(); !st.LastReload.OK {
			if !strings.Contains(st.LastReload.Error, "edgeguard.yaml:") {
				t.Errorf("reload error does not point into the file: %s", st.LastReload.Error)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("broken policy was not rejected within 15s\n%s", h.Logs())
}

func checkMetricPositive(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) {
	t.Helper()
	sum, ok := metricSum(fams, name, labels)
	if !ok {
		t.Errorf("metric %s missing from /metrics", name)
		return
	}
	if sum <= 0 {
		t.Errorf("metric %s%v = %v, want > 0", name, labels, sum)
	}
}

// metricSum sums a family's counters and gauges whose labels include
// labels; ok is false when the family is missing.
func metricSum(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (sum float64, ok bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		for k, v := range labels {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		}
	}
	return sum, true
}
