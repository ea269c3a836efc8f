package loader_test

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

// explainSizes are small tables; an LRU eviction changes nothing here,
// as every packet's model is loaded from the maps as they are.
var explainSizes = loader.Sizes{MaxRules: 64, SrcEntries: 512, AggEntries: 1024, PrefixEntries: 1024, ListEntries: 256, L4Entries: 64}

// randStanding writes random standing entries for the random frames'
// sources straight into the program's table: established (some with a
// jumped rate), validated, penalised (some penalties over), new.
func randStanding(h *diffHarness, r *rand.Rand, ns uint64, n int) {
	h.tb.Helper()
	for range n {
		a := netip.MustParseAddr(fmt.Sprintf(pick(r, diffSources...), r.IntN(24)))
		v := loader.LimiterEgStandingVal{LastSeen: ns, CleanSince: ns - uint64(r.IntN(5))*uint64(time.Second)}
		switch r.IntN(5) {
		case 0:
			v.Standing, v.Why = uint8(maps.StandingEstablished), uint8(maps.WhyClean)
			v.Usual, v.Current, v.RateAt, v.UsualAt = uint32(r.IntN(1000)), uint32(r.IntN(100000)), ns, ns
			v.Jumped = uint8(r.IntN(2))
		case 1:
			v.Standing, v.Why = uint8(maps.StandingValidated), uint8(maps.WhySet)
		case 2:
			v.Standing, v.Why = uint8(maps.StandingPenalised), uint8(maps.WhyOwnLimit)
			v.Since = ns - pick(r, uint64(0), uint64(time.Hour))
		default:
			v.Why = uint8(maps.WhyFirstSeen)
		}
		if v.Since == 0 {
			v.Since = ns
		}
		if err := h.td.d.Objects.Standing.Put(maps.StandingKey(a), v); err != nil {
			h.tb.Fatalf("set standing: %v", err)
		}
	}
}

// explainStep decides one frame through explain's path (the program's
// maps read by maps.ReadState, loaded by refmodel.FromState, decided by
// Explain for an IP packet) and then through the program, and requires
// the same action and reason.
func (h *diffHarness) explainStep(frame []byte, ns uint64, seen map[string]int) {
	h.tb.Helper()
	if len(frame) < minTestRunFrame || len(frame) > maxTestRunLinear {
		return
	}
	if err := h.td.m.SetTestClock(ns); err != nil {
		h.tb.Fatalf("set clock: %v", err)
	}
	st, err := h.td.m.ReadState()
	if err != nil {
		h.tb.Fatalf("read state: %v", err)
	}
	if st.NowNS != ns {
		h.tb.Fatalf("state read at %d, the test clock says %d", st.NowNS, ns)
	}
	model, err := refmodel.FromState(st)
	if err != nil {
		h.tb.Fatalf("load the model: %v", err)
	}
	var want refmodel.Verdict
	pi, reason := refmodel.Parse(frame)
	if reason == maps.ReasonOK {
		var tr refmodel.Trace
		want, tr = model.Explain(pi, st.NowNS)
		for _, b := range tr.Buckets {
			if b.Override != nil {
				seen["step_override"]++
			}
			if b.NewPart {
				seen["step_new_source_part"]++
			}
			if b.BudgetPart {
				seen["step_budget_part"]++
			}
		}
		if tr.Fingerprint != nil {
			seen["step_fingerprint"]++
		}
		if tr.Class != nil {
			seen["class_"+maps.ClassName(*tr.Class)]++
			if tr.Jumped {
				seen["class_jumped"]++
			}
		}
	} else {
		want = model.Run(frame, st.NowNS)
	}
	if err := model.LiveErr(); err != nil {
		h.tb.Fatalf("explain's lookups: %v", err)
	}
	before := h.programCell(want.Action, want.Reason)
	got := h.td.run(frame)
	h.log = append(h.log, fmt.Sprintf("t=%dns len=%d explain=%s frame=%s", ns, len(frame), want, hex.EncodeToString(frame[:min(len(frame), 96)])))
	wantRet := uint32(xdpPass)
	if !want.Passes() {
		wantRet = xdpDrop
	}
	if got != wantRet {
		h.fail("packet %d: program returned %d, explain says %s (XDP %d)", len(h.log), got, want, wantRet)
	}
	if after := h.programCell(want.Action, want.Reason); after.Packets != before.Packets+1 {
		h.fail("packet %d: explain says %s, the program counted it elsewhere:\n%s", len(h.log), want,
			counterDiff(h.programCounters(), maps.Counters{}))
	}
	seen[maps.ActionName(want.Action)]++
	seen[maps.ReasonName(want.Reason)]++
}

// runDiffExplain is one random run: a random policy, lists, standing,
// overrides and fingerprints, more of each (and a new policy) as it goes,
// each packet explained from the maps before the program decides it.
func runDiffExplain(h *diffHarness, seed uint64, n int) map[string]int {
	h.tb.Helper()
	r := rand.New(rand.NewPCG(seed, seed^0x6a09e667f3bcc909))
	h.td.m.Generations.SetV4DirectMinFacts(pick(r, 0, 1<<30))
	g := randPolicy(r)
	clearOverrides(h.td)
	clearFingerprints(h.td)
	h.reset(g, randLists(r))
	seen := map[string]int{}
	ns := diffStart
	h.installOverrides(r, g, ns, 24)
	h.installFingerprints(r, ns, 6)
	randStanding(h, r, ns, 40)
	for i := range n {
		switch i {
		case n / 3:
			g = randPolicy(r)
			h.swap(g)
			h.installOverrides(r, g, ns, 16)
			randStanding(h, r, ns, 20)
		case 2 * n / 3:
			h.installOverrides(r, g, ns, 16)
			h.installFingerprints(r, ns, 3)
			randStanding(h, r, ns, 20)
		}
		ns += randAdvance(r)
		h.explainStep(randFrame(r), ns, seen)
	}
	return seen
}

// TestDifferentialExplain holds explain's path to the program: 10,000
// random packets (10 runs of 1,000 from a printed seed), each decided by
// the reference model loaded from the program's maps as they are at that
// packet (maps.ReadState, refmodel.FromState, Explain), then by the
// program (BPF_PROG_TEST_RUN, on the test clock): the same action and
// reason for every one. The states include random lists, policies (IPv4
// direct table or trie), aggregate overrides with both parts,
// fingerprints, and standing entries of every class (jumped established
// ones included). EDGEGUARD_DIFF_SEED=N reruns seed N.
func TestDifferentialExplain(t *testing.T) {
	h := &diffHarness{tb: t, td: newTestDatapath(t, explainSizes), programOnly: true}
	seed := diffSeeds(t, uint64(time.Now().UnixNano()))[0]
	t.Logf("seed %d (EDGEGUARD_DIFF_SEED=%d to rerun)", seed, seed)
	seen := map[string]int{}
	for run := range uint64(10) {
		t.Run(fmt.Sprintf("run=%d", run), func(t *testing.T) {
			h.use(t)
			for k, n := range runDiffExplain(h, seed+run, 1000) {
				seen[k] += n
			}
		})
	}
	h.use(t)
	clearOverrides(h.td)
	clearFingerprints(h.td)
	t.Logf("seen: %v", seen)
	for _, k := range []string{"pass", "drop", "would_drop", "deny_list", "allow_list", "source_limit", "prefix_limit", "asn_limit",
		"global_limit", "fingerprint", "shield_tighten", "fleet_share", "rule_drop", "rule_pass", "step_override", "step_new_source_part", "step_budget_part",
		"step_fingerprint", "class_established", "class_validated", "class_penalised", "class_new", "class_jumped"} {
		if seen[k] == 0 {
			t.Errorf("no packet reached %s", k)
		}
	}
}
