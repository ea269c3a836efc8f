package netns_test

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// The patient botnet of issue 23 (docs/operations.md, "Personal budget"):
// 2,000 bots of the users' ASN, over 60 /24s, trickle 0.4 packets/s each
// (evenly: a patient bot paces itself) beside the users through the
// warm-up, long enough to become established by history; then each rises
// 11× to 4.4/s, under 10/s and far under the per-source (50/s) and per-/24
// (1,000/s; ~150/s here) limits, 4.4× the ASN's 2,000/s. Their datagrams
// are the users' (UDP to the echo port, the users' size): only their
// rates tell them apart. Each established source has priority up to its
// personal budget, 2 × its mean rate (rate_history 10 s here, so the
// warm-up is long enough to measure it): a bot keeps 0.8/s of its 4.4/s,
// the users (6/s in bursts of 3) all of theirs. Users arriving with the
// attack are new: they share what the established sources leave.
const (
	pbBots    = 2000
	pbTrickle = 0.4
	pbAttack  = 4.4
	pbASNRate = 2000
)

func TestPatientBotnetPersonalBudget(t *testing.T) {
	const arrivals = 4
	s := newBotnetScenario(t, false, arrivals)
	c := botnetCase{asnRate: pbASNRate, asnBurst: 2 * pbASNRate, bots: pbBots, prewarmRate: pbTrickle, botRate: pbAttack, arrivals: arrivals,
		likeUsers: true, standing: ", rate_history: 10s", warm: kgWarm + 2*time.Second, attack: 3*kgEstablishedAfter + time.Second}
	start := time.Now()
	r := c.run(s)
	r.report(t, "patient botnet (2,000 bots at 0.4/s for 12 s, then 4.4/s), per-ASN 2000/s, personal budgets (headroom 2)")
	r.checkHostile(t)
	users := userAddrs(s.lab.Legit[:kgUsers])
	r.checkUsersEstablished(t, users)

	// The bots earned their standing, and their budgets are what they
	// sent: the attack is against priority itself.
	isUser := map[netip.Addr]bool{}
	for _, u := range users {
		isUser[u] = true
	}
	var botMeans, userMeans []float64
	established := 0
	privBudget := 0.0 // what the established bots may send in priority, packets/s
	for a, v := range r.standingBefore {
		switch {
		case isUser[a]:
			userMeans = append(userMeans, meanRate(v))
		case inAny(kgBotNets(), a):
			botMeans = append(botMeans, meanRate(v))
			if privileged(v) {
				established++
				privBudget += math.Min(2*meanRate(v), pbAttack)
			}
		}
	}
	// Under load the generator skips late frames, and a bot whose gap then
	// exceeds established_after starts over: three in four suffice.
	if established < pbBots*3/4 {
		t.Fatalf("only %d of %d bots established after %v at %v/s: the botnet is not patient enough to test anything",
			established, pbBots, c.warm, pbTrickle)
	}
	newOffered := float64(pbBots)*pbAttack - privBudget
	leftover := (pbASNRate - privBudget - 2*kgUsers*kgUserRate) / newOffered
	report(t, "%d of %d bots established; bots' mean rate median %.2f/s, users' %.2f/s; the established bots' personal budgets "+
		"add up to %.0f/s of the ASN's %d/s; a new packet's expected share of the leftover %.1f%%",
		established, pbBots, median(botMeans), median(userMeans), privBudget, pbASNRate, 100*leftover)

	var lowest float64 = math.Inf(1)
	for _, u := range users {
		lowest = math.Min(lowest, meanRate(r.standingBefore[u]))
	}
	report(t, "asn classes: %s; the lowest user mean %.2f/s", s.classCounts("asn"), lowest)

	if r.during.Success() < 0.99 {
		t.Errorf("users during the attack: %v, want ≥ 99%%", r.during)
	}
	within(t, "aggregate passed (counters)", r.passed, r.budget, 0.10)

	// Users arriving with the attack are new: they get a new packet's share
	// of what the established sources leave, like the bots' packets over
	// their budgets.
	open := float64(r.arrived.OpeningReplied) / math.Max(1, float64(r.arrived.Opening))
	report(t, "arrivals: %v; opening requests %d/%d (%.1f%%), all requests %.1f%%, against the leftover share %.1f%% (%.2f×); "+
		"scenario %v", r.arrived, r.arrived.OpeningReplied, r.arrived.Opening, 100*open, 100*r.arrived.Success(), 100*leftover,
		r.arrived.Success()/leftover, time.Since(start).Round(time.Second))
	if r.arrived.Replied == 0 || r.arrived.Success() > math.Max(3*leftover, 0.2) {
		t.Errorf("arrivals %v (%.1f%%): want some answered and at most max(3× the leftover share %.1f%%, 20%%)",
			r.arrived, 100*r.arrived.Success(), 100*leftover)
	}
	after := s.standings()
	for _, a := range userAddrs(s.lab.Legit[kgUsers:]) {
		if v, ok := after[a]; ok && privileged(v) {
			t.Errorf("arrival %s became %s during the attack", a, maps.StandingName(maps.Standing(v.Standing)))
		}
	}
	// The attack did not become anyone's usual: means are unchanged by
	// congested measurements.
	for _, u := range users[:2] {
		if b, a := meanRate(r.standingBefore[u]), meanRate(after[u]); a > b*1.5+0.5 {
			t.Errorf("user %s mean rate moved from %.2f to %.2f/s during the attack", u, b, a)
		}
	}
	raised := 0
	for a, v := range after {
		if inAny(kgBotNets(), a) && meanRate(v) > 2*pbTrickle {
			raised++
		}
	}
	// A bot whose measurement closes in the attack's onset, before its
	// aggregate is congested, folds part of the ramp: that measurement is
	// uncongested (docs/operations.md, "Personal budget", the onset).
	// Observed: up to 26 of 2,000 (1.3%) in CI runs; more than 3% would
	// mean congested measurements count.
	t.Logf("%d of %d bots' mean rates above %v/s after the attack (onset measurements; at most %d allowed)",
		raised, pbBots, 2*pbTrickle, pbBots*3/100)
	if raised > pbBots*3/100 {
		t.Errorf("%d bots' mean rates rose above %v/s during the attack: congested measurements must not count", raised, 2*pbTrickle)
	}
}

func meanRate(v loader.LimiterEgStandingVal) float64 { return float64(v.Mean) / (1 << maps.RateShift) }

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	return xs[len(xs)/2]
}

// classCounts is the class counters of one aggregate kind (edgectl stats),
// as "class outcome packets" items: what the reserve band admitted and
// refused per class.
func (s *scenario) classCounts(aggregate string) string {
	s.t.Helper()
	out, err := s.lab.Daemon.Ctl(s.ctx, "stats", "--json")
	if err != nil {
		s.t.Fatal(err)
	}
	var st control.Stats
	if err := json.Unmarshal(out, &st); err != nil || st.Standing == nil {
		s.t.Fatalf("stats --json: %v: %s", err, out)
	}
	var classes []string
	for _, c := range st.Standing.Classes {
		if c.Aggregate == aggregate {
			classes = append(classes, fmt.Sprintf("%s %s %d", c.Class, c.Outcome, c.Packets))
		}
	}
	return strings.Join(classes, ", ")
}
