package daemon

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// testSlots: slot 1 is rule 7 "isp" (per_asn and a derived per /24
// per_prefix), slot 2 is rule 9 "whole" (group: whole).
func testSlots() map[uint32]slotRule {
	return map[uint32]slotRule{
		1: {id: 7, name: "isp", aggregate: policy.AggregateDerived, key: policy.KeyBits{V4: 24, V6: 48}},
		2: {id: 9, name: "whole", aggregate: policy.AggregateWhole},
	}
}

func refusal(src string, slot uint32, reason maps.Reason, asn uint32, o maps.Outcome, c maps.Class) maps.Sample {
	return maps.Sample{Kind: maps.SampleDrop, Source: netip.MustParseAddr(src), RuleSlot: slot, Reason: reason, ASN: asn,
		Action: maps.ActDrop, Refusal: true, Refused: o, Class: c}
}

// TestCongestedInstances: a known sequence of drop samples. An instance
// enters congestion at the first tick after its first refusal (logged
// once, with its ASN or prefix), is listed with its counts and share while
// it refuses, stays through quiet seconds shorter than congestionCalm, and
// leaves (logged, with what it refused by class) after congestionCalm
// without a refusal. Drops no aggregate made are not counted.
func TestCongestedInstances(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	w := &standingWatch{}
	t0 := time.Unix(1_000_000, 0)
	w.tickInstances(log, testSlots(), t0)
	at := func(s time.Duration) time.Time { return t0.Add(s) }

	for i := 0; i < 30; i++ { // AS64500 refuses 30 new sources (reserve) ...
		w.congestionSample(at(100*time.Millisecond), refusal(fmt.Sprintf("198.18.%d.1", i), 1, maps.ReasonASNLimit, 64500, maps.OutcomeRefusedReserve, maps.ClassNew))
	}
	for i := 0; i < 5; i++ { // ... and 5 established at full
		w.congestionSample(at(200*time.Millisecond), refusal("198.18.1.1", 1, maps.ReasonASNLimit, 64500, maps.OutcomeRefusedFull, maps.ClassUnknown))
	}
	for i := 0; i < 10; i++ { // 198.18.4.0/24 of rule isp
		w.congestionSample(at(300*time.Millisecond), refusal(fmt.Sprintf("198.18.4.%d", i+1), 1, maps.ReasonPrefixLimit, 64500, maps.OutcomeRefusedReserve, maps.ClassPenalised))
	}
	// Not counted: a drop by the per-source limit, a rule drop, a sample
	// without a refusal, a rate sample.
	w.congestionSample(at(0), maps.Sample{Kind: maps.SampleDrop, Source: netip.MustParseAddr("198.18.9.9"), RuleSlot: 1, Reason: maps.ReasonSrcLimit})
	w.congestionSample(at(0), refusal("198.18.9.9", 1, maps.ReasonRuleDrop, 0, maps.OutcomeRefusedFull, maps.ClassNew))
	w.congestionSample(at(0), maps.Sample{Kind: maps.SampleRate, Source: netip.MustParseAddr("198.18.9.9"), RuleSlot: 1, Reason: maps.ReasonASNLimit, ASN: 1})
	if st := w.instanceStatus(at(500 * time.Millisecond)); len(st) != 0 {
		t.Fatalf("listed before the tick: %+v", st)
	}
	w.tickInstances(log, nil, at(time.Second))
	st := w.instanceStatus(at(time.Second))
	if len(st) != 2 {
		t.Fatalf("want 2 instances, got %+v", st)
	}
	a, p := st[0], st[1]
	if a.Aggregate != "asn" || a.ASN != 64500 || a.Rule != "isp" || a.RefusedReserve != 30 || a.RefusedFull != 5 ||
		a.RefusedByClass["new"] != 30 || a.RefusedByClass["unknown"] != 5 || a.Share != 1 ||
		!a.Since.Equal(at(100*time.Millisecond)) || !a.LastRefused.Equal(at(200*time.Millisecond)) {
		t.Fatalf("asn instance: %+v", a)
	}
	if p.Aggregate != "prefix" || p.Prefix != "198.18.4.0/24" || p.Rule != "isp" || p.RefusedReserve != 10 ||
		p.RefusedByClass["penalised"] != 10 || p.ASN != 0 {
		t.Fatalf("prefix instance: %+v", p)
	}
	if n := strings.Count(buf.String(), "aggregate instance congested"); n != 2 ||
		!strings.Contains(buf.String(), "asn=64500") || !strings.Contains(buf.String(), "prefix=198.18.4.0/24") {
		t.Fatalf("enter events: %s", buf.String())
	}
	// The ASN keeps refusing; the prefix goes quiet.
	w.congestionSample(at(4*time.Second), refusal("198.18.7.1", 1, maps.ReasonASNLimit, 64500, maps.OutcomeRefusedReserve, maps.ClassNew))
	w.tickInstances(log, nil, at(5*time.Second))
	if st := w.instanceStatus(at(5 * time.Second)); len(st) != 2 {
		t.Fatalf("an instance left before congestionCalm: %+v", st)
	}
	w.tickInstances(log, nil, at(300*time.Millisecond+congestionCalm))
	st = w.instanceStatus(at(300*time.Millisecond + congestionCalm))
	if len(st) != 1 || st[0].ASN != 64500 || st[0].RefusedReserve != 31 {
		t.Fatalf("after the prefix's calm: %+v", st)
	}
	if !strings.Contains(buf.String(), "aggregate instance left congestion") || !strings.Contains(buf.String(), "penalised:10") {
		t.Fatalf("leave event: %s", buf.String())
	}
	w.tickInstances(log, nil, at(4*time.Second+congestionCalm))
	if st := w.instanceStatus(at(4*time.Second + congestionCalm)); len(st) != 0 {
		t.Fatalf("after the ASN's calm: %+v", st)
	}
	if n := strings.Count(buf.String(), "aggregate instance congested"); n != 2 {
		t.Fatalf("%d enter events, want 2 (no repeats)", n)
	}
	if n := strings.Count(buf.String(), "aggregate instance left congestion"); n != 2 {
		t.Fatalf("%d leave events, want 2", n)
	}
	if w.inst.congestedByKind()["asn"] != 0 {
		t.Fatal("metric still counts an instance")
	}
}

// TestCongestedInstancesBound: past maxCongestedInstances, a flood over
// many prefixes keeps the table at the bound and the most-refusing
// instances in it, each with its possible overcount; a whole aggregate and
// the global bucket are one instance each.
func TestCongestedInstancesBound(t *testing.T) {
	w := &standingWatch{}
	log := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	t0 := time.Unix(1_000_000, 0)
	w.tickInstances(log, testSlots(), t0)
	// Three heavy instances: 100 refusals each.
	for i := 0; i < 100; i++ {
		w.congestionSample(t0, refusal(fmt.Sprintf("198.18.0.%d", i), 2, maps.ReasonPrefixLimit, 0, maps.OutcomeRefusedReserve, maps.ClassNew))
		w.congestionSample(t0, refusal(fmt.Sprintf("198.19.0.%d", i), 1, maps.ReasonGlobalLimit, 0, maps.OutcomeRefusedReserve, maps.ClassNew))
		w.congestionSample(t0, refusal("fd00::1", 1, maps.ReasonPrefixLimit, 0, maps.OutcomeRefusedReserve, maps.ClassNew))
	}
	// 1,000 /24s (IPv4 under rule isp's derived /24s), 2 refusals each.
	for i := 0; i < 1000; i++ {
		for j := 0; j < 2; j++ {
			w.congestionSample(t0, refusal(fmt.Sprintf("198.%d.%d.9", 20+i/250, i%250), 1,
				maps.ReasonPrefixLimit, 0, maps.OutcomeRefusedReserve, maps.ClassNew))
		}
	}
	if n := len(w.inst.m); n != maxCongestedInstances {
		t.Fatalf("%d instances tracked, want the bound %d", n, maxCongestedInstances)
	}
	w.tickInstances(log, nil, t0.Add(time.Second))
	st := w.instanceStatus(t0.Add(time.Second))
	if len(st) != maxCongestedInstances {
		t.Fatalf("%d listed, want %d", len(st), maxCongestedInstances)
	}
	heavy := map[string]bool{}
	for _, c := range st[:3] {
		heavy[c.Aggregate+" "+c.Prefix] = true
		if c.RefusedReserve != 100 || c.Overcount != 0 {
			t.Errorf("heavy instance %+v: want 100 refusals, no overcount", c)
		}
	}
	if !heavy["prefix whole"] || !heavy["global "] || !heavy["prefix fd00::/48"] {
		t.Fatalf("heavy instances not on top: %+v", st[:3])
	}
	for _, c := range st[3:] {
		// Space-Saving: a light instance's count is its own plus at most
		// what it inherited.
		if c.RefusedReserve > 2 || c.RefusedReserve+c.Overcount > 100 {
			t.Errorf("light instance %+v", c)
		}
	}
	if w.inst.evicted == 0 {
		t.Fatal("no eviction counted")
	}
	t.Logf("%d instances evicted for more-refusing ones; light overcount up to %d", w.inst.evicted, st[len(st)-1].Overcount)
}

// TestCongestedInstancesUnderOverrides: a refusal under an override is
// counted under a reason that names the override's writer
// (shield_tighten, fleet_share, override), not the aggregate; the sample's
// RefusedAgg says which aggregate refused, and the refusal goes to that
// instance, with the policy's own refusals of the same instance.
func TestCongestedInstancesUnderOverrides(t *testing.T) {
	w := &standingWatch{}
	log := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	t0 := time.Unix(1_000_000, 0)
	w.tickInstances(log, testSlots(), t0)
	under := func(src string, slot uint32, reason maps.Reason, agg maps.ClassAgg, asn uint32) maps.Sample {
		s := refusal(src, slot, reason, asn, maps.OutcomeRefusedFull, maps.ClassUnknown)
		s.RefusedAgg = agg
		return s
	}
	for i := 0; i < 20; i++ {
		// The shield tightens AS64500 of rule isp; its own budget refused 5.
		w.congestionSample(t0, under(fmt.Sprintf("198.18.%d.1", i), 1, maps.ReasonShieldTighten, maps.ClassAggASN, 64500))
		// Fleet's share of rule whole's whole aggregate.
		w.congestionSample(t0, under(fmt.Sprintf("198.19.%d.1", i), 2, maps.ReasonFleetShare, maps.ClassAggPrefix, 0))
	}
	for i := 0; i < 5; i++ {
		w.congestionSample(t0, refusal("198.18.50.1", 1, maps.ReasonASNLimit, 64500, maps.OutcomeRefusedReserve, maps.ClassNew))
	}
	for i := 0; i < 7; i++ {
		// An edgectl override of rule isp's 198.18.4.0/24, and of global.
		w.congestionSample(t0, under(fmt.Sprintf("198.18.4.%d", i+1), 1, maps.ReasonOverride, maps.ClassAggPrefix, 64500))
		w.congestionSample(t0, under("fd00::7", 1, maps.ReasonOverride, maps.ClassAggGlobal, 0))
	}
	// Not counted: an override reason without a refusal, or with an
	// aggregate kind no program writes.
	w.congestionSample(t0, maps.Sample{Kind: maps.SampleDrop, Source: netip.MustParseAddr("198.18.9.9"), RuleSlot: 1, Reason: maps.ReasonOverride})
	w.congestionSample(t0, under("198.18.9.9", 1, maps.ReasonFleetShare, maps.ClassAggGlobal+1, 64500))

	w.tickInstances(log, nil, t0.Add(time.Second))
	st := w.instanceStatus(t0.Add(time.Second))
	got := map[string]uint64{}
	for _, c := range st {
		got[fmt.Sprintf("%s %s %d %s", c.Aggregate, c.Rule, c.ASN, c.Prefix)] = c.RefusedFull + c.RefusedReserve
	}
	want := map[string]uint64{
		"asn isp 64500 ":             25,
		"prefix whole 0 whole":       20,
		"prefix isp 0 198.18.4.0/24": 7,
		"global  0 ":                 7,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("instances %v, want %v\n%+v", got, want, st)
	}
	// Who decided, per instance.
	for _, c := range st {
		want := map[string]string{"asn": "map[asn_limit:5 shield_tighten:20]", "global": "map[override:7]"}[c.Aggregate]
		if c.Prefix == "whole" {
			want = "map[fleet_share:20]"
		} else if c.Aggregate == "prefix" {
			want = "map[override:7]"
		}
		if got := fmt.Sprint(c.RefusedByReason); got != want {
			t.Errorf("%s %s: refused by reason %s, want %s", c.Aggregate, c.Prefix, got, want)
		}
	}
	if k := w.inst.congestedByKind(); k["asn"] != 1 || k["prefix"] != 2 || k["global"] != 1 {
		t.Fatalf("edgeguard_aggregate_congested_instances: %v", k)
	}
}
