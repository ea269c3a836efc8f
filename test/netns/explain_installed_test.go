package netns_test

import (
	"encoding/json"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/trafficgen"
)

// The shield enforces, but with a surge floor no test traffic reaches: the
// entries below are the only ones in the data plane.
const installedPolicy = `defaults:
  per_source: {}
rules:
  - name: api
    match: {prefixes: [198.19.0.0/16]}
    per_source: {}
    per_prefix: {group: whole, packets: {rate: 100/s, burst: 100}}
global:
  packets: {rate: 100k/s, burst: 100k}
shield:
  mode: enforce
  surge: {min_rate: 10M/s}
`

// installedMaps opens the daemon's pinned maps from the test, to write
// what fleet mode and the shield write (their origins, the same calls).
func (s *scenario) installedMaps() *maps.Maps {
	s.t.Helper()
	raw, err := os.ReadFile(s.lab.PolicyPath())
	if err != nil {
		s.t.Fatal(err)
	}
	p, err := policy.Parse(s.lab.PolicyPath(), raw, os.ReadFile)
	if err != nil {
		s.t.Fatal(err)
	}
	t := p.Tables // the daemon's sizes (daemon.sizes)
	d, err := loader.Load(loader.Options{PinDir: s.lab.Config.PinDir, Sizes: loader.Sizes{MaxRules: t.MaxRules,
		SrcEntries: t.PerSourceEntries, AggEntries: t.AggregateEntries, PrefixEntries: t.PrefixEntries,
		ListEntries: t.ListEntries, V4Chunks: t.IPv4DirectChunks, StandingEntries: t.StandingEntries}})
	if err != nil {
		s.t.Fatalf("open the daemon's pinned maps: %v", err)
	}
	s.t.Cleanup(func() { d.Close() })
	return maps.New(d)
}

func (s *scenario) inventory() control.Inventory {
	s.t.Helper()
	var inv control.Inventory
	out := s.ctlText("show", "-o", "json")
	if err := json.Unmarshal([]byte(out), &inv); err != nil {
		s.t.Fatalf("show -o json: %v: %s", err, out)
	}
	return inv
}

// flood sends UDP packets from src (distinct sources in it; payload bytes
// after the UDP header) to dport at rate for 3 s and explains probe
// (explain's arguments) three times while it runs: it returns the
// daemon's counters' change and the explanations.
func (s *scenario) flood(src netip.Prefix, distinct, rate int, dport uint16, payload int, probe ...string) (map[string]uint64, []control.Explanation) {
	s.t.Helper()
	base := s.counters()
	var wg sync.WaitGroup
	var fr trafficgen.FloodResult
	var err error
	wg.Go(func() {
		fr, err = s.lab.Flood(s.ctx, s.lab.Attackers[0], trafficgen.Flood{Sources: []netip.Prefix{src}, Distinct: distinct,
			Proto: trafficgen.UDP, DstPort: dport, Payload: payload, Rate: rate, Count: 3 * rate, Duration: 4 * time.Second,
			Seed: uint64(rate), Step: 100 * time.Microsecond})
	})
	var es []control.Explanation
	for range 3 {
		time.Sleep(500 * time.Millisecond)
		es = append(es, s.explain(probe...))
	}
	wg.Wait()
	if err != nil || fr.Sent != uint64(3*rate) {
		s.t.Fatalf("flood: %+v, %v", fr, err)
	}
	return s.countersSince(base, fr.Sent), es
}

// agrees checks that explain, asked while the packets met the entry, said
// what the data plane counted: at least two of three say drop with reason
// (a probe may land just as a token came back), none says another reason.
func agrees(t *testing.T, what string, got map[string]uint64, es []control.Explanation, reason string) {
	t.Helper()
	n := 0
	var says []string
	for _, e := range es {
		says = append(says, e.Verdict+"/"+e.Reason)
		switch {
		case e.Verdict == "drop" && e.Reason == reason:
			n++
		case e.Verdict != "pass":
			t.Errorf("%s: explain said %s (%s): %s", what, e.Verdict, e.Reason, e.Why)
		}
	}
	report(t, "%s: the packets met %v; explain during them: %v; %s", what, got, says, es[0].Why)
	if n < 2 {
		t.Errorf("%s: explain said drop/%s %d of 3 times (%v) while the data plane counted %v", what, reason, n, says, got)
	}
}

// congestedBy checks, within the 5 s an instance stays listed after its
// last refusal, that status lists the aggregate instance (aggregate, and
// prefix "whole" or "" for global) as congested by the override's reason
// alone: refusals under an override are the aggregate's.
func (s *scenario) congestedBy(aggregate, prefix, reason string) {
	s.t.Helper()
	st, err := s.ctlStatus()
	if err != nil {
		s.t.Fatal(err)
	}
	for _, c := range st.CongestedInstances {
		if c.Aggregate == aggregate && c.Prefix == prefix {
			report(s.t, "congested instance %s %s: decided by %v", aggregate, prefix, c.RefusedByReason)
			if len(c.RefusedByReason) != 1 || c.RefusedByReason[reason] == 0 {
				s.t.Errorf("congested instance %s %s: refused by %v, want %s alone", aggregate, prefix, c.RefusedByReason, reason)
			}
			return
		}
	}
	s.t.Errorf("status lists no congested instance %s %s after refusals under %s: %+v", aggregate, prefix, reason, st.CongestedInstances)
}

// TestExplainInstalled: the four cases on the real daemon, each
// explained before and after the packets meet it, explain's verdict and
// reason compared with what the data plane counted for them: a fleet
// share holding a whole aggregate to 50/s, a shield tighten on global, a
// shield fingerprint; then a crash (kill -9) with a fingerprint and an
// override in force: after the restart show lists both, the shield adopts
// both (listed, releasable), and a release removes them from the data
// plane. Status lists the aggregate instances the fleet share and the
// tighten held as congested, decided by fleet_share and shield_tighten. The entries are written into the pinned maps by the test, as
// fleet mode and the shield write them (their origins, through
// internal/maps): this tests explain, show and the reasons, not when the
// shield or the fleet decide (their own tests do).
func TestExplainInstalled(t *testing.T) {
	s := newScenario(t, 1, attackerNet)
	s.start(installedPolicy)
	m := s.installedMaps()
	hour := time.Now().Add(time.Hour)

	// 1. A fleet share: rule api's whole aggregate held to 50/s burst 50.
	src := netip.MustParsePrefix("198.19.7.7/32")
	e := s.explain(src.Addr().String(), "--proto", "udp", "--dport", "9009")
	if e.Rule == nil || e.Rule.Name != "api" {
		t.Fatalf("explain %s: rule %+v, want api", src, e.Rule)
	}
	whole := maps.Aggregate{RuleID: e.Rule.ID, Kind: maps.AggKindWhole}
	if err := m.Overrides.Set(maps.Override{Aggregate: whole, Budget: maps.Rate{Count: 50, Per: time.Second, Burst: 50},
		Expires: hour, Origin: maps.OriginFleet}); err != nil {
		t.Fatal(err)
	}
	e = s.explain(src.Addr().String(), "--proto", "udp", "--dport", "9009")
	b := bucketOf(t, e, "per_prefix")
	if e.Verdict != "pass" || b.Override == nil || b.Override.Budget == nil || b.Override.Budget.Origin != "fleet" ||
		b.Packets == nil || b.Packets.Burst != 50 {
		t.Errorf("explain before the burst: %s (%s), per_prefix %+v", e.Verdict, e.Reason, b)
	}
	got, es := s.flood(src, 1, 500, 9009, 32, src.Addr().String(), "--proto", "udp", "--dport", "9009")
	agrees(t, "fleet share 50/s on "+whole.String(), got, es, "fleet_share")
	s.congestedBy("prefix", "whole", "fleet_share")
	if got["drop/fleet_share"] < 1200 || got["drop/prefix_limit"] != 0 {
		t.Errorf("fleet share: counters %v: want the refusals as fleet_share", got)
	}
	s.ctlText("show", "remove", "override", whole.String(), "--origin", "fleet")
	if inv := s.inventory(); len(inv.Overrides) != 0 {
		t.Errorf("after show remove: overrides %+v", inv.Overrides)
	}

	// 2. A shield tighten on global: new sources share 11/s burst 11.
	global := maps.Aggregate{Kind: maps.AggKindGlobal}
	if err := m.Overrides.Set(maps.Override{Aggregate: global, NewBudget: maps.Rate{Count: 11, Per: time.Second, Burst: 11},
		Expires: hour, Origin: maps.OriginShield}); err != nil {
		t.Fatal(err)
	}
	bots := netip.MustParsePrefix("198.19.64.0/18")
	got, es = s.flood(bots, 500, 1000, 9009, 32, "198.19.99.1", "--proto", "udp", "--dport", "9009")
	agrees(t, "shield tighten 11/s on global", got, es, "shield_tighten")
	s.congestedBy("global", "", "shield_tighten")
	if got["drop/shield_tighten"] < 2700 || got["drop/global_limit"] != 0 {
		t.Errorf("shield tighten: counters %v", got)
	}

	// 3. A shield fingerprint: udp dport 9000 len 228 at 1/s.
	fp := maps.Fingerprint{ID: 7, Mask: maps.FieldProto | maps.FieldDPort | maps.FieldLen, Proto: 17, DPort: 9000, Len: 228,
		Budget: maps.Rate{Count: 1, Per: time.Second, Burst: 1}, Expires: hour, Origin: maps.OriginShield}
	if err := m.Fingerprints.Set(fp); err != nil {
		t.Fatal(err)
	}
	fsrc := netip.MustParsePrefix("198.19.8.8/32")
	got, es = s.flood(fsrc, 1, 500, 9000, 228-20-8, fsrc.Addr().String(), "--proto", "udp", "--dport", "9000", "--len", "242")
	agrees(t, "fingerprint udp dport 9000 len 228 at 1/s", got, es, "fingerprint")
	if got["drop/fingerprint"] < 1490 {
		t.Errorf("fingerprint: counters %v", got)
	}
	for _, e := range es {
		if e.Fingerprint == nil || e.Fingerprint.ID != 7 {
			t.Errorf("explain during the fingerprint's flood: fingerprint %+v", e.Fingerprint)
		}
	}
	if e := s.explain(fsrc.Addr().String(), "--proto", "udp", "--dport", "9000", "--len", "243"); e.Fingerprint != nil {
		t.Errorf("a packet one byte longer matches the fingerprint: %+v", e.Fingerprint)
	}

	// 4. kill -9 with the fingerprint and the global tighten in force.
	s.lab.Daemon.Kill()
	if err := s.lab.Daemon.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	inv := s.inventory()
	if len(inv.Fingerprints) != 1 || inv.Fingerprints[0].ID != 7 || inv.Fingerprints[0].Match != "udp dport 9000 len 228" ||
		inv.Fingerprints[0].Dropped.Packets < 1490 || len(inv.Masks) != 1 || len(inv.Overrides) != 1 ||
		inv.Overrides[0].Aggregate != "global" || inv.Overrides[0].Part != "new_source" || inv.Overrides[0].Origin != "shield" {
		t.Errorf("show after the restart: %+v", inv)
	}
	// The shield starts at its first interval after the policy.
	var acts []control.ShieldAction
	var fpAct, tightAct uint32
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && (fpAct == 0 || tightAct == 0); time.Sleep(200 * time.Millisecond) {
		if err := json.Unmarshal([]byte(s.ctlText("shield", "list", "-o", "json")), &acts); err != nil {
			t.Fatal(err)
		}
		for _, a := range acts {
			switch {
			case a.Adopted && a.Kind == "fingerprint" && a.ID == 7:
				fpAct = a.ID
			case a.Adopted && a.Kind == "tighten" && a.Aggregate == "global":
				tightAct = a.ID
			}
		}
	}
	if fpAct == 0 || tightAct == 0 {
		t.Fatalf("shield list after the restart: %+v, want both adopted", acts)
	}
	if e := s.explain(fsrc.Addr().String(), "--proto", "udp", "--dport", "9000", "--len", "242"); e.Fingerprint == nil {
		t.Errorf("explain after the restart shows no fingerprint: %+v", e)
	}
	s.ctlText("shield", "release", strconv.Itoa(int(fpAct)))
	out := s.ctlText("show", "remove", "override", "global", "--origin", "shield")
	if !strings.Contains(out, "released the shield's action "+strconv.Itoa(int(tightAct))) {
		t.Errorf("show remove of the adopted tighten: %q", out)
	}
	if inv := s.inventory(); len(inv.Fingerprints) != 0 || len(inv.Overrides) != 0 || len(inv.Masks) != 0 {
		t.Errorf("show after both releases: %+v", inv)
	}
	if e := s.explain(fsrc.Addr().String(), "--proto", "udp", "--dport", "9000", "--len", "242"); e.Verdict != "pass" {
		t.Errorf("explain after the releases: %s (%s)", e.Verdict, e.Reason)
	}
}
