package shield

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/policy"
)

var t0 = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)

func testConfig() policy.Shield {
	c := policy.DefaultShield()
	c.Mode = ModeEnforce
	c.HalfLife = 10 * time.Minute
	c.LearnFor = time.Minute
	c.Factor, c.MinRate, c.Sustain, c.EndFactor, c.Cooldown = 3, perSecond(100), 2*time.Second, 1.5, 5*time.Second
	c.MaxAggregates = 256
	c.TTL = time.Minute
	return c
}

// flow is traffic of one kind in a simulation: rate(t) packets per second
// of samples made by mk.
type flow struct {
	rate func(sec int) float64
	mk   func(r *rand.Rand) Sample
}

type sim struct {
	t       *testing.T
	e       *Engine
	now     time.Time
	sec     int
	rng     *rand.Rand
	changes []Change
}

// perSecond is n packets per second as the policy writes a rate.
func perSecond(n uint64) policy.Rate { return policy.Rate{Count: n, Per: time.Second} }

func newSim(t *testing.T, c policy.Shield, o ...Options) *sim {
	var opts Options
	if len(o) > 0 {
		opts = o[0]
	}
	s := &sim{t: t, e: New(c, opts), now: t0, rng: rand.New(rand.NewPCG(1, 2))}
	s.e.SetRules(map[uint32]RuleShape{0: {PrefixLen4: 24, PrefixLen6: 48, ASN: true}}, GlobalShape{Limited: true})
	s.e.Tick(s.now)
	return s
}

// run advances n seconds; each flow emits up to 40 samples a second that
// stand for its rate.
func (s *sim) run(n int, flows ...flow) {
	for range n {
		for _, f := range flows {
			r := f.rate(s.sec)
			if r <= 0 {
				continue
			}
			k := int(math.Min(40, math.Ceil(r)))
			for range k {
				smp := f.mk(s.rng)
				smp.Weight = r / float64(k)
				s.e.Observe(smp)
			}
		}
		s.sec++
		s.now = s.now.Add(time.Second)
		s.changes = append(s.changes, s.e.Tick(s.now)...)
	}
}

func (s *sim) row(k Key) Row {
	for _, r := range s.e.Report(0).Rows {
		if r.Key == k {
			return r
		}
	}
	s.t.Fatalf("aggregate %s not tracked", k)
	return Row{}
}

func constant(r float64) func(int) float64 { return func(int) float64 { return r } }

// user is bursty: a user's second is 0, 1x or 3x its mean at random, so
// "the rate jumped" rules see honest variance.
func bursty(mean float64, seed uint64) func(int) float64 {
	return func(sec int) float64 {
		switch (uint64(sec)*2654435761 + seed) % 4 {
		case 0:
			return 0
		case 1, 2:
			return mean * 2 / 3
		}
		return mean * 2
	}
}

func udpFrom(asn uint32, pfx string, dport uint16) func(r *rand.Rand) Sample {
	p := netip.MustParsePrefix(pfx)
	return func(r *rand.Rand) Sample {
		a := p.Addr().As4()
		a[3] = byte(r.IntN(256))
		return Sample{Src: netip.AddrFrom4(a), ASN: asn, Proto: 17, SPort: uint16(1024 + r.IntN(60000)), DPort: dport,
			Len: uint16(60 + r.IntN(1400)), TTL: 64, Passed: true}
	}
}

var asnA = Key{Kind: KindASN, ASN: 64500}

// TestBaselineConstant: a steady rate learns a baseline at or up to one
// histogram bucket (19%) above it.
func TestBaselineConstant(t *testing.T) {
	s := newSim(t, testConfig())
	s.run(120, flow{constant(500), udpFrom(64500, "198.18.1.0/24", 443)})
	r := s.row(asnA)
	if r.Baseline < 500 || r.Baseline > 500*1.19+1 {
		t.Fatalf("baseline %.1f for a steady 500/s, want [500, 595]", r.Baseline)
	}
	if !r.Judged || r.State != Normal {
		t.Fatalf("row %+v: want judged and normal", r)
	}
	if len(s.changes) != 0 {
		t.Fatalf("changes on steady traffic: %+v", s.changes)
	}
}

// TestBaselineBursty: the baseline is the high percentile of bursty
// traffic, not its mean, and bursts never trip the detector.
func TestBaselineBursty(t *testing.T) {
	s := newSim(t, testConfig())
	s.run(300, flow{bursty(600, 7), udpFrom(64500, "198.18.1.0/24", 443)})
	r := s.row(asnA)
	if r.Baseline < 1200 || r.Baseline > 1200*1.19+1 {
		t.Fatalf("baseline %.1f, want the bursts' 1200/s (+19%%)", r.Baseline)
	}
	if len(s.changes) != 0 {
		t.Fatalf("bursty users caused changes: %+v", s.changes)
	}
}

// TestSlowRampNoAction: a 2x rise over ten minutes is learned, not acted on.
func TestSlowRampNoAction(t *testing.T) {
	s := newSim(t, testConfig())
	s.run(120, flow{constant(1000), udpFrom(64500, "198.18.1.0/24", 443)})
	s.run(600, flow{func(sec int) float64 { return 1000 * (1 + float64(sec-120)/600) }, udpFrom(64500, "198.18.1.0/24", 443)})
	for _, c := range s.changes {
		t.Errorf("slow ramp: %s %s: %s", c.Op, c.Action.Key, c.Why)
	}
	if r := s.row(asnA); r.State != Normal || r.Baseline < 1800 {
		t.Fatalf("after the ramp: %+v, want normal with the baseline following (>= 1800)", r)
	}
}

// TestDetectorFlapping: a rate that crosses the factor and falls back
// before sustain never surges; one that dips under factor but not under
// end_factor during a surge does not end it.
func TestDetectorFlapping(t *testing.T) {
	c := policy.Shield{Factor: 3, MinRate: perSecond(10), Sustain: 3 * time.Second, EndFactor: 1.5, Cooldown: 4 * time.Second}
	var d detector
	now := t0
	for i := range 60 {
		rate := 100.0
		if i%4 < 2 { // 2 s above, 2 s below
			rate = 400
		}
		d.step(now, rate, 100, c)
		if d.surging() {
			t.Fatalf("second %d: flapping surged", i)
		}
		now = now.Add(time.Second)
	}
	for range 4 {
		d.step(now, 400, 100, c)
		now = now.Add(time.Second)
	}
	if !d.surging() {
		t.Fatal("4 s above factor with sustain 3 s: not surging")
	}
	for i := range 20 {
		if d.step(now, 200, 100, c) { // 2x: under factor, over end_factor
			t.Fatalf("second %d: surge ended at 2x with end_factor 1.5", i)
		}
		now = now.Add(time.Second)
	}
	ended := false
	for range 6 {
		ended = ended || d.step(now, 100, 100, c)
		now = now.Add(time.Second)
	}
	if !ended || d.State != Normal {
		t.Fatalf("back at baseline for 6 s with cooldown 4 s: state %s, ended %v", d.State, ended)
	}
}

// TestDetectorMinRate: 10x a tiny baseline under min_rate is no surge.
func TestDetectorMinRate(t *testing.T) {
	c := policy.Shield{Factor: 3, MinRate: perSecond(1000), Sustain: time.Second, EndFactor: 1.5, Cooldown: time.Second}
	var d detector
	for i := range 10 {
		d.step(t0.Add(time.Duration(i)*time.Second), 500, 50, c)
	}
	if d.State != Normal {
		t.Fatalf("500/s over a 50/s baseline with min_rate 1000: %s", d.State)
	}
}

func users(n int) []flow {
	var out []flow
	for i := range n {
		asn := uint32(64500 + i%3)
		pfx := []string{"198.18.1.0/24", "198.18.2.0/24", "198.18.3.0/24"}[i%3]
		out = append(out, flow{bursty(300, uint64(i)), udpFrom(asn, pfx, 443)})
	}
	return out
}

// TestASNFloodTightens: a flood from one ASN at 20x its baseline, shaped
// like its users' traffic, tightens that ASN for new sources (and nothing
// broader), to its baseline, within sustain plus a few intervals; the
// action goes when the flood ends, after cooldown.
func TestASNFloodTightens(t *testing.T) {
	s := newSim(t, testConfig())
	u := users(6)
	s.run(180, u...)
	base := s.row(asnA).Baseline
	flood := flow{func(int) float64 { return 20 * base }, udpFrom(64500, "198.18.1.0/24", 443)}
	s.run(8, append(u, flood)...)
	var inst []Change
	for _, c := range s.changes {
		if c.Op == OpInstall {
			inst = append(inst, c)
		}
	}
	if len(inst) != 1 {
		t.Fatalf("installs %+v, want exactly one", inst)
	}
	a := inst[0].Action
	// The /24 of the flood is narrower than the ASN and surges too; either
	// is the flood's aggregate, and nothing broader may be touched.
	if a.Kind != Tighten || (a.Key != asnA && a.Key.Kind != KindPrefix) {
		t.Fatalf("action %+v, want tighten of the ASN or the flood's /24", a)
	}
	if a.Budget < a.Baseline || a.Budget > 1.01*a.Baseline*s.e.cfg.TightenTo {
		t.Fatalf("budget %.0f vs baseline %.0f", a.Budget, a.Baseline)
	}
	if inst[0].Mitigate > 6*time.Second || !a.Enforced {
		t.Fatalf("mitigated after %s (enforced %v)", inst[0].Mitigate, a.Enforced)
	}
	s.changes = nil
	s.run(30, u...)
	if len(s.changes) != 1 || s.changes[0].Op != OpRemove || s.changes[0].Action.ID != a.ID {
		t.Fatalf("after the flood: %+v, want the action removed", s.changes)
	}
	if got := len(s.e.Report(0).Actions); got != 0 {
		t.Fatalf("%d actions left", got)
	}
}

// TestMonitorWritesNothing: monitor decides the same, marks it not
// enforced, and counts would-drops.
func TestMonitorWritesNothing(t *testing.T) {
	c := testConfig()
	c.Mode = ModeMonitor
	s := newSim(t, c)
	u := users(3)
	s.run(120, u...)
	s.run(10, append(u, flow{constant(20000), udpFrom(64500, "198.18.1.0/24", 443)})...)
	if len(s.changes) == 0 {
		t.Fatal("monitor: no decision reported")
	}
	for _, ch := range s.changes {
		if ch.Action.Enforced {
			t.Fatalf("monitor enforced %+v", ch)
		}
	}
	if _, wd := s.e.Counts(); wd <= 0 {
		t.Fatal("monitor: no would-drop counted")
	}
	// monitor -> enforce installs what it would do.
	c.Mode = ModeEnforce
	got := s.e.Reconfigure(c, s.now)
	if len(got) == 0 || got[0].Op != OpInstall || !got[0].Action.Enforced {
		t.Fatalf("to enforce: %+v", got)
	}
}

// TestForbidReleasePin: a forbidden aggregate is never touched; a released
// action is not taken again during the same surge; a pinned one outlives
// its surge.
func TestForbidReleasePin(t *testing.T) {
	c := testConfig()
	c.Forbid = []policy.ShieldForbid{{ASN: 64500}, {Prefix: netip.MustParsePrefix("198.18.1.0/24")}}
	s := newSim(t, c)
	u := users(3)
	s.run(120, u...)
	flood := flow{constant(20000), udpFrom(64500, "198.18.1.0/24", 443)}
	s.run(10, append(u, flood)...)
	for _, ch := range s.changes {
		if ch.Action.Key.Kind == KindASN || ch.Action.Key.Kind == KindPrefix {
			t.Fatalf("forbidden aggregate acted on: %+v", ch.Action)
		}
	}

	s = newSim(t, testConfig())
	s.run(120, u...)
	s.run(8, append(u, flood)...)
	acts := s.e.Report(0).Actions
	if len(acts) != 1 {
		t.Fatalf("actions %+v", acts)
	}
	if _, err := s.e.Release(acts[0].ID, "alice", s.now); err != nil {
		t.Fatal(err)
	}
	s.changes = nil
	s.run(5, append(u, flood)...)
	for _, ch := range s.changes {
		if ch.Action.Key == acts[0].Key {
			t.Fatalf("released aggregate acted on again: %+v", ch)
		}
	}
	if _, err := s.e.Release(999, "bob", s.now); err == nil {
		t.Fatal("release of an unknown id: no error")
	}

	s = newSim(t, testConfig())
	s.run(120, u...)
	s.run(8, append(u, flood)...)
	acts = s.e.Report(0).Actions
	if _, err := s.e.Pin(acts[0].ID, "carol"); err != nil {
		t.Fatal(err)
	}
	s.run(120, u...)
	if got := s.e.Report(0).Actions; len(got) != 1 || !got[0].Pinned {
		t.Fatalf("pinned action after the surge: %+v", got)
	}
	// A forbid added at run time removes what it covers.
	ch := s.e.AddForbid(Forbid{Key: &acts[0].Key, By: "dave"}, s.now)
	if len(ch) != 1 || ch[0].Op != OpRemove || ch[0].By != "dave" {
		t.Fatalf("forbid: %+v", ch)
	}
}

// TestFingerprintFlood: random sources flood UDP to one port with one
// length (seeded: they differ per run); the shield installs a fingerprint
// that names them, with no collateral on users' ports.
func TestFingerprintFlood(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 9))
	port := uint16(2000 + rng.IntN(30000))
	length := uint16(100 + rng.IntN(1300))
	s := newSim(t, testConfig())
	u := users(6)
	s.run(180, u...)
	flood := flow{constant(30000), func(r *rand.Rand) Sample {
		return Sample{Src: netip.AddrFrom4([4]byte{198, 19, byte(r.IntN(256)), byte(r.IntN(256))}), Proto: 17,
			SPort: uint16(r.IntN(65536)), DPort: port, Len: length, TTL: uint8(30 + r.IntN(30)), Passed: true}
	}}
	s.run(8, append(u, flood)...)
	var fp *Action
	for _, c := range s.changes {
		if c.Op == OpInstall && c.Action.Kind == FingerprintRule {
			fp = &c.Action
		}
		if c.Op == OpInstall && c.Action.Kind == Tighten && c.Action.Key.Kind != KindGlobal {
			t.Errorf("tightened %s", c.Action.Key)
		}
	}
	if fp == nil {
		t.Fatalf("no fingerprint: %+v", s.changes)
	}
	f := fp.Fingerprint
	if f.Mask&(FProto|FDPort) != FProto|FDPort || f.Proto != 17 || f.DPort != port {
		t.Fatalf("fingerprint %s, want proto udp dport %d", f, port)
	}
	if f.Mask&FLen != 0 && f.Len != length {
		t.Fatalf("fingerprint %s: len %d", f, length)
	}
	if fp.Collateral > 0.01 || fp.Budget > 1000 {
		t.Fatalf("collateral %.3f budget %.0f", fp.Collateral, fp.Budget)
	}
	// Users' samples never match it.
	for range 1000 {
		if smp := users(1)[0].mk(s.rng); f.Matches(smp) {
			t.Fatalf("fingerprint %s matches user traffic %+v", f, smp)
		}
	}
}

// TestSpaceSaving checks the summary's guarantees on a known stream.
func TestSpaceSaving(t *testing.T) {
	ss := newSpaceSaving[int](10)
	rng := rand.New(rand.NewPCG(3, 4))
	truth := map[int]float64{}
	for range 100000 {
		var k int
		switch x := rng.Float64(); {
		case x < 0.3:
			k = 1
		case x < 0.45:
			k = 2
		default:
			k = 100 + rng.IntN(10000)
		}
		ss.add(k, 1)
		truth[k]++
	}
	top, w, _ := ss.top()
	if top != 1 {
		t.Fatalf("top %d, want 1", top)
	}
	if len(ss.heap) != 10 || len(ss.index) != 10 {
		t.Fatalf("%d counters, %d indexed, want 10", len(ss.heap), len(ss.index))
	}
	for i, e := range ss.heap {
		if e.count < truth[e.key] || e.count-e.err > truth[e.key] {
			t.Fatalf("item %d: count %.0f err %.0f, truth %.0f", e.key, e.count, e.err, truth[e.key])
		}
		if ss.index[e.key] != e || e.pos != i || (i > 0 && ss.heap[(i-1)/2].count > e.count) {
			t.Fatalf("heap broken at %d", i)
		}
	}
	if w > truth[1] {
		t.Fatalf("lower bound %.0f above truth %.0f", w, truth[1])
	}
	if _, ok := ss.index[2]; !ok {
		t.Fatal("item 2 (15%, above 1/k) not held")
	}
	if b := ss.bound(5_000_000); b < 0 || b > 100000/10 {
		t.Fatalf("bound of an absent item %.0f, want <= total/k", b)
	}
}

// TestBoundedMemory: a flood from a million random /24s keeps the table at
// its capacity.
func TestBoundedMemory(t *testing.T) {
	c := testConfig()
	c.MaxAggregates = 100
	s := newSim(t, c)
	s.run(30, flow{constant(10000), func(r *rand.Rand) Sample {
		return Sample{Src: netip.AddrFrom4([4]byte{byte(r.IntN(200)), byte(r.IntN(256)), byte(r.IntN(256)), 1}), Proto: 6, DPort: uint16(r.IntN(65536)), Weight: 1}
	}})
	if n := s.e.Report(0).Tracked; n > 100 {
		t.Fatalf("tracked %d, capacity 100", n)
	}
}

// TestStateRoundTrip: baselines survive Save/Load (decayed for the time
// down); hostile state files are refused whole.
func TestStateRoundTrip(t *testing.T) {
	s := newSim(t, testConfig())
	s.run(120, flow{constant(500), udpFrom(64500, "198.18.1.0/24", 443)})
	s.e.AddForbid(Forbid{ASN: 64999, By: "op"}, s.now)
	data, err := s.e.Save(s.now)
	if err != nil {
		t.Fatal(err)
	}
	e2 := New(testConfig(), Options{})
	n, err := e2.Load(data, s.now.Add(time.Minute))
	if err != nil || n == 0 {
		t.Fatalf("load: %d, %v", n, err)
	}
	var got Row
	for _, r := range e2.Report(0).Rows {
		if r.Key == asnA {
			got = r
		}
	}
	if got.Baseline != s.row(asnA).Baseline || !got.Judged {
		t.Fatalf("after load %+v, before %+v", got, s.row(asnA))
	}
	if f := e2.Report(0).Forbid; len(f) != 1 || f[0].ASN != 64999 {
		t.Fatalf("forbids after load: %+v", f)
	}
	var st map[string]any
	json.Unmarshal(data, &st)
	bad := []string{
		`{"version":2}`,
		`{"version":1,"aggregates":[{"key":{"Kind":9},"packets":{"w":[]}}]}`,
		`{"version":1,"aggregates":[{"key":{"Kind":5,"Rule":3}}]}`,
		`{"version":1,"aggregates":[{"key":{"Kind":5},"learned":-1}]}`,
		`{"version":1,"aggregates":[{"key":{"Kind":5},"packets":{"w":[-1]}}]}`,
		`{"version":1,"aggregates":[{"key":{"Kind":5}},{"key":{"Kind":5}}]}`,
		`{"version":1,"forbid":[{}]}`,
		`[1,2,3]`,
		strings.Repeat("{", 100),
	}
	for _, b := range bad {
		e3 := New(testConfig(), Options{})
		if _, err := e3.Load([]byte(b), s.now); err == nil {
			t.Errorf("state %q loaded", b)
		}
		if len(e3.Report(0).Rows) != 0 {
			t.Errorf("state %q: half loaded", b)
		}
	}
}

// TestParseKeyRoundTrip: every key kind reads back, and junk is refused.
func TestParseKeyRoundTrip(t *testing.T) {
	for _, k := range []Key{
		{Kind: KindPrefix, Rule: 3, Prefix: netip.MustParsePrefix("198.18.4.0/24")},
		{Kind: KindASN, Rule: 0, ASN: 64500}, {Kind: KindCountry, Country: [2]byte{'D', 'E'}},
		{Kind: KindPort, Proto: 17, Port: 53}, {Kind: KindRule, Rule: 7}, {Kind: KindGlobal},
	} {
		got, err := ParseKey(k.String())
		if err != nil || got != k {
			t.Errorf("%s: %+v, %v", k, got, err)
		}
	}
	for _, s := range []string{"", "rule", "rule x", "rule 1 asn", "rule 1 prefix 300.0.0.0/8", "port udp", "port xyz/1", "port udp/70000", "country DEU", "global 1"} {
		if _, err := ParseKey(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
	for _, s := range []string{"198.18.0.0/15", "198.18.0.1", "AS64500", "global", "port tcp/22"} {
		if _, err := ParseForbid(s); err != nil {
			t.Errorf("forbid %q: %v", s, err)
		}
	}
	for _, s := range []string{"AS", "AS0", "ASx", "AS-1", "nonsense"} {
		if _, err := ParseForbid(s); err == nil {
			t.Errorf("forbid %q parsed", s)
		}
	}
}

// TestCountedAggregates: aggregates the data plane counts exactly learn
// from Count, not from samples (which would count them twice), and an ASN
// surge explains the global one: only the ASN is tightened.
func TestCountedAggregates(t *testing.T) {
	c := testConfig()
	e := New(c, Options{})
	e.SetRules(map[uint32]RuleShape{0: {PrefixLen4: 24, PrefixLen6: 48, ASN: true, Counted: true}}, GlobalShape{Limited: true, Counted: true})
	asnB := Key{Kind: KindASN, ASN: 64501}
	glob := Key{Kind: KindGlobal}
	now := t0
	e.Tick(now)
	var changes []Change
	step := func(a, b float64) {
		e.Count(asnA, a, a*100)
		e.Count(asnB, b, b*100)
		e.Count(glob, a+b, (a+b)*100)
		// Samples of the same traffic must not add to counted keys.
		e.Observe(Sample{Src: netip.MustParseAddr("198.18.1.1"), ASN: 64500, Proto: 17, DPort: 443, Len: 100, Weight: a})
		now = now.Add(time.Second)
		changes = append(changes, e.Tick(now)...)
	}
	for range 120 {
		step(400, 400)
	}
	var base float64
	for _, r := range e.Report(0).Rows {
		if r.Key == asnA {
			base = r.Baseline
		}
	}
	if base < 400 || base > 480 {
		t.Fatalf("counted baseline %.0f for 400/s (samples double counted?)", base)
	}
	for range 8 {
		step(20*400, 400)
	}
	var got []Key
	for _, ch := range changes {
		if ch.Op == OpInstall {
			got = append(got, ch.Action.Key)
		}
	}
	if len(got) != 1 || got[0] != asnA {
		t.Fatalf("installs on %v, want only %s (global is explained by it)", got, asnA)
	}
}

// TestReconfigureDropsGoneAggregates: a reload that removes the bucket an
// action tightens removes the action.
func TestReconfigureDropsGoneAggregates(t *testing.T) {
	s := newSim(t, testConfig())
	u := users(3)
	s.run(120, u...)
	s.run(8, append(u, flow{constant(20000), udpFrom(64500, "198.18.1.0/24", 443)})...)
	if len(s.e.Report(0).Actions) != 1 {
		t.Fatalf("actions %+v", s.e.Report(0).Actions)
	}
	s.e.SetRules(map[uint32]RuleShape{0: {}}, GlobalShape{Limited: true}) // no per_prefix, no per_asn any more
	ch := s.e.Reconfigure(testConfig(), s.now)
	if len(ch) != 1 || ch[0].Op != OpRemove || ch[0].By != "policy" {
		t.Fatalf("reconfigure: %+v", ch)
	}
}

// TestSparseSamplesNoSurge: an aggregate seen through one 1-in-1024
// sample now and then (each reads as 1024/s in its interval) never
// surges on that noise.
func TestSparseSamplesNoSurge(t *testing.T) {
	s := newSim(t, testConfig())
	mk := udpFrom(64999, "198.51.100.0/24", 7777)
	for i := range 600 {
		if i%25 == 0 || (i > 300 && i < 306) { // a sample every 25 s, then five in a row
			smp := mk(s.rng)
			smp.Weight = 1024
			s.e.Observe(smp)
		}
		s.now = s.now.Add(time.Second)
		s.changes = append(s.changes, s.e.Tick(s.now)...)
	}
	if surges, _ := s.e.Counts(); surges != 0 || len(s.changes) != 0 {
		t.Fatalf("%d surges, changes %+v on sampling noise", surges, s.changes)
	}
}

// onRule makes a flow's samples those of rule id.
func onRule(id uint32, f flow) flow {
	mk := f.mk
	f.mk = func(r *rand.Rand) Sample { s := mk(r); s.Rule = id; return s }
	return f
}

// udpFlood is 30,000/s of UDP from random sources of 198.19.0.0/16 with
// random ports, lengths and TTLs, except what set fixes.
func udpFlood(id uint32, set func(*Sample)) flow {
	return onRule(id, flow{constant(30000), func(r *rand.Rand) Sample {
		s := Sample{Src: netip.AddrFrom4([4]byte{198, 19, byte(r.IntN(256)), byte(r.IntN(256))}), Proto: 17,
			SPort: uint16(r.IntN(65536)), DPort: uint16(r.IntN(65536)), Len: uint16(60 + r.IntN(1400)),
			TTL: uint8(30 + r.IntN(30)), Passed: true}
		set(&s)
		return s
	}})
}

// TestFingerprintMaskSlots: the shield never has fingerprints of more
// distinct masks than Options.MaxMasks (the data plane's slots); near ties
// go to a mask it holds already; a surge whose fingerprint needs another
// mask while every slot is taken is reported once (TakeNoSlots) and gets
// its fingerprint when a slot frees.
func TestFingerprintMaskSlots(t *testing.T) {
	o := Options{MaxMasks: 2}
	s := newSim(t, testConfig(), o)
	// Four rules with no bucket: their floods get fingerprints.
	s.e.SetRules(map[uint32]RuleShape{1: {}, 2: {}, 3: {}, 4: {}}, GlobalShape{})
	var u []flow
	for id := uint32(1); id <= 4; id++ {
		for _, f := range users(3) {
			u = append(u, onRule(id, f))
		}
	}
	s.run(180, u...)
	masks := func() map[maskSlot]bool {
		out := map[maskSlot]bool{}
		for _, a := range s.e.Report(0).Actions {
			if a.Fingerprint != nil {
				out[a.Fingerprint.slot()] = true
			}
		}
		if len(out) > o.MaxMasks {
			t.Fatalf("%d distinct masks in use, at most %d: %v", len(out), o.MaxMasks, out)
		}
		return out
	}
	fpOf := func(id uint32) *Fingerprint {
		for _, a := range s.e.Report(0).Actions {
			if a.Key == (Key{Kind: KindRule, Rule: id}) && a.Fingerprint != nil {
				return a.Fingerprint
			}
		}
		return nil
	}
	runChecked := func(n int, flows ...flow) {
		for range n {
			s.run(1, flows...)
			masks()
		}
	}

	// A: one port, all else random: proto+dport (and UDP's zero TCP
	// flags, a tie with one more field).
	a := udpFlood(1, func(s *Sample) { s.DPort = 1111 })
	runChecked(8, append(u, a)...)
	fa := fpOf(1)
	if fa == nil || fa.Mask&^FTCPFlags != FProto|FDPort {
		t.Fatalf("flood A: fingerprint %v, want proto+dport", fa)
	}
	// C: one port, one length, one TTL. Alone it would get
	// proto+dport+len+ttl (most fields); A's mask covers as much and is
	// installed.
	cf := udpFlood(3, func(s *Sample) { s.DPort, s.Len, s.TTL = 3333, 700, 44 })
	runChecked(8, append(u, a, cf)...)
	if f := fpOf(3); f == nil || f.Mask != fa.Mask || f.DPort != 3333 {
		t.Fatalf("flood C: fingerprint %v, want %s dport 3333 (the installed mask)", f, fa.Mask)
	}
	// B: one source port (reflection): the second mask.
	b := udpFlood(2, func(s *Sample) { s.SPort = 53 })
	runChecked(8, append(u, a, cf, b)...)
	if f := fpOf(2); f == nil || f.Mask != FProto|FSPort {
		t.Fatalf("flood B: fingerprint %v, want proto+sport", f)
	}
	if got := s.e.TakeNoSlots(); len(got) != 0 {
		t.Fatalf("no-slot reports with a slot free: %+v", got)
	}
	// E: one length only: a third mask, no slot. Reported once.
	e := udpFlood(4, func(s *Sample) { s.Len = 777 })
	runChecked(8, append(u, a, cf, b, e)...)
	if f := fpOf(4); f != nil {
		t.Fatalf("flood E: fingerprint %v installed with every slot taken", f)
	}
	got := s.e.TakeNoSlots()
	if len(got) != 1 || got[0].Key != (Key{Kind: KindRule, Rule: 4}) || got[0].Fingerprint.Mask&FLen == 0 ||
		got[0].Fingerprint.Len != 777 || got[0].Masks != 2 {
		t.Fatalf("no-slot reports %+v, want one for rule 4's len 777", got)
	}
	runChecked(5, append(u, a, cf, b, e)...)
	if again := s.e.TakeNoSlots(); len(again) != 0 {
		t.Fatalf("reported again in the same surge: %+v", again)
	}
	// B ends: its action goes, E gets the slot.
	runChecked(30, append(u, a, cf, e)...)
	if f := fpOf(2); f != nil {
		t.Fatalf("flood B ended, its fingerprint %v is still there", f)
	}
	if f := fpOf(4); f == nil || f.Mask&FLen == 0 || f.Len != 777 {
		t.Fatalf("flood E: fingerprint %v after a slot freed, want one on len 777", f)
	}
}

// TestFingerprintSlotKey: a source prefix's length is part of the data
// plane's mask (IPv4 /24 and IPv6 /48 take two slots).
func TestFingerprintSlotKey(t *testing.T) {
	v4 := Fingerprint{Mask: FProto | FSrc, Src: netip.MustParsePrefix("198.19.7.0/24")}
	v6 := Fingerprint{Mask: FProto | FSrc, Src: netip.MustParsePrefix("fd00:1::/48")}
	port := Fingerprint{Mask: FProto | FDPort, DPort: 53}
	if v4.slot() == v6.slot() || v4.slot().srcBits != 120 || v6.slot().srcBits != 48 || port.slot().srcBits != 0 {
		t.Fatalf("slots %+v %+v %+v", v4.slot(), v6.slot(), port.slot())
	}
}
