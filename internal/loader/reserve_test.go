package loader_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

const half = 500_000 // a 50% reserve, in parts per million

// reserveGen is a policy whose only limit is one aggregate of the given kind
// (100/s, burst 100) with a reserve; 198.18.0.0/16 is AS64500.
func reserveGen(kind maps.ClassAgg, reserve uint32) policy.Compiled {
	agg := policy.Bucket{Packets: perSecond(100, 100)}
	r := policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}, Reserve: reserve}
	g := defaultGen(r)
	switch kind {
	case maps.ClassAggPrefix:
		g.Rules[0].PerPrefix, g.Rules[0].Aggregate = agg, policy.AggregateWhole
	case maps.ClassAggASN:
		g.Rules[0].PerASN = agg
		g.Prefixes = []policy.PrefixFact{{Prefix: netip.MustParsePrefix("198.18.0.0/16"), RuleID: 0, ASN: 64500}}
	case maps.ClassAggGlobal:
		g.Global, g.GlobalReserve = agg, reserve
	}
	g.Standing = policy.Standing{
		EstablishedAfter: 30 * time.Second,
		Penalty:          time.Minute,
		KnownGood:        []netip.Prefix{netip.MustParsePrefix("198.18.200.0/24")},
	}
	return g
}

func (td *testDatapath) burst(src string, n int) (passed int) {
	td.tb.Helper()
	frame := packet.UDP4(src, 5000, 53, 10)
	for i := 0; i < n; i++ {
		if td.run(frame) == xdpPass {
			passed++
		}
	}
	return passed
}

func (td *testDatapath) classCounters() maps.ClassCounters {
	td.tb.Helper()
	c, err := td.m.Standing.ClassCounters()
	if err != nil {
		td.tb.Fatal(err)
	}
	return c
}

// TestReserveAdmission: in every kind of aggregate bucket, new and
// penalised sources get the burst minus the reserve, established,
// validated and known-good sources the rest, and all of them together never
// more than the burst. Exact, on a frozen clock.
func TestReserveAdmission(t *testing.T) {
	for _, kind := range []maps.ClassAgg{maps.ClassAggPrefix, maps.ClassAggASN, maps.ClassAggGlobal} {
		for _, privileged := range []string{"established", "validated", "known_good"} {
			t.Run(fmt.Sprintf("%s/%s", maps.ClassAggName(kind), privileged), func(t *testing.T) {
				td := newTestDatapath(t, smallSizes)
				td.setClock(time.Hour)
				td.apply(reserveGen(kind, half))
				user := "198.18.1.1"
				switch privileged {
				case "established":
					must(t, td.m.Standing.Set(netip.MustParseAddr(user), maps.StandingEstablished))
				case "validated":
					must(t, td.m.Standing.Set(netip.MustParseAddr(user), maps.StandingValidated))
				default:
					user = "198.18.200.9"
				}
				must(t, td.m.Standing.Set(netip.MustParseAddr("198.18.9.9"), maps.StandingPenalised))
				// New sources (many of them: a flood) fill it to the band.
				flood := 0
				for i := 0; i < 200; i++ {
					flood += td.burst(fmt.Sprintf("198.18.%d.%d", 2+i/250, 1+i%250), 1)
				}
				if flood != 50 {
					t.Fatalf("new sources: %d of 200 admitted, want 50 (burst 100 less a 50%% reserve)", flood)
				}
				if got := td.burst("198.18.9.9", 10); got != 0 {
					t.Fatalf("penalised source admitted %d in the band, want 0", got)
				}
				if got := td.burst(user, 80); got != 50 {
					t.Fatalf("%s source: %d of 80 admitted in the band, want the reserve's 50", privileged, got)
				}
				if got := td.burst(user, 5) + td.burst("198.18.3.3", 5); got != 0 {
					t.Fatalf("full bucket admitted %d", got)
				}
				// A second later the budget's 100 tokens came back: the
				// flood takes its 50, the user the rest.
				td.setClock(time.Hour + time.Second)
				flood = 0
				for i := 0; i < 200; i++ {
					flood += td.burst(fmt.Sprintf("198.18.%d.%d", 5+i/250, 1+i%250), 1)
				}
				user2 := td.burst(user, 200)
				if flood != 50 || user2 != 50 {
					t.Fatalf("after 1s: flood %d, user %d; want 50 and 50", flood, user2)
				}
				c := td.classCounters()
				userClass := maps.ClassEstablished
				if privileged == "validated" {
					userClass = maps.ClassValidated
				}
				if got := c[0][kind][userClass][maps.OutcomeAdmittedReserve].Packets; got != 100 {
					t.Errorf("class counter %s admitted_reserve = %d, want 100", maps.ClassName(userClass), got)
				}
				if got := c[0][kind][maps.ClassNew][maps.OutcomeRefusedReserve].Packets; got != 300 {
					t.Errorf("class counter new refused_reserve = %d, want 300", got)
				}
				if got := c[0][kind][maps.ClassPenalised][maps.OutcomeRefusedReserve].Packets; got != 10 {
					t.Errorf("class counter penalised refused_reserve = %d, want 10", got)
				}
				// No refused flood source got an entry; the 100 admitted
				// ones did (admitted at the new-source tolerance).
				st, err := td.m.Standing.Counts()
				must(t, err)
				want := uint64(100)
				if privileged == "known_good" {
					want++ // the user: known good, and admitted as new too
				}
				if st.Created != want {
					t.Errorf("standing entries created: %d, want %d (one per admitted source without an entry)", st.Created, want)
				}
			})
		}
	}
}

// TestReserveOff: reserve 0 is the old behaviour, everyone shares the
// burst, and no standing is looked up.
func TestReserveOff(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(time.Hour)
	td.apply(reserveGen(maps.ClassAggPrefix, 0))
	must(t, td.m.Standing.Set(netip.MustParseAddr("198.18.1.1"), maps.StandingEstablished))
	if got := td.burst("198.18.2.2", 150); got != 100 {
		t.Fatalf("new source: %d admitted, want the whole burst of 100", got)
	}
	if got := td.burst("198.18.1.1", 10); got != 0 {
		t.Fatalf("established source: %d admitted from a full bucket", got)
	}
}

// TestReserveDryRun: a dry-run rule passes what the reserve would refuse
// and counts it as "would drop", apart from enforced refusals.
func TestReserveDryRun(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(time.Hour)
	g := reserveGen(maps.ClassAggPrefix, half)
	g.Rules[0].Mode = policy.RuleModeDryRun
	td.apply(g)
	if got := td.burst("198.18.2.2", 80); got != 80 {
		t.Fatalf("dry run: %d of 80 passed", got)
	}
	c := td.classCounters()
	if got := c[1][maps.ClassAggPrefix][maps.ClassNew][maps.OutcomeRefusedReserve].Packets; got != 30 {
		t.Errorf("would-drop (reserve) = %d, want 30", got)
	}
	if got := c[0][maps.ClassAggPrefix][maps.ClassNew][maps.OutcomeRefusedReserve].Packets; got != 0 {
		t.Errorf("enforced reserve refusals = %d in dry run", got)
	}
	cs := td.counters()
	if got := cs.Get(maps.ActWouldDrop, maps.ReasonPrefixLimit).Packets; got != 30 {
		t.Errorf("would_drop/prefix_limit = %d, want 30", got)
	}
}

// TestStandingLifecycle: new -> established after a clean history, history
// during congestion does not count, own limit -> penalised -> decays.
func TestStandingLifecycle(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	g := reserveGen(maps.ClassAggPrefix, half)
	g.Rules[0].PerSource = policy.Bucket{Packets: perSecond(10, 10)}
	td.apply(g)
	user := netip.MustParseAddr("198.18.1.1")
	lookup := func() maps.StandingEntry {
		t.Helper()
		e, err := td.m.Standing.Lookup(user)
		must(t, err)
		return e
	}
	start := time.Hour
	at := func(d time.Duration) { td.setClock(start + d) }
	at(0)
	td.burst(user.String(), 2)
	// The per-source bucket's new-source filter defers the first packet:
	// the entry is made for an admitted packet.
	if e := lookup(); !e.Tracked || e.Standing != maps.StandingNew || e.Why != maps.WhyFirstSeen {
		t.Fatalf("after first packets: %+v", e)
	}
	for s := 1; s <= 27; s++ { // to 29.7 s, a packet in every epoch
		at(time.Duration(s) * 1100 * time.Millisecond)
		td.burst(user.String(), 1)
	}
	if e := lookup(); e.Standing != maps.StandingNew {
		t.Fatalf("established before established_after: %+v", e)
	}
	at(31 * time.Second)
	td.burst(user.String(), 1)
	e := lookup()
	if e.Standing != maps.StandingEstablished || e.Why != maps.WhyClean {
		t.Fatalf("after 31s of clean history: %+v", e)
	}
	// Exceeding its own limit penalises it (at most an epoch later).
	at(33 * time.Second)
	td.burst(user.String(), 30)
	if e := lookup(); e.Standing != maps.StandingPenalised || e.Why != maps.WhyOwnLimit {
		t.Fatalf("after exceeding its own limit: %+v", e)
	}
	// Penalised: new-source tolerance only.
	at(40 * time.Second)
	// The penalty runs a minute from the last offence, then decays.
	at(33*time.Second + time.Minute + 2*time.Second)
	td.burst(user.String(), 1)
	if e := lookup(); e.Standing != maps.StandingNew || e.Why != maps.WhyDecayed {
		t.Fatalf("after the penalty: %+v", e)
	}

	// A new source admitted while its aggregate is congested starts over.
	other := netip.MustParseAddr("198.18.7.7")
	at(200 * time.Second)
	td.burst(other.String(), 2)
	at(215 * time.Second)
	td.burst(other.String(), 1)
	// Congest the aggregate: 40 other sources fill it past half of the
	// new-source tolerance of 50.
	at(216*time.Second + 100*time.Millisecond)
	for i := 0; i < 40; i++ {
		td.burst(fmt.Sprintf("198.18.8.%d", i+1), 1)
	}
	td.burst(other.String(), 1)
	e, err := td.m.Standing.Lookup(other)
	must(t, err)
	if e.Standing != maps.StandingNew || e.Why != maps.WhyCongested || e.CleanSinceNS != uint64(start+216*time.Second+100*time.Millisecond) {
		t.Fatalf("admitted while congested: %+v", e)
	}
	// 29 s later it is still new; 31 s after the congestion, established.
	for s := 1; s <= 31; s++ {
		at(216*time.Second + 100*time.Millisecond + time.Duration(s)*time.Second)
		td.burst(other.String(), 1)
	}
	if e, _ := td.m.Standing.Lookup(other); e.Standing != maps.StandingEstablished {
		t.Fatalf("31s after congestion: %+v", e)
	}
}

// TestStandingIdleRestarts: a source gone longer than established_after
// starts its history over; one packet long ago is not a history.
func TestStandingIdleRestarts(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.apply(reserveGen(maps.ClassAggPrefix, half))
	td.setClock(time.Hour)
	td.burst("198.18.1.1", 1)
	td.setClock(time.Hour + 10*time.Minute)
	td.burst("198.18.1.1", 1)
	e, err := td.m.Standing.Lookup(netip.MustParseAddr("198.18.1.1"))
	must(t, err)
	if e.Standing != maps.StandingNew || e.CleanSinceNS != uint64(time.Hour+10*time.Minute) {
		t.Fatalf("after a 10 min gap: %+v", e)
	}
}

// TestStandingTableFullEvictsNobody: with the table full, new sources are
// not entered (counted), and established ones keep their standing.
func TestStandingTableFullEvictsNobody(t *testing.T) {
	sizes := smallSizes
	sizes.StandingEntries = 8
	td := newTestDatapath(t, sizes)
	td.apply(reserveGen(maps.ClassAggPrefix, half))
	td.setClock(time.Hour)
	must(t, td.m.Standing.Set(netip.MustParseAddr("198.18.1.1"), maps.StandingEstablished))
	for i := 0; i < 50; i++ {
		td.setClock(time.Hour + time.Duration(i)*time.Second)
		td.burst(fmt.Sprintf("198.18.3.%d", i+1), 1)
	}
	st, err := td.m.Standing.Counts()
	must(t, err)
	if st.Created != 7 || st.Full != 43 {
		t.Errorf("created %d, refused (full) %d; want 7 and 43", st.Created, st.Full)
	}
	if e, _ := td.m.Standing.Lookup(netip.MustParseAddr("198.18.1.1")); e.Standing != maps.StandingEstablished {
		t.Fatalf("established source lost its standing: %+v", e)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestReserveDropSamples: a drop sample says which congestion refused the
// packet (per-instance congestion in the daemon reads it): the reserve for
// a new source, the full bucket for an established one (class unknown: a
// full bucket looks up no standing), nothing for a drop
// that no aggregate made.
func TestReserveDropSamples(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(time.Hour)
	g := reserveGen(maps.ClassAggASN, half)
	g.Samples = policy.Limit{Rate: policy.Rate{Count: 1_000_000_000, Per: time.Second}, Burst: 1_000_000_000}
	td.apply(g)
	r, err := td.m.Samples.NewDropReader()
	must(t, err)
	t.Cleanup(func() { r.Close() })
	next := func() (maps.Sample, bool) {
		r.SetDeadline(time.Now())
		s, err := r.Read()
		if err != nil {
			return maps.Sample{}, false
		}
		return s, true
	}
	user := "198.18.1.1"
	must(t, td.m.Standing.Set(netip.MustParseAddr(user), maps.StandingEstablished))
	if got := td.burst("198.18.2.2", 60); got != 50 {
		t.Fatalf("new source: %d of 60 admitted, want 50", got)
	}
	if got := td.burst(user, 60); got != 50 {
		t.Fatalf("established source: %d of 60 admitted, want 50", got)
	}
	want := []struct {
		src     string
		outcome maps.Outcome
		class   maps.Class
		n       int
	}{
		{"198.18.2.2", maps.OutcomeRefusedReserve, maps.ClassNew, 10},
		// A full bucket refuses everyone without a standing lookup.
		{user, maps.OutcomeRefusedFull, maps.ClassUnknown, 10},
	}
	for _, w := range want {
		for i := 0; i < w.n; i++ {
			s, ok := next()
			if !ok {
				t.Fatalf("%s: %d drop samples, want %d", w.src, i, w.n)
			}
			if s.Source.String() != w.src || s.Reason != maps.ReasonASNLimit || !s.Refusal || s.Refused != w.outcome ||
				s.Class != w.class || s.ASN != 64500 {
				t.Fatalf("%s sample %d: source %s reason %s refusal %v outcome %s class %s asn %d; want reason asn_limit, %s, %s, AS64500",
					w.src, i, s.Source, maps.ReasonName(s.Reason), s.Refusal, maps.OutcomeName(s.Refused),
					maps.ClassName(s.Class), s.ASN, maps.OutcomeName(w.outcome), maps.ClassName(w.class))
			}
		}
	}
	if s, ok := next(); ok {
		t.Fatalf("extra sample %+v", s)
	}
	// A drop no aggregate made (a deny-list entry is not sampled; a drop
	// rule is) carries no refusal.
	g.Rules[0].Action = policy.ActionDrop
	td.apply(g)
	td.burst("198.18.3.3", 1)
	s, ok := next()
	if !ok || s.Refusal || s.Refused != 0 || s.Reason != maps.ReasonRuleDrop {
		t.Fatalf("rule drop sample %+v (ok %v): want reason rule_drop, no refusal", s, ok)
	}
}
