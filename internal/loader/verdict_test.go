package loader_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

// step is one moment of a scripted timeline: optionally do something (apply
// a policy, inspect the tables), then, if frame is set, send it at `at` on
// the test clock and check its verdict and counters.
type step struct {
	at    time.Duration
	do    func(td *testDatapath)
	frame []byte
	want  verdict
}

type verdictCase struct {
	name  string
	gen   policy.Compiled
	lists []maps.ListEntry
	steps []step
}

// t0 is the timeline's origin: an hour of uptime, so fresh buckets are full.
const t0 = time.Hour

func udp4(src string) []byte { return packet.UDP4(src, 5000, 53, 10) }

func udp6(src string) []byte {
	return packet.Frame{Src: netip.MustParseAddr(src), Proto: packet.ProtoUDP, SrcPort: 5000, DstPort: 53, Payload: 10}.Build()
}

func udpPorts(src string, sport, dport uint16) []byte { return packet.UDP4(src, sport, dport, 10) }

func pkts(n, burst uint64) policy.Bucket { return policy.Bucket{Packets: perSecond(n, burst)} }

func generation(rules ...policy.CompiledRule) policy.Compiled {
	for i := range rules {
		if rules[i].SourceKey.V4 == 0 {
			rules[i].SourceKey.V4 = 32
		}
		if rules[i].SourceKey.V6 == 0 {
			rules[i].SourceKey.V6 = 64
		}
	}
	return policy.Compiled{Mode: policy.ModeEnforce, Malformed: policy.VerdictPass, Rules: rules}
}

func withPrefixes(g policy.Compiled, facts ...policy.PrefixFact) policy.Compiled {
	g.Prefixes = append(g.Prefixes, facts...)
	return g
}

func fact(prefix string, rule, asn uint32) policy.PrefixFact {
	return policy.PrefixFact{Prefix: netip.MustParsePrefix(prefix), RuleID: rule, ASN: asn}
}

func srcBuckets(td *testDatapath) map[refmodel.SrcKey]refmodel.Bucket {
	td.tb.Helper()
	out := map[refmodel.SrcKey]refmodel.Bucket{}
	var k refmodel.SrcKey
	var b struct {
		B         refmodel.Bucket
		Pkts, Pad uint32
	}
	it := td.d.Objects.SrcBuckets.Iterate()
	for it.Next(&k, &b) {
		out[k] = b.B
	}
	if err := it.Err(); err != nil {
		td.tb.Fatal(err)
	}
	return out
}

func aggBuckets(td *testDatapath) map[refmodel.AggKey]refmodel.Bucket {
	td.tb.Helper()
	out := map[refmodel.AggKey]refmodel.Bucket{}
	var k refmodel.AggKey
	var b refmodel.Bucket
	it := td.d.Objects.AggBuckets.Iterate()
	for it.Next(&k, &b) {
		out[k] = b
	}
	if err := it.Err(); err != nil {
		td.tb.Fatal(err)
	}
	return out
}

// wholeBucket is a rule's whole-aggregate bucket: its slot of
// whole_buckets in the live generation.
func wholeBucket(td *testDatapath, rule uint32) refmodel.Bucket {
	td.tb.Helper()
	slots, err := td.m.Generations.RuleSlots()
	if err != nil {
		td.tb.Fatal(err)
	}
	slot, ok := slots[rule]
	if !ok {
		td.tb.Fatalf("rule %d is not live", rule)
	}
	var b refmodel.Bucket
	if err := td.d.Objects.WholeBuckets.Lookup(slot, &b); err != nil {
		td.tb.Fatal(err)
	}
	return b
}

// wantWholeCharged checks that a rule's whole aggregate was charged.
func wantWholeCharged(rule uint32) func(td *testDatapath) {
	return func(td *testDatapath) {
		td.tb.Helper()
		if b := wholeBucket(td, rule); b == (refmodel.Bucket{}) {
			td.tb.Fatalf("rule %d: whole aggregate bucket untouched", rule)
		}
	}
}

func globalBucket(td *testDatapath) refmodel.Bucket {
	td.tb.Helper()
	var b refmodel.Bucket
	if err := td.d.Objects.GlobalBuckets.Lookup(uint32(0), &b); err != nil {
		td.tb.Fatal(err)
	}
	return b
}

func srcKey(rule uint32, prefix string) refmodel.SrcKey {
	k := maps.LPMKey(netip.MustParsePrefix(prefix))
	return refmodel.SrcKey{RuleId: rule, Addr: k.Addr}
}

func prefixAggKey(rule uint32, prefix string) refmodel.AggKey {
	k := maps.LPMKey(netip.MustParsePrefix(prefix))
	return refmodel.AggKey{RuleId: rule, Kind: refmodel.AggKindPrefix, Len: uint8(k.Prefixlen), Addr: k.Addr}
}

// wantSrcKeys checks the per-source table holds exactly keys.
func wantSrcKeys(keys ...refmodel.SrcKey) func(td *testDatapath) {
	return func(td *testDatapath) {
		td.tb.Helper()
		got := srcBuckets(td)
		if len(got) != len(keys) {
			td.tb.Fatalf("src_buckets has %d entries %v, want exactly %v", len(got), got, keys)
		}
		for _, k := range keys {
			if _, ok := got[k]; !ok {
				td.tb.Fatalf("src_buckets lacks %+v; has %v", k, got)
			}
		}
	}
}

func wantAggKeys(keys ...refmodel.AggKey) func(td *testDatapath) {
	return func(td *testDatapath) {
		td.tb.Helper()
		got := aggBuckets(td)
		if len(got) != len(keys) {
			td.tb.Fatalf("agg_buckets has %d entries %v, want exactly %v", len(got), got, keys)
		}
		for _, k := range keys {
			if _, ok := got[k]; !ok {
				td.tb.Fatalf("agg_buckets lacks %+v; has %v", k, got)
			}
		}
	}
}

func applyGen(g policy.Compiled) func(td *testDatapath) {
	return func(td *testDatapath) { td.apply(g) }
}

// floodSteps sends n packets from n different sources of a /16 at one
// instant, each expecting w.
func floodSteps(at time.Duration, n int, w verdict) []step {
	var out []step
	for i := range n {
		// Two packets per source: past the new-source filter, only the
		// peek at the aggregates keeps the second from creating a bucket.
		f := udp4(fmt.Sprintf("198.19.%d.%d", i/200, 1+i%200))
		out = append(out, step{at: at, frame: f, want: w}, step{at: at, frame: f, want: w})
	}
	return out
}

func verdictCases() []verdictCase {
	const r1, r2, r3 = 1, 2, 3
	second := time.Second
	every := func(base time.Duration, n int, gap time.Duration, frame []byte, w verdict) []step {
		var out []step
		for i := range n {
			out = append(out, step{at: base + time.Duration(i)*gap, frame: frame, want: w})
		}
		return out
	}
	cat := func(parts ...[]step) []step {
		var out []step
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}

	dryGlobal := generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)})
	dryGlobal.Mode = policy.ModeDryRun

	dryRule := withPrefixes(generation(
		policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)},
		policy.CompiledRule{ID: r1, PerSource: pkts(1, 1), Mode: policy.RuleModeDryRun},
	), fact("198.18.1.0/24", r1, 0))

	enforceUnderDry := withPrefixes(generation(
		policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)},
		policy.CompiledRule{ID: r1, PerSource: pkts(1, 1), Mode: policy.RuleModeEnforce},
	), fact("198.18.1.0/24", r1, 0))
	enforceUnderDry.Mode = policy.ModeDryRun

	global := generation(policy.CompiledRule{ID: 0})
	global.Global = pkts(1, 2)

	globalOver := generation(policy.CompiledRule{ID: 0, PerSource: pkts(10, 5)})
	globalOver.Global = pkts(1, 1)

	malformedDrop := generation(policy.CompiledRule{ID: 0})
	malformedDrop.Malformed = policy.VerdictDrop
	malformedDryDrop := malformedDrop
	malformedDryDrop.Mode = policy.ModeDryRun

	l4 := generation(policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1}, policy.CompiledRule{ID: r2}, policy.CompiledRule{ID: r3})
	l4.L4 = []policy.L4Entry{
		{Protocol: packet.ProtoUDP, Dir: policy.PortSrc, Port: 53, RuleID: r1},
		{Protocol: packet.ProtoUDP, Dir: policy.PortDst, Port: 80, RuleID: r2},
		{Protocol: packet.ProtoUDP, Dir: policy.PortAny, RuleID: r3},
	}

	trie := withPrefixes(generation(policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1}, policy.CompiledRule{ID: r2}, policy.CompiledRule{ID: r3}, policy.CompiledRule{ID: 4}),
		fact("198.18.0.0/16", r1, 0), fact("198.18.1.0/24", r2, 0), fact("198.18.1.128/25", r3, 0),
		fact("fd00::/16", r1, 0), fact("fd00:1::/32", r2, 0))
	trie.L4 = []policy.L4Entry{{Protocol: packet.ProtoUDP, Dir: policy.PortSrc, Port: 123, RuleID: 4}}

	hashedIDs := uint32(4000781694)
	swapBefore := withPrefixes(generation(policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1, PerSource: pkts(1, 2)}, policy.CompiledRule{ID: r2, PerSource: pkts(1, 1)}),
		fact("198.18.1.0/24", r1, 0), fact("198.18.2.0/24", r2, 0))
	swapAfter := withPrefixes(generation(policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1, PerSource: pkts(1, 2)}, policy.CompiledRule{ID: hashedIDs, PerSource: pkts(1, 1)}),
		fact("198.18.1.0/24", r1, 0), fact("198.18.2.0/24", hashedIDs, 0))

	return []verdictCase{
		{name: "ok under the default rule", gen: generation(policy.CompiledRule{ID: 0, PerSource: pkts(10, 5)}),
			steps: every(t0, 3, 0, udp4("198.18.0.1"), okRule(0))},
		{name: "non_ip: arp is never limited", gen: generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)}),
			steps: every(t0, 3, 0, packet.ARP(), passed(maps.ReasonNonIP))},
		{name: "prefix fact naming no rule: no_policy", gen: withPrefixes(generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)}), fact("198.18.9.0/24", 99, 0)),
			steps: cat(every(t0, 3, 0, udp4("198.18.9.1"), passed(maps.ReasonNoPolicy)), []step{{do: wantSrcKeys()}})},

		// Lists.
		{name: "allow list passes without limiting", gen: generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)}),
			lists: []maps.ListEntry{{Prefix: netip.MustParsePrefix("198.18.0.0/24"), AllowUntil: maps.Forever}},
			steps: cat(every(t0, 3, 0, udp4("198.18.0.1"), passed(maps.ReasonAllow)), []step{{do: wantSrcKeys()}})},
		{name: "deny list drops, not counted under a rule", gen: generation(policy.CompiledRule{ID: 0}),
			lists: []maps.ListEntry{{Prefix: netip.MustParsePrefix("198.18.0.0/24"), DenyUntil: maps.Forever}},
			steps: cat(every(t0, 2, 0, udp4("198.18.0.1"), dropped(maps.ReasonDeny)), []step{{at: t0, frame: udp4("198.18.1.1"), want: okRule(0)}})},
		{name: "deny expires on the test clock", gen: generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)}),
			lists: []maps.ListEntry{{Prefix: netip.MustParsePrefix("2001:db8::/48"), DenyUntil: uint64(t0 + 10*second)}},
			steps: []step{
				{at: t0, frame: udp6("2001:db8::1"), want: dropped(maps.ReasonDeny)},
				{at: t0 + 10*second - 1, frame: udp6("2001:db8::1"), want: dropped(maps.ReasonDeny)},
				{at: t0 + 10*second, frame: udp6("2001:db8::1"), want: okRule(0)},
				{at: t0 + 10*second, frame: udp6("2001:db8::1"), want: limitedBy(maps.ReasonSrcLimit, 0)},
			}},
		{name: "allow expires on the test clock", gen: generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)}),
			lists: []maps.ListEntry{{Prefix: netip.MustParsePrefix("198.18.0.1/32"), AllowUntil: uint64(t0 + second)}},
			steps: []step{
				{at: t0 + second - 1, frame: udp4("198.18.0.1"), want: passed(maps.ReasonAllow)},
				{at: t0 + second - 1, frame: udp4("198.18.0.1"), want: passed(maps.ReasonAllow)},
				{at: t0 + second, frame: udp4("198.18.0.1"), want: okRule(0)},
				{at: t0 + second, frame: udp4("198.18.0.1"), want: limitedBy(maps.ReasonSrcLimit, 0)},
			}},
		{name: "most specific list entry answers", gen: generation(policy.CompiledRule{ID: 0}),
			lists: []maps.ListEntry{
				{Prefix: netip.MustParsePrefix("198.18.0.0/16"), DenyUntil: maps.Forever},
				{Prefix: netip.MustParsePrefix("198.18.7.0/24"), AllowUntil: maps.Forever},
			},
			steps: []step{
				{at: t0, frame: udp4("198.18.7.7"), want: passed(maps.ReasonAllow)},
				{at: t0, frame: udp4("198.18.8.7"), want: dropped(maps.ReasonDeny)},
			}},
		{name: "deny in global dry-run: would_drop", gen: dryGlobal,
			lists: []maps.ListEntry{{Prefix: netip.MustParsePrefix("198.18.0.0/24"), DenyUntil: maps.Forever}},
			steps: []step{{at: t0, frame: udp4("198.18.0.1"), want: verdict{action: maps.ActWouldDrop, reason: maps.ReasonDeny}}}},

		// Buckets.
		{name: "source limit: burst, then the rate", gen: generation(policy.CompiledRule{ID: 0, PerSource: pkts(2, 2)}),
			steps: cat(
				every(t0, 2, 0, udp4("198.18.0.1"), okRule(0)),
				every(t0, 2, 0, udp4("198.18.0.1"), limitedBy(maps.ReasonSrcLimit, 0)),
				[]step{{at: t0, frame: udp4("198.18.0.2"), want: okRule(0)}},
				[]step{{at: t0 + 500*time.Millisecond - 1, frame: udp4("198.18.0.1"), want: limitedBy(maps.ReasonSrcLimit, 0)}},
				[]step{{at: t0 + 500*time.Millisecond, frame: udp4("198.18.0.1"), want: okRule(0)}},
				// 198.18.0.2 sent one packet: the new-source filter gives it no
				// bucket until it is seen again.
				[]step{{do: wantSrcKeys(srcKey(0, "198.18.0.1/32"))}},
			)},
		{name: "non-first fragments are limited by source", gen: generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 2)}),
			steps: []step{
				{at: t0, frame: packet.Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: packet.ProtoUDP, FragOffset: 185}.Build(), want: okRule(0)},
				{at: t0, frame: packet.Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: packet.ProtoUDP, FragOffset: 370}.Build(), want: okRule(0)},
				{at: t0, frame: packet.Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: packet.ProtoUDP, FragOffset: 555}.Build(), want: limitedBy(maps.ReasonSrcLimit, 0)},
				{at: t0, frame: packet.Frame{Src: netip.MustParseAddr("fd00::1"), Proto: packet.ProtoUDP, FragOffset: 185, IPv6Ext: []uint8{44}}.Build(), want: okRule(0)},
				{at: t0, frame: packet.Frame{Src: netip.MustParseAddr("fd00::2"), Proto: packet.ProtoUDP, FragOffset: 370, IPv6Ext: []uint8{44}}.Build(), want: okRule(0)},
				{at: t0, frame: packet.Frame{Src: netip.MustParseAddr("fd00::3"), Proto: packet.ProtoUDP, FragOffset: 555, IPv6Ext: []uint8{44}}.Build(), want: limitedBy(maps.ReasonSrcLimit, 0)},
			}},
		{name: "ipv6 sources share a bucket per /64", gen: generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)}),
			steps: []step{
				{at: t0, frame: udp6("fd00:1::1"), want: okRule(0)},
				{at: t0, frame: udp6("fd00:1::ffff:2"), want: limitedBy(maps.ReasonSrcLimit, 0)},
				{at: t0, frame: udp6("fd00:1:0:0:8000::1"), want: limitedBy(maps.ReasonSrcLimit, 0)},
				{at: t0, frame: udp6("fd00:1:0:1::1"), want: okRule(0)},
				{at: t0, frame: udp6("fd00:1:0:1::2"), want: limitedBy(maps.ReasonSrcLimit, 0)},
				{do: wantSrcKeys(srcKey(0, "fd00:1::/64"), srcKey(0, "fd00:1:0:1::/64"))},
			}},
		{name: "prefix limit, whole: all sources of the rule share it",
			gen: withPrefixes(generation(policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1, PerSource: pkts(10, 5), PerPrefix: pkts(1, 3), Aggregate: policy.AggregateWhole}), fact("198.18.0.0/16", r1, 0)),
			steps: []step{
				{at: t0, frame: udp4("198.18.1.1"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.2.1"), want: okRule(r1)},
				{at: t0, frame: udp6("fd00::1"), want: okRule(0)},
				{at: t0, frame: udp4("198.18.3.1"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.4.1"), want: limitedBy(maps.ReasonPrefixLimit, r1)},
				// Not in agg_buckets: the rule's slot of whole_buckets.
				{do: wantAggKeys()},
				{do: wantWholeCharged(r1)},
			}},
		{name: "prefix limit, derived /24",
			gen: withPrefixes(generation(policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1, PerPrefix: pkts(1, 2), Aggregate: policy.AggregateDerived, AggregateKey: policy.KeyBits{V4: 24, V6: 48}}), fact("198.18.0.0/16", r1, 0)),
			steps: []step{
				{at: t0, frame: udp4("198.18.1.1"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.1.2"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.1.3"), want: limitedBy(maps.ReasonPrefixLimit, r1)},
				{at: t0, frame: udp4("198.18.2.3"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.2.4"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.2.5"), want: limitedBy(maps.ReasonPrefixLimit, r1)},
				{do: wantAggKeys(prefixAggKey(r1, "198.18.1.0/24"), prefixAggKey(r1, "198.18.2.0/24"))},
			}},
		{name: "prefix limit, derived /48",
			gen: withPrefixes(generation(policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1, PerPrefix: pkts(1, 2), Aggregate: policy.AggregateDerived, AggregateKey: policy.KeyBits{V4: 24, V6: 48}}), fact("fd00::/16", r1, 0)),
			steps: []step{
				{at: t0, frame: udp6("fd00:1:1::1"), want: okRule(r1)},
				{at: t0, frame: udp6("fd00:1:1:ffff::1"), want: okRule(r1)},
				{at: t0, frame: udp6("fd00:1:1:7::1"), want: limitedBy(maps.ReasonPrefixLimit, r1)},
				{at: t0, frame: udp6("fd00:1:2::1"), want: okRule(r1)},
				// One packet: no bucket yet for fd00:1:2::/48 (new-source filter).
				{do: wantAggKeys(prefixAggKey(r1, "fd00:1:1::/48"))},
			}},
		{name: "asn limit across prefixes of one asn",
			gen: withPrefixes(generation(policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1, PerASN: pkts(1, 2)}),
				fact("203.0.113.0/24", r1, 64500), fact("198.51.100.0/24", r1, 64500), fact("192.0.2.0/24", r1, 64501)),
			steps: []step{
				{at: t0, frame: udp4("203.0.113.1"), want: okRule(r1)},
				{at: t0, frame: udp4("198.51.100.1"), want: okRule(r1)},
				{at: t0, frame: udp4("203.0.113.2"), want: limitedBy(maps.ReasonASNLimit, r1)},
				{at: t0, frame: udp4("192.0.2.1"), want: okRule(r1)},
				{do: wantAggKeys(refmodel.AggKey{RuleId: r1, Kind: refmodel.AggKindASN, Asn: 64500}, refmodel.AggKey{RuleId: r1, Kind: refmodel.AggKindASN, Asn: 64501})},
			}},
		{name: "global limit", gen: global,
			steps: []step{
				{at: t0, frame: udp4("198.18.0.1"), want: okRule(0)},
				{at: t0, frame: udp6("fd00::1"), want: okRule(0)},
				{at: t0, frame: udp4("198.18.0.3"), want: limitedBy(maps.ReasonGlobalLimit, 0)},
				{at: t0 + second, frame: udp4("198.18.0.3"), want: okRule(0)},
			}},

		// Dry-run.
		{name: "global dry-run: would_drop, passed", gen: dryGlobal,
			steps: []step{
				{at: t0, frame: udp4("198.18.0.1"), want: okRule(0)},
				{at: t0, frame: udp4("198.18.0.1"), want: wouldDrop(maps.ReasonSrcLimit, 0)},
			}},
		{name: "rule dry-run under global enforce", gen: dryRule,
			steps: []step{
				{at: t0, frame: udp4("198.18.1.1"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.1.1"), want: wouldDrop(maps.ReasonSrcLimit, r1)},
				{at: t0, frame: udp4("198.18.2.1"), want: okRule(0)},
				{at: t0, frame: udp4("198.18.2.1"), want: limitedBy(maps.ReasonSrcLimit, 0)},
			}},
		{name: "rule enforce under global dry-run", gen: enforceUnderDry,
			steps: []step{
				{at: t0, frame: udp4("198.18.1.1"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.1.1"), want: limitedBy(maps.ReasonSrcLimit, r1)},
				{at: t0, frame: udp4("198.18.2.1"), want: okRule(0)},
				{at: t0, frame: udp4("198.18.2.1"), want: wouldDrop(maps.ReasonSrcLimit, 0)},
			}},

		// Malformed verdicts.
		{name: "malformed passes", gen: generation(policy.CompiledRule{ID: 0}),
			steps: []step{{at: t0, frame: with(udp4("198.18.0.1"), 14, 0x44), want: passed(maps.ReasonBadIPv4)}}},
		{name: "malformed drops", gen: malformedDrop,
			steps: []step{
				{at: t0, frame: with(udp4("198.18.0.1"), 14, 0x44), want: dropped(maps.ReasonBadIPv4)},
				{at: t0, frame: udp4("198.18.0.1")[:40], want: dropped(maps.ReasonBadIPLen)},
			}},
		{name: "malformed drop in dry-run: would_drop", gen: malformedDryDrop,
			steps: []step{{at: t0, frame: with(udp4("198.18.0.1"), 14, 0x44), want: verdict{action: maps.ActWouldDrop, reason: maps.ReasonBadIPv4}}}},

		// Rule selection.
		{name: "l4 rules: source port, then destination port, then protocol", gen: l4,
			steps: []step{
				{at: t0, frame: udpPorts("198.18.0.1", 53, 80), want: okRule(r1)},
				{at: t0, frame: udpPorts("198.18.0.1", 80, 53), want: okRule(r3)},
				{at: t0, frame: udpPorts("198.18.0.1", 1000, 80), want: okRule(r2)},
				{at: t0, frame: udpPorts("198.18.0.1", 1000, 1000), want: okRule(r3)},
				{at: t0, frame: packet.Frame{Src: netip.MustParseAddr("198.18.0.1"), Proto: packet.ProtoTCP, SrcPort: 53, DstPort: 80}.Build(), want: okRule(0)},
			}},
		{name: "most specific prefix picks the rule; l4 overrides it", gen: trie,
			steps: []step{
				{at: t0, frame: udp4("198.18.0.1"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.1.1"), want: okRule(r2)},
				{at: t0, frame: udp4("198.18.1.129"), want: okRule(r3)},
				{at: t0, frame: udp4("198.19.1.129"), want: okRule(0)},
				{at: t0, frame: udp6("fd00:2::1"), want: okRule(r1)},
				{at: t0, frame: udp6("fd00:1::1"), want: okRule(r2)},
				{at: t0, frame: udpPorts("198.18.1.129", 123, 123), want: okRule(4)},
			}},
		{name: "rule actions drop and pass", gen: withPrefixes(generation(
			policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1, Action: policy.ActionDrop}, policy.CompiledRule{ID: r2, Action: policy.ActionPass, PerSource: pkts(1, 1)}),
			fact("198.18.1.0/24", r1, 0), fact("198.18.2.0/24", r2, 0)),
			steps: []step{
				{at: t0, frame: udp4("198.18.1.1"), want: limitedBy(maps.ReasonRuleDrop, r1)},
				{at: t0, frame: udp4("198.18.2.1"), want: verdict{action: maps.ActPass, reason: maps.ReasonRulePass, rule: r2, ruled: true}},
				{at: t0, frame: udp4("198.18.2.1"), want: verdict{action: maps.ActPass, reason: maps.ReasonRulePass, rule: r2, ruled: true}},
				{do: wantSrcKeys()},
			}},

		// State under flood.
		{name: "aggregate over budget: no per-source entries",
			gen: withPrefixes(generation(policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1, PerSource: pkts(10, 5), PerPrefix: pkts(1, 1), Aggregate: policy.AggregateWhole}), fact("198.19.0.0/16", r1, 0)),
			steps: cat(
				[]step{{at: t0, frame: udp4("198.19.200.1"), want: okRule(r1)}},
				floodSteps(t0, 300, limitedBy(maps.ReasonPrefixLimit, r1)),
				[]step{{do: wantSrcKeys()}},
			)},
		{name: "global over budget: no per-source entries", gen: globalOver,
			steps: cat(
				[]step{{at: t0, frame: udp4("198.19.200.1"), want: okRule(0)}},
				floodSteps(t0, 300, limitedBy(maps.ReasonGlobalLimit, 0)),
				[]step{{do: wantSrcKeys()}},
			)},
		{name: "asn over budget: no per-source entries",
			gen: withPrefixes(generation(policy.CompiledRule{ID: 0}, policy.CompiledRule{ID: r1, PerSource: pkts(10, 5), PerASN: pkts(1, 1)}), fact("198.19.0.0/16", r1, 64500)),
			steps: cat(
				[]step{{at: t0, frame: udp4("198.19.200.1"), want: okRule(r1)}},
				floodSteps(t0, 300, limitedBy(maps.ReasonASNLimit, r1)),
				[]step{{do: wantSrcKeys()}},
			)},

		// Atomic policy swap.
		{name: "policy swap keeps the state of surviving rule ids", gen: swapBefore,
			steps: []step{
				{at: t0, frame: udp4("198.18.1.1"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.1.1"), want: okRule(r1)},
				{at: t0, frame: udp4("198.18.2.1"), want: okRule(r2)},
				{at: t0, frame: udp4("198.18.2.1"), want: limitedBy(maps.ReasonSrcLimit, r2)},
				{do: applyGen(swapAfter)},
				// r1 survived: still empty. r2 became another id: a fresh bucket.
				{at: t0, frame: udp4("198.18.1.1"), want: limitedBy(maps.ReasonSrcLimit, r1)},
				{at: t0, frame: udp4("198.18.2.1"), want: okRule(hashedIDs)},
				{at: t0, frame: udp4("198.18.2.1"), want: limitedBy(maps.ReasonSrcLimit, hashedIDs)},
				{do: applyGen(swapBefore)},
				{at: t0, frame: udp4("198.18.1.1"), want: limitedBy(maps.ReasonSrcLimit, r1)},
				{at: t0, frame: udp4("198.18.2.1"), want: limitedBy(maps.ReasonSrcLimit, r2)},
				{at: t0 + second, frame: udp4("198.18.2.1"), want: okRule(r2)},
			}},
	}
}

// TestVerdicts runs scripted timelines for every verdict and reason, on one
// program whose tables are emptied between cases.
func TestVerdicts(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	for _, tc := range verdictCases() {
		t.Run(tc.name, func(t *testing.T) {
			td.tb = t
			clearTables(td)
			td.apply(tc.gen)
			if err := td.m.Lists.Set(tc.lists); err != nil {
				t.Fatalf("set lists: %v", err)
			}
			c := newChecker(td)
			for i, s := range tc.steps {
				if s.do != nil {
					s.do(td)
					c.sync()
				}
				if s.frame == nil {
					continue
				}
				td.setClock(s.at)
				c.send(fmt.Sprintf("step %d", i), s.frame, s.want)
			}
		})
	}
}

// TestNoPolicyYet: before the first Apply every IP packet passes as
// no_policy, malformed frames pass (no malformed verdict is set yet), and
// nothing is created in the tables.
func TestNoPolicyYet(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	c := newChecker(td)
	c.send("udp4", udp4("198.18.0.1"), passed(maps.ReasonNoPolicy))
	c.send("udp6", udp6("fd00::1"), passed(maps.ReasonNoPolicy))
	c.send("arp", packet.ARP(), passed(maps.ReasonNonIP))
	c.send("bad ipv4", with(udp4("198.18.0.1"), 14, 0x44), passed(maps.ReasonBadIPv4))
	c.send("truncated udp", udp4("198.18.0.1")[:40], passed(maps.ReasonBadIPLen))
	wantSrcKeys()(td)
	wantAggKeys()(td)
	if g := globalBucket(td); g != (refmodel.Bucket{}) {
		t.Errorf("global bucket %+v, want untouched", g)
	}
}

// TestDropsChargeNothingAbove checks "a packet dropped by a more specific
// bucket must not consume tokens of the aggregates above it", and that a
// packet an aggregate drops does not charge the source bucket below it.
func TestDropsChargeNothingAbove(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	const r1 = 1
	g := withPrefixes(generation(policy.CompiledRule{ID: 0},
		policy.CompiledRule{ID: r1, PerSource: pkts(1, 1), PerPrefix: pkts(1, 3), Aggregate: policy.AggregateWhole, PerASN: pkts(1, 10)}),
		fact("198.18.0.0/16", r1, 64500))
	g.Global = pkts(1, 10)
	td.apply(g)
	td.setClock(t0)
	c := newChecker(td)

	c.send("a: first", udp4("198.18.0.1"), okRule(r1))
	aggs, whole, glob := aggBuckets(td), wholeBucket(td, r1), globalBucket(td)
	if len(aggs) != 1 || whole == (refmodel.Bucket{}) {
		t.Fatalf("agg_buckets %v, whole aggregate %+v: want the asn bucket and a charged whole aggregate", aggs, whole)
	}
	for i := range 5 {
		c.send(fmt.Sprintf("a: over its source limit #%d", i), udp4("198.18.0.1"), limitedBy(maps.ReasonSrcLimit, r1))
	}
	if got := aggBuckets(td); fmt.Sprint(got) != fmt.Sprint(aggs) {
		t.Fatalf("source-limited packets charged the aggregates: %v, before %v", got, aggs)
	}
	if got := wholeBucket(td, r1); got != whole {
		t.Fatalf("source-limited packets charged the whole aggregate: %+v, before %+v", got, whole)
	}
	if got := globalBucket(td); got != glob {
		t.Fatalf("source-limited packets charged the global bucket: %+v, before %+v", got, glob)
	}

	// Use up the prefix aggregate (burst 3) with two more sources, then
	// a fourth source and the first one are dropped by it without touching
	// their own buckets.
	c.send("b", udp4("198.18.0.2"), okRule(r1))
	c.send("c", udp4("198.18.0.3"), okRule(r1))
	srcs := srcBuckets(td)
	td.setClock(t0 + time.Second)
	c.send("a: source refilled, aggregate empty", udp4("198.18.0.1"), okRule(r1))
	c.send("d: aggregate empty", udp4("198.18.0.4"), limitedBy(maps.ReasonPrefixLimit, r1))
	c.send("b: aggregate empty", udp4("198.18.0.2"), limitedBy(maps.ReasonPrefixLimit, r1))
	got := srcBuckets(td)
	a := srcKey(r1, "198.18.0.1/32")
	delete(got, a)
	delete(srcs, a)
	if fmt.Sprint(got) != fmt.Sprint(srcs) {
		t.Fatalf("prefix-limited packets charged or created source buckets: %v, before %v", got, srcs)
	}
}

// TestIPv6V4MappedSourceIsMalformed: the data plane keeps IPv4 as
// IPv4-mapped IPv6 (::ffff:a.b.c.d), so an IPv6 packet from ::ffff:10.1.2.3
// (not a valid source on the wire, RFC 4291 2.5.5.2) must not be taken for
// the IPv4 host 10.1.2.3: it would match IPv4 allow entries and pass
// unlimited. It is malformed (bad_ipv6) and gets the malformed verdict.
func TestIPv6V4MappedSourceIsMalformed(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	g := generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)})
	g.Global = pkts(1, 1)
	td.apply(g)
	if err := td.m.Lists.Set([]maps.ListEntry{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), AllowUntil: maps.Forever}}); err != nil {
		t.Fatal(err)
	}
	td.setClock(t0)
	c := newChecker(td)
	c.send("ipv6 packet from ::ffff:10.1.2.3", udp6("::ffff:10.1.2.3"), passed(maps.ReasonBadIPv6))
}

// TestPolicySwapIsAtomic applies two policies in turn while another
// goroutine sends packets: every packet must see one whole policy (its
// rule's action), never a half-written one (no_policy, or a limit that
// neither policy has).
func TestPolicySwapIsAtomic(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	dropAll := withPrefixes(generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)}, policy.CompiledRule{ID: 1, Action: policy.ActionDrop}), fact("198.18.0.0/16", 1, 0))
	passAll := withPrefixes(generation(policy.CompiledRule{ID: 0, PerSource: pkts(1, 1)}, policy.CompiledRule{ID: 2, Action: policy.ActionPass}), fact("198.18.0.0/16", 2, 0))
	passAll.Malformed = policy.VerdictDrop
	td.apply(dropAll)
	td.setClock(t0)
	before := td.counters()

	const applies = 60
	done := make(chan struct{})
	sent := make(chan int, 1)
	go func() {
		n := 0
		frame := udp4("198.18.0.1")
		for {
			select {
			case <-done:
				sent <- n
				return
			default:
			}
			// Run directly: td.run would call Fatal off the test goroutine.
			if _, err := td.d.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: frame}); err != nil {
				t.Errorf("prog test run: %v", err)
				sent <- n
				return
			}
			n++
		}
	}()
	for i := range applies {
		if i%2 == 0 {
			td.apply(passAll)
		} else {
			td.apply(dropAll)
		}
	}
	close(done)
	n := <-sent
	after := td.counters()
	var got uint64
	for a := range after {
		for r := range after[a] {
			d := after[a][r].Packets - before[a][r].Packets
			got += d
			if d == 0 {
				continue
			}
			ok := (maps.Action(a) == maps.ActDrop && maps.Reason(r) == maps.ReasonRuleDrop) ||
				(maps.Action(a) == maps.ActPass && maps.Reason(r) == maps.ReasonRulePass)
			if !ok {
				t.Errorf("%d packets counted %s/%s during swaps: a half-applied policy was visible",
					d, maps.ActionName(maps.Action(a)), maps.ReasonName(maps.Reason(r)))
			}
		}
	}
	if got != uint64(n) {
		t.Errorf("counted %d packets, sent %d", got, n)
	}
	if n < applies {
		t.Errorf("only %d packets ran during %d applies: the swap was hardly exercised", n, applies)
	}
	t.Logf("%d packets during %d applies", n, applies)
}
