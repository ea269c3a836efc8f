package loader_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

// clearOverrides deletes every override the program holds (a fresh model
// has none). Stale gate bits only cost a lookup that misses.
func clearOverrides(td *testDatapath) {
	td.tb.Helper()
	o := &td.d.Objects
	var k loader.LimiterEgAggKey
	var v loader.LimiterEgOverride
	var keys []loader.LimiterEgAggKey
	for it := o.Overrides.Iterate(); it.Next(&k, &v); {
		keys = append(keys, k)
	}
	for _, k := range keys {
		if err := o.Overrides.Delete(k); err != nil {
			td.tb.Fatalf("clear overrides: %v", err)
		}
	}
}

// programOverrides reads the overrides table as it is.
func (h *diffHarness) programOverrides() map[refmodel.AggKey]refmodel.Override {
	h.tb.Helper()
	out := map[refmodel.AggKey]refmodel.Override{}
	var k loader.LimiterEgAggKey
	var v loader.LimiterEgOverride
	it := h.td.d.Objects.Overrides.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		h.tb.Fatal(err)
	}
	return out
}

// checkOverrides compares the override tables, new-source buckets included.
func (h *diffHarness) checkOverrides(when string) {
	h.tb.Helper()
	prog, model := h.programOverrides(), h.model.Overrides()
	if !reflect.DeepEqual(prog, model) {
		s := ""
		for k, v := range prog {
			if mv, ok := model[k]; !ok || mv != v {
				s += fmt.Sprintf("  %+v: program %+v, model %+v (present %v)\n", k, v, mv, ok)
			}
		}
		for k, v := range model {
			if _, ok := prog[k]; !ok {
				s += fmt.Sprintf("  %+v: only in the model: %+v\n", k, v)
			}
		}
		h.fail("%s: overrides differ (program %d, model %d):\n%s", when, len(prog), len(model), s)
	}
}

// randAggregates are the aggregates of g an override may name: the global
// bucket, the ASN aggregates of the ASN and ICMP rules, the whole
// aggregates, and derived prefix aggregates the frames fall in. Some have
// no budget in g: maps refuses those, and so they are skipped.
func randAggregates(g policy.Compiled) []maps.Aggregate {
	out := []maps.Aggregate{{Kind: maps.AggKindGlobal}}
	for _, r := range g.Rules {
		for _, asn := range []uint32{64496, 64497, 64500, 64501} {
			out = append(out, maps.Aggregate{RuleID: r.ID, Kind: maps.AggKindASN, ASN: asn})
		}
		out = append(out, maps.Aggregate{RuleID: r.ID, Kind: maps.AggKindWhole})
		if r.Aggregate == policy.AggregateDerived {
			for _, a := range []string{"198.18.1.1", "198.18.2.9", "198.18.3.3", "198.18.9.20"} {
				out = append(out, maps.Aggregate{RuleID: r.ID, Kind: maps.AggKindPrefix,
					Prefix: netip.PrefixFrom(netip.MustParseAddr(a), int(r.AggregateKey.V4)).Masked()})
			}
			for _, a := range []string{"fd00:1::1", "fd00:1:1::1", "fd00:4::1"} {
				out = append(out, maps.Aggregate{RuleID: r.ID, Kind: maps.AggKindPrefix,
					Prefix: netip.PrefixFrom(netip.MustParseAddr(a), int(r.AggregateKey.V6)).Masked()})
			}
		}
	}
	return out
}

// installOverrides writes up to n random overrides of g's aggregates to
// the program at ns, then gives the model what the program holds for each
// (the compiled value; the model keeps its own new-source buckets).
func (h *diffHarness) installOverrides(r *rand.Rand, g policy.Compiled, ns uint64, n int) int {
	h.tb.Helper()
	if err := h.td.m.SetTestClock(ns); err != nil {
		h.tb.Fatal(err)
	}
	cands := randAggregates(g)
	installed := 0
	for range n {
		o := maps.Override{Aggregate: cands[r.IntN(len(cands))], Origin: pick(r, maps.OriginShield, maps.OriginFleet),
			Expires: time.Now().Add(pick(r, 2*time.Second, 5*time.Second, time.Hour, time.Hour))}
		if r.IntN(3) != 0 {
			o.Budget = maps.Rate{Count: pick(r, uint64(2), 10, 100), Per: time.Second, Burst: pick(r, uint64(1), 3, 10)}
		}
		if o.Budget.Count == 0 || r.IntN(3) != 0 {
			// Tight, or loose under a tight budget: the aggregate then
			// refuses what the new-source bucket took (the refund).
			o.NewBudget = maps.Rate{Count: pick(r, uint64(1), 5, 50, 1000), Per: time.Second, Burst: pick(r, uint64(1), 2, 5, 50)}
		}
		if err := h.td.m.Overrides.Set(o); err != nil {
			continue // an aggregate g has no budget for
		}
		installed++
		h.log = append(h.log, fmt.Sprintf("override %v: budget %+v new %+v", o.Aggregate, o.Budget, o.NewBudget))
	}
	if h.programOnly {
		return installed
	}
	for k, v := range h.programOverrides() {
		if old, ok := h.model.Overrides()[k]; !ok || old.Expires != v.Expires || old.NewExpires != v.NewExpires || old.Budget != v.Budget || old.NewBudget != v.NewBudget || old.Origin != v.Origin {
			h.model.SetOverride(k, v)
		}
	}
	h.checkOverrides("after installing overrides")
	return installed
}

// runDiffOverrides is runDiff with random aggregate overrides and
// fingerprint rules: installed at the start, more half way after the
// policy swap (which drops the overrides of rules gone or without the
// budget), and more or replaced three quarters in; some expire during the
// run (the timeline spans about 30 s).
func runDiffOverrides(h *diffHarness, seed uint64, n int) map[string]int {
	h.tb.Helper()
	r := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	h.td.m.Generations.SetV4DirectMinFacts(0)
	g := randPolicy(r)
	g.Samples = everyDrop
	clearOverrides(h.td)
	clearFingerprints(h.td)
	h.reset(g, randLists(r))
	seen := map[string]int{}
	ns := diffStart
	seen["overrides_installed"] += h.installOverrides(r, g, ns, 24)
	seen["fingerprints_installed"] += h.installFingerprints(r, ns, 6)
	for i := range n {
		switch i {
		case n / 2:
			g = randPolicy(r)
			g.Samples = everyDrop
			h.swap(g)
			h.checkOverrides("after the policy swap")
			seen["overrides_installed"] += h.installOverrides(r, g, ns, 16)
			seen["fingerprints_installed"] += h.installFingerprints(r, ns, 3)
		case 3 * n / 4:
			seen["overrides_installed"] += h.installOverrides(r, g, ns, 16)
			seen["fingerprints_installed"] += h.installFingerprints(r, ns, 3)
		}
		ns += randAdvance(r)
		v := h.step(randFrame(r), ns)
		seen[maps.ActionName(v.Action)]++
		seen[maps.ReasonName(v.Reason)]++
	}
	h.checkState()
	h.checkOverrides("at the end")
	h.checkFingerprints("at the end")
	for _, st := range h.model.FingerprintStats() {
		seen["fingerprint_matched"] += int(st.Matched.Packets)
		seen["fingerprint_spared"] += int(st.Spared.Packets)
		seen["fingerprint_dropped"] += int(st.Dropped.Packets)
	}
	for _, o := range h.model.Overrides() {
		if o.NewBucket != (refmodel.Bucket{}) {
			seen["new_source_buckets_charged"]++
		}
		if (o.Expires != 0 && o.Expires <= ns) || (o.NewExpires != 0 && o.NewExpires <= ns) {
			seen["overrides_expired"]++
		}
		if o.Expires != 0 && o.NewExpires != 0 && o.Expires != o.NewExpires {
			seen["override_parts_apart"]++
		}
	}
	return seen
}

// TestDifferentialOverrides: TestDifferential's random runs with random
// aggregate overrides (budget replacement, new-source buckets and their
// refund, expiry, pruning by a policy swap) and fingerprint rules (match
// by mask order, bucket, dry run, validated sources spared, replacement,
// expiry) on both sides: every verdict, counter, bucket, override,
// fingerprint bucket and fingerprint counter must agree, and every drop
// sample must say the model's reason and which aggregate refused. EDGEGUARD_DIFF_SEED=N runs seed
// N alone (the seeds run are printed).
func TestDifferentialOverrides(t *testing.T) {
	h := newDiffHarness(t)
	drops, err := h.td.m.Samples.NewDropReader()
	if err != nil {
		t.Fatal(err)
	}
	defer drops.Close()
	h.drops = drops
	seeds := diffSeeds(t, 101, 102, 103, 104, 105, 106)
	seen := map[string]int{}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			h.use(t)
			t.Logf("seed %d (EDGEGUARD_DIFF_SEED=%d to rerun)", seed, seed)
			for k, n := range runDiffOverrides(h, seed, 1000) {
				seen[k] += n
			}
		})
	}
	h.use(t)
	clearOverrides(h.td)
	clearFingerprints(h.td)
	t.Logf("seen: %v", seen)
	t.Logf("drop samples: %v", h.sampled)
	under := 0
	for k, n := range h.sampled {
		for _, r := range []maps.Reason{maps.ReasonShieldTighten, maps.ReasonFleetShare, maps.ReasonOverride} {
			if strings.HasPrefix(k, "sampled_"+maps.ReasonName(r)+"_by_") {
				under += n
			}
		}
	}
	if under == 0 {
		t.Error("no drop sample of a refusal under an override was checked")
	}
	if len(seeds) > 1 {
		for _, k := range []string{"overrides_installed", "new_source_buckets_charged", "overrides_expired", "override_parts_apart", "prefix_limit", "asn_limit", "global_limit",
			"fingerprints_installed", "fingerprint_matched", "fingerprint_spared", "fingerprint_dropped", "fingerprint",
			"shield_tighten", "fleet_share"} {
			if seen[k] == 0 {
				t.Errorf("no run reached %s", k)
			}
		}
	}
}

// clearFingerprints deletes every fingerprint the program holds (and so
// its masks).
func clearFingerprints(td *testDatapath) {
	td.tb.Helper()
	var k loader.LimiterEgFpKey
	var v loader.LimiterEgFpVal
	ids := map[uint32]bool{}
	for it := td.d.Objects.FpRules.Iterate(); it.Next(&k, &v); {
		ids[v.Id] = true
	}
	for id := range ids {
		if err := td.m.Fingerprints.Delete(id); err != nil {
			td.tb.Fatalf("clear fingerprints: %v", err)
		}
	}
	// Counters of ids whose key another id took over stay (as in the
	// model): a fresh model has none.
	var id uint32
	var per []loader.LimiterEgFpStats
	var stale []uint32
	for it := td.d.Objects.FpStats.Iterate(); it.Next(&id, &per); {
		stale = append(stale, id)
	}
	for _, id := range stale {
		if err := td.d.Objects.FpStats.Delete(id); err != nil {
			td.tb.Fatalf("clear fingerprint counters: %v", err)
		}
	}
}

// programFingerprints reads the fingerprint table, its masks (in order)
// and its counters summed over CPUs.
func (h *diffHarness) programFingerprints() (map[refmodel.FpKey]refmodel.FpVal, []refmodel.FpMask, map[uint32]refmodel.FpStats) {
	h.tb.Helper()
	o := &h.td.d.Objects
	rules := map[refmodel.FpKey]refmodel.FpVal{}
	var k loader.LimiterEgFpKey
	var v loader.LimiterEgFpVal
	it := o.FpRules.Iterate()
	for it.Next(&k, &v) {
		rules[k] = v
	}
	if err := it.Err(); err != nil {
		h.tb.Fatal(err)
	}
	var fm loader.LimiterEgFpMasks
	if err := o.FpMasks.Lookup(uint32(0), &fm); err != nil {
		h.tb.Fatal(err)
	}
	var masks []refmodel.FpMask
	for i := 0; i < int(min(fm.N, uint32(len(fm.Fields)))); i++ {
		masks = append(masks, refmodel.FpMask{Fields: fm.Fields[i], SrcLen: fm.SrcLen[i]})
	}
	stats := map[uint32]refmodel.FpStats{}
	var id uint32
	var per []loader.LimiterEgFpStats
	sit := o.FpStats.Iterate()
	for sit.Next(&id, &per) {
		var sum refmodel.FpStats
		for _, c := range per {
			for _, p := range [][2]*loader.LimiterEgCounter{{&sum.Matched, &c.Matched}, {&sum.Dropped, &c.Dropped}, {&sum.Spared, &c.Spared}} {
				p[0].Packets += p[1].Packets
				p[0].Bytes += p[1].Bytes
			}
		}
		stats[id] = sum
	}
	if err := sit.Err(); err != nil {
		h.tb.Fatal(err)
	}
	return rules, masks, stats
}

// checkFingerprints compares the fingerprint tables (buckets included)
// and counters.
func (h *diffHarness) checkFingerprints(when string) {
	h.tb.Helper()
	rules, _, stats := h.programFingerprints()
	if mr := h.model.FingerprintRules(); !reflect.DeepEqual(rules, mr) {
		h.fail("%s: fingerprint rules differ:\n  program %+v\n  model   %+v", when, rules, mr)
	}
	if ms := h.model.FingerprintStats(); !reflect.DeepEqual(stats, ms) {
		h.fail("%s: fingerprint counters differ:\n  program %+v\n  model   %+v", when, stats, ms)
	}
}

// installFingerprints writes up to n random fingerprints (ids 1-8, so
// some replace others) to the program at ns, over fields the random frames
// have, and gives the model the masks and each fingerprint as written.
func (h *diffHarness) installFingerprints(r *rand.Rand, ns uint64, n int) int {
	h.tb.Helper()
	if err := h.td.m.SetTestClock(ns); err != nil {
		h.tb.Fatal(err)
	}
	installed := 0
	for range n {
		f := maps.Fingerprint{ID: uint32(1 + r.IntN(8)), Origin: maps.OriginShield, DryRun: r.IntN(4) == 0,
			Expires: time.Now().Add(pick(r, 3*time.Second, time.Hour, time.Hour))}
		switch r.IntN(7) {
		case 0:
			f.Mask, f.Proto = maps.FieldProto, pick[uint8](r, 6, 17, 1)
		case 1:
			f.Mask, f.Proto, f.DPort = maps.FieldProto|maps.FieldDPort, pick[uint8](r, 6, 17), pick[uint16](r, 53, 80, 123)
		case 2:
			f.Mask, f.SPort = maps.FieldSPort, pick[uint16](r, 123, 40000, 80)
		case 3:
			f.Mask, f.Src = maps.FieldSrc, pick(r, netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("fd00:1::/32"), netip.MustParsePrefix("203.0.113.0/24"))
		case 4:
			f.Mask, f.Proto, f.TTL = maps.FieldProto|maps.FieldTTL, pick[uint8](r, 6, 17), pick[uint8](r, 64, 63)
		case 5:
			f.Mask, f.Proto, f.TCPFlags, f.Src = maps.FieldProto|maps.FieldTCPFlags|maps.FieldSrc, 6, 0, netip.MustParsePrefix("198.18.0.0/16")
		case 6: // refuses all of 198.18.1/24, whose 198.18.1.7 is validated: spared
			f.Mask, f.Src, f.DryRun = maps.FieldSrc, netip.MustParsePrefix("198.18.1.0/24"), false
		}
		if r.IntN(4) != 0 && f.Src.Bits() != 24 {
			f.Budget = maps.Rate{Count: pick(r, uint64(2), 20, 200), Per: time.Second, Burst: pick(r, uint64(1), 5, 20)}
		}
		if err := h.td.m.Fingerprints.Set(f); err != nil {
			h.log = append(h.log, fmt.Sprintf("fingerprint %d refused: %v", f.ID, err))
			continue
		}
		installed++
		h.log = append(h.log, fmt.Sprintf("fingerprint %d: %+v", f.ID, f))
		if h.programOnly {
			continue
		}
		rules, masks, _ := h.programFingerprints()
		h.model.SetFingerprintMasks(masks)
		for k, v := range rules {
			if v.Id == f.ID {
				h.model.SetFingerprint(k, v)
			}
		}
	}
	if !h.programOnly {
		h.checkFingerprints("after installing fingerprints")
	}
	return installed
}
