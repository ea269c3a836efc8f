package l7

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

// TestSlidingLogKnownSequence: 3 per 10s on one key, at the boundaries.
func TestSlidingLogKnownSequence(t *testing.T) {
	alg, err := NewSlidingLog(3, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, err := NewStore(alg, StoreConfig{Capacity: 16})
	if err != nil {
		t.Fatal(err)
	}
	s := int64(time.Second)
	for i, c := range []struct {
		at         int64
		n          int64
		allowed    bool
		remaining  int64
		retryAfter time.Duration
	}{
		{0, 1, true, 2, 0},
		{1 * s, 1, true, 1, 0},
		{2 * s, 1, true, 0, 0},
		{3 * s, 1, false, 0, 7 * time.Second},              // the unit of t=0 leaves at 10s
		{10*s - 1, 1, false, 0, 1},                         // one nanosecond before
		{10 * s, 1, true, 0, 0},                            // (now-10s, now]: t=0 is out
		{10*s + s/2, 1, false, 0, 500 * time.Millisecond},  // t=1s leaves at 11s
		{10*s + s/2, 2, false, 0, 1500 * time.Millisecond}, // and t=2s at 12s
		{10*s + s/2, 4, false, 0, Never},                   // more than the limit, ever
		{10*s + s/2, 0, true, 0, 0},                        // n=0 reports
		{11 * s, 1, true, 0, 0},
		{12 * s, 1, true, 0, 0},
		{12 * s, 1, false, 0, 8 * time.Second}, // log 10s, 11s, 12s
		{5 * s, 1, false, 0, 8 * time.Second},  // a stale clock is read as the newest time (12s)
		{22 * s, 3, true, 0, 0},                // all three left at 22s
	} {
		d := st.Take(7, c.at, c.n)
		if d.Allowed != c.allowed || d.Remaining != c.remaining || d.RetryAfter != c.retryAfter {
			t.Errorf("step %d (t=%v n=%d): allowed %t remaining %d retry %v, want %t %d %v",
				i, time.Duration(c.at), c.n, d.Allowed, d.Remaining, d.RetryAfter, c.allowed, c.remaining, c.retryAfter)
		}
	}
}

// refLog is the sliding log's definition: every admitted unit's time.
type refLog struct {
	limit, window int64
	times         map[uint64][]int64
	newest        map[uint64]int64
}

func (r *refLog) count(key uint64, now int64) int64 {
	var n int64
	for _, t := range r.times[key] {
		if t > now-r.window {
			n++
		}
	}
	return n
}

func (r *refLog) admits(key uint64, now, n int64) bool {
	now = max(now, r.newest[key])
	return r.count(key, now)+n <= r.limit
}

func (r *refLog) charge(key uint64, now, n int64) int64 {
	now = max(now, r.newest[key])
	for range n {
		r.times[key] = append(r.times[key], now)
	}
	r.newest[key] = now
	return now
}

// refund removes n units charged at at, those still in the window.
func (r *refLog) refund(key uint64, at, n, now int64) {
	if now >= at+r.window {
		return
	}
	ts := r.times[key]
	for i := len(ts) - 1; i >= 0 && n > 0; i-- {
		if ts[i] == at {
			ts = append(ts[:i], ts[i+1:]...)
			n--
		}
	}
	r.times[key] = ts
}

// TestSlidingLogMatchesDefinition replays random timelines through two
// sliding-log stores checked all-or-nothing (takeAll: a request one refuses
// is charged on neither, so rollbacks happen), with random refunds of
// earlier admitted requests (refundAll), and compares every decision with
// the definition (refLog). The stores are sized so that none is ever full (checked).
func TestSlidingLogMatchesDefinition(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		a, _ := NewSlidingLog(5, int64ToDuration(1e9))
		b, _ := NewSlidingLog(3, int64ToDuration(7e8))
		sa, _ := NewStore(a, StoreConfig{Capacity: 256})
		sb, _ := NewStore(b, StoreConfig{Capacity: 64})
		ra := &refLog{limit: 5, window: 1e9, times: map[uint64][]int64{}, newest: map[uint64]int64{}}
		rb := &refLog{limit: 3, window: 7e8, times: map[uint64][]int64{}, newest: map[uint64]int64{}}
		type charged struct {
			checks  [2]Check
			charges [MaxChecks]undo
			atA     int64
			atB     int64
		}
		var held []*charged
		clock := new(l7test.ManualClock)
		now := int64(1)
		for step := range 3000 {
			switch rng.IntN(10) {
			case 0:
				now += rng.Int64N(2e9) // sometimes everything slides out
			case 1, 2:
				// same instant: equal timestamps
			default:
				now += rng.Int64N(1e8)
			}
			clock.Set(now)
			if len(held) > 0 && rng.IntN(4) == 0 {
				i := rng.IntN(len(held))
				h := held[i]
				held = append(held[:i], held[i+1:]...)
				var out [2]Decision
				refundAll(clock, h.checks[:], &h.charges, out[:])
				ra.refund(h.checks[0].Key, h.atA, h.checks[0].N, now)
				rb.refund(h.checks[1].Key, h.atB, h.checks[1].N, now)
				continue
			}
			// Keys are hashes in a Store (its shard is the top bits).
			ka, kb := uint64(rng.IntN(20)+1)*0x9e3779b97f4a7c15, uint64(rng.IntN(5)+1)*0xbf58476d1ce4e5b9
			n := rng.Int64N(4)
			// Take may see a slightly stale clock (a request that read it
			// before another was decided).
			at := now - rng.Int64N(3)*int64(time.Millisecond)
			h := &charged{checks: [2]Check{{Store: sa, Key: ka, N: n}, {Store: sb, Key: kb, N: n}}}
			var out [2]Decision
			var full [MaxChecks]bool
			got := takeAll(at, h.checks[:], out[:], &full, &h.charges)
			if sa.Stats().Full+sb.Stats().Full > 0 {
				t.Fatalf("seed %d step %d: a store was full", seed, step)
			}
			want := ra.admits(ka, at, n) && rb.admits(kb, at, n)
			if got != want {
				t.Fatalf("seed %d step %d: t=%d keys %x/%x n=%d: admitted %t (%+v), definition says %t (counts %d, %d)",
					seed, step, at, ka, kb, n, got, out, want, ra.count(ka, max(at, ra.newest[ka])), rb.count(kb, max(at, rb.newest[kb])))
			}
			if !got {
				continue
			}
			h.atA, h.atB = ra.charge(ka, at, n), rb.charge(kb, at, n)
			if n > 0 && rng.IntN(3) == 0 {
				held = append(held, h)
			}
			// Remaining agrees with the definition after the charge.
			if r := out[0].Remaining; r != 5-ra.count(ka, h.atA) {
				t.Fatalf("seed %d step %d: remaining %d, want %d", seed, step, r, 5-ra.count(ka, h.atA))
			}
		}
	}
}

func int64ToDuration(ns int64) time.Duration { return time.Duration(ns) }

// TestSlidingLogIdleEviction: a key whose units have all slid out is idle
// (its slot may go to a new key); one with a unit in the window is not.
func TestSlidingLogIdleEviction(t *testing.T) {
	alg, _ := NewSlidingLog(2, time.Second)
	st, _ := NewStore(alg, StoreConfig{Capacity: 8, Shards: 1})
	for k := uint64(1); k <= 8; k++ {
		if !st.Take(k, 0, 1).Allowed {
			t.Fatalf("key %d refused", k)
		}
	}
	if n := st.Sweep(int64(time.Second) - 1); n != 0 {
		t.Fatalf("sweep before the window ended freed %d keys", n)
	}
	if n := st.Sweep(int64(time.Second)); n != 8 {
		t.Fatalf("sweep after the window freed %d keys, want 8", n)
	}
	// A new key in a reused slot starts fresh (the old ring is ignored).
	for k := uint64(100); k < 108; k++ {
		for i := range 2 {
			if !st.Take(k, int64(time.Second), 1).Allowed {
				t.Fatalf("key %d take %d refused in a reused slot", k, i)
			}
		}
		if st.Take(k, int64(time.Second), 1).Allowed {
			t.Fatalf("key %d: third take admitted", k)
		}
	}
}

func TestSlidingLogLimits(t *testing.T) {
	if _, err := NewSlidingLog(MaxSlidingLogLimit+1, time.Second); err == nil {
		t.Error("a limit above MaxSlidingLogLimit was accepted")
	}
	if _, err := NewSlidingLog(MaxSlidingLogLimit, time.Hour); err != nil {
		t.Errorf("MaxSlidingLogLimit: %v", err)
	}
}
