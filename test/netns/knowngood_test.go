package netns_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/internal/trafficgen"
)

// Known-good-first scenarios (issue #11, docs/operations.md "Botnet inside
// the users' ASN"): a botnet whose every source sends at a normal rate,
// spread over many /24s of the users' own ASN, fills an aggregate (the
// ASN's bucket, or the host's global one), while users who were active
// before the attack keep making bursty requests. A request counts only if
// its reply comes within 1 s, and nothing is retried.
//
// The users' ASN (AS64501 in kgASNData) holds 198.18.0.0/16: the users'
// own /24s (198.18.0.0/24 to 198.18.7.0/24, one per client namespace, two
// users each) and the bots' 60 /24s, 198.18.100.0/24 to 198.18.159.0/24,
// which the edge routes back to the attacker's namespace.

// kgASNData is the scenarios' iptoasn TSV: the users' residential ISP is
// one ASN for all of 198.18.0.0/16, users and bots alike.
const kgASNData = "0.0.0.0\t198.17.255.255\t64510\tZZ\tINTERNET\n" +
	"198.18.0.0\t198.18.255.255\t64501\tZZ\tRESIDENTIAL-ISP\n" +
	"198.19.0.0\t255.255.255.255\t64510\tZZ\tINTERNET\n"

const (
	kgUsers = 8 // client namespaces, two users (addresses) each
	// Requests per second per user on average, in bursts of kgUserBurst
	// back to back at exponential gaps (mean 0.5 s). A gap longer than
	// established_after restarts a new source's clean history (it is gone
	// "longer than the whole wait"): with the scenarios' 4 s that happens
	// to one gap in e^8 ≈ 3,000.
	kgUserRate    = 6
	kgUserBurst   = 3
	kgBotPrefixes = 60 // /24s the bots spread over
	kgBots        = 1500
	kgBotRate     = 10 // packets per second per bot
)

// kgBotNets are the bots' /24s, all inside the users' ASN.
func kgBotNets() []netip.Prefix {
	var out []netip.Prefix
	for i := 0; i < kgBotPrefixes; i++ {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(100 + i), 0}), 24))
	}
	return out
}

// kgLimits are the per-source and per-/24 limits of every scenario: far
// above a bot's 10/s and a /24's 250/s, so only the aggregate can hold the
// botnet.
const kgLimits = `defaults:
  per_source:
    key: {ipv4: 32, ipv6: 64}
    packets: {rate: 50/s, burst: 100}
  per_prefix:
    group: {ipv4: 24, ipv6: 48}
    packets: {rate: 1000/s, burst: 1000}
`

// kgEstablishedAfter is the scenarios' standing.established_after: short,
// so the suite stays fast; every attack lasts at least 3× as long.
const kgEstablishedAfter = 4 * time.Second

// kgWarm is the users' time alone before an attack with standing: a
// bursty user's first request comes after a random gap (mean 1 s), and its
// standing is updated at most once per epoch (~1.07 s) on a packet, so
// established_after + 6 s leaves every user established.
const kgWarm = kgEstablishedAfter + 6*time.Second

// botnetCase is one scenario.
type botnetCase struct {
	// reserve, if set, is every aggregate's reserve: (defaults and
	// global); "" leaves the default (50%).
	reserve string
	// arrivals are extra client namespaces (after the kgUsers) whose
	// addresses start with the attack, two bursty streams each.
	arrivals int
	// prewarm: the bots send at prewarmRate each during the warm-up too
	// (a patient botnet earning its standing).
	prewarmRate float64
	// bots and botRate are the botnet's size and each bot's rate during
	// the attack (0: kgBots, kgBotRate).
	bots    int
	botRate float64
	// standing is added inside the policy's standing: mapping, e.g.
	// ", rate_history: 10s".
	standing string
	// asnBurst is the per-ASN burst in packets (0: asnRate, one second).
	asnBurst int
	// likeUsers: the bots' datagrams are the users' (same port, same
	// size, UDP from a random port): nothing but their timing tells them
	// apart. Their passes are then counted from the program's counters.
	likeUsers bool
	// during runs alongside the attack (a reload, a restart).
	during func(s *scenario)
	// asnRate > 0: ASN data loaded and a per-ASN budget of asnRate/s
	// (burst one second); 0: no ASN data, and a global budget of
	// globalRate/s (burst one second) is the aggregate that fills.
	asnRate, globalRate int
	// extra is appended to the policy.
	extra string
	// spoofed: the flood comes from a random address of the users' /16
	// per packet instead of from kgBots fixed bots.
	spoofed bool
	warm    time.Duration // users alone, before the attack
	attack  time.Duration // the flood, with the users
}

// botnetRun is what one scenario measured.
type botnetRun struct {
	flood          trafficgen.FloodResult
	floodSpec      trafficgen.Flood
	before, during trafficgen.LegitResult
	// passed is what the program passed while the flood ran (bots and
	// users, from its counters), budget what the aggregate allows in that
	// time (burst + rate × the flood's duration).
	passed, budget float64
	rate           float64
	d              testbed.Counters
	// arrived is what the arrivals saw; botPassed the flood packets the
	// sink received.
	arrived   trafficgen.LegitResult
	botPassed uint64
	// standingBefore is the standing table when the attack started.
	standingBefore map[netip.Addr]loader.LimiterEgStandingVal
}

func (c botnetCase) policy(s *scenario) string {
	p := "apiVersion: edgeguard/v1\n" + s.lab.InterfacesYAML("native") + "metrics: {listen: \"\"}\n" + kgLimits
	reserve := ""
	if c.reserve != "" {
		reserve = "  reserve: " + c.reserve + "\n"
	}
	if c.asnRate > 0 {
		burst := c.asnBurst
		if burst == 0 {
			burst = c.asnRate
		}
		p += fmt.Sprintf("  per_asn:\n    packets: {rate: %d/s, burst: %d}\n", c.asnRate, burst) + reserve
		p += "asn_data: {path: " + filepath.Join(filepath.Dir(s.lab.PolicyPath()), "ip2asn.tsv") + "}\n"
		p += "global:\n  packets: {rate: 1M/s, burst: 1M}\n" + reserve
	} else {
		p += reserve + fmt.Sprintf("global:\n  packets: {rate: %d/s, burst: %d}\n", c.globalRate, c.globalRate) + reserve
	}
	p += fmt.Sprintf("standing: {established_after: %v%s}\n", kgEstablishedAfter, c.standing)
	return p + c.extra
}

// newBotnetScenario builds the lab: kgUsers (+ arrivals) client
// namespaces, one attacker whose namespace takes the bots' (or the spoofed
// flood's) answers, and the scenarios' ASN data.
func newBotnetScenario(t *testing.T, spoofed bool, arrivals int) *scenario {
	t.Helper()
	routes := kgBotNets()
	if spoofed {
		routes = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16")}
	}
	s := newScenario(t, kgUsers+arrivals, routes...)
	if err := os.WriteFile(filepath.Join(filepath.Dir(s.lab.PolicyPath()), "ip2asn.tsv"), []byte(kgASNData), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// userConns opens one connected UDP socket per user: both addresses of
// each client, to the echo server.
func (s *scenario) userConns(clients []*testbed.Client) []*net.UDPConn {
	s.t.Helper()
	var conns []*net.UDPConn
	for _, c := range clients {
		for _, src := range []netip.Addr{c.Src4, c.Alt4} {
			u, err := c.NS.DialUDP(netip.AddrPortFrom(src, 0), netip.AddrPortFrom(c.EdgeAddr4, testbed.EchoPort))
			if err != nil {
				s.t.Fatal(err)
			}
			s.t.Cleanup(func() { u.Close() })
			conns = append(conns, u)
		}
	}
	return conns
}

// users runs the users' bursty requests for d.
func users(s *scenario, conns []*net.UDPConn, d time.Duration, seed uint64) trafficgen.LegitResult {
	s.t.Helper()
	r, err := trafficgen.LegitUDP{
		Conns: conns, Rate: kgUserRate, Burst: kgUserBurst, Seed: seed,
		Count: int(d.Seconds()*kgUserRate) + 10*kgUserBurst, Duration: d,
	}.Run(s.ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

// run starts the daemon with c's policy, lets the users warm up, then
// floods while they go on.
func (c botnetCase) run(s *scenario) botnetRun {
	t := s.t
	t.Helper()
	if err := s.lab.WritePolicy(c.policy(s)); err != nil {
		t.Fatal(err)
	}
	if err := s.lab.Daemon.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	conns := s.userConns(s.lab.Legit[:kgUsers])
	var r botnetRun
	bots, botRate := c.bots, c.botRate
	if bots == 0 {
		bots, botRate = kgBots, kgBotRate
	}
	r.floodSpec = trafficgen.Flood{
		Sources: kgBotNets(), Distinct: bots, Proto: trafficgen.UDP, Payload: 32,
		Rate: int(float64(bots) * botRate), Duration: c.attack, Seed: 11,
		// 1,500 independent bots: their packets arrive as a Poisson
		// stream, not evenly spaced (which would flatter the flood
		// against a user arriving at a random instant), each at its own
		// time (per-frame deadlines: steps would clump them by the
		// machine's load).
		Poisson: true, Deadlines: true,
	}
	if c.spoofed {
		r.floodSpec.Sources, r.floodSpec.Distinct = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16")}, 0
	}
	if c.likeUsers {
		r.floodSpec.DstPort, r.floodSpec.Payload = testbed.EchoPort, trafficgen.LegitSize
	}
	r.floodSpec.Count = int(float64(r.floodSpec.Rate) * c.attack.Seconds())
	var wg sync.WaitGroup
	var fe error
	if c.prewarmRate > 0 {
		warm := r.floodSpec
		warm.Rate, warm.Duration = int(float64(bots)*c.prewarmRate), c.warm
		warm.Count = int(float64(warm.Rate) * c.warm.Seconds())
		wg.Go(func() { _, fe = s.lab.Flood(s.ctx, s.lab.Attackers[0], warm) })
	}
	r.before = users(s, conns, c.warm, 1)
	wg.Wait()
	if fe != nil {
		t.Fatal(fe)
	}
	r.standingBefore = s.standings()

	base := s.counters()
	sinkBase := s.lab.Sink.Other()
	var arrivals []*net.UDPConn
	if c.arrivals > 0 {
		// Two bursty streams per arriving address (two tabs), for twice
		// the samples without more namespaces to attach.
		arrivals = append(s.userConns(s.lab.Legit[kgUsers:]), s.userConns(s.lab.Legit[kgUsers:])...)
	}
	wg.Go(func() { r.flood, fe = s.lab.Flood(s.ctx, s.lab.Attackers[0], r.floodSpec) })
	if c.during != nil {
		wg.Go(func() { c.during(s) })
	}
	var ae error
	if len(arrivals) > 0 {
		wg.Go(func() {
			r.arrived, ae = trafficgen.LegitUDP{
				Conns: arrivals, Rate: kgUserRate, Burst: kgUserBurst, Seed: 3,
				Count: int(c.attack.Seconds()*kgUserRate) + 10*kgUserBurst, Duration: c.attack,
			}.Run(s.ctx)
		})
	}
	r.during = users(s, conns, c.attack, 2)
	wg.Wait()
	if fe != nil || ae != nil {
		t.Fatalf("flood: %v; arrivals: %v", fe, ae)
	}
	r.botPassed = s.sinkSettled() - sinkBase
	r.d = s.countersSince(base, r.flood.Sent+uint64(r.during.Sent+r.arrived.Sent))
	r.passed = float64(r.d.Action("pass"))
	r.rate = float64(c.asnRate)
	if c.asnRate == 0 {
		r.rate = float64(c.globalRate)
	}
	burst := float64(c.asnBurst)
	if burst == 0 {
		burst = r.rate
	}
	r.budget = burst + r.rate*r.flood.Elapsed.Seconds()
	return r
}

// offeredRatio is how many times the aggregate's rate the flood sent.
func (r botnetRun) offeredRatio() float64 {
	return float64(r.flood.Sent) / r.flood.Elapsed.Seconds() / r.rate
}

// report prints the run and its margins: users' success against 99%, the
// aggregate's passes against its budget (±10%), the flood against 4×.
func (r botnetRun) report(t *testing.T, what string) {
	t.Helper()
	report(t, "%s: flood %d in %v (%.1f× the aggregate's %.0f/s); aggregate passed %.0f of budget %.0f (%+.1f%%, margin ±10%%); "+
		"drops asn %d global %d prefix %d source %d; users before %v; users during %v (margin to 99%%: %+.2f points)",
		what, r.flood.Sent, r.flood.Elapsed.Round(time.Millisecond), r.offeredRatio(), r.rate, r.passed, r.budget,
		100*(r.passed/r.budget-1), r.d["drop/asn_limit"], r.d["drop/global_limit"], r.d["drop/prefix_limit"],
		r.d["drop/source_limit"], r.before, r.during, 100*(r.during.Success()-0.99))
}

// checkHostile fails the test when the run could not test anything: a
// flood under 4× the budget, users failing before the attack, or bots
// caught by a per-source or per-/24 limit (they must look normal).
func (r botnetRun) checkHostile(t *testing.T) {
	t.Helper()
	if r.offeredRatio() < 4 {
		t.Fatalf("the flood reached only %.1f× the aggregate's rate (%d packets in %v): want ≥ 4× to test anything",
			r.offeredRatio(), r.flood.Sent, r.flood.Elapsed)
	}
	if r.before.Success() < 0.99 {
		t.Errorf("users before the attack: %v, want ≥ 99%%", r.before)
	}
	if n := r.d["drop/source_limit"] + r.d["drop/prefix_limit"]; n != 0 {
		t.Errorf("%d per-source or per-/24 drops: the bots are meant to be under those limits", n)
	}
}

// Before standing (issue #11), and with the reserve turned off (reserve:
// 0) today: every packet that reaches a full aggregate competes on equal
// terms, so the users get about budget ÷ flood of their requests through.
// These pin that number down (docs/operations.md) and show the scenario
// can fail: users must lose most of their requests here.

func TestKnownGoodBeforeASNBudget(t *testing.T) {
	s := newBotnetScenario(t, false, 0)
	r := botnetCase{asnRate: 2000, reserve: "0", warm: 3 * time.Second, attack: 12 * time.Second}.run(s)
	r.report(t, "before (reserve 0), per-ASN 2000/s")
	r.checkHostile(t)
	within(t, "aggregate passed (counters)", r.passed, r.budget, 0.10)
	if r.during.Success() > 0.5 {
		t.Errorf("users during the attack %v: without priority they should lose most requests; the scenario is not hostile", r.during)
	}
}

func TestKnownGoodBeforeGlobalBudget(t *testing.T) {
	s := newBotnetScenario(t, false, 0)
	r := botnetCase{globalRate: 3000, reserve: "0", warm: 3 * time.Second, attack: 12 * time.Second}.run(s)
	r.report(t, "before (reserve 0), global 3000/s, no ASN data")
	r.checkHostile(t)
	within(t, "aggregate passed (counters)", r.passed, r.budget, 0.10)
	if r.during.Success() > 0.5 {
		t.Errorf("users during the attack %v: without priority they should lose most requests; the scenario is not hostile", r.during)
	}
}

// standings reads the daemon's pinned standing table (the kernel's state,
// not the daemon's view of it): address -> entry.
func (s *scenario) standings() map[netip.Addr]loader.LimiterEgStandingVal {
	s.t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(s.lab.Config.PinDir, "maps", loader.LimiterMapStanding), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		s.t.Fatalf("open the pinned standing table: %v", err)
	}
	defer m.Close()
	out := map[netip.Addr]loader.LimiterEgStandingVal{}
	var k loader.LimiterEgStandingKey
	var v loader.LimiterEgStandingVal
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[netip.AddrFrom16(k.Addr).Unmap()] = v
	}
	if err := it.Err(); err != nil && !errors.Is(err, ebpf.ErrIterationAborted) {
		s.t.Fatalf("read the standing table: %v", err)
	}
	return out
}

func privileged(v loader.LimiterEgStandingVal) bool {
	return maps.Standing(v.Standing) == maps.StandingEstablished || maps.Standing(v.Standing) == maps.StandingValidated
}

// userAddrs are the users' addresses (both of each of the clients).
func userAddrs(clients []*testbed.Client) []netip.Addr {
	var out []netip.Addr
	for _, c := range clients {
		out = append(out, c.Src4, c.Alt4)
	}
	return out
}

// checkUsersEstablished fails the test when a user had not earned its
// standing before the attack: the scenario would not test priority.
func (r botnetRun) checkUsersEstablished(t *testing.T, users []netip.Addr) {
	t.Helper()
	for _, u := range users {
		if v, ok := r.standingBefore[u]; !ok || !privileged(v) {
			t.Fatalf("user %s not established after the warm-up (entry %v: %+v): cannot test priority", u, ok, v)
		}
	}
}

// checkNoBotStanding asserts that no source inside the bots' /24s (or, for
// a spoofed flood, no address of the users' /16 but the users) holds
// standing after the attack: every such entry of the whole table is new
// or penalised.
func checkNoBotStanding(t *testing.T, after map[netip.Addr]loader.LimiterEgStandingVal, users []netip.Addr, within []netip.Prefix) int {
	t.Helper()
	isUser := map[netip.Addr]bool{}
	for _, u := range users {
		isUser[u] = true
	}
	tracked := 0
	for a, v := range after {
		in := false
		for _, p := range within {
			in = in || p.Contains(a)
		}
		if !in || isUser[a] {
			continue
		}
		tracked++
		if privileged(v) {
			t.Errorf("bot %s gained standing: %s (%s)", a, maps.StandingName(maps.Standing(v.Standing)),
				maps.StandingWhyName(maps.StandingWhy(v.Why)))
		}
	}
	return tracked
}

// checkKnownGood is what every attack on established users must show:
// users ≥ 99%, the aggregate at its budget ±10%, no bot with standing.
func (r botnetRun) checkKnownGood(t *testing.T, s *scenario, bots []netip.Prefix) {
	t.Helper()
	r.checkHostile(t)
	users := userAddrs(s.lab.Legit[:kgUsers])
	r.checkUsersEstablished(t, users)
	if r.during.Success() < 0.99 {
		t.Errorf("users during the attack: %v, want ≥ 99%%", r.during)
	}
	within(t, "aggregate passed (counters)", r.passed, r.budget, 0.10)
	report(t, "class counters: asn [%s]; global [%s]", s.classCounts("asn"), s.classCounts("global"))
	n := checkNoBotStanding(t, s.standings(), users, bots)
	report(t, "standing after the attack: %d bot addresses tracked, none established or validated; %d users established",
		n, len(users))
}

// The attacks of the issue, with standing (standing.established_after 4s,
// the default 50% reserve): users who were active before the attack are
// established and use the reserve the bots cannot.

func TestKnownGoodASNBudget(t *testing.T) {
	s := newBotnetScenario(t, false, 0)
	r := botnetCase{asnRate: 2000, warm: kgWarm, attack: 3*kgEstablishedAfter + time.Second}.run(s)
	r.report(t, "with standing, per-ASN 2000/s")
	r.checkKnownGood(t, s, kgBotNets())
}

func TestKnownGoodGlobalBudget(t *testing.T) {
	s := newBotnetScenario(t, false, 0)
	r := botnetCase{globalRate: 3000, warm: kgWarm, attack: 3*kgEstablishedAfter + time.Second}.run(s)
	r.report(t, "with standing, global 3000/s, no ASN data")
	r.checkKnownGood(t, s, kgBotNets())
}

// A spoofed flood: a random source of the users' own /16 per packet.
func TestKnownGoodSpoofedFromUsersPrefix(t *testing.T) {
	s := newBotnetScenario(t, true, 0)
	r := botnetCase{asnRate: 2000, spoofed: true, warm: kgWarm, attack: 3*kgEstablishedAfter + time.Second}.run(s)
	r.report(t, "with standing, spoofed from 198.18.0.0/16, per-ASN 2000/s")
	r.checkKnownGood(t, s, []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16")})
}

// Users who arrive during the attack are new, like the bots: they share
// the budget minus the reserve with the flood (docs/operations.md, "What a
// user arriving during an attack gets"), and they do not become
// established while it lasts (history gathered during congestion does not
// count). A new source's packet is admitted when it finds the aggregate
// below the new-source tolerance, which the flood refills to as soon as a
// token is back. What their requests get then depends on the flood's
// timing, not on the data plane (a new user and a bot are treated alike
// per packet): against independent bots (Poisson) the first request of a
// user's burst gets a bot packet's odds; against evenly spaced packets
// much less (3.5% in the reference model); against clumps more. The
// reference model pins each case on exact clocks
// (internal/refmodel TestArrivalsAgainstFloodTiming). The stepped
// generator's timing followed the machine's load (a quiet machine
// measured 2.8%, a loaded one 14-32%, against a bot's 13%); with
// per-frame deadlines it follows the schedule, evenly spaced on a quiet
// machine (0.20× a bot packet's odds for the opening requests, CI), less
// so under load (0.5-1.1× at load 10-13, where late frames are skipped).
// Asserted: some of the arrivals' opening requests are answered (not
// shut out) and at most 2× a bot packet's odds (not favoured), all their
// requests stay far below the
// established users' (under 90%), and none of them is established after
// the attack.
func TestKnownGoodUsersArrivingDuringAttack(t *testing.T) {
	const arrivals = 4
	s := newBotnetScenario(t, false, arrivals)
	r := botnetCase{asnRate: 2000, arrivals: arrivals, warm: kgWarm, attack: 3*kgEstablishedAfter + time.Second}.run(s)
	r.report(t, "with standing, per-ASN 2000/s, 8 users (16 streams) arriving with the attack")
	r.checkKnownGood(t, s, kgBotNets())
	botShare := float64(r.botPassed) / float64(r.flood.Sent)
	if r.arrived.Opening == 0 {
		t.Fatalf("arrivals sent no burst: %v", r.arrived)
	}
	open := float64(r.arrived.OpeningReplied) / float64(r.arrived.Opening)
	se := math.Sqrt(botShare * (1 - botShare) / float64(r.arrived.Opening))
	report(t, "arrivals: %v; opening requests %d/%d (%.1f%%); a bot packet got through with probability %.1f%% (%d of %d); "+
		"margin of the opening requests to a bot's share less 3 standard errors (%.1f points): %+.1f points",
		r.arrived, r.arrived.OpeningReplied, r.arrived.Opening, 100*open, 100*botShare, r.botPassed, r.flood.Sent,
		300*se, 100*(open-(botShare-3*se)))
	// What the arrivals' opening requests get is a factor of a bot
	// packet's odds that depends on the flood's spacing: 0.2-0.27× for an
	// evenly spaced flood (a quiet machine: the deadline sender keeps the
	// schedule), 0.5-1.1× measured at load 10-13 (late frames skipped),
	// 1× for independent bots (the reference model), up to 2.4× for a
	// clumped one. Asserted: not shut out (some are answered: ~10 of 388
	// expected even when evenly spaced), not favoured (at most 2×).
	ratio := open / botShare
	report(t, "arrivals' opening requests at %.2f× a bot packet's odds (want some answered and at most 2×: margin %+.2f); flood frames late %d",
		ratio, 2-ratio, r.flood.Late)
	if r.arrived.OpeningReplied == 0 || ratio > 2 {
		t.Errorf("arrivals' opening requests %d/%d (%.1f%%) against a bot packet's %.1f%% (%.2f×): want some answered and at most 2×",
			r.arrived.OpeningReplied, r.arrived.Opening, 100*open, 100*botShare, ratio)
	}
	if got := r.arrived.Success(); got >= 0.9 {
		t.Errorf("arrivals' success %.1f%%: new sources should stay far below the established users (want under 90%%)", 100*got)
	}
	after := s.standings()
	for _, a := range userAddrs(s.lab.Legit[kgUsers:]) {
		if v, ok := after[a]; ok && privileged(v) {
			t.Errorf("arrival %s became %s during the attack", a, maps.StandingName(maps.Standing(v.Standing)))
		}
	}
}

// A pre-warmed botnet: every bot sends 1 packet a second through the
// warm-up (the aggregate is not congested, so they earn standing like the
// users), then 10 a second. Measured and reported, no threshold: standing
// cannot tell a patient botnet from users (docs/operations.md).
func TestKnownGoodPrewarmedBotnet(t *testing.T) {
	s := newBotnetScenario(t, false, 0)
	r := botnetCase{asnRate: 2000, prewarmRate: 1, warm: kgWarm, attack: 3*kgEstablishedAfter + time.Second}.run(s)
	r.report(t, "pre-warmed botnet (1/s each for 10s, then 10/s), per-ASN 2000/s")
	r.checkHostile(t)
	established := 0
	for a, v := range r.standingBefore {
		for _, p := range kgBotNets() {
			if p.Contains(a) && privileged(v) {
				established++
			}
		}
	}
	report(t, "pre-warmed: %d of %d bots established before the attack; users during the attack %.1f%%",
		established, kgBots, 100*r.during.Success())
}

// A policy reload and a daemon restart (SIGKILL, then a new daemon) during
// the attack keep standing: the users stay established with the same
// entries (same since), and keep ≥ 99%.
func TestKnownGoodReloadAndRestartKeepStanding(t *testing.T) {
	s := newBotnetScenario(t, false, 0)
	var reloadErr, restartErr error
	var reloaded, restarted time.Duration
	c := botnetCase{asnRate: 2000, warm: kgWarm, attack: 3*kgEstablishedAfter + time.Second}
	c.during = func(s *scenario) {
		start := time.Now()
		time.Sleep(3 * time.Second)
		// The per-/24 limit changes: a new generation, the same rules.
		pol := strings.Replace(c.policy(s), "rate: 1000/s, burst: 1000", "rate: 1200/s, burst: 1200", 1)
		if err := s.lab.WritePolicy(pol); err != nil {
			reloadErr = err
			return
		}
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if st, err := s.lab.Daemon.Status(s.ctx); err == nil && st.Generation >= 2 {
				reloaded = time.Since(start)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if reloaded == 0 {
			reloadErr = errors.New("the reload did not apply within 10s")
			return
		}
		time.Sleep(3 * time.Second)
		s.lab.Daemon.Kill()
		restartErr = s.lab.Daemon.Start(s.ctx)
		restarted = time.Since(start)
	}
	r := c.run(s)
	if reloadErr != nil || restartErr != nil {
		t.Fatalf("reload: %v; restart: %v", reloadErr, restartErr)
	}
	r.report(t, fmt.Sprintf("with standing, per-ASN 2000/s, reload at %v, kill -9 and restart done at %v",
		reloaded.Round(10*time.Millisecond), restarted.Round(10*time.Millisecond)))
	r.checkKnownGood(t, s, kgBotNets())
	after := s.standings()
	for _, u := range userAddrs(s.lab.Legit[:kgUsers]) {
		b, a := r.standingBefore[u], after[u]
		if !privileged(a) || a.Since != b.Since {
			t.Errorf("user %s: before the attack %s since %d, after reload and restart %s since %d: standing was reset",
				u, maps.StandingName(maps.Standing(b.Standing)), b.Since, maps.StandingName(maps.Standing(a.Standing)), a.Since)
		}
	}
}

// ctlStatus is `edgectl status --json`, decoded.
func (s *scenario) ctlStatus() (control.Status, error) {
	var st control.Status
	out, err := s.lab.Daemon.Ctl(s.ctx, "status", "--json")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("decode status: %w: %s", err, out)
	}
	return st, nil
}

// A congested ASN is named: while the botnet fills AS64501's budget,
// `edgectl status --json` lists the instance (aggregate asn, asn 64501,
// the rule) with refusals by the reserve of new sources, and no other
// instance (the bots' /24s stay under their per-prefix limit, the global
// budget is far away); after the flood it leaves the list once it has
// refused nothing for congestionCalm (5 s) plus a tick.
func TestKnownGoodCongestedASNInStatus(t *testing.T) {
	s := newBotnetScenario(t, false, 0)
	type seen struct {
		at   time.Duration
		inst []control.CongestedInstance
	}
	var polls []seen
	var pollErr error
	c := botnetCase{asnRate: 2000, warm: kgWarm, attack: 3*kgEstablishedAfter + time.Second}
	c.during = func(s *scenario) {
		start := time.Now()
		for time.Since(start) < c.attack-time.Second {
			time.Sleep(500 * time.Millisecond)
			st, err := s.ctlStatus()
			if err != nil {
				pollErr = err
				return
			}
			polls = append(polls, seen{time.Since(start), st.CongestedInstances})
		}
	}
	r := c.run(s)
	r.report(t, "with standing, per-ASN 2000/s, status polled")
	if pollErr != nil {
		t.Fatal(pollErr)
	}
	r.checkHostile(t)
	first := time.Duration(-1)
	var last control.CongestedInstance
	for _, p := range polls {
		for _, in := range p.inst {
			if in.Aggregate != "asn" || in.ASN != 64501 {
				t.Errorf("at %v: instance %+v listed; only AS64501 refuses", p.at.Round(time.Millisecond), in)
				continue
			}
			if first < 0 {
				first = p.at
			}
			last = in
		}
	}
	if first < 0 {
		t.Fatalf("AS64501 never listed as congested in %d polls of edgectl status --json", len(polls))
	}
	if last.Rule == "" || last.RefusedReserve == 0 || last.RefusedByClass["new"] == 0 || last.Since.IsZero() {
		t.Errorf("AS64501 listed as %+v: want its rule, refusals of new sources by the reserve, since", last)
	}
	// Listed from the first seconds of the attack to its end (the polls
	// stop a second before it): congested throughout, with a margin.
	listed := 0
	for _, p := range polls {
		if len(p.inst) > 0 {
			listed++
		}
	}
	report(t, "AS64501 listed first at %v into the attack, in %d of %d polls; last: %d refused by the reserve, %d full, by class %v",
		first.Round(time.Millisecond), listed, len(polls), last.RefusedReserve, last.RefusedFull, last.RefusedByClass)
	if first > 3*time.Second {
		t.Errorf("AS64501 listed only %v into the attack; want within 3 s (a tick is 1 s)", first)
	}
	if listed < len(polls)-2 {
		t.Errorf("AS64501 listed in %d of %d polls during the attack; want all but the first two", listed, len(polls))
	}
	// After the flood: gone after congestionCalm (5 s) and a tick, with
	// margin for a loaded machine.
	end := time.Now()
	for {
		st, err := s.ctlStatus()
		if err != nil {
			t.Fatal(err)
		}
		if len(st.CongestedInstances) == 0 {
			report(t, "AS64501 left the list %v after the flood (calm 5 s, margin to 20 s)", time.Since(end).Round(time.Millisecond))
			break
		}
		if time.Since(end) > 20*time.Second {
			t.Fatalf("still listed 20 s after the flood: %+v", st.CongestedInstances)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
