package maps_test

import (
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// explainLab is a limiter on the kernel's clock (ExplainPath reads it),
// driven with BPF_PROG_TEST_RUN. Rates are per hour, so nothing refills
// while a test runs and the test does not depend on timing.
type explainLab struct {
	t *testing.T
	d *loader.Datapath
	m *maps.Maps
}

func newExplainLab(t *testing.T) *explainLab {
	t.Helper()
	testenv.RequireRoot(t)
	d, err := loader.Load(loader.Options{Sizes: loader.Sizes{MaxRules: 64, SrcEntries: 4096, AggEntries: 4096,
		PrefixEntries: 4096, ListEntries: 1024, L4Entries: 64}})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return &explainLab{t: t, d: d, m: maps.New(d)}
}

func perHour(n uint64) policy.Limit {
	return policy.Limit{Rate: policy.Rate{Count: n, Per: time.Hour}, Burst: n}
}

// send runs one UDP frame from src through the program: true if passed.
func (l *explainLab) send(src string, sport uint16) bool {
	l.t.Helper()
	a := netip.MustParseAddr(src)
	dst := netip.MustParseAddr("198.18.0.1")
	if a.Is6() {
		dst = netip.MustParseAddr("fd00::1")
	}
	f := packet.Frame{Src: a, Dst: dst, Proto: packet.ProtoUDP, SrcPort: sport, DstPort: 7007, Payload: 22}
	ret, err := l.d.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: f.Build()})
	if err != nil {
		l.t.Fatalf("prog test run: %v", err)
	}
	return ret == 2 // XDP_PASS
}

// drops is the program's drop counter for reason r.
func (l *explainLab) drops(r maps.Reason) uint64 {
	l.t.Helper()
	c, err := l.m.Counters()
	if err != nil {
		l.t.Fatal(err)
	}
	return c[maps.ActDrop][r].Packets
}

func (l *explainLab) explain(p maps.Probe) maps.Path {
	l.t.Helper()
	path, err := l.m.ExplainPath(p)
	if err != nil {
		l.t.Fatalf("explain %v: %v", p.Addr, err)
	}
	return path
}

func udpProbe(src string, sport uint16) maps.Probe {
	return maps.Probe{Addr: netip.MustParseAddr(src), Proto: 17, SPort: sport, DPort: 7007, Len: 64}
}

func bucket(t *testing.T, p maps.Path, k maps.BucketKind) maps.PathBucket {
	t.Helper()
	for _, b := range p.Buckets {
		if b.Kind == k {
			return b
		}
	}
	t.Fatalf("no %s bucket on the path: %+v", k, p.Buckets)
	return maps.PathBucket{}
}

// TestExplainPathAgreesWithProgram checks ExplainPath against the program
// itself: before each packet, what explain predicts is what the program
// then does, through the per-source, prefix, ASN and global buckets, the
// lists, an L4 override, a rule drop and a dry-run rule.
func TestExplainPathAgreesWithProgram(t *testing.T) {
	l := newExplainLab(t)
	g := policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictPass,
		Global:    policy.Bucket{Packets: perHour(1000)},
		Rules: []policy.CompiledRule{
			{
				ID:           0,
				PerSource:    policy.Bucket{Packets: perHour(3)},
				SourceKey:    policy.KeyBits{V4: 32, V6: 64},
				PerPrefix:    policy.Bucket{Packets: perHour(5)},
				Aggregate:    policy.AggregateDerived,
				AggregateKey: policy.KeyBits{V4: 24, V6: 48},
				PerASN:       policy.Bucket{Packets: perHour(7)},
			},
			{ID: 7, PerPrefix: policy.Bucket{Packets: perHour(2)}, Aggregate: policy.AggregateWhole, SourceKey: policy.KeyBits{V4: 32, V6: 64}},
			{ID: 9, Action: policy.ActionDrop, SourceKey: policy.KeyBits{V4: 32, V6: 64}},
			{ID: 11, PerSource: policy.Bucket{Packets: perHour(1)}, SourceKey: policy.KeyBits{V4: 32, V6: 64}, Mode: policy.RuleModeDryRun},
			{ID: 13, PerASN: policy.Bucket{Packets: perHour(10)}, SourceKey: policy.KeyBits{V4: 32, V6: 64}, Reserve: 500_000},
		},
		Prefixes: []policy.PrefixFact{
			{Prefix: netip.MustParsePrefix("198.51.100.0/24"), RuleID: 0, ASN: 64500, Country: [2]byte{'Z', 'Z'}},
			{Prefix: netip.MustParsePrefix("198.51.101.0/24"), RuleID: 0, ASN: 64500},
			{Prefix: netip.MustParsePrefix("192.0.2.0/24"), RuleID: 9},
			{Prefix: netip.MustParsePrefix("2001:db8::/32"), RuleID: 11},
			{Prefix: netip.MustParsePrefix("198.51.102.0/24"), RuleID: 13, ASN: 64502},
		},
		L4: []policy.L4Entry{{Protocol: 17, Dir: policy.PortSrc, Port: 53, RuleID: 7}},
	}
	if err := l.m.Apply(&g); err != nil {
		t.Fatal(err)
	}

	// A fresh source: every bucket full, the first packet passes.
	p := l.explain(udpProbe("198.51.100.7", 4000))
	if p.Verdict != maps.ActPass || p.Reason != maps.ReasonOK || p.Fact == nil || p.Fact.ASN != 64500 || p.NoRule {
		t.Fatalf("fresh source: %+v", p)
	}
	if len(p.Buckets) != 4 {
		t.Fatalf("buckets on the path: %+v, want per_source, per_prefix, per_asn, global", p.Buckets)
	}
	src := bucket(t, p, maps.BucketSource)
	if src.Exists || src.Key != netip.MustParsePrefix("198.51.100.7/32") || src.Packets.Available != 3 || src.Packets.Burst != 3 {
		t.Errorf("per_source before any packet: %+v", src)
	}
	if b := bucket(t, p, maps.BucketPrefix); b.Key != netip.MustParsePrefix("198.51.100.0/24") || b.Whole {
		t.Errorf("per_prefix: %+v", b)
	}
	if b := bucket(t, p, maps.BucketASN); b.ASN != 64500 {
		t.Errorf("per_asn: %+v", b)
	}
	// Each packet: explain predicts, the program decides.
	for i := 0; i < 4; i++ {
		want := l.explain(udpProbe("198.51.100.7", 4000)).Verdict == maps.ActPass
		if got := l.send("198.51.100.7", 4000); got != want {
			t.Fatalf("packet %d: explain said pass=%v, the program passed=%v", i+1, want, got)
		}
	}
	p = l.explain(udpProbe("198.51.100.7", 4000))
	if p.Verdict != maps.ActDrop || p.Reason != maps.ReasonSrcLimit {
		t.Errorf("after 3 of 3 packets: %v %v, want drop source_limit", maps.ActionName(p.Verdict), maps.ReasonName(p.Reason))
	}
	if b := bucket(t, p, maps.BucketSource); !b.Exists || b.Packets.Available >= 1 || b.Admits {
		t.Errorf("per_source after its burst: %+v", b)
	}
	if b := bucket(t, p, maps.BucketPrefix); b.Packets.Available < 1.99 || b.Packets.Available > 2.01 {
		t.Errorf("per_prefix after 3 of 5: %+v", b)
	}
	// Another source of the /24 takes the prefix aggregate's last two; then
	// a third source is refused by the aggregate, before its own bucket.
	for i := 0; i < 2; i++ {
		if !l.send("198.51.100.8", 4000) {
			t.Fatalf("second source, packet %d dropped", i+1)
		}
	}
	p = l.explain(udpProbe("198.51.100.9", 4000))
	if p.Verdict != maps.ActDrop || p.Reason != maps.ReasonPrefixLimit || !bucket(t, p, maps.BucketSource).Admits {
		t.Errorf("third source of a full /24: %+v", p)
	}
	if l.send("198.51.100.9", 4000) {
		t.Error("the program passed what explain said the /24 refuses")
	}
	// The first source is over its own limit and its /24 is full: the
	// program drops at the aggregate's peek, before the source's bucket,
	// and counts the drop under the aggregate's reason. So does explain.
	p = l.explain(udpProbe("198.51.100.7", 4000))
	before := l.drops(maps.ReasonPrefixLimit)
	if l.send("198.51.100.7", 4000) || l.drops(maps.ReasonPrefixLimit) != before+1 || p.Reason != maps.ReasonPrefixLimit {
		t.Errorf("source over its limit in a full /24: explain says %s, the program counted prefix_limit drops %d -> %d",
			maps.ReasonName(p.Reason), before, l.drops(maps.ReasonPrefixLimit))
	}
	// The ASN aggregate (7) holds 198.51.101.0/24 too: 5 passed so far.
	for i := 0; i < 2; i++ {
		if !l.send("198.51.101.1", 4000) {
			t.Fatalf("other /24 of the ASN, packet %d dropped", i+1)
		}
	}
	p = l.explain(udpProbe("198.51.101.2", 4000))
	if p.Reason != maps.ReasonASNLimit || l.send("198.51.101.2", 4000) {
		t.Errorf("full ASN: explain %v, want asn_limit and a drop", maps.ReasonName(p.Reason))
	}

	// L4 override: UDP from port 53 goes to rule 7 (a whole aggregate of 2).
	p = l.explain(udpProbe("198.51.100.7", 53))
	if p.L4 == nil || p.L4.Dir != maps.L4Src || p.L4.Port != 53 || p.RuleID != 7 || p.Verdict != maps.ActPass || !bucket(t, p, maps.BucketPrefix).Whole {
		t.Errorf("udp from port 53: %+v", p)
	}
	l.send("203.0.113.1", 53)
	l.send("203.0.113.2", 53)
	if p := l.explain(udpProbe("203.0.113.3", 53)); p.Reason != maps.ReasonPrefixLimit || l.send("203.0.113.3", 53) {
		t.Errorf("whole aggregate after 2 of 2: %v", maps.ReasonName(p.Reason))
	}

	// Rule drop, and a dry-run rule's would-drop.
	if p := l.explain(udpProbe("192.0.2.1", 4000)); p.Verdict != maps.ActDrop || p.Reason != maps.ReasonRuleDrop || l.send("192.0.2.1", 4000) {
		t.Errorf("drop rule: %+v", p)
	}
	l.send("2001:db8::1", 4000)
	p = l.explain(udpProbe("2001:db8::2", 4000)) // same /64: same per-source bucket
	if p.Verdict != maps.ActWouldDrop || p.Reason != maps.ReasonSrcLimit || bucket(t, p, maps.BucketSource).Key != netip.MustParsePrefix("2001:db8::/64") {
		t.Errorf("dry-run rule after its burst: %+v", p)
	}
	if !l.send("2001:db8::2", 4000) {
		t.Error("dry-run dropped")
	}

	// The reserve: new sources may fill the ASN bucket (10) to 5, an
	// established one to 10.
	for i := 1; i <= 6; i++ {
		src := "198.51.102." + strconv.Itoa(i)
		p := l.explain(udpProbe(src, 4000))
		want := p.Verdict == maps.ActPass
		if got := l.send(src, 4000); got != want || want != (i <= 5) {
			t.Fatalf("new source %d into a bucket with a 50%% reserve: explain pass=%v, program pass=%v, want %v", i, want, got, i <= 5)
		}
		if b := bucket(t, p, maps.BucketASN); b.Packets.Reserve != 5 || (i == 6) != b.ReserveRefuses || p.Privileged {
			t.Errorf("new source %d: ASN bucket %+v", i, b)
		}
	}
	vip := netip.MustParseAddr("198.51.102.100")
	if err := l.m.SetStanding(vip, maps.StandingEstablished); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 6; i++ {
		p := l.explain(udpProbe(vip.String(), 4000))
		want := p.Verdict == maps.ActPass
		if got := l.send(vip.String(), 4000); got != want || want != (i < 5) || !p.Privileged ||
			p.Standing.Standing != maps.StandingEstablished {
			t.Fatalf("established source, packet %d: explain pass=%v (privileged %v), program pass=%v, want %v",
				i+1, want, p.Privileged, got, i < 5)
		}
	}

	// Lists: deny beats every rule; allow passes without buckets.
	if err := l.m.SetLists([]maps.ListEntry{
		{Prefix: netip.MustParsePrefix("198.51.100.0/25"), DenyUntil: maps.Forever, Origin: maps.OriginCLI},
		{Prefix: netip.MustParsePrefix("198.51.101.0/24"), AllowUntil: maps.Forever, Origin: maps.OriginPolicy},
	}); err != nil {
		t.Fatal(err)
	}
	p = l.explain(udpProbe("198.51.100.9", 4000))
	if p.Verdict != maps.ActDrop || p.Reason != maps.ReasonDeny || p.List == nil ||
		p.List.Prefix != netip.MustParsePrefix("198.51.100.0/25") || p.List.Origin != maps.OriginCLI || len(p.Buckets) != 0 {
		t.Errorf("deny-listed: %+v", p)
	}
	if l.send("198.51.100.9", 4000) {
		t.Error("the program passed a deny-listed source")
	}
	p = l.explain(udpProbe("198.51.101.2", 4000))
	if p.Verdict != maps.ActPass || p.Reason != maps.ReasonAllow || !l.send("198.51.101.2", 4000) {
		t.Errorf("allow-listed: %+v", p)
	}
	if _, err := l.m.ExplainPath(maps.Probe{}); err == nil {
		t.Error("explain of an invalid address: no error")
	}
}
