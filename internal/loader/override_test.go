package loader_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// ovrStart is the test clock at the start of the override tests: far from
// zero, like a host's uptime.
const ovrStart = 1000 * time.Second

// asnGen is a default rule (id) with an ASN budget of 1000/s, burst 100;
// 198.18.0.0/16 is AS64500, 198.19.0.0/16 AS64501.
func asnGen(id uint32) policy.Compiled {
	g := generation(policy.CompiledRule{ID: id, PerASN: pkts(1000, 100)})
	if id != 0 {
		g.Rules = append(g.Rules, policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}})
	}
	return withPrefixes(g, fact("198.18.0.0/16", id, 64500), fact("198.19.0.0/16", id, 64501))
}

// rate is a maps rate (overrides' budgets) of n/s with a burst.
func rate(n, burst uint64) maps.Rate { return maps.Rate{Count: n, Per: time.Second, Burst: burst} }

func asnAgg(rule, asn uint32) maps.Aggregate {
	return maps.Aggregate{RuleID: rule, Kind: maps.AggKindASN, ASN: asn}
}

func (td *testDatapath) setOverride(o maps.Override) {
	td.tb.Helper()
	if err := td.m.Overrides.Set(o); err != nil {
		td.tb.Fatalf("set override %v: %v", o.Aggregate, err)
	}
}

func (td *testDatapath) gateWords() []uint32 {
	td.tb.Helper()
	var out []uint32
	for i := uint32(0); i < td.d.Sizes.MaxRules; i++ {
		var v uint32
		if err := td.d.Objects.AggGate.Lookup(i, &v); err != nil {
			td.tb.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

func (td *testDatapath) wantGateClear() {
	td.tb.Helper()
	for slot, w := range td.gateWords() {
		if w != 0 {
			td.tb.Fatalf("gate of slot %d is %#x, want 0 (no override, no watch)", slot, w)
		}
	}
}

// TestOverrideTightensAndExpires: an override's budget replaces the ASN
// aggregate's for that ASN only; once expired the policy's budget is back,
// Overrides no longer lists it, PruneOverrides deletes it and the gate is
// clear again.
func TestOverrideTightensAndExpires(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	td.apply(asnGen(0))
	td.wantGateClear()
	td.setOverride(maps.Override{Aggregate: asnAgg(0, 64500), Budget: rate(10, 5),
		Expires: time.Now().Add(10 * time.Second), Origin: maps.OriginShield})

	if got := td.burst("198.18.1.1", 20); got != 5 {
		t.Fatalf("AS64500 under an override of burst 5: %d of 20 passed", got)
	}
	if got := td.burst("198.19.1.1", 20); got != 20 {
		t.Fatalf("AS64501, no override: %d of 20 passed, want all", got)
	}
	list, err := td.m.Overrides.All()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Aggregate != asnAgg(0, 64500) || list[0].Budget.Count != 10 || list[0].Budget.Burst != 5 ||
		list[0].Origin != maps.OriginShield || time.Until(list[0].Expires) > 10*time.Second || time.Until(list[0].Expires) < 9*time.Second {
		t.Fatalf("overrides read back: %+v", list)
	}

	// Past the expiry (and the override's debt): the policy's burst.
	td.setClock(ovrStart + 11*time.Second)
	if got := td.burst("198.18.1.1", 150); got != 100 {
		t.Fatalf("after the expiry: %d of 150 passed, want the policy's burst of 100", got)
	}
	if list, err := td.m.Overrides.All(); err != nil || len(list) != 0 {
		t.Fatalf("overrides after the expiry: %v, %v; want none", list, err)
	}
	if n, err := td.m.Overrides.Prune(); err != nil || n != 1 {
		t.Fatalf("prune: %d, %v; want 1", n, err)
	}
	td.wantGateClear()
}

// sampleAll turns both samplers on in g (every drop, and every packet 1
// in 1) and opens their rings.
func (td *testDatapath) sampleAll(g *policy.Compiled) (drops, rates *maps.SampleReader) {
	td.tb.Helper()
	g.Samples = policy.Limit{Rate: policy.Rate{Count: 1_000_000_000, Per: time.Second}, Burst: 1_000_000_000}
	g.Sampling = policy.Sampling{OneIn: 1, MaxPerSecond: 1_000_000}
	var err error
	if drops, err = td.m.Samples.NewDropReader(); err != nil {
		td.tb.Fatal(err)
	}
	td.tb.Cleanup(func() { drops.Close() })
	if rates, err = td.m.Samples.NewRateReader(); err != nil {
		td.tb.Fatal(err)
	}
	td.tb.Cleanup(func() { rates.Close() })
	return drops, rates
}

// wantRefusedBy reads the samples of passed + dropped packets: a drop
// sample for each drop and a 1-in-N sample for every packet. Each drop
// must say reason, an aggregate refusal, and agg as the aggregate that
// refused (per-instance congestion needs it: an override's reason names
// its writer, not the aggregate); a pass no refusal.
func wantRefusedBy(t *testing.T, drops, rates *maps.SampleReader, passed, dropped int, reason maps.Reason, agg maps.ClassAgg) {
	t.Helper()
	check := func(ring string, s maps.Sample) {
		t.Helper()
		if s.Action != maps.ActDrop {
			if s.Refused != 0 {
				t.Errorf("%s: a passed packet says refused: %+v", ring, s)
			}
			return
		}
		if s.Reason != reason || s.Refused == 0 || s.RefusedAgg != agg || (s.Kind == maps.SampleDrop && !s.Refusal) {
			t.Errorf("%s: reason %s, refused %s by %s (refusal %v); want %s, refused by %s", ring,
				maps.ReasonName(s.Reason), maps.OutcomeName(s.Refused), maps.ClassAggName(s.RefusedAgg), s.Refusal,
				maps.ReasonName(reason), maps.ClassAggName(agg))
		}
	}
	for range dropped {
		s, _ := readOneFrame(t, drops)
		check("drop sample", s)
	}
	n := 0
	for range passed + dropped {
		s, _ := readOneFrame(t, rates)
		check("1-in-N sample", s)
		if s.Action == maps.ActDrop {
			n++
		}
	}
	if n != dropped {
		t.Errorf("1-in-N samples: %d drops, want %d", n, dropped)
	}
	requireRingEmpty(t, drops, "drop samples")
	requireRingEmpty(t, rates, "1-in-N samples")
}

// TestOverrideKinds: prefix, whole, ASN and global overrides limit their
// own aggregate instance, and aggregates a rule does not have are refused.
// Both samplers say which aggregate refused, under the reason that names
// the override's writer.
func TestOverrideKinds(t *testing.T) {
	exp := time.Now().Add(time.Hour)
	budget := rate(1, 2)
	t.Run("prefix", func(t *testing.T) {
		td := newTestDatapath(t, smallSizes)
		td.setClock(ovrStart)
		g := generation(policy.CompiledRule{ID: 0, Aggregate: policy.AggregateDerived, AggregateKey: policy.KeyBits{V4: 24, V6: 48}, PerPrefix: pkts(1000, 100)})
		drops, rates := td.sampleAll(&g)
		td.apply(g)
		a := maps.Aggregate{Kind: maps.AggKindPrefix, Prefix: netip.MustParsePrefix("198.18.1.0/24")}
		td.setOverride(maps.Override{Aggregate: a, Budget: budget, Expires: exp, Origin: maps.OriginCLI})
		if got := td.burst("198.18.1.5", 10); got != 2 {
			t.Fatalf("198.18.1.0/24 under an override of burst 2: %d of 10 passed", got)
		}
		wantRefusedBy(t, drops, rates, 2, 8, maps.ReasonOverride, maps.ClassAggPrefix)
		if got := td.burst("198.18.2.5", 10); got != 10 {
			t.Fatalf("198.18.2.0/24: %d of 10 passed, want all", got)
		}
		wantRefusedBy(t, drops, rates, 10, 0, maps.ReasonOverride, maps.ClassAggPrefix)
		wrong := maps.Aggregate{Kind: maps.AggKindPrefix, Prefix: netip.MustParsePrefix("198.18.0.0/16")}
		if err := td.m.Overrides.Set(maps.Override{Aggregate: wrong, Budget: budget, Expires: exp}); err == nil {
			t.Fatal("a /16 override of a rule with /24 aggregates was accepted")
		}
		if err := td.m.Overrides.Set(maps.Override{Aggregate: maps.Aggregate{Kind: maps.AggKindWhole}, Budget: budget, Expires: exp}); err == nil {
			t.Fatal("a whole override of a derived rule was accepted")
		}
	})
	t.Run("whole", func(t *testing.T) {
		td := newTestDatapath(t, smallSizes)
		td.setClock(ovrStart)
		g := generation(policy.CompiledRule{ID: 0, Aggregate: policy.AggregateWhole, PerPrefix: pkts(1000, 100)})
		drops, rates := td.sampleAll(&g)
		td.apply(g)
		td.setOverride(maps.Override{Aggregate: maps.Aggregate{Kind: maps.AggKindWhole}, Budget: budget, Expires: exp, Origin: maps.OriginFleet})
		if got := td.burst("198.18.1.5", 5) + td.burst("198.19.1.5", 5); got != 2 {
			t.Fatalf("whole aggregate under an override of burst 2: %d of 10 passed", got)
		}
		wantRefusedBy(t, drops, rates, 2, 8, maps.ReasonFleetShare, maps.ClassAggPrefix)
	})
	t.Run("asn new sources", func(t *testing.T) {
		// Refused by the shield's new-source part, not by the budget.
		td := newTestDatapath(t, smallSizes)
		td.setClock(ovrStart)
		g := asnGen(0)
		g.Standing = policy.Standing{EstablishedAfter: 30 * time.Second, Penalty: time.Hour}
		drops, rates := td.sampleAll(&g)
		td.apply(g)
		td.setOverride(maps.Override{Aggregate: asnAgg(0, 64500), NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 3},
			Expires: exp, Origin: maps.OriginShield})
		if got := td.newSources("198.18.2", 0); got != 3 {
			t.Fatalf("new sources under a new-source burst of 3: %d of 20 passed", got)
		}
		wantRefusedBy(t, drops, rates, 3, 17, maps.ReasonShieldTighten, maps.ClassAggASN)
	})
	t.Run("global", func(t *testing.T) {
		td := newTestDatapath(t, smallSizes)
		td.setClock(ovrStart)
		g := asnGen(7)
		g.Global = pkts(1000, 100)
		drops, rates := td.sampleAll(&g)
		td.apply(g)
		td.setOverride(maps.Override{Aggregate: maps.Aggregate{Kind: maps.AggKindGlobal}, Budget: budget, Expires: exp, Origin: maps.OriginShield})
		// Rule 7's and the default rule's packets share the global bucket.
		if got := td.burst("198.18.1.5", 5) + td.burst("203.0.113.5", 5); got != 2 {
			t.Fatalf("global under an override of burst 2: %d of 10 passed", got)
		}
		wantRefusedBy(t, drops, rates, 2, 8, maps.ReasonShieldTighten, maps.ClassAggGlobal)
	})
	t.Run("no policy budget", func(t *testing.T) {
		// Overrides change budgets the policy has, they add none.
		td := newTestDatapath(t, smallSizes)
		td.setClock(ovrStart)
		g := asnGen(0)
		g.Rules[0].PerASN = policy.Bucket{}
		td.apply(g)
		for _, a := range []maps.Aggregate{asnAgg(0, 64501), {Kind: maps.AggKindGlobal}} {
			if err := td.m.Overrides.Set(maps.Override{Aggregate: a, Budget: budget, Expires: exp}); err == nil {
				t.Errorf("override of %v, which has no budget, accepted", a)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		td := newTestDatapath(t, smallSizes)
		td.setClock(ovrStart)
		td.apply(asnGen(0))
		for name, o := range map[string]maps.Override{
			"unknown rule":     {Aggregate: asnAgg(99, 64500), Budget: budget, Expires: exp},
			"no expiry":        {Aggregate: asnAgg(0, 64500), Budget: budget},
			"past expiry":      {Aggregate: asnAgg(0, 64500), Budget: budget, Expires: time.Now().Add(-time.Second)},
			"no budget":        {Aggregate: asnAgg(0, 64500), Expires: exp},
			"asn 0":            {Aggregate: asnAgg(0, 0), Budget: budget, Expires: exp},
			"global with rule": {Aggregate: maps.Aggregate{RuleID: 3, Kind: maps.AggKindGlobal}, Budget: budget, Expires: exp},
			"no prefix":        {Aggregate: maps.Aggregate{Kind: maps.AggKindPrefix}, Budget: budget, Expires: exp},
			"bad kind":         {Aggregate: maps.Aggregate{Kind: 9}, Budget: budget, Expires: exp},
		} {
			err := td.m.Overrides.Set(o)
			if err == nil {
				t.Errorf("%s: accepted", name)
			}
			if name == "unknown rule" && !errors.Is(err, maps.ErrUnknownRule) {
				t.Errorf("unknown rule: %v, want ErrUnknownRule", err)
			}
		}
		if list, err := td.m.Overrides.All(); err != nil || len(list) != 0 {
			t.Fatalf("after refusals: %v, %v", list, err)
		}
		td.wantGateClear()
	})
}

// TestOverrideNewBudget: the new-source bucket charges new and penalised
// sources, never established or validated ones, and is charged in
// addition to the aggregate's own bucket.
func TestOverrideNewBudget(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	g := asnGen(0)
	g.Rules[0].PerASN = pkts(1000, 1000)
	g.Standing = policy.Standing{EstablishedAfter: 30 * time.Second, Penalty: time.Hour}
	td.apply(g)
	must(t, td.m.Standing.Set(netip.MustParseAddr("198.18.1.7"), maps.StandingValidated))
	must(t, td.m.Standing.Set(netip.MustParseAddr("198.18.1.8"), maps.StandingEstablished))
	must(t, td.m.Standing.Set(netip.MustParseAddr("198.18.1.9"), maps.StandingPenalised))
	td.setOverride(maps.Override{Aggregate: asnAgg(0, 64500), NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 3},
		Expires: time.Now().Add(time.Hour), Origin: maps.OriginShield})

	newPassed := 0
	for i := range 4 {
		newPassed += td.burst(fmt.Sprintf("198.18.2.%d", i+1), 5)
	}
	if newPassed != 3 {
		t.Fatalf("new sources under a new-source burst of 3: %d of 20 passed", newPassed)
	}
	if got := td.burst("198.18.1.9", 5); got != 0 {
		t.Fatalf("penalised source: %d of 5 passed, want 0 (the new-source bucket is empty)", got)
	}
	if got := td.burst("198.18.1.7", 50); got != 50 {
		t.Fatalf("validated source: %d of 50 passed, want all", got)
	}
	if got := td.burst("198.18.1.8", 50); got != 50 {
		t.Fatalf("established source: %d of 50 passed, want all", got)
	}
	if got := td.burst("198.19.2.1", 20); got != 20 {
		t.Fatalf("new source of AS64501: %d of 20 passed, want all", got)
	}
	// The aggregate's own bucket was charged by every admitted packet:
	// 3 + 50 + 50, so 897 are left of its burst of 1000 for AS64500.
	if got := td.burst("198.18.1.7", 1000); got != 897 {
		t.Fatalf("validated source after 103 admitted packets: %d passed, want 897", got)
	}

	// Replacing the override with the same new-source budget keeps its
	// bucket (still empty); a new budget starts it full.
	td.setOverride(maps.Override{Aggregate: asnAgg(0, 64500), NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 3},
		Budget: rate(1000, 1000), Expires: time.Now().Add(time.Hour), Origin: maps.OriginShield})
	td.setClock(ovrStart + 2*time.Second) // the aggregate refills; the new-source bucket (1/h) does not
	if got := td.burst("198.18.3.1", 5); got != 0 {
		t.Fatalf("replaced with the same new-source budget: %d passed, want 0", got)
	}
	td.setOverride(maps.Override{Aggregate: asnAgg(0, 64500), NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 2},
		Expires: time.Now().Add(time.Hour)})
	if got := td.burst("198.18.3.1", 5); got != 2 {
		t.Fatalf("new new-source budget of burst 2: %d passed", got)
	}
}

// TestOverrideNewBudgetNotChargedForRefusals: packets the aggregate itself
// refuses cost the new-source bucket nothing (the look before the charge
// refuses them; a refusal at the charge, a race with another CPU, gives
// the new-source charge back).
func TestOverrideNewBudgetNotChargedForRefusals(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	g := asnGen(0)
	g.Rules[0].PerASN = pkts(1, 2) // the aggregate admits 2
	td.apply(g)
	td.setOverride(maps.Override{Aggregate: asnAgg(0, 64500), NewBudget: maps.Rate{Count: 1, Per: time.Hour, Burst: 5},
		Expires: time.Now().Add(time.Hour)})
	if got := td.burst("198.18.2.1", 10); got != 2 {
		t.Fatalf("%d of 10 passed, want the aggregate's 2", got)
	}
	// The peek refuses before either bucket is charged; the remaining
	// three new-source packets are still there once the aggregate
	// refills (2 s at 1/s).
	td.setClock(ovrStart + 10*time.Second)
	if got := td.burst("198.18.2.1", 10); got != 2 {
		t.Fatalf("after the refill: %d of 10 passed, want 2", got)
	}
	td.setClock(ovrStart + 20*time.Second)
	if got := td.burst("198.18.2.1", 10); got != 1 {
		t.Fatalf("after the second refill: %d of 10 passed, want the last new-source packet", got)
	}
}

// TestOverridesSurviveReloadAndApply: overrides live in pinned maps; a
// restarted daemon's program enforces them; a policy swap keeps those of
// surviving rules and deletes the others.
func TestOverridesSurviveReloadAndApply(t *testing.T) {
	requireRoot(t)
	pinDir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("egdp-ovr-%d", os.Getpid()))
	t.Cleanup(func() { loader.Unpin(pinDir) })
	td := openPinnedTestDatapath(t, smallSizes, pinDir)
	td.setClock(ovrStart)
	td.apply(asnGen(7))
	td.setOverride(maps.Override{Aggregate: asnAgg(7, 64500), Budget: rate(1, 3), Expires: time.Now().Add(time.Hour)})
	must(t, td.m.Overrides.Watch(7, maps.AggKindASN, maps.OriginShield))
	if got := td.burst("198.18.1.1", 10); got != 3 {
		t.Fatalf("before the restart: %d of 10 passed, want 3", got)
	}
	td.d.Close()

	td = openPinnedTestDatapath(t, smallSizes, pinDir)
	td.setClock(ovrStart + 3*time.Second) // three more packets' worth
	if got := td.burst("198.18.1.1", 10); got != 3 {
		t.Fatalf("after the restart: %d of 10 passed, want 3", got)
	}
	// The same policy again: the rule survives, so does its override.
	td.apply(asnGen(7))
	td.setClock(ovrStart + 6*time.Second)
	if got := td.burst("198.18.1.1", 10); got != 3 {
		t.Fatalf("after re-applying the policy: %d of 10 passed, want 3", got)
	}
	// Rule 7 is gone: so are its override and its watch.
	td.apply(asnGen(8))
	list, err := td.m.Overrides.All()
	if err != nil || len(list) != 0 {
		t.Fatalf("overrides after rule 7 left: %v, %v", list, err)
	}
	td.wantGateClear()
	if got := td.burst("198.18.1.1", 50); got != 50 {
		t.Fatalf("rule 8 has no override: %d of 50 passed", got)
	}
}

// TestAggregateCounters: every instance of a watched (rule, kind) is
// counted, passed and dropped, exactly; unwatching stops it.
func TestAggregateCounters(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	g := asnGen(0)
	g.Rules[0].PerASN = pkts(1, 5)
	td.apply(g)
	must(t, td.m.Overrides.Watch(0, maps.AggKindASN, maps.OriginShield))
	must(t, td.m.Overrides.Watch(0, maps.AggKindGlobal, maps.OriginShield))
	if err := td.m.Overrides.Watch(0, maps.AggKindPrefix, maps.OriginShield); err == nil {
		t.Fatal("watching the prefix aggregates of a rule without any was accepted")
	}
	if err := td.m.Overrides.Watch(5, maps.AggKindASN, maps.OriginShield); !errors.Is(err, maps.ErrUnknownRule) {
		t.Fatalf("watching an unknown rule: %v, want ErrUnknownRule", err)
	}
	td.burst("198.18.1.1", 10)
	td.burst("198.19.1.1", 3)
	td.burst("203.0.113.1", 2) // no ASN: global only

	read := func() map[string][2]uint64 {
		t.Helper()
		cs, err := td.m.Overrides.AggregateCounters()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][2]uint64{}
		for _, c := range cs {
			out[c.Aggregate.String()] = [2]uint64{c.Passed.Packets, c.Dropped.Packets}
		}
		return out
	}
	got := read()
	want := map[string][2]uint64{"rule 0 asn 64500": {5, 5}, "rule 0 asn 64501": {3, 0}, "global": {10, 5}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("aggregate counters %v, want %v", got, want)
	}
	must(t, td.m.Overrides.Unwatch(0, maps.AggKindASN, maps.OriginShield))
	td.burst("198.18.1.1", 1)
	got = read()
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if fmt.Sprint(keys) != "[global]" || got["global"] != [2]uint64{10, 6} {
		t.Fatalf("after unwatching the ASN aggregates: %v", got)
	}
	must(t, td.m.Overrides.Unwatch(0, maps.AggKindGlobal, maps.OriginShield))
	td.wantGateClear()
}

// TestOverrideBytes: an override's byte budget (fleet mode's share of a
// byte budget) is enforced in the byte dimension, alongside its packet
// budget; a dimension the override leaves zero is not limited while it is
// in force (the override replaces the whole budget, so fleet mode writes
// both), and Overrides reads the byte budget back.
func TestOverrideBytes(t *testing.T) {
	// The policy: 1000/s (burst 100) and 100 kB/s with a burst of 110
	// frames: td.burst's 52-byte frames meet the packet burst first, and
	// the byte burst above it (so an override without bytes shows).
	const frame = 14 + 20 + 8 + 10
	both := policy.Bucket{Packets: perSecond(1000, 100),
		Bytes: policy.Limit{Rate: policy.Rate{Count: 100_000, Per: time.Second}, Burst: 110 * frame}}
	for _, c := range []struct {
		name          string
		budget, bytes maps.Rate
		want          int
	}{
		{"packets and bytes, bytes bind", rate(1000, 100), rate(100*frame, 10*frame), 10},
		{"packets and bytes, packets bind", rate(1000, 4), rate(100*frame, 10*frame), 4},
		{"bytes only: packets unlimited meanwhile", maps.Rate{}, rate(1000*frame, 150*frame), 150},
		{"packets only: bytes unlimited meanwhile", rate(1000, 120), maps.Rate{}, 120},
	} {
		t.Run(c.name, func(t *testing.T) {
			td := newTestDatapath(t, smallSizes)
			td.setClock(ovrStart)
			g := generation(policy.CompiledRule{ID: 0, PerASN: both})
			td.apply(withPrefixes(g, fact("198.18.0.0/16", 0, 64500), fact("198.19.0.0/16", 0, 64501)))
			td.setOverride(maps.Override{Aggregate: asnAgg(0, 64500), Budget: c.budget, Bytes: c.bytes,
				Expires: time.Now().Add(10 * time.Second), Origin: maps.OriginFleet})
			if got := td.burst("198.18.1.1", 200); got != c.want {
				t.Errorf("AS64500 under the override: %d of 200 passed, want %d", got, c.want)
			}
			if got := td.burst("198.19.1.1", 200); got != 100 {
				t.Errorf("AS64501, the policy's budget: %d of 200 passed, want the packet burst of 100", got)
			}
			list, err := td.m.Overrides.All()
			if err != nil || len(list) != 1 || list[0].Bytes.Count != c.bytes.Count || list[0].Bytes.Burst != c.bytes.Burst ||
				list[0].Budget.Count != c.budget.Count {
				t.Errorf("read back %+v (%v), want budget %+v and bytes %+v", list, err, c.budget, c.bytes)
			}
		})
	}
}
