package netns_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/internal/trafficgen"
	"github.com/edgeguard/edgeguard/test/netns"
)

// Fleet mode (docs/fleet.md) with the real daemon on three edge hosts:
// each is a lab of its own (edge namespace, one legitimate client, one
// attacker), and a real redis-server runs in a fourth namespace that every
// edge reaches over a veth of its own (198.18.250.4i+1 on the edge,
// 198.18.250.4i+2 on the Redis side). The XDP program is attached to the
// client-facing interfaces only.

var fleetSeq atomic.Uint64

type fleetHost struct {
	name string
	lab  *testbed.Lab
	ctl  *control.Client
	// redisAddr is where this host reaches Redis.
	redisAddr string
}

type fleetLab struct {
	t       *testing.T
	ctx     context.Context
	hosts   []*fleetHost
	redisNS *netns.Namespace
	dir     string

	mu    sync.Mutex
	redis *exec.Cmd
}

func newFleetLab(t *testing.T) *fleetLab {
	t.Helper()
	netns.RequireRoot(t)
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not on PATH: apt-get install -y redis-server (scripts/install-deps.sh)")
	}
	bin, err := edgectl()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	fl := &fleetLab{t: t, ctx: ctx, dir: t.TempDir()}
	seq := fleetSeq.Add(1)
	for i, name := range []string{"a", "b", "c"} {
		dir := filepath.Join(fl.dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "ip2asn.tsv"), []byte(testbed.LabASNData), 0o644); err != nil {
			t.Fatal(err)
		}
		lab, err := testbed.NewLab(testbed.LabConfig{
			Prefix: fmt.Sprintf("eg-test-%d-f%d%s", os.Getpid(), seq, name), Legit: 1, Attackers: 1,
			Spoofed: []netip.Prefix{attackerNet}, Bin: bin, Dir: dir,
			PinDir: fmt.Sprintf("/sys/fs/bpf/eg-test-%d-fleet%d-%s", os.Getpid(), seq, name),
		})
		if err != nil {
			t.Fatal(err)
		}
		h := &fleetHost{name: name, lab: lab, ctl: control.NewClient(lab.Daemon.Socket)}
		t.Cleanup(func() {
			if t.Failed() && lab.Daemon.Running() {
				t.Logf("host %s daemon log:\n%s", name, lab.Daemon.Logs())
			}
			if err := lab.Close(); err != nil {
				t.Errorf("tear down host %s: %v", name, err)
			}
		})
		if i == 0 {
			if fl.redisNS, err = lab.TB.Namespace("redis"); err != nil {
				t.Fatal(err)
			}
		}
		edge := netip.AddrFrom4([4]byte{198, 18, 250, byte(4*i + 1)})
		peer := netip.AddrFrom4([4]byte{198, 18, 250, byte(4*i + 2)})
		if _, err := lab.TB.Connect(lab.Star.Edge, fl.redisNS, testbed.VethSpec{
			NameA: "eg-redis", NameB: "eg-h" + name,
			AddrsA: []netip.Prefix{netip.PrefixFrom(edge, 30)}, AddrsB: []netip.Prefix{netip.PrefixFrom(peer, 30)},
		}); err != nil {
			t.Fatal(err)
		}
		h.redisAddr = netip.AddrPortFrom(peer, 6379).String()
		fl.hosts = append(fl.hosts, h)
	}
	fl.startRedis()
	t.Cleanup(fl.killRedis)
	return fl
}

// startRedis runs redis-server in the Redis namespace on every address
// (no persistence: a restart comes back empty, the hard case).
func (fl *fleetLab) startRedis() {
	fl.t.Helper()
	fl.mu.Lock()
	defer fl.mu.Unlock()
	cmd := exec.Command("nsenter", "--net="+fl.redisNS.Path(), "redis-server", "--port", "6379", "--bind", "0.0.0.0",
		"--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", fl.dir,
		"--logfile", filepath.Join(fl.dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		fl.t.Fatalf("start redis-server: %v", err)
	}
	fl.redis = cmd
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := fl.redisCLI("PING")
		if err == nil && strings.TrimSpace(out) == "PONG" {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(fl.dir, "redis.log"))
			fl.t.Fatalf("redis-server did not answer PING within 10s: %v %s\n%s", err, out, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killRedis is kill -9 redis-server.
func (fl *fleetLab) killRedis() {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.redis == nil {
		return
	}
	fl.redis.Process.Kill()
	fl.redis.Wait()
	fl.redis = nil
}

// redisCLI runs redis-cli against the fleet's Redis from inside its
// namespace.
func (fl *fleetLab) redisCLI(args ...string) (string, error) {
	a := append([]string{"--net=" + fl.redisNS.Path(), "redis-cli", "-h", "127.0.0.1", "-p", "6379"}, args...)
	out, err := exec.Command("nsenter", a...).CombinedOutput()
	return string(out), err
}

// start writes each host's policy (body with the fleet: section for it)
// and starts the daemons, then waits until all three see each other.
func (fl *fleetLab) start(interval time.Duration, body string, extra ...string) {
	fl.t.Helper()
	for i, h := range fl.hosts {
		p := "apiVersion: edgeguard/v1\n" + h.lab.InterfacesYAML("native") + "metrics: {listen: \"\"}\n" +
			"asn_data: {path: " + filepath.Join(h.lab.Config.Dir, "ip2asn.tsv") + "}\n" +
			fmt.Sprintf("fleet: {name: egfl, host_id: %s, interval: %v, redis: {addrs: [%q], timeout: 300ms}}\n", h.name, interval, h.redisAddr) +
			body
		if i < len(extra) {
			p += extra[i]
		}
		if err := h.lab.WritePolicy(p); err != nil {
			fl.t.Fatal(err)
		}
	}
	// One after the other: loading the program is CPU-bound (the
	// verifier), and three at once on a loaded 2-core machine can miss
	// the testbed's start deadline; one retry for the same reason.
	for _, h := range fl.hosts {
		err := h.lab.Daemon.Start(fl.ctx)
		if err != nil && strings.Contains(err.Error(), "did not come up") {
			fl.t.Logf("host %s: %v; retrying once", h.name, firstLine(err.Error()))
			err = h.lab.Daemon.Start(fl.ctx)
		}
		if err != nil {
			fl.t.Fatalf("host %s: %v", h.name, err)
		}
	}
	fl.waitFor(20*time.Second, "all three hosts see three members with synced lists", func() bool {
		for _, h := range fl.hosts {
			st, err := h.ctl.FleetStatus(fl.ctx)
			if err != nil || len(st.Members) != 3 || !st.RedisUp || !st.Lists.Synced {
				return false
			}
		}
		return true
	})
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func (fl *fleetLab) waitFor(d time.Duration, what string, cond func() bool) time.Duration {
	fl.t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			fl.t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func (h *fleetHost) listed(ctx context.Context, kind control.ListKind, p netip.Prefix) (control.ListEntry, bool) {
	es, err := h.ctl.List(ctx, kind)
	if err != nil {
		return control.ListEntry{}, false
	}
	for _, e := range es {
		if e.Prefix == p {
			return e, true
		}
	}
	return control.ListEntry{}, false
}

const fleetListsPolicy = `lists:
  protected: [198.18.100.0/24]
`

// TestFleetSharedLists: a deny added on host A (by the CLI, and by the
// L7 stage's escalation origin) is in B's and C's data plane within 1 s,
// with its expiry and origin host, and B's and C's users are denied;
// entries written to Redis by anyone else pass B's and C's checks first
// (0.0.0.0/0, too wide, protected: refused), a host that starts later gets
// the current set, and a removal on any host removes it everywhere.
func TestFleetSharedLists(t *testing.T) {
	fl := newFleetLab(t)
	// Host a runs an L7 stage in front of an upstream in its edge
	// namespace; its escalations must reach b and c like any deny.
	a0 := fl.hosts[0].lab.Legit[0]
	var upLn net.Listener
	if err := fl.hosts[0].lab.Star.Edge.Do(func() (err error) {
		upLn, err = net.Listen("tcp", netip.AddrPortFrom(a0.EdgeAddr4, 9200).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	go up.Serve(upLn)
	t.Cleanup(func() { up.Close() })
	proxyAddr := netip.AddrPortFrom(a0.EdgeAddr4, 8080)
	fl.start(time.Second, fleetListsPolicy, fmt.Sprintf(fleetL7Section, proxyAddr, upLn.Addr()))
	a, b, c := fl.hosts[0], fl.hosts[1], fl.hosts[2]
	user := netip.PrefixFrom(b.lab.Legit[0].Src4, 29).Masked() // the same /29 in every lab
	if lr, err := b.lab.LegitUDP(fl.ctx, 20, time.Second, false); err != nil || lr.Success() < 0.99 {
		t.Fatalf("before the deny, b's users get %v (%v)", lr, err)
	}
	start := time.Now()
	if _, err := a.lab.Daemon.Ctl(fl.ctx, "deny", "add", user.String(), "--ttl", "10m", "--reason", "fleet test"); err != nil {
		t.Fatal(err)
	}
	added := time.Since(start)
	for _, h := range []*fleetHost{b, c} {
		took := fl.waitFor(5*time.Second, "deny on "+h.name, func() bool { _, ok := h.listed(fl.ctx, control.Deny, user); return ok })
		e, _ := h.listed(fl.ctx, control.Deny, user)
		t.Logf("deny from a on %s after %v (the CLI call took %v): %+v", h.name, took, added, e)
		if took > time.Second {
			t.Errorf("a's deny reached %s after %v, want within 1s", h.name, took)
		}
		if e.Origin != "fleet" || e.Host != "a" || e.Expires == nil || time.Until(*e.Expires) < 9*time.Minute {
			t.Errorf("%s holds %+v, want origin fleet, host a, expiry in ~10m", h.name, e)
		}
	}
	if lr, err := b.lab.LegitUDP(fl.ctx, 20, time.Second, false); err != nil || lr.Success() > 0.01 {
		t.Errorf("after a's deny, b's users still get %v (%v): not enforced", lr, err)
	}
	// The L7 stage's escalations enter the list with origin l7.
	esc := netip.MustParsePrefix("198.18.77.0/24")
	if _, err := a.ctl.AddToList(fl.ctx, control.Deny, control.ListChange{Prefix: esc, TTL: control.Duration(time.Minute), Origin: "l7", Reason: "escalated"}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*fleetHost{b, c} {
		if took := fl.waitFor(5*time.Second, "escalation on "+h.name, func() bool { _, ok := h.listed(fl.ctx, control.Deny, esc); return ok }); took > time.Second {
			t.Errorf("a's escalation reached %s after %v, want within 1s", h.name, took)
		}
		if e, _ := h.listed(fl.ctx, control.Deny, esc); !strings.HasPrefix(e.Reason, "l7: ") {
			t.Errorf("%s: escalation %+v does not say it came from l7", h.name, e)
		}
	}
	// Hostile entries, straight into the stream, from a host that is not
	// in the fleet; then one good entry: it arrives, the others do not.
	at := strconv.FormatInt(time.Now().UnixMilli(), 10)
	for _, p := range []string{"0.0.0.0/0", "198.0.0.0/8", "198.18.100.0/24", "198.18.100.7/32"} {
		entry := fmt.Sprintf(`{"v":1,"op":"add","list":"deny","prefix":%q,"origin":"cli","host":"mallory","at_ms":%s}`, p, at)
		if out, err := fl.redisCLI("XADD", "eg:fleet:{egfl}:lists", "*", "e", entry); err != nil {
			t.Fatalf("xadd: %v %s", err, out)
		}
	}
	good := netip.MustParsePrefix("198.18.88.0/24")
	goodEntry := fmt.Sprintf(`{"v":1,"op":"add","list":"deny","prefix":%q,"origin":"cli","host":"mallory","at_ms":%s}`, good.String(), at)
	if out, err := fl.redisCLI("XADD", "eg:fleet:{egfl}:lists", "*", "e", goodEntry); err != nil {
		t.Fatalf("xadd: %v %s", err, out)
	}
	fl.waitFor(5*time.Second, "the good entry on b", func() bool { _, ok := b.listed(fl.ctx, control.Deny, good); return ok })
	for _, h := range []*fleetHost{b, c} {
		es, _ := h.ctl.List(fl.ctx, control.Deny)
		for _, e := range es {
			if e.Host == "mallory" && e.Prefix != good {
				t.Errorf("%s applied a hostile entry: %+v", h.name, e)
			}
		}
	}
	if st, _ := b.ctl.FleetStatus(fl.ctx); st.Lists.Refused < 3 || st.Lists.Malformed < 1 {
		t.Errorf("b's list status %+v: want 3 refused (too wide, protected twice) and 1 malformed (0.0.0.0/0)", st.Lists)
	}
	if lr, err := c.lab.LegitUDP(fl.ctx, 20, time.Second, false); err != nil || lr.Success() > 0.01 {
		t.Errorf("c's users get %v (%v) while a's deny is in force", lr, err)
	}
	// A restarted host gets the current set from the snapshot first.
	if err := c.lab.Daemon.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if out, err := fl.redisCLI("HDEL", "eg:fleet:{egfl}:lists:snap", "deny|"+good.String()); err != nil {
		t.Fatalf("hdel: %v %s", err, out)
	}
	// Keep no state: the snapshot is what c must load.
	os.RemoveAll(filepath.Join(filepath.Dir(c.lab.Daemon.Socket), "state"))
	if err := c.lab.Daemon.Start(fl.ctx); err != nil {
		t.Fatal(err)
	}
	fl.waitFor(10*time.Second, "c reloads a's deny from the snapshot", func() bool { _, ok := c.listed(fl.ctx, control.Deny, user); return ok })
	if _, ok := c.listed(fl.ctx, control.Deny, good); ok {
		t.Error("c kept an entry the snapshot no longer has")
	}
	// A removal on b removes it everywhere, a's own entry included.
	if _, err := b.lab.Daemon.Ctl(fl.ctx, "deny", "remove", user.String()); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*fleetHost{a, c} {
		fl.waitFor(5*time.Second, "removal on "+h.name, func() bool { _, ok := h.listed(fl.ctx, control.Deny, user); return !ok })
	}
	if lr, err := c.lab.LegitUDP(fl.ctx, 20, time.Second, false); err != nil || lr.Success() < 0.99 {
		t.Errorf("after the removal c's users get %v (%v)", lr, err)
	}
	if out, err := c.lab.Daemon.Ctl(fl.ctx, "fleet", "status"); err != nil || !strings.Contains(string(out), "c (this host)") || !strings.Contains(string(out), "synced") {
		t.Errorf("edgectl fleet status: %v\n%s", err, out)
	}

	// The real L7 stage on a: a client that keeps getting 429s is
	// escalated to a's deny list, and from there to b's and c's.
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := a0.NS.Do(func() (err error) {
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(a0.Src4, 0))}
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}}
	client := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	codes := map[int]int{}
	for range 6 {
		resp, err := client.Get("http://" + proxyAddr.String() + "/v1/thing")
		if err != nil {
			codes[-1]++ // escalated: the SYN is dropped at the NIC
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[200] != 2 || codes[429] < 3 {
		t.Fatalf("a's L7 stage answered %v; want 2×200 then 429s", codes)
	}
	escalated := netip.PrefixFrom(a0.Src4, 32)
	fl.waitFor(10*time.Second, "the escalation on a", func() bool { e, ok := a.listed(fl.ctx, control.Deny, escalated); return ok && e.Origin == "l7" })
	for _, h := range []*fleetHost{b, c} {
		took := fl.waitFor(5*time.Second, "a's L7 escalation on "+h.name, func() bool { _, ok := h.listed(fl.ctx, control.Deny, escalated); return ok })
		e, _ := h.listed(fl.ctx, control.Deny, escalated)
		t.Logf("a's L7 escalation on %s after %v: %+v", h.name, took, e)
		if took > time.Second {
			t.Errorf("a's L7 escalation reached %s after %v, want within 1s", h.name, took)
		}
		if e.Origin != "fleet" || e.Host != "a" || !strings.HasPrefix(e.Reason, "l7: ") {
			t.Errorf("%s holds %+v, want origin fleet from a with an l7 reason", h.name, e)
		}
	}
}

// fleetL7Section is host a's L7 stage: 2 requests a minute per client,
// escalation after 3 rejections.
const fleetL7Section = `l7:
  listen: %s
  upstream: http://%s
  escalation: {enabled: true, rejections: 3, window: 1m, ttl: 10m}
  routes:
    - name: api
      match: {path_prefix: /}
      limits:
        - {name: per-ip, key: ip, rate: 2/min, burst: 2}
`

// fleetASNRate is the scope: fleet per-ASN budget of the share tests.
const fleetASNRate = 1000

var fleetSharesPolicy = fmt.Sprintf(`rules:
  - name: bots
    match: {asns: [64500]}
    scope: fleet
    reserve: 0
    per_asn: {packets: {rate: %d/s, burst: %d}}
`, fleetASNRate, fleetASNRate/2)

// floodAll floods every host at its rate (packets/s) for d, from 200
// addresses of the attacker /16 each.
func (fl *fleetLab) floodAll(rates []int, d time.Duration, seed uint64) {
	fl.t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(fl.hosts))
	for i, h := range fl.hosts {
		wg.Go(func() {
			_, errs[i] = h.lab.Flood(fl.ctx, h.lab.Attackers[0], trafficgen.Flood{
				Sources: []netip.Prefix{attackerNet}, Distinct: 200, Proto: trafficgen.UDP, Payload: 16,
				Rate: rates[i], Count: rates[i]*int(d/time.Second) + rates[i], Duration: d, Seed: seed + uint64(i),
				Step: time.Millisecond,
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			fl.t.Fatalf("flood on %s: %v", fl.hosts[i].name, err)
		}
	}
}

// passedOver is what each host's sink received over window, and the
// rates (packets/s).
func (fl *fleetLab) passedOver(window time.Duration) ([]float64, float64) {
	before := make([]uint64, len(fl.hosts))
	for i, h := range fl.hosts {
		before[i] = h.lab.Sink.Other()
	}
	start := time.Now()
	time.Sleep(window)
	el := time.Since(start).Seconds()
	rates := make([]float64, len(fl.hosts))
	total := 0.0
	for i, h := range fl.hosts {
		rates[i] = float64(h.lab.Sink.Other()-before[i]) / el
		total += rates[i]
	}
	return rates, total
}

func (fl *fleetLab) share(h *fleetHost) control.FleetShare {
	st, err := h.ctl.FleetStatus(fl.ctx)
	if err != nil || len(st.Shares) == 0 {
		return control.FleetShare{}
	}
	return st.Shares[0]
}

// TestFleetShares: a per-ASN scope: fleet budget with the flood split
// 90/9/1 across the three hosts passes the budget ±10% in total (a static
// budget ÷ 3 would pass ~63%), each host's share tracks its demand; the
// split flips to 1/9/90 mid-flood and the shares follow within 3
// intervals; users (another ASN) are untouched.
func TestFleetShares(t *testing.T) {
	fl := newFleetLab(t)
	const interval = time.Second
	fl.start(interval, fleetSharesPolicy)
	a, c := fl.hosts[0], fl.hosts[2]
	split := []int{2700, 270, 30}
	var wg sync.WaitGroup
	var lr trafficgen.LegitResult
	var lerr error
	wg.Go(func() { lr, lerr = a.lab.LegitUDP(fl.ctx, 10, 18*time.Second, false) })
	flipped := make(chan time.Time, 1)
	wg.Go(func() {
		fl.floodAll(split, 9*time.Second, 1)
		flipped <- time.Now()
		fl.floodAll([]int{30, 270, 2700}, 9*time.Second, 11)
	})
	// Phase 1: after the first intervals, the total and the shares.
	time.Sleep(3 * interval)
	rates, total := fl.passedOver(4 * time.Second)
	sa, sc := fl.share(a), fl.share(c)
	t.Logf("90/9/1: passed %.0f/s in total (budget %d/s): %.0f %.0f %.0f; a's share %+v; c's share %+v", total, fleetASNRate,
		rates[0], rates[1], rates[2], sa, sc)
	within(t, "fleet total passed/s at 90/9/1", total, fleetASNRate, 0.10)
	if sa.Fraction < 0.7 || sc.Fraction > 0.15 || sa.Static || sa.Hosts != 3 {
		t.Errorf("shares do not track demand at 90/9/1: a %+v, c %+v", sa, sc)
	}
	// Phase 2: the flip, when phase 1's floods end and phase 2's start.
	// c's share must pass 70% within 3 intervals of it.
	var flip time.Time
	select {
	case flip = <-flipped:
	case <-time.After(20 * time.Second):
		t.Fatal("phase 1 floods did not end")
	}
	fl.waitFor(15*time.Second, "c's share follows", func() bool { return fl.share(c).Fraction > 0.7 })
	took := time.Since(flip)
	t.Logf("c's share passed 70%% %v after the flip", took)
	if took > 3*interval {
		t.Errorf("c's share followed its demand after %v, want within 3 intervals (%v)", took, 3*interval)
	}
	time.Sleep(interval)
	rates, total = fl.passedOver(3 * time.Second)
	t.Logf("1/9/90: passed %.0f/s in total: %.0f %.0f %.0f; a's share %+v; c's share %+v", total, rates[0], rates[1], rates[2],
		fl.share(a), fl.share(c))
	within(t, "fleet total passed/s at 1/9/90", total, fleetASNRate, 0.10)
	wg.Wait()
	if lerr != nil || lr.Success() < 0.99 {
		t.Errorf("users got %v (%v), want ≥ 99%%", lr, lerr)
	}
}

// TestFleetRedisKilled: kill -9 redis-server mid-flood. Every host keeps
// enforcing, on its static share (budget ÷ 3, documented), with no window
// without limits; when Redis returns (empty) the shares converge again
// within 3 intervals.
func TestFleetRedisKilled(t *testing.T) {
	fl := newFleetLab(t)
	const interval = time.Second
	fl.start(interval, fleetSharesPolicy)
	split := []int{2700, 270, 30}
	done := make(chan struct{})
	go func() { defer close(done); fl.floodAll(split, 20*time.Second, 21) }()
	time.Sleep(4 * interval)
	if _, total := fl.passedOver(2 * time.Second); total < 0.9*fleetASNRate || total > 1.1*fleetASNRate {
		t.Errorf("before the kill the fleet passes %.0f/s, want %d ±10%%", total, fleetASNRate)
	}
	fl.killRedis()
	killed := time.Now()
	// Every second of the outage is measured: the fleet never passes
	// more than its budget (the shares in force stay until the next sync
	// finds Redis gone, then the static shares take over: a at budget/3,
	// b and c their demand under it), never the whole per-host budget a
	// lapse would give each host.
	for i := range 5 {
		rates, total := fl.passedOver(time.Second)
		t.Logf("outage second %d: %.0f/s in total (%.0f %.0f %.0f)", i, total, rates[0], rates[1], rates[2])
		if total > 1.1*fleetASNRate || (i >= 2 && rates[0] > 1.15*fleetASNRate/3) {
			t.Errorf("outage second %d: the fleet passes %.0f/s (a %.0f/s): limits lapsed", i, total, rates[0])
		}
	}
	for _, h := range fl.hosts {
		st, err := h.ctl.FleetStatus(fl.ctx)
		if err != nil || st.RedisUp || !st.Fallback || len(st.Shares) == 0 || !st.Shares[0].Static {
			t.Errorf("host %s during the outage: %+v (%v), want redis down, static shares", h.name, st, err)
		}
	}
	if !strings.Contains(fl.hosts[0].lab.Daemon.Logs(), "redis unreachable") {
		t.Error("no log event says redis is unreachable")
	}
	fl.startRedis()
	back := time.Now()
	t.Logf("redis down for %v", back.Sub(killed).Round(time.Millisecond))
	took := fl.waitFor(20*time.Second, "shares converge after the restart", func() bool {
		s := fl.share(fl.hosts[0])
		return !s.Static && s.Fraction > 0.7 && s.Hosts == 3
	})
	t.Logf("shares converged %v after redis returned", took)
	if took > 3*interval+interval/2 {
		t.Errorf("shares converged %v after redis returned, want within 3 intervals", took)
	}
	time.Sleep(interval)
	if _, total := fl.passedOver(2 * time.Second); total < 0.9*fleetASNRate || total > 1.1*fleetASNRate {
		t.Errorf("after the restart the fleet passes %.0f/s, want %d ±10%%", total, fleetASNRate)
	}
	<-done
}
