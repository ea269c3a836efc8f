package loader_test

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

// diffSizes are small tables: a differential run creates at most a few
// hundred buckets, far below any LRU eviction.
var diffSizes = loader.Sizes{MaxRules: 64, SrcEntries: 8192, AggEntries: 8192, PrefixEntries: 1024, ListEntries: 256, L4Entries: 64}

// diffHarness runs the same frames through the program and the reference
// model and fails on the first difference.
type diffHarness struct {
	tb        testing.TB
	td        *testDatapath
	model     *refmodel.Model
	base      maps.Counters
	baseRules map[uint32]maps.RuleCounters
	baseClass maps.ClassCounters
	baseEv    maps.StandingCounts
	log       []string // the run so far, printed on a difference
	// programOnly: state is installed in the program alone (the explain
	// test loads its models from the program's maps).
	programOnly bool
	// drops, when set, is the drop-sample ring of a policy that samples
	// every drop (everyDrop): step reads each packet's sample and holds it
	// to the model's verdict and refusal.
	drops   *maps.SampleReader
	sampled map[string]int // drop samples checked, by what they said
}

// everyDrop is a drop-sample budget no run reaches.
var everyDrop = policy.Limit{Rate: policy.Rate{Count: 1_000_000_000, Per: time.Second}, Burst: 1_000_000_000}

// checkDropSample compares the drop sample of the packet just run (none
// for a pass, a deny-list drop or a malformed frame) with the model's
// verdict: its reason, and which aggregate refused it (an override's
// reason does not say; per-instance congestion reads it).
func (h *diffHarness) checkDropSample(want refmodel.Verdict) {
	h.tb.Helper()
	h.drops.SetDeadline(time.Now())
	s, err := h.drops.Read()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if want.Refused != 0 {
			h.fail("packet %d: the model's %s (refused by %s) has no drop sample", len(h.log), want, maps.ClassAggName(want.RefusedAgg))
		}
		return
	}
	if err != nil {
		h.tb.Fatalf("read drop sample: %v", err)
	}
	if s.Reason != want.Reason || s.Action != want.Action || s.Refused != want.Refused ||
		(want.Refused != 0 && s.RefusedAgg != want.RefusedAgg) {
		h.fail("packet %d: drop sample %s/%s refused %s by %s; model %s refused %s by %s", len(h.log),
			maps.ActionName(s.Action), maps.ReasonName(s.Reason), maps.OutcomeName(s.Refused), maps.ClassAggName(s.RefusedAgg),
			want, maps.OutcomeName(want.Refused), maps.ClassAggName(want.RefusedAgg))
	}
	if h.sampled == nil {
		h.sampled = map[string]int{}
	}
	h.sampled["drop_samples"]++
	if s.Refused != 0 {
		h.sampled["sampled_"+maps.ReasonName(s.Reason)+"_by_"+maps.ClassAggName(s.RefusedAgg)]++
	}
}

func newDiffHarness(tb testing.TB) *diffHarness {
	return &diffHarness{tb: tb, td: newTestDatapath(tb, diffSizes)}
}

// use makes failures go to tb (a subtest or a fuzz input).
func (h *diffHarness) use(tb testing.TB) {
	h.tb = tb
	h.td.tb = tb
}

// reset empties the program's bucket tables, applies g and lists to both
// sides and starts a fresh model; counters are compared from here on.
func (h *diffHarness) reset(g policy.Compiled, lists []maps.ListEntry) {
	h.tb.Helper()
	clearTables(h.td)
	h.td.apply(g)
	if err := h.td.m.Lists.Set(lists); err != nil {
		h.tb.Fatalf("set lists: %v", err)
	}
	h.model = refmodel.New(diffSizes.MaxRules, diffSizes.SrcEntries)
	if err := h.model.Apply(&g); err != nil {
		h.tb.Fatalf("model apply: %v", err)
	}
	if err := h.model.SetLists(lists); err != nil {
		h.tb.Fatalf("model set lists: %v", err)
	}
	// One validated, one validated by a handshake only (ranks as new) and
	// one penalised source, on both sides.
	for _, s := range []struct {
		addr string
		st   maps.Standing
		why  maps.StandingWhy
	}{{"198.18.1.7", maps.StandingValidated, maps.WhySet}, {"198.18.1.6", maps.StandingValidated, maps.WhyTCP},
		{"198.18.2.9", maps.StandingPenalised, maps.WhySet}} {
		k := maps.StandingKey(netip.MustParseAddr(s.addr))
		v := loader.LimiterEgStandingVal{Since: diffStart, CleanSince: diffStart, LastSeen: diffStart, Standing: uint8(s.st), Why: uint8(s.why)}
		if err := h.td.d.Objects.Standing.Put(k, v); err != nil {
			h.tb.Fatalf("set standing: %v", err)
		}
		h.model.SetStanding(k, s.st, s.why, diffStart)
	}
	h.base = h.td.counters()
	h.baseRules = h.ruleCounters()
	var err error
	if h.baseClass, err = h.td.m.Standing.ClassCounters(); err != nil {
		h.tb.Fatal(err)
	}
	if h.baseEv, err = h.td.m.Standing.Counts(); err != nil {
		h.tb.Fatal(err)
	}
	h.log = h.log[:0]
}

// clearTables empties the bucket tables (per-source, aggregates, whole
// aggregates, global)
// and the new-source filter.
func clearTables(td *testDatapath) {
	td.tb.Helper()
	o := &td.d.Objects
	var sk loader.LimiterEgSrcKey
	var ak loader.LimiterEgAggKey
	var b loader.LimiterEgBucket
	var sb loader.LimiterEgSrcBucket
	var srcKeys []loader.LimiterEgSrcKey
	for it := o.SrcBuckets.Iterate(); it.Next(&sk, &sb); {
		srcKeys = append(srcKeys, sk)
	}
	for _, k := range srcKeys {
		if err := o.SrcBuckets.Delete(k); err != nil {
			td.tb.Fatalf("clear src_buckets: %v", err)
		}
	}
	var aggKeys []loader.LimiterEgAggKey
	for it := o.AggBuckets.Iterate(); it.Next(&ak, &b); {
		aggKeys = append(aggKeys, ak)
	}
	for _, k := range aggKeys {
		if err := o.AggBuckets.Delete(k); err != nil {
			td.tb.Fatalf("clear agg_buckets: %v", err)
		}
	}
	n := o.WholeBuckets.MaxEntries()
	slots := make([]uint32, n)
	for i := range slots {
		slots[i] = uint32(i)
	}
	if _, err := o.WholeBuckets.BatchUpdate(slots, make([]loader.LimiterEgBucket, n), nil); err != nil {
		td.tb.Fatalf("clear whole_buckets: %v", err)
	}
	for slot := uint32(0); slot < 2; slot++ {
		if err := o.GlobalBuckets.Put(slot, loader.LimiterEgBucket{}); err != nil {
			td.tb.Fatalf("clear global_buckets: %v", err)
		}
	}
	var stk loader.LimiterEgStandingKey
	var stv loader.LimiterEgStandingVal
	var stKeys []loader.LimiterEgStandingKey
	for it := o.Standing.Iterate(); it.Next(&stk, &stv); {
		stKeys = append(stKeys, stk)
	}
	for _, k := range stKeys {
		if err := o.Standing.Delete(k); err != nil {
			td.tb.Fatalf("clear standing: %v", err)
		}
	}
	// The new-source filter is state too: a fresh model starts empty.
	n = o.SeenFilter.MaxEntries()
	keys := make([]uint32, n)
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := o.SeenFilter.BatchUpdate(keys, make([]uint64, n), nil); err != nil {
		td.tb.Fatalf("clear seen_filter: %v", err)
	}
}

// swap applies a new generation to both sides mid-run.
func (h *diffHarness) swap(g policy.Compiled) {
	h.tb.Helper()
	h.td.apply(g)
	if err := h.model.Apply(&g); err != nil {
		h.tb.Fatalf("model apply: %v", err)
	}
	h.log = append(h.log, "apply a new generation")
}

func (h *diffHarness) ruleCounters() map[uint32]maps.RuleCounters {
	h.tb.Helper()
	rc, err := h.td.m.Counters.Rules(h.model.RuleIDs())
	if err != nil {
		h.tb.Fatal(err)
	}
	return rc
}

// programCounters returns the program's counters since the last reset.
func (h *diffHarness) programCounters() maps.Counters {
	c := h.td.counters()
	for a := range c {
		for r := range c[a] {
			c[a][r].Packets -= h.base[a][r].Packets
			c[a][r].Bytes -= h.base[a][r].Bytes
		}
	}
	return c
}

func (h *diffHarness) fail(format string, args ...any) {
	h.tb.Helper()
	start := max(0, len(h.log)-12)
	h.tb.Fatalf("%s\nlast steps:\n%s", fmt.Sprintf(format, args...), joinLines(h.log[start:]))
}

func joinLines(s []string) string {
	out := ""
	for _, l := range s {
		out += "  " + l + "\n"
	}
	return out
}

// step sends one frame at ns through both and compares the XDP action and
// every counter, so the (action, reason) of this packet must agree.
//
// BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header
// (EINVAL) and splits long ones, so those are not sent to either side.
func (h *diffHarness) step(frame []byte, ns uint64) refmodel.Verdict {
	h.tb.Helper()
	if len(frame) < minTestRunFrame || len(frame) > maxTestRunLinear {
		h.log = append(h.log, fmt.Sprintf("skip a %d-byte frame: BPF_PROG_TEST_RUN cannot send it whole", len(frame)))
		return refmodel.Verdict{}
	}
	if err := h.td.m.SetTestClock(ns); err != nil {
		h.tb.Fatalf("set clock: %v", err)
	}
	got := h.td.run(frame)
	want := h.model.Run(frame, ns)
	h.log = append(h.log, fmt.Sprintf("t=%dns len=%d model=%s frame=%s", ns, len(frame), want, hex.EncodeToString(frame[:min(len(frame), 96)])))
	wantRet := uint32(xdpPass)
	if !want.Passes() {
		wantRet = xdpDrop
	}
	if got != wantRet {
		h.fail("packet %d: program returned %d, model says %s (XDP %d)", len(h.log), got, want, wantRet)
	}
	// Each packet is counted exactly once, so the program counted this one
	// where the model did iff that one cell moved with the model: one map
	// read per packet instead of all of them (all are compared at the end).
	mc := h.model.Counters()
	if got := h.programCell(want.Action, want.Reason); got != mc[want.Action][want.Reason] {
		h.fail("packet %d: model counted %s, the program did not (program %+v, model %+v); all counters:\n%s",
			len(h.log), want, got, mc[want.Action][want.Reason], counterDiff(h.programCounters(), mc))
	}
	if h.drops != nil {
		h.checkDropSample(want)
	}
	return want
}

func counterDiff(prog, model maps.Counters) string {
	s := ""
	for a := range prog {
		for r := range prog[a] {
			if prog[a][r] != model[a][r] {
				s += fmt.Sprintf("  %s/%s: program %+v, model %+v\n",
					maps.ActionName(maps.Action(a)), maps.ReasonName(maps.Reason(r)), prog[a][r], model[a][r])
			}
		}
	}
	return s
}

// programCell reads one (action, reason) counter since the last reset.
func (h *diffHarness) programCell(a maps.Action, r maps.Reason) maps.Counter {
	h.tb.Helper()
	var per []loader.LimiterEgCounter
	idx := uint32(a)*uint32(loader.LimiterEgReasonEG_R_MAX) + uint32(r)
	if err := h.td.d.Objects.Stats.Lookup(idx, &per); err != nil {
		h.tb.Fatalf("read counter %d: %v", idx, err)
	}
	var c maps.Counter
	for _, p := range per {
		c.Packets += p.Packets
		c.Bytes += p.Bytes
	}
	c.Packets -= h.base[a][r].Packets
	c.Bytes -= h.base[a][r].Bytes
	return c
}

// checkState compares all counters, rule counters and every bucket table.
func (h *diffHarness) checkState() {
	h.tb.Helper()
	if pc, mc := h.programCounters(), h.model.Counters(); pc != mc {
		h.fail("counters differ:\n%s", counterDiff(pc, mc))
	}
	now := h.ruleCounters()
	want := h.model.RuleCounters()
	for id := range now {
		var got maps.RuleCounters
		for a := range got {
			got[a].Packets = now[id][a].Packets - h.baseRules[id][a].Packets
			got[a].Bytes = now[id][a].Bytes - h.baseRules[id][a].Bytes
		}
		if got != want[id] {
			h.fail("rule %d counters: program %+v, model %+v", id, got, want[id])
		}
	}
	o := &h.td.d.Objects
	var sk refmodel.SrcKey
	var ak refmodel.AggKey
	var b refmodel.Bucket
	src := map[refmodel.SrcKey]refmodel.Bucket{}
	var sb loader.LimiterEgSrcBucket
	for it := o.SrcBuckets.Iterate(); it.Next(&sk, &sb); {
		src[sk] = sb.B
	}
	if ms := h.model.SrcBuckets(); !reflect.DeepEqual(src, ms) {
		h.fail("src_buckets differ: program has %d entries, model %d\n%s", len(src), len(ms), bucketDiff(src, ms))
	}
	agg := map[refmodel.AggKey]refmodel.Bucket{}
	for it := o.AggBuckets.Iterate(); it.Next(&ak, &b); {
		agg[ak] = b
	}
	if ma := h.model.AggBuckets(); !reflect.DeepEqual(agg, ma) {
		h.fail("agg_buckets differ: program has %d entries, model %d\n%s", len(agg), len(ma), bucketDiff(agg, ma))
	}
	// Whole aggregates: the program keeps them by slot, the model by rule
	// id. Every live rule's slot must hold the model's bucket (zero when
	// the model has none); slots of rules that left keep stale state, as
	// agg_buckets entries did, and are not compared.
	slots, err := h.td.m.Generations.RuleSlots()
	if err != nil {
		h.tb.Fatal(err)
	}
	mw := h.model.WholeBuckets()
	whole := map[uint32]refmodel.Bucket{}
	for _, id := range h.model.RuleIDs() {
		slot, ok := slots[id]
		if !ok {
			h.tb.Fatalf("rule %d has no slot in the program", id)
		}
		if err := o.WholeBuckets.Lookup(slot, &b); err != nil {
			h.tb.Fatalf("read whole_buckets[%d]: %v", slot, err)
		}
		if _, touched := mw[id]; touched || b != (refmodel.Bucket{}) {
			whole[id] = b
		}
	}
	if !reflect.DeepEqual(whole, mw) {
		h.fail("whole_buckets differ: program has %d non-empty live slots, model %d\n%s", len(whole), len(mw), bucketDiff(whole, mw))
	}
	if err := o.GlobalBuckets.Lookup(uint32(0), &b); err != nil {
		h.tb.Fatal(err)
	}
	if mg := h.model.GlobalBucket(); b != mg {
		h.fail("global bucket: program %+v, model %+v", b, mg)
	}
	// Standing: the table, the class counters and the events.
	st := map[refmodel.StandingKey]refmodel.StandingVal{}
	var stk refmodel.StandingKey
	var stv refmodel.StandingVal
	for it := o.Standing.Iterate(); it.Next(&stk, &stv); {
		st[stk] = stv
	}
	if ms := h.model.Standing(); !reflect.DeepEqual(st, ms) {
		n := 0
		for k, v := range st {
			if mv, ok := ms[k]; (!ok || mv != v) && n < 10 {
				h.log = append(h.log, fmt.Sprintf("standing %v: program %+v, model %+v (present %v)", netip.AddrFrom16(k.Addr), v, mv, ok))
				n++
			}
		}
		h.fail("standing tables differ: program %d entries, model %d", len(st), len(ms))
	}
	cc, err := h.td.m.Standing.ClassCounters()
	if err != nil {
		h.tb.Fatal(err)
	}
	for d := range cc {
		for a := range cc[d] {
			for c := range cc[d][a] {
				for o := range cc[d][a][c] {
					got := cc[d][a][c][o]
					got.Packets -= h.baseClass[d][a][c][o].Packets
					got.Bytes -= h.baseClass[d][a][c][o].Bytes
					if want := h.model.ClassCounters()[d][a][c][o]; got != want {
						h.fail("class counter dry=%d %s/%s/%s: program %+v, model %+v", d, maps.ClassAggName(maps.ClassAgg(a)),
							maps.ClassName(maps.Class(c)), maps.OutcomeName(maps.Outcome(o)), got, want)
					}
				}
			}
		}
	}
	ev, err := h.td.m.Standing.Counts()
	if err != nil {
		h.tb.Fatal(err)
	}
	ev.Created -= h.baseEv.Created
	ev.Established -= h.baseEv.Established
	ev.Penalised -= h.baseEv.Penalised
	ev.Full -= h.baseEv.Full
	ev.Jumped -= h.baseEv.Jumped
	if mev := h.model.StandingCounts(); ev != mev {
		h.fail("standing events: program %+v, model %+v", ev, mev)
	}
}

// bucketDiff lists the keys whose buckets differ (at most ten).
func bucketDiff[K comparable](prog, model map[K]refmodel.Bucket) string {
	s, n := "", 0
	for k, b := range prog {
		if mb, ok := model[k]; (!ok || mb != b) && n < 10 {
			s += fmt.Sprintf("  key %+v: program %+v, model %+v (present %v)\n", k, b, mb, ok)
			n++
		}
	}
	for k, mb := range model {
		if _, ok := prog[k]; !ok && n < 10 {
			s += fmt.Sprintf("  key %+v: only in the model: %+v\n", k, mb)
			n++
		}
	}
	return s
}

// Rule ids of the differential policy.
const (
	dRuleDefault = 0 // everything else
	dRuleNet1    = 1 // 198.18.1.0/24: whole aggregate
	dRuleNet16   = 2 // 198.18.0.0/16: derived /24 aggregates, byte limits
	dRuleV6      = 3 // fd00::/16: /64 sources, derived /48 aggregates
	dRuleASN     = 4 // 203.0.113.0/24, 203.0.114.0/24, fd00:4::/32: ASN aggregate
	dRuleNTP     = 5 // udp source port 123
	dRuleWeb     = 6 // tcp destination port 80
	dRuleICMP    = 7 // icmp, any type
	dRuleMissing = 9 // named by a prefix fact, absent from the rules
)

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

func randRate(r *rand.Rand) policy.Limit {
	if r.IntN(4) == 0 {
		return policy.Limit{Rate: policy.Rate{}}
	}
	return policy.Limit{Rate: policy.Rate{Count: pick(r, uint64(5), 20, 100, 1000), Per: pick(r, time.Second, 100*time.Millisecond)}, Burst: pick(r, uint64(1), 3, 10)}
}

func randByteRate(r *rand.Rand) policy.Limit {
	if r.IntN(2) == 0 {
		return policy.Limit{Rate: policy.Rate{}}
	}
	return policy.Limit{Rate: policy.Rate{Count: pick(r, uint64(20_000), 200_000, 3_000_000), Per: time.Second}, Burst: pick(r, uint64(1000), 1500, 4000, 20000)}
}

func randBucket(r *rand.Rand) policy.Bucket {
	return policy.Bucket{Packets: randRate(r), Bytes: randByteRate(r)}
}

// randPolicy is the differential policy with random rates, modes and key
// lengths: every rule shape of the data plane appears in it.
func randPolicy(r *rand.Rand) policy.Compiled {
	mode := func() policy.RuleMode {
		return pick(r, policy.RuleModeInherit, policy.RuleModeInherit, policy.RuleModeEnforce, policy.RuleModeDryRun)
	}
	rules := []policy.CompiledRule{
		{ID: dRuleDefault, PerSource: randBucket(r), SourceKey: policy.KeyBits{V4: pick[uint8](r, 32, 32, 24, 0), V6: pick[uint8](r, 64, 64, 128, 48)}, Mode: mode()},
		{ID: dRuleNet1, PerSource: randBucket(r), PerPrefix: randBucket(r), Aggregate: policy.AggregateWhole, SourceKey: policy.KeyBits{V4: 32, V6: 64}, Mode: mode()},
		{
			ID:           dRuleNet16,
			PerSource:    randBucket(r),
			PerPrefix:    randBucket(r),
			Aggregate:    policy.AggregateDerived,
			AggregateKey: policy.KeyBits{V4: pick[uint8](r, 24, 28, 32), V6: 48},
			SourceKey:    policy.KeyBits{V4: 32, V6: 64},
			Mode:         mode(),
		},
		{
			ID:           dRuleV6,
			PerSource:    randBucket(r),
			PerPrefix:    randBucket(r),
			Aggregate:    pick(r, policy.AggregateDerived, policy.AggregateWhole, policy.AggregateNone),
			AggregateKey: policy.KeyBits{V4: 24, V6: pick[uint8](r, 48, 56, 0)},
			SourceKey:    policy.KeyBits{V4: 32, V6: pick[uint8](r, 64, 64, 60, 128)},
			Mode:         mode(),
		},
		{ID: dRuleASN, PerSource: randBucket(r), PerASN: randBucket(r), SourceKey: policy.KeyBits{V4: 32, V6: 64}, Mode: mode()},
		{ID: dRuleNTP, PerSource: randBucket(r), PerPrefix: randBucket(r), Aggregate: policy.AggregateWhole, SourceKey: policy.KeyBits{V4: 32, V6: 64}, Mode: mode()},
		{
			ID:        dRuleWeb,
			PerSource: randBucket(r),
			SourceKey: policy.KeyBits{V4: 32, V6: 64},
			Mode:      mode(),
			Action:    pick(r, policy.ActionLimit, policy.ActionDrop, policy.ActionPass),
		},
		{ID: dRuleICMP, PerSource: randBucket(r), PerASN: randBucket(r), SourceKey: policy.KeyBits{V4: 32, V6: 64}, Mode: mode()},
	}
	g := policy.Compiled{
		Mode:      pick(r, policy.ModeEnforce, policy.ModeEnforce, policy.ModeDryRun),
		Malformed: pick(r, policy.VerdictPass, policy.VerdictDrop),
		Rules:     rules,
		Prefixes: []policy.PrefixFact{
			{Prefix: netip.MustParsePrefix("198.18.1.0/24"), RuleID: dRuleNet1, ASN: 64496},
			{Prefix: netip.MustParsePrefix("198.18.0.0/16"), RuleID: dRuleNet16},
			{Prefix: netip.MustParsePrefix("fd00::/16"), RuleID: dRuleV6, ASN: 64497},
			{Prefix: netip.MustParsePrefix("203.0.113.0/24"), RuleID: dRuleASN, ASN: 64500},
			{Prefix: netip.MustParsePrefix("203.0.114.0/24"), RuleID: dRuleASN, ASN: 64500},
			{Prefix: netip.MustParsePrefix("fd00:4::/32"), RuleID: dRuleASN, ASN: 64501},
			{Prefix: netip.MustParsePrefix("198.18.200.0/24"), RuleID: dRuleMissing},
			{Prefix: netip.MustParsePrefix("192.0.2.128/25"), RuleID: dRuleWeb},
		},
		L4: []policy.L4Entry{
			{Protocol: packet.ProtoUDP, Dir: policy.PortSrc, Port: 123, RuleID: dRuleNTP},
			{Protocol: packet.ProtoTCP, Dir: policy.PortDst, Port: 80, RuleID: dRuleWeb},
			{Protocol: packet.ProtoICMP, Dir: policy.PortAny, RuleID: dRuleICMP},
			{Protocol: packet.ProtoICMPv6, Dir: policy.PortDst, Port: 128, RuleID: dRuleICMP},
		},
	}
	if r.IntN(2) == 0 {
		g.Global = policy.Bucket{
			Packets: policy.Limit{Rate: policy.Rate{Count: pick(r, uint64(20), 50, 2000), Per: time.Second}, Burst: pick(r, uint64(5), 20)},
			Bytes:   pick(r, policy.Limit{Rate: policy.Rate{}}, policy.Limit{Rate: policy.Rate{Count: 2_000_000, Per: time.Second}, Burst: 30_000}),
		}
	}
	if r.IntN(4) == 0 {
		g.L4 = append(g.L4, policy.L4Entry{Protocol: packet.ProtoUDP, Dir: policy.PortAny, RuleID: dRuleNTP})
	}
	// Reserves and standing: short enough to move sources along the
	// timeline (it spans a few seconds).
	for i := range g.Rules {
		g.Rules[i].Reserve = pick[uint32](r, 0, 300_000, 500_000, 500_000, 900_000)
	}
	g.GlobalReserve = pick[uint32](r, 0, 500_000, 750_000)
	if r.IntN(4) != 0 {
		g.Standing = policy.Standing{
			EstablishedAfter: pick(r, time.Second, 2*time.Second),
			Penalty:          pick(r, time.Second, 3*time.Second),
			KnownGood: []netip.Prefix{netip.MustParsePrefix("198.18.1.128/25"), netip.MustParsePrefix("fd00:4::/48"),
				netip.MustParsePrefix("203.0.113.7/32")},
		}
		// The usual rate and jumps: the shortest half-life (its decay
		// steps of 625 ms fall inside the timeline), or off.
		if r.IntN(3) != 0 {
			g.Standing.RateHistory = 10 * time.Second
			g.Standing.JumpFactor = pick(r, 0, 1.5, 4)
			g.Standing.JumpMin = policy.Rate{Count: pick[uint64](r, 0, 10, 100), Per: time.Second}
		}
		// Personal budgets: off, tight or loose, and a default a
		// timeline's few packets per source can use up or not.
		g.Standing.PersonalHeadroom = pick[float64](r, 0, 1, 2, 2)
		g.Standing.PersonalDefault = policy.Rate{Count: pick[uint64](r, 1, 5, 20), Per: time.Second}
		g.Standing.PersonalBurstSeconds = pick[uint32](r, 1, 2, 2, 60)
	}
	if r.IntN(2) == 0 {
		// Drop samples use their own bucket and must change no verdict.
		g.Samples = policy.Limit{Rate: policy.Rate{Count: 50, Per: time.Second}, Burst: 5}
	}
	// Policy rule ids are name hashes: give a random subset of the rules a
	// large id. The hash is fixed, so an id can survive a swap (keeping its
	// buckets and counters) or be renamed (starting afresh).
	renamed := map[uint32]uint32{}
	for id := uint32(1); id <= dRuleICMP; id++ {
		if r.IntN(2) == 0 {
			renamed[id] = id*2654435761 ^ 0x5bd1e995
		}
	}
	rename := func(id uint32) uint32 {
		if n, ok := renamed[id]; ok {
			return n
		}
		return id
	}
	for i := range g.Rules {
		g.Rules[i].ID = rename(g.Rules[i].ID)
	}
	for i := range g.Prefixes {
		g.Prefixes[i].RuleID = rename(g.Prefixes[i].RuleID)
	}
	for i := range g.L4 {
		g.L4[i].RuleID = rename(g.L4[i].RuleID)
	}
	return g
}

// minTestRunFrame is ETH_HLEN: the kernel's BPF_PROG_TEST_RUN for XDP
// rejects shorter data with EINVAL.
const minTestRunFrame = 14

// maxTestRunLinear is the largest frame BPF_PROG_TEST_RUN hands to an XDP
// program in one buffer on 4 KiB pages (PAGE_SIZE minus XDP headroom and
// skb_shared_info). Longer data is split into fragments, and the program,
// which measures data_end - data, sees only the first 3520 bytes. Drivers
// never give multi-buffer frames to a program not marked xdp.frags, so
// such frames are not sent.
const maxTestRunLinear = 3520

// diffStart is the timeline's origin: an hour of "uptime".
const diffStart = uint64(time.Hour)

func randLists(r *rand.Rand) []maps.ListEntry {
	until := func() uint64 { return diffStart + uint64(r.IntN(3000))*uint64(time.Millisecond) }
	return []maps.ListEntry{
		{Prefix: netip.MustParsePrefix("198.18.9.0/28"), DenyUntil: until()},
		{Prefix: netip.MustParsePrefix("198.18.9.16/28"), AllowUntil: until()},
		{Prefix: netip.MustParsePrefix("198.18.9.20/32"), DenyUntil: until(), AllowUntil: until()},
		{Prefix: netip.MustParsePrefix("fd00:9::/64"), DenyUntil: maps.Forever},
	}
}

var diffSources = []string{
	"198.18.1.%d", "198.18.2.%d", "198.18.3.%d", "198.18.9.%d", "198.18.200.%d",
	"203.0.113.%d", "203.0.114.%d", "192.0.2.%d",
	"fd00:1::%x", "fd00:1:0:1::%x", "fd00:1:1::%x", "fd00:4::%x", "fd00:9::%x", "2001:db8::%x", "::ffff:198.18.1.%d",
}

func randFrame(r *rand.Rand) []byte {
	src := netip.MustParseAddr(fmt.Sprintf(pick(r, diffSources...), r.IntN(24)))
	f := packet.Frame{Src: src, Payload: r.IntN(1400)}
	// Besides TCP, UDP and ICMP: GRE, ICMP of the other family
	// (malformed), and now and then a tunnel, ESP or SCTP (no ports).
	if src.Is4() {
		f.Proto = pick[uint8](r, packet.ProtoUDP, packet.ProtoTCP, packet.ProtoICMP, 47)
	} else {
		f.Proto = pick[uint8](r, packet.ProtoUDP, packet.ProtoTCP, packet.ProtoICMPv6, 47)
	}
	switch r.IntN(32) {
	case 0:
		f.Proto = packet.ProtoICMPv6
		if !src.Is4() {
			f.Proto = packet.ProtoICMP
		}
	case 1, 2:
		f.Proto = pick[uint8](r, 4, 41, 50, 51, 132)
	}
	f.SrcPort = pick[uint16](r, 123, 40000, 80, uint16(r.IntN(65536)))
	f.DstPort = pick[uint16](r, 53, 80, 128, 123, uint16(r.IntN(256)))
	switch r.IntN(8) {
	case 0:
		f.VLANs = []uint16{100}
	case 1:
		f.VLANs = []uint16{100, 200}
	case 2:
		if r.IntN(4) == 0 {
			f.VLANs = []uint16{100, 200, 300} // malformed: three tags
		}
	}
	if r.IntN(6) == 0 {
		f.FragOffset = uint16(pick(r, 0, 0, 1, 185))
		f.MoreFragments = r.IntN(2) == 0
		if !src.Is4() {
			f.IPv6Ext = append(f.IPv6Ext, 44)
		}
	}
	if src.Is4() && r.IntN(8) == 0 {
		f.IPv4Options = make([]byte, 4*(1+r.IntN(10)))
	}
	if !src.Is4() && r.IntN(4) == 0 {
		for n := r.IntN(9); n > 0; n-- {
			f.IPv6Ext = append(f.IPv6Ext, pick[uint8](r, 0, 43, 60, 51, 44))
			f.IPv6ExtLen = append(f.IPv6ExtLen, uint8(r.IntN(3)))
		}
	}
	b := f.Build()
	switch r.IntN(16) {
	case 0: // truncated somewhere in the headers
		b = b[:r.IntN(min(len(b), f.Ends().L4+1))]
	case 1: // a corrupted header byte
		b[r.IntN(min(len(b), f.Ends().L4))] ^= byte(1 + r.IntN(255))
	case 2:
		b = packet.ARP()
	case 3: // the datagram ends before the frame: padding (or a trailer) after it
		at := ipStart(f) + 8 + r.IntN(len(b)-ipStart(f)-8+1) // the length field stays
		b = withIPLen(b[:at], ipStart(f), at-ipStart(f))
		for n := r.IntN(48); n > 0; n-- {
			b = append(b, byte(r.Uint32()))
		}
	case 4: // a length field that says anything
		binary.BigEndian.PutUint16(b[ipStart(f)+pick(r, 2, 4):], uint16(pick(r, r.IntN(64), r.IntN(65536), len(b)-ipStart(f)+r.IntN(9)-4)))
	case 5: // any TCP data offset
		if f.Proto == packet.ProtoTCP && len(f.IPv6Ext) == 0 {
			b[f.Ends().L4-20+12] = byte(r.IntN(16)) << 4
		}
	}
	return b
}

func randAdvance(r *rand.Rand) uint64 {
	return uint64(pick(r, 0, 0, time.Microsecond, 100*time.Microsecond, time.Millisecond, 10*time.Millisecond, 200*time.Millisecond))
}

// runDiff sends n random packets from seed, swapping in a second random
// policy half way, and compares everything.
func runDiff(h *diffHarness, seed uint64, n int, extra []byte) map[string]int {
	h.tb.Helper()
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	// Even seeds look IPv4 sources up in the direct table, odd ones in
	// the trie (the policy has fewer facts than the default threshold).
	direct := seed%2 == 0
	if direct {
		h.td.m.Generations.SetV4DirectMinFacts(0)
	} else {
		h.td.m.Generations.SetV4DirectMinFacts(math.MaxInt)
	}
	h.reset(randPolicy(r), randLists(r))
	if got := h.td.m.Generations.V4Direct().Used; got != direct {
		h.tb.Fatalf("ipv4 direct table in use: %v, want %v", got, direct)
	}
	seen := map[string]int{}
	ns := diffStart
	for i := range n {
		if i == n/2 {
			h.swap(randPolicy(r))
		}
		ns += randAdvance(r)
		frame := randFrame(r)
		if extra != nil && i%4 == 0 {
			frame = extra
		}
		v := h.step(frame, ns)
		seen[maps.ActionName(v.Action)]++
		seen[maps.ReasonName(v.Reason)]++
	}
	h.checkState()
	ev := h.model.StandingCounts()
	seen["standing_created"] += int(ev.Created)
	seen["standing_established"] += int(ev.Established)
	seen["standing_penalised"] += int(ev.Penalised)
	seen["standing_jumped"] += int(ev.Jumped)
	for _, e := range h.model.Standing() {
		if e.Current != 0 {
			seen["standing_rate_measured"]++
		}
	}
	cc := h.model.ClassCounters()
	for d := range cc {
		for a := range cc[d] {
			for c := range cc[d][a] {
				seen["class_"+maps.OutcomeName(maps.Outcome(maps.OutcomeRefusedReserve))] += int(cc[d][a][c][maps.OutcomeRefusedReserve].Packets)
				seen["class_"+maps.OutcomeName(maps.Outcome(maps.OutcomeAdmittedReserve))] += int(cc[d][a][c][maps.OutcomeAdmittedReserve].Packets)
				if maps.Class(c) == maps.ClassOverBudget {
					seen["class_over_budget"] += int(cc[d][a][c][maps.OutcomeRefusedReserve].Packets + cc[d][a][c][maps.OutcomeAdmitted].Packets)
				}
			}
		}
	}
	return seen
}

// TestDifferential feeds random packet sequences to the program and to the
// reference model: every verdict, every counter, every bucket must agree.
func TestDifferential(t *testing.T) {
	h := newDiffHarness(t)
	seen := map[string]int{}
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			h.use(t)
			for k, n := range runDiff(h, seed, 1000, nil) {
				seen[k] += n
			}
		})
	}
	h.use(t)
	// The random runs must reach every verdict, or agreeing proves little.
	// (bad_ethernet cannot be sent: see step. fingerprint and the
	// override reasons need a fingerprint or an override, which these runs
	// install none of: TestDifferentialOverrides does.)
	for a := maps.ActPass; a <= maps.ActWouldDrop; a++ {
		if seen[maps.ActionName(a)] == 0 {
			t.Errorf("no packet got action %s", maps.ActionName(a))
		}
	}
	for r := maps.ReasonOK; r < maps.Reason(loader.LimiterEgReasonEG_R_MAX); r++ {
		overridden := r == maps.ReasonFingerprint || r == maps.ReasonShieldTighten || r == maps.ReasonFleetShare || r == maps.ReasonOverride
		if r != maps.ReasonBadEth && !overridden && seen[maps.ReasonName(r)] == 0 {
			t.Errorf("no packet got reason %s", maps.ReasonName(r))
		}
	}
	// And every part of standing and the reserve.
	for _, k := range []string{"standing_created", "standing_established", "standing_penalised", "standing_jumped", "standing_rate_measured",
		"class_refused_reserve", "class_admitted_reserve", "class_over_budget"} {
		if seen[k] == 0 {
			t.Errorf("no run reached %s", k)
		}
	}
	t.Logf("verdicts seen: %v", seen)
}

// FuzzDifferential lets the fuzzer pick the policy and packet sequence
// (seed) and one frame of its own making, sent every fourth packet. A run
// is slow (a few hundred syscalls), so keep minimization short:
//
//	go test -run '^$' -fuzz FuzzDifferential -fuzztime 30000x -fuzzminimizetime 10x -parallel 1 ./internal/loader/
//
// (A count, not a duration: with go1.26 a duration can end the run with a
// spurious "context deadline exceeded", golang/go#75804.)
func FuzzDifferential(f *testing.F) {
	f.Add(uint64(1), packet.UDP4("198.18.1.1", 123, 53, 100), uint8(32))
	f.Add(uint64(2), packet.Frame{Src: netip.MustParseAddr("fd00:1::1"), Proto: packet.ProtoTCP, DstPort: 80, IPv6Ext: []uint8{0, 43, 60, 44, 51, 60, 0}}.Build(), uint8(32))
	f.Add(uint64(3), packet.Frame{Src: netip.MustParseAddr("203.0.113.7"), Proto: packet.ProtoICMP, VLANs: []uint16{1, 2}}.Build(), uint8(40))
	f.Add(uint64(4), packet.Frame{Src: netip.MustParseAddr("198.18.2.9"), Proto: packet.ProtoUDP, FragOffset: 185, IPv4Options: make([]byte, 8)}.Build(), uint8(40))
	f.Add(uint64(5), packet.ARP(7), uint8(8))
	f.Add(uint64(6), packet.UDP4("198.18.1.1", 123, 53, 100)[:37], uint8(16))
	f.Add(uint64(7), []byte{}, uint8(64))
	f.Add(uint64(8), packet.Frame{Src: netip.MustParseAddr("::ffff:198.18.1.4"), Proto: packet.ProtoUDP, SrcPort: 123}.Build(), uint8(24))
	h := newDiffHarness(f)
	f.Fuzz(func(t *testing.T, seed uint64, frame []byte, n uint8) {
		h.use(t)
		runDiff(h, seed, int(n%64)+1, frame)
	})
}
