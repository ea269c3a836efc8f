package netns_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/internal/trafficgen"
)

// BGP speaker scenarios (issue #27, docs/bgp.md) against a real BIRD 2
// (Debian's bird2) in a namespace of its own, peered with the edge over a
// veth of its own (no XDP on it). The daemon opens the session (GoBGP
// listens on no port); BIRD is passive. What BIRD received is read with
// its own CLI (birdc show route ... all).
const (
	bgpEdgeAddr = "198.18.250.1"
	bgpPeerAddr = "198.18.250.2"
	// bgpPassword is the session's TCP MD5 key (RFC 2385), in BIRD's
	// configuration and the daemon's password_file.
	bgpPassword = "edgeguard-lab-key"
)

// birdPeer is a running BIRD in the scenario's "rtr" namespace.
type birdPeer struct {
	t    *testing.T
	sock string
	logs bytes.Buffer
}

func startBird(t *testing.T, s *scenario) *birdPeer {
	t.Helper()
	bird, err := exec.LookPath("bird")
	if err != nil {
		t.Fatalf("bird (BIRD 2) is not installed: run scripts/install-deps.sh (Debian package bird2): %v", err)
	}
	ns, err := s.lab.TB.Namespace("rtr")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.lab.TB.Connect(s.lab.Star.Edge, ns, testbed.VethSpec{NameA: "eg-rtr", NameB: "eg-bgp",
		AddrsA: []netip.Prefix{netip.MustParsePrefix(bgpEdgeAddr + "/30")},
		AddrsB: []netip.Prefix{netip.MustParsePrefix(bgpPeerAddr + "/30")}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "bird.conf")
	// Passive: BIRD waits for the daemon's session. No kernel protocol:
	// nothing it learns leaves its tables.
	if err := os.WriteFile(conf, []byte(`log stderr all;
router id `+bgpPeerAddr+`;
protocol device {}
# Routes BIRD offers the speaker, which must keep none of them.
protocol static offered { ipv4; route 198.18.99.0/24 unreachable; route 198.18.98.0/24 unreachable; }
flow4 table flowtab4;
flow6 table flowtab6;
protocol bgp edge {
  local `+bgpPeerAddr+` as 64513;
  neighbor `+bgpEdgeAddr+` as 64512;
  passive on;
  hold time 9;
  password "`+bgpPassword+`";
  ipv4 { import all; export where proto = "offered"; };
  ipv6 { import all; export none; };
  flow4 { table flowtab4; import all; export none; };
  flow6 { table flowtab6; import all; export none; };
}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(s.lab.PolicyPath()), "bgp.pass"), []byte(bgpPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := &birdPeer{t: t, sock: filepath.Join(dir, "bird.ctl")}
	cmd := exec.Command("nsenter", "--net="+ns.Path(), bird, "-f", "-c", conf, "-s", b.sock, "-P", filepath.Join(dir, "bird.pid"))
	cmd.Stdout, cmd.Stderr = &b.logs, &b.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	// Before the lab's cleanup (registered earlier, runs later): the
	// namespace goes after its BIRD.
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("bird log:\n%s", b.logs.String())
		}
	})
	testenv.WaitFor(t, "birdc answers", func() bool { _, err := b.ctl("show", "status"); return err == nil })
	return b
}

func (b *birdPeer) ctl(args ...string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", b.sock}, args...)...).CombinedOutput()
	return string(out), err
}

// routes is `birdc show route table TABLE protocol edge all`: one
// string per route the speaker sent (its line and its attribute lines).
func (b *birdPeer) routes(table string) []string {
	b.t.Helper()
	out, err := b.ctl("show", "route", "table", table, "protocol", "edge", "all")
	if err != nil {
		b.t.Fatalf("birdc show route table %s: %v\n%s", table, err, out)
	}
	var routes []string
	for _, line := range strings.Split(out, "\n") {
		switch {
		case line == "" || strings.HasPrefix(line, "BIRD ") || strings.HasPrefix(line, "Table "):
		case strings.HasPrefix(line, "\t") || strings.HasPrefix(line, " "):
			if len(routes) > 0 {
				routes[len(routes)-1] += "\n" + line
			}
		default:
			routes = append(routes, line)
		}
	}
	return routes
}

// route is the route of table whose text contains every part.
func (b *birdPeer) route(table string, parts ...string) (string, bool) {
	for _, r := range b.routes(table) {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(r, p)
		}
		if ok {
			return r, true
		}
	}
	return "", false
}

func (s *scenario) bgpList() control.BGPReport {
	s.t.Helper()
	out, err := s.lab.Daemon.Ctl(s.ctx, "bgp", "list", "-o", "json")
	if err != nil {
		s.t.Fatalf("bgp list: %v: %s", err, out)
	}
	var r control.BGPReport
	if err := json.Unmarshal(out, &r); err != nil {
		s.t.Fatalf("bgp list -o json: %v: %s", err, out)
	}
	return r
}

func (s *scenario) waitEstablished() {
	s.t.Helper()
	testenv.WaitFor(s.t, "bgp session established", func() bool {
		r := s.bgpList()
		return len(r.Peers) == 1 && r.Peers[0].State == "established"
	})
}

// bgpSection is the policy's bgp: section for the lab: the edge's first
// addresses as destinations.
func bgpSection(dryRun bool, extra string) string {
	return fmt.Sprintf(`bgp:
  local_as: 64512
  router_id: %s
  dry_run: %t
  destinations: [198.18.0.1/32, "fd00::1/128"]
  neighbors: [{address: %s, as: 64513, password_file: bgp.pass, families: [ipv4-unicast, ipv4-flowspec, ipv6-flowspec]}]
%s`, bgpEdgeAddr, dryRun, bgpPeerAddr, extra)
}

// TestBGPBlackhole: in dry run the session comes up and an operator's
// blackhole is listed but not announced; leaving dry run (a live policy
// change) announces it: BIRD has 198.18.0.1/32 with 65535:666; a guard
// refuses an allow-listed prefix (BIRD never sees it); across a daemon
// restart the session closes (BIRD drops the route) and the restarted
// daemon announces it again from its state directory; edgectl show lists
// both announcements and show remove bgp ID withdraws the blackhole alone
// (BIRD drops it, keeps the FlowSpec rule); withdraw --all takes the rest.
func TestBGPBlackhole(t *testing.T) {
	s := newScenario(t, 1)
	b := startBird(t, s)
	lists := "lists: {allow: [198.18.77.0/24]}\n"
	start := time.Now()
	// A wrong TCP MD5 key first: BIRD's kernel drops the daemon's
	// segments and the session stays down; the right key, written to the
	// same password_file, is picked up live.
	passFile := filepath.Join(filepath.Dir(s.lab.PolicyPath()), "bgp.pass")
	if err := os.WriteFile(passFile, []byte("not-the-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.start(lists + bgpSection(true, ""))
	time.Sleep(5 * time.Second)
	if p := s.bgpList().Peers; len(p) != 1 || p[0].State == "established" {
		t.Fatalf("with a wrong MD5 key: peers %+v, want one not established", p)
	}
	if err := os.WriteFile(passFile, []byte(bgpPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.waitEstablished()
	testenv.WaitFor(t, "the speaker counts BIRD's 2 routes", func() bool { return s.bgpList().Peers[0].Received == 2 })
	if p := s.bgpList().Peers[0]; p.Accepted != 0 {
		t.Errorf("the speaker kept %d of the routes BIRD sent: want none", p.Accepted)
	}
	if out, err := s.lab.Daemon.Ctl(s.ctx, "bgp", "blackhole", "198.18.0.1", "--ttl", "5m", "--reason", "test"); err != nil {
		t.Fatalf("bgp blackhole in dry run: %v: %s", err, out)
	}
	r := s.bgpList()
	if len(r.Announcements) != 1 || r.Announcements[0].State != "dry-run" || r.Announcements[0].Route != "198.18.0.1/32" {
		t.Fatalf("dry run: announcements %+v: want one dry-run 198.18.0.1/32", r.Announcements)
	}
	// The session is up and the speaker holds the route: had it sent it,
	// BIRD would have it within this round trip (a keepalive-free
	// UPDATE on an established session).
	time.Sleep(2 * time.Second)
	if rs := b.routes("master4"); len(rs) != 0 {
		t.Fatalf("dry run: BIRD received %q", rs)
	}

	s.policy(lists + bgpSection(false, ""))
	var route string
	testenv.WaitFor(t, "BIRD has the blackhole after leaving dry run", func() bool {
		var ok bool
		route, ok = b.route("master4", "198.18.0.1/32")
		return ok
	})
	if !strings.Contains(route, "(65535,666)") || !strings.Contains(route, "BGP.community") {
		t.Errorf("blackhole route without the BLACKHOLE community:\n%s", route)
	}

	// Withdrawn at its TTL, by the speaker itself.
	if out, err := s.lab.Daemon.Ctl(s.ctx, "bgp", "blackhole", "198.18.0.2", "--ttl", "3s"); err != nil {
		t.Fatalf("bgp blackhole --ttl 3s: %v: %s", err, out)
	}
	announced := time.Now()
	testenv.WaitFor(t, "BIRD has the 3s blackhole", func() bool { _, ok := b.route("master4", "198.18.0.2/32"); return ok })
	testenv.WaitFor(t, "BIRD drops the 3s blackhole at its TTL", func() bool { _, ok := b.route("master4", "198.18.0.2/32"); return !ok })
	if d := time.Since(announced); d < 3*time.Second || d > 6*time.Second {
		t.Errorf("the 3s blackhole was withdrawn %v after its announcement: want 3s to 6s (the speaker looks once a second)", d)
	}
	ttlGone := time.Since(announced)

	out, err := s.lab.Daemon.Ctl(s.ctx, "bgp", "blackhole", "198.18.77.5")
	if err == nil || !strings.Contains(string(out), "lists.allow") {
		t.Errorf("blackhole of an allow-listed address: err %v, output %s: want a refusal naming lists.allow", err, out)
	}
	if out, err := s.lab.Daemon.Ctl(s.ctx, "bgp", "blackhole", "198.18.0.0/24"); err == nil || !strings.Contains(string(out), "bgp.widths") {
		t.Errorf("blackhole of a /24: err %v, output %s: want a refusal naming bgp.widths", err, out)
	}

	// An operator's FlowSpec rule with every component and a rate.
	if out, err := s.lab.Daemon.Ctl(s.ctx, "bgp", "flowspec", "--dst", "198.18.0.1", "--src", "198.18.100.0/24", "--proto", "tcp",
		"--dport", "443", "--sport", "1024", "--length", "60", "--tcp-flags", "0x02", "--fragment", "not-a-fragment",
		"--rate", "1Mbit/s", "--ttl", "1m"); err != nil {
		t.Fatalf("bgp flowspec: %v: %s", err, out)
	}
	var fs string
	testenv.WaitFor(t, "BIRD has the operator's FlowSpec rule", func() bool {
		var ok bool
		fs, ok = b.route("flowtab4", "dport 443")
		return ok
	})
	// Exactly SYN: SYN set and every other flag clear. 125000 B/s as an
	// IEEE float: 0x47f42400 (RFC 8955 7.3).
	for _, want := range []string{"dst 198.18.0.1/32", "src 198.18.100.0/24", "proto 6", "sport 1024", "length 60",
		"tcp flags 0x2/0x2 && 0x0/0xfd", "fragment !is_fragment", "(generic, 0x80060000, 0x47f42400)"} {
		if !strings.Contains(fs, want) {
			t.Errorf("operator's FlowSpec rule has no %q:\n%s", want, fs)
		}
	}
	if out, err := s.lab.Daemon.Ctl(s.ctx, "bgp", "flowspec", "--dst", "198.18.0.1", "--src", "198.18.77.0/25", "--proto", "udp"); err == nil ||
		!strings.Contains(string(out), "lists.allow") {
		t.Errorf("FlowSpec rule matching an allow-listed source: err %v, output %s: want a refusal naming lists.allow", err, out)
	}

	if err := s.lab.Daemon.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "BIRD drops the route when the daemon stops", func() bool {
		_, ok := b.route("master4", "198.18.0.1/32")
		return !ok
	})
	if err := s.lab.Daemon.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "BIRD has the blackhole again after the restart", func() bool {
		_, ok := b.route("master4", "198.18.0.1/32")
		return ok
	})
	if rs := b.routes("master4"); len(rs) != 1 {
		t.Errorf("after the restart BIRD has %d routes, want 1 (the guard's refusals stay refused): %q", len(rs), rs)
	}
	if _, ok := b.route("flowtab4", "dport 443"); !ok {
		t.Errorf("after the restart BIRD has no FlowSpec rule: %q", b.routes("flowtab4"))
	}
	// edgectl show lists the announcements (what is at the routers) and
	// show remove bgp ID withdraws one: BIRD drops that route alone.
	var bh *control.InventoryBGP
	inv := s.inventory()
	for i, a := range inv.BGP {
		if a.Kind == "blackhole" && a.Route == "198.18.0.1/32" {
			bh = &inv.BGP[i]
		}
	}
	if bh == nil || bh.State != "announced" || bh.Origin != "cli" || bh.Expires.IsZero() || len(inv.BGP) != 2 {
		t.Fatalf("edgectl show's bgp rows after the restart: %+v, want the blackhole announced and the FlowSpec rule", inv.BGP)
	}
	if out, err := s.lab.Daemon.Ctl(s.ctx, "show", "remove", "bgp", strconv.FormatUint(bh.ID, 10)); err != nil ||
		!strings.Contains(string(out), "198.18.0.1/32") {
		t.Fatalf("show remove bgp %d: %v: %s", bh.ID, err, out)
	}
	testenv.WaitFor(t, "BIRD drops the blackhole removed with show remove bgp", func() bool {
		_, ok := b.route("master4", "198.18.0.1/32")
		return !ok
	})
	if _, ok := b.route("flowtab4", "dport 443"); !ok {
		t.Errorf("show remove bgp of the blackhole took the FlowSpec rule too: %q", b.routes("flowtab4"))
	}
	if inv := s.inventory(); len(inv.BGP) != 1 || inv.BGP[0].Kind != "flowspec" {
		t.Errorf("edgectl show after the removal: %+v", inv.BGP)
	}
	if out, err := s.lab.Daemon.Ctl(s.ctx, "bgp", "withdraw", "--all"); err != nil {
		t.Fatalf("bgp withdraw --all: %v: %s", err, out)
	}
	testenv.WaitFor(t, "BIRD drops the withdrawn routes", func() bool { return len(b.routes("master4"))+len(b.routes("flowtab4")) == 0 })
	// A policy without a bgp: section closes the session.
	if out, err := b.ctl("show", "protocols", "edge"); !strings.Contains(out, "Established") {
		t.Fatalf("BIRD's session before the section goes: %v\n%s", err, out)
	}
	s.policy(lists)
	testenv.WaitFor(t, "BIRD's session closes when the policy loses its bgp: section", func() bool {
		out, _ := b.ctl("show", "protocols", "edge")
		return !strings.Contains(out, "Established")
	})
	if r := s.bgpList(); r.Enabled || len(r.Peers) != 0 {
		t.Errorf("bgp list without a bgp: section: %+v", r)
	}
	audit, _ := os.ReadFile(filepath.Join(filepath.Dir(s.lab.Daemon.Socket), "state", "bgp-audit.jsonl"))
	for _, op := range []string{`"op":"announce"`, `"op":"refuse"`, `"op":"withdraw"`} {
		if !bytes.Contains(audit, []byte(op)) {
			t.Errorf("audit file has no %s record:\n%s", op, audit)
		}
	}
	report(t, "dry run, announce, ttl (3s blackhole withdrawn after %v), guard, restart, show remove bgp, withdraw in %v",
		ttlGone.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// TestBGPFlowSpecFromShield: the shield finds a UDP flood's fingerprint
// (a port drawn per run) and BIRD receives it as FlowSpec rules for the
// destinations (IPv4 and IPv6) with the fingerprint's components and the
// discard action (traffic-rate 0); after the flood the rules are
// withdrawn with the shield's action (at the latest its TTL).
func TestBGPFlowSpecFromShield(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	port := uint16(2000 + rand.New(rand.NewPCG(seed, 27)).IntN(28000))
	t.Logf("seed %d: flood to udp/%d", seed, port)
	s := newScenario(t, 2, kgBotNets()...)
	// The bots' /24s are an ASN of their own that sent nothing before.
	asnData := strings.Replace(shASNData, "198.18.100.0\t198.18.199.255\t64501", "198.18.100.0\t198.18.199.255\t64503", 1)
	if err := os.WriteFile(filepath.Join(filepath.Dir(s.lab.PolicyPath()), "ip2asn.tsv"), []byte(asnData), 0o644); err != nil {
		t.Fatal(err)
	}
	b := startBird(t, s)
	const ttl = 8 * time.Second
	p := shPolicy(s, "enforce")
	p = strings.Replace(p, fmt.Sprintf("learn_for: %v", shLearnFor), "learn_for: 3s", 1)
	p = strings.Replace(p, fmt.Sprintf("ttl: %v", shTTL), fmt.Sprintf("ttl: %v", ttl), 1)
	// The flood's 3000/s of 142-byte frames is 3.4 Mbit/s: above half
	// of a 2 Mbit/s uplink, the automatic blackhole is announced too.
	if err := s.lab.WritePolicy(p + "sampling: {one_in: 16}\n" + bgpSection(false, "  uplink: {rate: 2Mbit/s, fraction: 50%}\n  blackhole: {ttl: 10s}\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.lab.Daemon.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	s.waitEstablished()
	conns := s.userConns(s.lab.Legit[:2])
	users(s, conns, 6*time.Second, 10)
	const rate, floodLen = 3000, 8 * time.Second
	spec := trafficgen.Flood{Sources: kgBotNets(), Proto: trafficgen.UDP, DstPort: port, Payload: 100,
		Rate: rate, Count: rate * int(floodLen.Seconds()), Duration: floodLen, Seed: seed}
	var wg sync.WaitGroup
	var fe error
	wg.Go(func() { _, fe = s.lab.Flood(s.ctx, s.lab.Attackers[0], spec) })
	start := time.Now()
	var r4 string
	testenv.WaitFor(t, "BIRD has a FlowSpec rule for the flood", func() bool {
		var ok bool
		r4, ok = b.route("flowtab4", fmt.Sprintf("dport %d", port))
		return ok
	})
	got := time.Since(start)
	r6, ok6 := b.route("flowtab6", fmt.Sprintf("dport %d", port))
	testenv.WaitFor(t, "BIRD has the uplink blackhole", func() bool {
		_, ok := b.route("master4", "198.18.0.1/32", "(65535,666)")
		return ok
	})
	var up control.BGPAnnouncement
	for _, a := range s.bgpList().Announcements {
		if a.Kind == "blackhole" {
			up = a
		}
	}
	if up.Origin != "uplink" || !strings.Contains(up.Reason, "offered") {
		t.Errorf("blackhole announcement %+v: want origin uplink with the offered rate as its reason", up)
	}
	wg.Wait()
	if fe != nil {
		t.Fatal(fe)
	}
	// 100-byte payloads: IPv4 total length 128; IPv6 (RFC 8956) the
	// length after the 40-byte header, 88.
	for _, want := range []string{"dst 198.18.0.1/32", "proto 17", fmt.Sprintf("dport %d", port), "length 128;", "(generic, 0x80060000, 0x0)"} {
		if !strings.Contains(r4, want) {
			t.Errorf("IPv4 FlowSpec rule has no %q:\n%s", want, r4)
		}
	}
	if !ok6 {
		t.Errorf("no IPv6 FlowSpec rule for the flood:\n%q", b.routes("flowtab6"))
	}
	for _, want := range []string{"dst fd00::1/128", "next header 17", fmt.Sprintf("dport %d", port), "length 88;", "(generic, 0x80060000, 0x0)"} {
		if ok6 && !strings.Contains(r6, want) {
			t.Errorf("IPv6 FlowSpec rule has no %q:\n%s", want, r6)
		}
	}
	ended := time.Now()
	deadline := ttl + 10*time.Second // the surge's end (cooldown 3 s) or the TTL, plus a shield interval and a BGP round trip
	for {
		_, in4 := b.route("flowtab4", fmt.Sprintf("dport %d", port))
		_, in6 := b.route("flowtab6", fmt.Sprintf("dport %d", port))
		if !in4 && !in6 {
			break
		}
		if time.Since(ended) > deadline {
			t.Fatalf("FlowSpec rules still announced %v after the flood:\n%+v", deadline, s.bgpList().Announcements)
		}
		time.Sleep(200 * time.Millisecond)
	}
	report(t, "flowspec for udp/%d at BIRD %v into the flood; withdrawn %v after it (action ttl %v)\n%s\n%s\nuplink blackhole: %s",
		port, got.Round(time.Millisecond), time.Since(ended).Round(time.Millisecond), ttl, r4, r6, up.Reason)
}
