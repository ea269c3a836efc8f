package netns_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/trafficgen"
)

// TestKernelMatrixScenario is scenario 1 (one source held to its per-source
// limit, a legitimate client unaffected) at rates an emulated CPU can
// offer: scripts/kernel-matrix.sh runs it inside each kernel under QEMU's
// TCG, where the generator reaches a few hundred packets per second, not
// the 5,000 of scenario 1. The flood is 500/s against a limit of 50/s
// (burst 50), so ten times the budget is offered; the report line is the
// kernel matrix's pass/drop row.
func TestKernelMatrixScenario(t *testing.T) {
	s := newScenario(t, 1)
	s.start(`defaults:
  per_source: {packets: {rate: 50/s, burst: 50}}
`)
	a := s.lab.Attackers[0]
	base := s.counters()
	fr, lr := s.floodWithLegit(trafficgen.Flood{
		Sources: []netip.Prefix{netip.PrefixFrom(a.Src4, 32)}, Distinct: 1, Proto: trafficgen.UDP,
		Payload: 32, Rate: 500, Count: 2000, Duration: 4 * time.Second, Seed: 1,
	}, 5)
	d := s.countersSince(base, fr.Sent+uint64(lr.Sent))
	budget := 50 + 50*fr.Elapsed.Seconds()
	dropped := d["drop/source_limit"]
	report(t, "offered %d in %v, passed %d (budget %.0f), dropped source_limit %d; legit udp %v",
		fr.Sent, fr.Elapsed.Round(time.Millisecond), fr.Sent-dropped, budget, dropped, lr)
	if float64(fr.Sent) < 2*budget {
		t.Fatalf("the generator offered %d packets, under twice the budget %.0f: too slow a machine to tell a limit", fr.Sent, budget)
	}
	within(t, "flood passed (counters: offered - src_limit drops)", float64(fr.Sent-dropped), budget, 0.10)
	if lr.Success() < 0.99 {
		t.Errorf("legit success %.4f, want ≥ 0.99", lr.Success())
	}
}
