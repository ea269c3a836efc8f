package fleet

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func approx(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

// sharesFor computes every host's share as each would, from the same
// demands.
func sharesFor(budget, floor float64, hosts int, demand map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for self, own := range demand {
		var others []HostDemand
		for h, d := range demand {
			if h != self {
				others = append(others, HostDemand{Host: h, Demand: d})
			}
		}
		out[self] = ShareOf(budget, floor, hosts, self, own, others)
	}
	return out
}

func TestSharesFollowDemand(t *testing.T) {
	s := sharesFor(1000, 0.1, 3, map[string]float64{"a": 9000, "b": 900, "c": 100})
	// floor 10% of 1000/3 each; the other 900 split 90/9/1.
	each := 100.0 / 3
	want := map[string]float64{"a": each + 810, "b": each + 81, "c": each + 9}
	sum := 0.0
	for h, v := range s {
		if !approx(v, want[h]) {
			t.Errorf("share %s = %.3f, want %.3f", h, v, want[h])
		}
		sum += v
	}
	if !approx(sum, 1000) {
		t.Errorf("shares sum to %.3f, want the budget 1000", sum)
	}
	// A static budget ÷ 3 is what fleet mode must beat.
	if s["a"] < 2*1000.0/3 {
		t.Errorf("the busiest host's share %.1f is not well above budget/3", s["a"])
	}
}

// TestSharesSumToBudget: with consistent views the shares add up to the
// budget exactly, whatever the demands, hosts and floor.
func TestSharesSumToBudget(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		n := 1 + r.IntN(20)
		demand := map[string]float64{}
		for j := range n {
			d := 0.0
			if r.IntN(4) > 0 {
				d = r.Float64() * 1e6
			}
			demand[fmt.Sprintf("h%d", j)] = d
		}
		budget := 1 + r.Float64()*1e5
		floor := r.Float64() * 0.9
		s := sharesFor(budget, floor, n, demand)
		sum := 0.0
		for h, v := range s {
			if v < floor*budget/float64(n)-1e-9 {
				t.Fatalf("case %d: %s's share %.3f is below the floor", i, h, v)
			}
			sum += v
		}
		if !approx(sum, budget) {
			t.Fatalf("case %d: shares sum to %.6f, budget %.6f (demand %v)", i, sum, budget, demand)
		}
	}
}

func TestShareEdges(t *testing.T) {
	if got := ShareOf(600, 0.1, 3, "a", 0, nil); !approx(got, 200) {
		t.Errorf("no demand anywhere: %v, want budget/hosts", got)
	}
	if got := ShareOf(600, 0.1, 1, "a", 50, nil); !approx(got, 600) {
		t.Errorf("alone: %v, want the whole budget", got)
	}
	// A host that just started seeing traffic, unknown to the others,
	// takes the floor plus its part; the member count comes from the
	// heartbeats and is raised to the hosts that published.
	if got := ShareOf(900, 0.1, 1, "a", 0, []HostDemand{{Host: "b", Demand: 10}, {Host: "c", Demand: 10}}); !approx(got, 30) {
		t.Errorf("idle host: %v, want the floor 30", got)
	}
	// Its own entry among the others is ignored (its fresh measurement counts).
	if got := ShareOf(900, 0, 2, "a", 10, []HostDemand{{Host: "a", Demand: 1e9}, {Host: "b", Demand: 10}}); !approx(got, 450) {
		t.Errorf("self among others: %v, want 450", got)
	}
	if got := ShareOf(0, 0.1, 3, "a", 10, nil); got != 0 {
		t.Errorf("zero budget: %v", got)
	}
	if got := ShareOf(900, 5, 3, "a", 10, []HostDemand{{Host: "b", Demand: 10}, {Host: "c", Demand: 10}}); got <= 0 || got > 900 {
		t.Errorf("floor above 1 is clamped: %v", got)
	}
	if got := ShareOf(900, 0.1, 3, "a", 10, []HostDemand{{Host: "b", Demand: -1e9}}); got <= 0 || got > 900 {
		t.Errorf("negative demand: %v", got)
	}
	if got := StaticShare(900, 3); got != 300 {
		t.Errorf("static share %v", got)
	}
	if got := StaticShare(900, 0); got != 900 {
		t.Errorf("static share without members %v", got)
	}
}

// TestOvershootBound checks the documented bound: when demand moves
// between hosts within one interval, a host's fresh own demand against the
// others' stale ones makes the shares sum to at most the budget plus
// (1 - floor) x budget x the largest fraction of fleet demand any one host
// gained (docs/fleet.md, "Bounds"), and at least the budget minus the same.
func TestOvershootBound(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		n := 2 + r.IntN(8)
		before, after := map[string]float64{}, map[string]float64{}
		var tb, ta float64
		for j := range n {
			h := fmt.Sprintf("h%d", j)
			before[h], after[h] = r.Float64()*1e4, r.Float64()*1e4
			tb += before[h]
			ta += after[h]
		}
		budget, floor := 1000.0, 0.1
		sum := 0.0
		for self := range after {
			var others []HostDemand
			for h, d := range before {
				if h != self {
					others = append(others, HostDemand{Host: h, Demand: d})
				}
			}
			sum += ShareOf(budget, floor, n, self, after[self], others)
		}
		// The bound, from the worst single host's change of weight.
		gain := 0.0
		for h := range after {
			wOld := before[h] / tb
			wNew := after[h] / (after[h] + tb - before[h])
			gain += math.Abs(wNew - wOld)
		}
		bound := (1 - floor) * budget * gain
		if sum > budget+bound+1e-6 || sum < budget-bound-1e-6 {
			t.Fatalf("case %d: shares sum to %.2f, outside %.0f ± %.2f", i, sum, budget, bound)
		}
	}
}

func TestParseDemandHostile(t *testing.T) {
	if d, at, ok := parseDemand("12.5 10.000 1764637200000 18750.000 15000"); !ok || d.Demand != 12.5 || d.Bytes != 18750 ||
		at.UnixMilli() != 1764637200000 {
		t.Errorf("good demand: %v %v %v", d, at, ok)
	}
	if d, _, ok := parseDemand("0 0 1 1e15 1e15"); !ok || d.Bytes != 1e15 {
		t.Errorf("byte demand at the bound: %v %v", d, ok)
	}
	for _, v := range []string{"", "1 2", "1 2 3", "1 2 3 4", "1 2 3 4 5 6", "NaN 1 5 0 0", "Inf 1 5 0 0", "-1 0 5 0 0",
		"1e13 0 5 0 0", "1 -1 5 0 0", "1 1 -5 0 0", "1 1 0 0 0", "x y z 0 0", "1 1 99999999999999999999 0 0", "1 1 1.5 0 0",
		"1 1 5 NaN 0", "1 1 5 0 Inf", "1 1 5 -1 0", "1 1 5 0 -1", "1 1 5 1.1e15 0", "1 1 5 0 1e16", "1 1 5 x 0",
		"1 1 5 0 0" + strings.Repeat(" ", 120)} {
		if _, _, ok := parseDemand(v); ok {
			t.Errorf("parseDemand(%q) accepted", v)
		}
	}
}
