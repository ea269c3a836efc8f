package netns_test

import (
	"encoding/json"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/trafficgen"
)

// A patient botnet (issue #12 item 5, docs/shield.md "Patient botnets"):
// bots inside the users' ASN trickle at a tenth of their rate long enough
// to become established by history, then each rises 10x, still far within
// its per-source limit (the built-in 5k/s). Their own usual rate says they
// jumped: inside the ASN aggregate the shield tightened they are charged as
// new, while the users at their usual rate keep their standing.
const (
	ptBots      = 300
	ptTrickle   = 2 // packets per second per bot while earning standing
	ptSurge     = 10 * ptTrickle
	ptWarm      = 30 * time.Second // > learn_for (20 s) and > established_after
	ptSurgeLen  = 14 * time.Second
	ptEstablish = 8 * time.Second // standing.established_after
)

// ptPolicy is the shield scenarios' built-in policy (per-source limit
// 5k/s keyed by /32 and /64, shield in enforce, time-compressed baseline)
// with a short established_after and the default usual-rate knobs.
func ptPolicy(s *scenario) string {
	return shPolicy(s, "enforce") + "standing: {established_after: " + ptEstablish.String() + "}\n"
}

func (s *scenario) standingEvents() map[string]uint64 {
	s.t.Helper()
	out, err := s.lab.Daemon.Ctl(s.ctx, "stats", "--json")
	if err != nil {
		s.t.Fatal(err)
	}
	var st control.Stats
	if err := json.Unmarshal(out, &st); err != nil {
		s.t.Fatalf("stats --json: %v: %s", err, out)
	}
	if st.Standing == nil {
		s.t.Fatalf("stats --json has no standing section: %s", out)
	}
	return st.Standing.Events
}

// TestPatientBotnetLosesStanding: 300 bots of AS64501 (over 60 /24s) send
// 2/s each for 30 s beside the users and become established; then each
// sends 20/s. The shield tightens AS64501; the bots, jumped, share its
// new-source budget (held to <= 2x the baseline after 5 s), while the
// users of AS64501 (established, at their usual rate) keep >= 99% and
// those of AS64502 100%. Every established bot is counted as jumped, and
// explain shows a bot jumped and a user not.
func TestPatientBotnetLosesStanding(t *testing.T) {
	s := newShieldScenario(t)
	if err := s.lab.WritePolicy(ptPolicy(s)); err != nil {
		t.Fatal(err)
	}
	if err := s.lab.Daemon.Start(s.ctx); err != nil {
		t.Fatal(err)
	}
	connsA := s.userConns(s.lab.Legit[:4])
	connsB := s.userConns(s.lab.Legit[4:shUsers])
	// The bots' trickle: each bot in turn, evenly spaced (a patient bot
	// paces itself; see docs/shield.md for bursty bots).
	trickle := trafficgen.Flood{Sources: kgBotNets(), Distinct: ptBots, Proto: trafficgen.UDP, Payload: 32,
		Rate: ptBots * ptTrickle, Count: ptBots * ptTrickle * int(ptWarm.Seconds()), Duration: ptWarm, Seed: 31}
	var wg sync.WaitGroup
	var fe error
	wg.Go(func() { _, fe = s.lab.Flood(s.ctx, s.lab.Attackers[0], trickle) })
	wg.Go(func() { users(s, connsB, ptWarm, 5) })
	before := users(s, connsA, ptWarm, 4)
	wg.Wait()
	if fe != nil {
		t.Fatal(fe)
	}
	a, ok := shieldReportOf(s.shield()).aggregate(shASNA)
	if !ok || !a.Judged || a.State != "normal" {
		t.Fatalf("after %v: %s is %+v (found %v): want learned and normal", ptWarm, shASNA, a, ok)
	}
	baseline := a.Baseline
	st := s.standings()
	established := 0
	for addr, v := range st {
		for _, p := range kgBotNets() {
			if p.Contains(addr) && privileged(v) {
				established++
			}
		}
	}
	userIPs := userAddrs(s.lab.Legit[:shUsers])
	for _, u := range userIPs {
		if v, ok := st[u]; !ok || !privileged(v) {
			t.Fatalf("user %s not established after the warm-up (%v: %+v): cannot test standing", u, ok, v)
		}
	}
	if established < ptBots*9/10 {
		t.Fatalf("only %d of %d bots established after %v at %d/s: the botnet is not patient enough to test anything",
			established, ptBots, ptWarm, ptTrickle)
	}
	ev0 := s.standingEvents()

	// The surge: each bot 10x, still 250x under its per-source limit.
	surge := trickle
	surge.Rate, surge.Count, surge.Duration, surge.Step = ptBots*ptSurge, ptBots*ptSurge*int(ptSurgeLen.Seconds()), ptSurgeLen, 100*time.Microsecond
	var flood trafficgen.FloodResult
	var usersB, usersA trafficgen.LegitResult
	var sinkEarly uint64
	var early time.Duration
	var during control.ShieldReport
	sink0 := s.lab.Sink.Other()
	start := time.Now()
	wg.Go(func() { flood, fe = s.lab.Flood(s.ctx, s.lab.Attackers[0], surge) })
	wg.Go(func() { usersB = users(s, connsB, ptSurgeLen, 7) })
	wg.Go(func() {
		time.Sleep(shMitigateBy)
		sinkEarly, early = s.lab.Sink.Other()-sink0, time.Since(start)
		time.Sleep(ptSurgeLen / 2)
		during = s.shield()
	})
	usersA = users(s, connsA, ptSurgeLen, 6)
	wg.Wait()
	if fe != nil {
		t.Fatal(fe)
	}
	sinkLate := s.sinkSettled() - sink0 - sinkEarly
	late := flood.Elapsed - early
	passed := float64(sinkLate) / late.Seconds()
	ev := s.standingEvents()
	jumped := ev["jumped"] - ev0["jumped"]

	var botIP netip.Addr
	for addr, v := range st {
		if kgBotNets()[0].Contains(addr) && privileged(v) {
			botIP = addr
			break
		}
	}
	if !botIP.IsValid() {
		t.Fatal("no established bot in 198.18.100.0/24 to explain")
	}
	bot := s.explain(botIP.String())
	botText := s.ctlText("explain", botIP.String())
	user := s.explain(userIPs[0].String())
	report(t, "AS64501 baseline %.0f/s (users + bots at %d/s); %d of %d bots established; surge %d at %d/s (%.1fx baseline) in %v; "+
		"passed %d in the first %v, then %.0f/s (%.2fx baseline, limit 2x); jumped events %d (of %d established bots); "+
		"users AS64501 before %v, during %v (margin to 99%%: %+.2f points), AS64502 %v; actions %+v",
		baseline, ptTrickle, established, ptBots, flood.Sent, surge.Rate, float64(surge.Rate)/baseline, flood.Elapsed.Round(time.Millisecond),
		sinkEarly, early.Round(time.Millisecond), passed, passed/baseline, jumped, established,
		before, usersA, 100*(usersA.Success()-0.99), usersB, during.Actions)
	if bot.Standing != nil && bot.Standing.Rate != nil {
		report(t, "explain bot: %s, usual %.1f/s current %.1f/s jumped %v; user: %+v", bot.Standing.Standing,
			bot.Standing.Rate.Usual, bot.Standing.Rate.Current, bot.Standing.Rate.Jumped, user.Standing.Rate)
	}

	if n := len(during.Actions); n != 1 || during.Actions[0].Kind != "tighten" || during.Actions[0].Aggregate != shASNA ||
		!during.Actions[0].Enforced {
		t.Errorf("actions during the surge %+v: want one enforced tighten of %s", during.Actions, shASNA)
	}
	if passed > 2*baseline {
		t.Errorf("the surge passed %.0f/s after %v: want <= 2x the baseline %.0f/s (established bots kept their standing?)",
			passed, shMitigateBy, baseline)
	}
	if usersA.Success() < 0.99 {
		t.Errorf("AS64501's users during the surge %v: want >= 99%%", usersA)
	}
	if usersB.Success() < 1 {
		t.Errorf("AS64502's users %v: want 100%%", usersB)
	}
	if jumped < uint64(established)*9/10 {
		t.Errorf("jumped events %d: want >= 90%% of the %d established bots", jumped, established)
	}
	if bot.Standing == nil || bot.Standing.Rate == nil || !bot.Standing.Rate.Jumped || bot.Standing.Standing != "established" {
		t.Errorf("explain of a bot after the surge: %+v, want established and jumped", bot.Standing)
	}
	if !strings.Contains(botText, "rate") || !strings.Contains(botText, "current") || !strings.Contains(botText, "jumped") {
		t.Errorf("edgectl explain %s shows no rate line saying jumped:\n%s", botIP, botText)
	}
	if user.Standing == nil || user.Standing.Rate == nil || user.Standing.Rate.Jumped {
		t.Errorf("explain of a user: %+v, want a measured rate, not jumped", user.Standing)
	}
}
