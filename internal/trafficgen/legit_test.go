package trafficgen

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// TestBurstyComesInBursts checks the bursty schedule: sends come in groups
// of the burst size back to back, the groups apart, and on average at the
// asked rate (loosely: the gaps are random and the machine is shared).
func TestBurstyComesInBursts(t *testing.T) {
	const rate, burst = 200, 5
	var at []time.Time
	start := time.Now()
	bursty(context.Background(), rate, burst, 10_000, time.Second, rand.New(rand.NewPCG(7, 1)), func(seq int) {
		if seq != len(at) {
			t.Fatalf("seq %d after %d sends", seq, len(at))
		}
		at = append(at, time.Now())
	})
	if el := time.Since(start); el > 1500*time.Millisecond {
		t.Errorf("a 1s schedule took %v", el)
	}
	// 40 bursts expected in 1 s; a Poisson count is within ±50% of 40
	// with probability > 0.999.
	if n := len(at); n < 20*burst || n > 60*burst {
		t.Errorf("%d sends in 1s at %d/s in bursts of %d, want about %d", n, rate, burst, rate)
	}
	if len(at)%burst != 0 {
		t.Errorf("%d sends: not whole bursts of %d", len(at), burst)
	}
	var inBurst, between time.Duration
	for i := 1; i < len(at); i++ {
		if d := at[i].Sub(at[i-1]); i%burst != 0 {
			inBurst = max(inBurst, d)
		} else {
			between += d
		}
	}
	// Within a burst there is no wait at all; between bursts the mean gap
	// is 25 ms. Compare the two instead of asserting a wall-clock time.
	if bursts := len(at)/burst - 1; bursts > 0 && inBurst*4 > between/time.Duration(bursts) {
		t.Errorf("longest gap inside a burst %v, mean gap between bursts %v: not bursty", inBurst, between/time.Duration(bursts))
	}
}

// TestBurstyBounds: the count and the context bound a bursty schedule.
func TestBurstyBounds(t *testing.T) {
	n := 0
	bursty(context.Background(), 1000, 7, 10, time.Minute, rand.New(rand.NewPCG(1, 1)), func(int) { n++ })
	if n != 10 {
		t.Errorf("count 10: %d sends", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n = 0
	bursty(ctx, 1000, 7, 1000, time.Minute, rand.New(rand.NewPCG(1, 1)), func(int) { n++ })
	if n != 0 {
		t.Errorf("cancelled context: %d sends", n)
	}
	if _, err := (LegitUDP{Rate: 1, Count: 1, Duration: time.Second, Burst: 1001}).Run(context.Background()); err == nil {
		t.Error("burst 1001 accepted")
	}
}
