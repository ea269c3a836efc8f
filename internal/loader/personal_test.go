package loader_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

// personalGen: rule 0 with a per-source limit keyed by /32 (1000/s: never
// reached here, it counts the packets the mean is measured from) and an
// ASN budget of 100/s, burst 100, with a 50% reserve; 198.18.0.0/16 is
// AS64500. Standing with the default personal budget (headroom 2, default
// 20/s) and the shortest rate_history (10 s), penalties an hour.
func personalGen(headroom float64) policy.Compiled {
	g := generation(policy.CompiledRule{ID: 0, PerSource: pkts(1000, 1000), PerASN: pkts(100, 100), Reserve: half})
	g.Standing = policy.DefaultStanding()
	g.Standing.Penalty = time.Hour
	g.Standing.RateHistory = 10 * time.Second
	g.Standing.PersonalHeadroom = headroom
	return withPrefixes(g, fact("198.18.0.0/16", 0, 64500))
}

// fillBand sends one packet from each of n new sources of 198.18.50.0/23:
// the ASN bucket fills to its new-source tolerance (its reserve band's
// edge). Returns how many were admitted.
func (td *jumpTD) fillBand(n int) int {
	got := 0
	for i := range n {
		got += td.burst(fmt.Sprintf("198.18.%d.%d", 50+i/250, 1+i%250), 1)
	}
	return got
}

// TestPersonalBudget: in the reserve band an established source has
// priority up to its personal budget (headroom × its mean rate, with its
// busiest second as burst) and the rest of its packets are charged as new
// (class over_budget, refused by the reserve); an established source with
// no measured rate gets the default budget; a source validated by a
// handshake only ranks as new; with personal budgets off the established
// source has the whole band. Exact against internal/refmodel.Personal, on
// the test clock.
func TestPersonalBudget(t *testing.T) {
	for _, headroom := range []float64{2, 0} {
		t.Run(fmt.Sprintf("headroom=%g", headroom), func(t *testing.T) {
			td := &jumpTD{testDatapath: newTestDatapath(t, smallSizes), now: ovrStart}
			td.setClock(td.now)
			g := personalGen(headroom)
			td.apply(g)
			const user, cold, shook = "198.18.1.1", "198.18.1.2", "198.18.1.3"
			must(t, td.m.Standing.Set(netip.MustParseAddr(user), maps.StandingEstablished))
			must(t, td.m.Standing.Set(netip.MustParseAddr(cold), maps.StandingEstablished))
			must(t, td.m.Standing.SetWhy(netip.MustParseAddr(shook), maps.StandingValidated, maps.WhyTCP))
			// Learn: 4 packets per epoch for 12 epochs, uncongested.
			for range 12 {
				td.step(map[string]int{user: 4})
			}
			e := td.entry(user)
			if !near(e.MeanRate, perEpoch(4)) {
				t.Fatalf("mean rate %v/s after 12 epochs of 4: want %v/s", e.MeanRate, perEpoch(4))
			}
			// The attack: new sources fill the bucket to its band.
			td.now += jumpEpoch
			td.setClock(td.now)
			if got := td.fillBand(200); got != 50 {
				t.Fatalf("new sources admitted %d of 200, want 50 (burst 100 less the reserve)", got)
			}
			b := refmodel.Personal(maps.StandingConfig(g.Standing), e.Raw, false)
			want := 30 // budgets off: the band holds 50
			if !b.Off {
				want = int(b.Tau / b.T)
			}
			got := td.burst(user, 30)
			t.Logf("personal budget: rate %.3g/s, burst %.3g packets (mean %.3g/s, usual %.3g/s); admitted %d of 30 in the band",
				float64(b.Rate)/16, b.BurstPkts, e.MeanRate, e.UsualRate, got)
			if got != want {
				t.Fatalf("established source in the band: %d of 30 admitted, want %d", got, want)
			}
			if headroom == 0 {
				return
			}
			// Headroom 2 over 3.7/s: 7.4/s, and a burst of its two busiest
			// seconds (2 × 3.7) or one second of that, 7.4 packets.
			if want != 7 {
				t.Errorf("personal burst %d packets: want 7 (2 × %v/s over one second)", want, perEpoch(4))
			}
			c := td.classCounters()
			if n := c[0][maps.ClassAggASN][maps.ClassEstablished][maps.OutcomeAdmittedReserve].Packets; n != uint64(want) {
				t.Errorf("established admitted_reserve %d, want %d", n, want)
			}
			if n := c[0][maps.ClassAggASN][maps.ClassOverBudget][maps.OutcomeRefusedReserve].Packets; n != uint64(30-want) {
				t.Errorf("over_budget refused_reserve %d, want %d", n, 30-want)
			}
			// No measured rate: the default budget (20/s, burst one second).
			if got := td.burst(cold, 30); got != 20 {
				t.Errorf("established source without a rate: %d of 30 admitted in the band, want the default's 20", got)
			}
			// A handshake proves an address, not good intent.
			if got := td.burst(shook, 5); got != 0 {
				t.Errorf("source validated by a handshake only: %d of 5 admitted in the band, want 0 (ranks as new)", got)
			}
			// The next class, as explain computes it: the live maps read
			// into the model (maps.ReadState, refmodel.FromState, NextCharge).
			now := uint64(td.now) << maps.TickShift
			st, err := td.m.ReadState()
			if err != nil {
				t.Fatal(err)
			}
			model, err := refmodel.FromState(st)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				at   uint64
				want maps.Class
			}{{now, maps.ClassOverBudget}, {now + uint64(time.Second)<<maps.TickShift, maps.ClassEstablished}} {
				cls, b, metered, inUse := model.NextCharge(netip.MustParseAddr(user), c.at)
				if cls != c.want || !metered || b.RatePerSecond() <= 0 {
					t.Errorf("explain's next charge of the user at +%v: %s (budget %v/s, metered %v), want %s",
						time.Duration((c.at-now)>>maps.TickShift), maps.ClassName(cls), b.RatePerSecond(), metered, maps.ClassName(c.want))
				}
				if c.want == maps.ClassOverBudget && inUse < 0.99 {
					t.Errorf("explain's burst in use of an over-budget user: %.2f, want 1", inUse)
				}
			}
			if cls, _, metered, _ := model.NextCharge(netip.MustParseAddr(shook), now); cls != maps.ClassNew || metered {
				t.Errorf("explain's next charge of a handshake-only source: %s (metered %v), want new, no budget", maps.ClassName(cls), metered)
			}
			// Congestion froze its rates: this epoch's measurement (in the
			// band) does not join its mean.
			td.now += jumpEpoch
			td.setClock(td.now)
			td.fillBand(200)
			td.burst(user, 30)
			if e2 := td.entry(user); e2.MeanRate != e.MeanRate {
				t.Errorf("mean rate moved from %v to %v/s while congested", e.MeanRate, e2.MeanRate)
			}
		})
	}
}

// TestPersonalBudgetSlowRamp measures what a slow ramp gains (docs/
// operations.md, "Personal budget"): a source that raises its rate by 10%
// an epoch from 2 to ~35 packets per epoch while the aggregate is not
// congested raises its mean with it (over rate_history, 10 s here), so in
// the band it keeps about headroom × its recent mean; a source that jumps
// from 2 straight to the same rate keeps headroom × 2. Asserted: each
// keeps exactly what the reference model's budget allows, and the ramp's
// gain is reported.
func TestPersonalBudgetSlowRamp(t *testing.T) {
	td := &jumpTD{testDatapath: newTestDatapath(t, smallSizes), now: ovrStart}
	td.setClock(td.now)
	g := personalGen(2)
	td.apply(g)
	const ramp, jump = "198.18.1.1", "198.18.1.2"
	must(t, td.m.Standing.Set(netip.MustParseAddr(ramp), maps.StandingEstablished))
	must(t, td.m.Standing.Set(netip.MustParseAddr(jump), maps.StandingEstablished))
	for range 10 {
		td.step(map[string]int{ramp: 2, jump: 2})
	}
	rate := 2.0
	for range 30 {
		rate *= 1.1
		td.step(map[string]int{ramp: int(rate), jump: 2})
	}
	final := int(rate)
	kept := map[string]int{}
	var budgets [2]refmodel.PersonalBudget
	for i, src := range []string{ramp, jump} {
		budgets[i] = refmodel.Personal(maps.StandingConfig(g.Standing), td.entry(src).Raw, false)
	}
	// Five epochs of attack: each starts with the band refilled by new
	// sources, then each source sends its final rate.
	const epochs = 5
	allowed := map[string]int{}
	var tats [2]uint64
	for range epochs {
		td.now += jumpEpoch
		td.setClock(td.now)
		td.fillBand(300)
		for i, src := range []string{ramp, jump} {
			kept[src] += td.burst(src, final)
			for range final {
				if budgets[i].Take(&tats[i], uint64(td.now)<<maps.TickShift) {
					allowed[src]++
				}
			}
		}
	}
	for i, src := range []string{ramp, jump} {
		b := budgets[i]
		t.Logf("%s: %d per epoch in the attack; budget %.3g/s burst %.3g; kept %d of %d (%.0f%%)",
			src, final, float64(b.Rate)/16, b.BurstPkts, kept[src], final*epochs, 100*float64(kept[src])/float64(final*epochs))
		if kept[src] != allowed[src] {
			t.Errorf("%s kept %d of its packets in the band, want %d (its budget)", src, kept[src], allowed[src])
		}
	}
	t.Logf("the ramp gained %.1f× the priority of the jump (%d against %d packets)", float64(kept[ramp])/float64(kept[jump]), kept[ramp], kept[jump])
	if kept[ramp] <= kept[jump] {
		t.Errorf("the ramp kept %d, the jump %d: a ramp inside rate_history should raise its budget", kept[ramp], kept[jump])
	}
}

// TestPersonalBudgetOverride: under an aggregate override with a
// new-source bucket (any origin: here the CLI's), what an established
// source sends over its personal budget is charged as new there; within
// it, it is not.
func TestPersonalBudgetOverride(t *testing.T) {
	td := &jumpTD{testDatapath: newTestDatapath(t, smallSizes), now: ovrStart}
	td.setClock(td.now)
	g := personalGen(2)
	td.apply(g)
	const user = "198.18.1.1"
	must(t, td.m.Standing.Set(netip.MustParseAddr(user), maps.StandingEstablished))
	for range 8 {
		td.step(map[string]int{user: 3})
	}
	b := refmodel.Personal(maps.StandingConfig(g.Standing), td.entry(user).Raw, false)
	td.setOverride(maps.Override{Aggregate: asnAgg(0, 64500), NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 3},
		Expires: time.Now().Add(time.Hour), Origin: maps.OriginCLI})
	got, want := td.burst(user, 20), int(b.Tau/b.T)+3
	t.Logf("personal burst %.3g packets; with the override's new-source burst 3: %d of 20 passed", b.BurstPkts, got)
	if got != want {
		t.Errorf("established source under an override: %d of 20 passed, want %d (its personal burst, then the new-source burst 3)", got, want)
	}
}

// TestPenalisedLast: in an aggregate congested below its band (filled past
// half the new-source tolerance), new sources are still admitted and a
// penalised source is not: penalised ranks last (docs/operations.md,
// "Class ranking"); the refused packet's charge is given back.
func TestPenalisedLast(t *testing.T) {
	td := &jumpTD{testDatapath: newTestDatapath(t, smallSizes), now: ovrStart}
	td.setClock(td.now)
	td.apply(personalGen(2))
	const bad = "198.18.9.9"
	must(t, td.m.Standing.Set(netip.MustParseAddr(bad), maps.StandingPenalised))
	// Below half of the new-source tolerance (25 of 50): not congested,
	// the penalised source passes like anyone.
	if got := td.fillBand(20); got != 20 {
		t.Fatalf("new sources: %d of 20", got)
	}
	if got := td.burst(bad, 1); got != 1 {
		t.Fatalf("penalised source in an uncongested aggregate: %d of 1 admitted, want 1", got)
	}
	if got := td.fillBand(10); got != 10 {
		t.Fatalf("new sources: %d of 10", got)
	}
	// Now past half: the penalised source is refused, new ones are not.
	if got := td.burst(bad, 5); got != 0 {
		t.Errorf("penalised source in a congested aggregate: %d of 5 admitted, want 0", got)
	}
	if got := td.burst("198.18.60.1", 19); got != 19 {
		t.Errorf("new source after the refusals: %d of 19 admitted, want 19 (the refused charges given back)", got)
	}
	c := td.classCounters()
	if n := c[0][maps.ClassAggASN][maps.ClassPenalised][maps.OutcomeRefusedReserve].Packets; n != 5 {
		t.Errorf("penalised refused_reserve %d, want 5", n)
	}
}
