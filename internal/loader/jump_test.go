package loader_test

import (
	"fmt"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// jumpEpoch is one epoch of the new-source filter (2^30 ns): standing is
// updated at most once per source per epoch, so the tests step the clock
// by whole epochs and each step's first packet measures the last one.
const jumpEpoch = time.Duration(1 << 30)

// jumpGen: rule 0 with a per-source limit keyed by /32 (1000/s, burst
// 1000: nothing here reaches it) and an ASN budget far above the tests;
// 198.18.0.0/16 is AS64500, 198.19.0.0/16 AS64501. Standing with the
// defaults' usual rate: half-life 10m, jump factor 4, minimum 10/s.
func jumpGen() policy.Compiled {
	g := generation(policy.CompiledRule{ID: 0, PerSource: pkts(1000, 1000), PerASN: pkts(100000, 100000)})
	g.Standing = policy.DefaultStanding()
	g.Standing.Penalty = time.Hour
	// Personal budgets off: these tests are about jumps alone (an
	// override's new-source bucket also takes what a source sends over
	// its personal budget: TestPersonalBudget*).
	g.Standing.PersonalHeadroom = 0
	return withPrefixes(g, fact("198.18.0.0/16", 0, 64500), fact("198.19.0.0/16", 0, 64501))
}

type jumpTD struct {
	*testDatapath
	now time.Duration
}

// step moves the clock one epoch on and sends each source its packets.
func (td *jumpTD) step(sends map[string]int) {
	td.tb.Helper()
	td.now += jumpEpoch
	td.setClock(td.now)
	for src, n := range sends {
		if got := td.burst(src, n); got != n {
			td.tb.Fatalf("at %v: %s passed %d of %d (nothing should refuse these)", td.now, src, got, n)
		}
	}
}

func (td *jumpTD) entry(src string) maps.StandingEntry {
	td.tb.Helper()
	e, err := td.m.Standing.Lookup(netip.MustParseAddr(src))
	if err != nil || !e.Tracked {
		td.tb.Fatalf("standing of %s: %+v, %v", src, e, err)
	}
	return e
}

// perEpoch is n packets per epoch in packets per second, as the data plane
// measures it (1/16 packet per second, rounded down).
func perEpoch(n int) float64 {
	return math.Floor(float64(n)*16*1000/float64(jumpEpoch.Milliseconds())) / 16
}

func near(got, want float64) bool { return math.Abs(got-want) <= 1.0/16 }

// TestStandingUsualRateAndJump: the usual rate is learned from the
// source's packets (its bucket's count), a rise past jump_factor × usual
// marks it jumped with its usual rate frozen, and it clears when the rate
// falls back. A bursty source whose bursts are its usual pattern is never
// marked, however uneven its epochs.
func TestStandingUsualRateAndJump(t *testing.T) {
	td := &jumpTD{testDatapath: newTestDatapath(t, smallSizes), now: ovrStart}
	td.setClock(td.now)
	td.apply(jumpGen())
	const steady, bursty = "198.18.1.1", "198.18.1.2"
	must(t, td.m.Standing.Set(netip.MustParseAddr(steady), maps.StandingEstablished))
	must(t, td.m.Standing.Set(netip.MustParseAddr(bursty), maps.StandingEstablished))

	// Learn: the steady source at 5 per epoch; the bursty one 25 in one
	// epoch, then idle 1-4 epochs (no packet: no update), repeatedly.
	gaps := []int{3, 1, 4, 2, 1, 3, 4, 1, 2}
	gi, idle := 0, 0
	for i := 0; i < 24; i++ {
		s := map[string]int{steady: 5}
		if idle == 0 {
			s[bursty] = 25
			idle = gaps[gi%len(gaps)]
			gi++
		} else {
			idle--
		}
		td.step(s)
	}
	e := td.entry(steady)
	t.Logf("steady source after 24 epochs at 5/epoch: usual %.3f/s current %.3f/s jumped %v (want %.3f/s)",
		e.UsualRate, e.CurrentRate, e.Jumped, perEpoch(5))
	if !near(e.UsualRate, perEpoch(5)) || !near(e.CurrentRate, perEpoch(5)) || e.Jumped || e.RateAtNS != uint64(td.now) {
		t.Fatalf("steady source: %+v, want usual = current = %.3f/s, not jumped, measured now", e, perEpoch(5))
	}
	b := td.entry(bursty)
	t.Logf("bursty source (25 per burst, gaps 1-4 epochs): usual %.3f/s current %.3f/s jumped %v", b.UsualRate, b.CurrentRate, b.Jumped)
	if b.Jumped || b.UsualRate < 0.9*perEpoch(25)/2 {
		t.Fatalf("bursty source: %+v, want not jumped with a usual rate of its bursts (>= %.2f/s)", b, 0.9*perEpoch(25)/2)
	}
	// One more burst right after its last: 25 in one epoch again, the
	// highest it has ever done, is not a jump.
	td.step(map[string]int{steady: 5})
	td.step(map[string]int{steady: 5, bursty: 25})
	td.step(map[string]int{steady: 5, bursty: 25})
	if b = td.entry(bursty); b.Jumped {
		t.Fatalf("bursty source after two bursts in a row: %+v, want not jumped", b)
	}

	// Jump: the steady source rises 6× (30 per epoch). The first epoch's
	// measure covers the last quiet one; the next sees 30.
	usual := e.UsualRate
	before, err := td.m.Standing.Counts()
	must(t, err)
	td.step(map[string]int{steady: 30})
	if e = td.entry(steady); e.Jumped {
		t.Fatalf("jumped on the measure of a quiet epoch: %+v", e)
	}
	for i := 0; i < 10; i++ {
		td.step(map[string]int{steady: 30})
		e = td.entry(steady)
		if !e.Jumped || e.UsualRate != usual || !near(e.CurrentRate, perEpoch(30)) {
			t.Fatalf("epoch %d at 30: %+v, want jumped, usual frozen at %.3f/s, current %.3f/s", i, e, usual, perEpoch(30))
		}
	}
	after, err := td.m.Standing.Counts()
	must(t, err)
	if after.Jumped-before.Jumped != 1 {
		t.Fatalf("jumped events %d, want 1 (one jump of one source)", after.Jumped-before.Jumped)
	}
	t.Logf("jumped at 30/epoch: current %.3f/s, usual frozen at %.3f/s (factor %.1f > 4)", e.CurrentRate, e.UsualRate,
		e.CurrentRate/e.UsualRate)
	// Back to 5: the first measure still covers an epoch at 30, the next
	// clears the jump; the usual rate was not raised by the surge.
	td.step(map[string]int{steady: 5})
	td.step(map[string]int{steady: 5})
	if e = td.entry(steady); e.Jumped || !near(e.UsualRate, usual) || !near(e.CurrentRate, perEpoch(5)) {
		t.Fatalf("back at 5/epoch: %+v, want cleared with usual %.3f/s", e, usual)
	}
	// A surge that starts inside an epoch: measured at 15 (3x, no jump),
	// then at 30. The partial measurement joins the usual rate only after
	// a measurement that is no jump, so 30 is judged against the usual 5.
	td.step(map[string]int{steady: 15})
	td.step(map[string]int{steady: 30})
	if e = td.entry(steady); e.Jumped || !near(e.CurrentRate, perEpoch(15)) {
		t.Fatalf("measured at 15/epoch: %+v, want not jumped (3x)", e)
	}
	td.step(map[string]int{steady: 30})
	if e = td.entry(steady); !e.Jumped || !near(e.UsualRate, usual) {
		t.Fatalf("surge starting mid-epoch, measured at 30/epoch: %+v, want jumped against usual %.3f/s", e, usual)
	}
	td.step(map[string]int{steady: 5})
	td.step(map[string]int{steady: 5})
	if e = td.entry(steady); e.Jumped || !near(e.UsualRate, usual) {
		t.Fatalf("back at 5/epoch again: %+v, want cleared with usual %.3f/s", e, usual)
	}

	// Under the minimum: 9 per epoch from a source whose usual is 2 per
	// epoch is more than 4× but not above jump_min 10/s.
	const slow = "198.18.1.3"
	must(t, td.m.Standing.Set(netip.MustParseAddr(slow), maps.StandingEstablished))
	for i := 0; i < 4; i++ {
		td.step(map[string]int{slow: 2})
	}
	for i := 0; i < 3; i++ {
		td.step(map[string]int{slow: 9})
	}
	if e = td.entry(slow); e.Jumped || !near(e.CurrentRate, perEpoch(9)) {
		t.Fatalf("slow source at 9/epoch (under jump_min): %+v, want not jumped", e)
	}
	// A new source learns its usual rate but never jumps (nothing to lose).
	const fresh = "198.18.1.4"
	td.step(map[string]int{fresh: 2})
	td.step(map[string]int{fresh: 2})
	td.step(map[string]int{fresh: 2})
	for i := 0; i < 3; i++ {
		td.step(map[string]int{fresh: 40})
	}
	if e = td.entry(fresh); e.Standing != maps.StandingNew || e.Jumped || !near(e.CurrentRate, perEpoch(40)) {
		t.Fatalf("new source at 40/epoch: %+v, want new, not jumped, current %.3f/s", e, perEpoch(40))
	}
}

// TestStandingJumpedChargedAsNew: a jumped established source is charged
// as new (the override's new-source bucket) only inside an aggregate with
// a live shield override; an established source at its usual rate, a
// jumped validated source, the same jumped source under an override the
// shield did not write, and under none, keep their standing.
func TestStandingJumpedChargedAsNew(t *testing.T) {
	td := &jumpTD{testDatapath: newTestDatapath(t, smallSizes), now: ovrStart}
	td.setClock(td.now)
	td.apply(jumpGen())
	const jumper, usual, vjumper, other = "198.18.1.1", "198.18.1.2", "198.18.1.3", "198.19.1.1"
	for _, a := range []string{jumper, usual, other} {
		must(t, td.m.Standing.Set(netip.MustParseAddr(a), maps.StandingEstablished))
	}
	must(t, td.m.Standing.Set(netip.MustParseAddr(vjumper), maps.StandingValidated))
	for i := 0; i < 6; i++ {
		td.step(map[string]int{jumper: 3, usual: 3, vjumper: 3, other: 3})
	}
	for i := 0; i < 3; i++ {
		td.step(map[string]int{jumper: 40, usual: 3, vjumper: 40, other: 40})
	}
	for _, a := range []string{jumper, vjumper, other} {
		if e := td.entry(a); !e.Jumped {
			t.Fatalf("%s after 3 epochs at 40 (usual 3): %+v, want jumped", a, e)
		}
	}
	if e := td.entry(usual); e.Jumped {
		t.Fatalf("source at its usual rate: %+v, want not jumped", e)
	}
	// No override: everyone passes.
	for _, a := range []string{jumper, usual, vjumper, other} {
		if got := td.burst(a, 20); got != 20 {
			t.Fatalf("no override: %s passed %d of 20", a, got)
		}
	}
	// An override written by the CLI (not the shield): standing as before.
	nb := maps.Rate{Count: 1, Per: time.Hour, Burst: 3}
	td.setOverride(maps.Override{Aggregate: asnAgg(0, 64500), NewBudget: nb, Expires: time.Now().Add(time.Hour), Origin: maps.OriginCLI})
	if got := td.burst(jumper, 20); got != 20 {
		t.Fatalf("cli override: the jumped source passed %d of 20, want all (only the shield's overrides demote)", got)
	}
	// The shield's: the jumped established source shares the new-source
	// bucket (burst 3), the others keep their standing.
	td.setOverride(maps.Override{Aggregate: asnAgg(0, 64500), NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 2},
		Expires: time.Now().Add(time.Hour), Origin: maps.OriginShield})
	got := map[string]int{}
	for _, a := range []string{jumper, usual, vjumper, other} {
		got[a] = td.burst(a, 20)
	}
	t.Logf("under a shield override (new-source burst 2): passed of 20 each: %v", fmt.Sprint(got))
	if got[jumper] != 2 {
		t.Errorf("jumped established source: %d of 20 passed, want 2 (the new-source burst)", got[jumper])
	}
	if got[usual] != 20 || got[vjumper] != 20 || got[other] != 20 {
		t.Errorf("usual-rate, validated (jumped) and other-ASN (jumped) sources: %v, want 20 each", got)
	}
	// Its standing is unchanged: it loses it only for the surge.
	if e := td.entry(jumper); e.Standing != maps.StandingEstablished || !e.Jumped {
		t.Errorf("the jumped source's entry: %+v, want still established (and jumped)", e)
	}
}
