package l7

import (
	"math/rand/v2"
	"testing"
	"time"
)

func refundAlgorithms() []Algorithm {
	return []Algorithm{
		mustAlg(NewGCRA(10, time.Second, 0)),
		mustAlg(NewGCRA(7, time.Second, 3)),
		mustAlg(NewTokenBucket(10, time.Second, 0)),
		mustAlg(NewTokenBucket(3, time.Second, 5)),
		mustAlg(NewFixedWindow(10, time.Second)),
		mustAlg(NewSlidingWindow(10, time.Second)),
		mustAlg(NewSlidingWindow(1, time.Second)),
		mustAlg(NewLeakyBucket(10, time.Second, 3, 0)),
		mustAlg(NewLeakyBucket(5, time.Second, 0, 0)),
	}
}

// sameDecisions checks that a and b decide every request of 1..limit
// units alike at now and at a few later times.
func sameDecisions(t *testing.T, alg Algorithm, a, b State, now int64, what string) {
	t.Helper()
	w := int64(alg.Window())
	for _, dt := range []int64{0, 1, w / 7, w / 3, w / 2, w - 1, w, 3 * w / 2, 2 * w} {
		for n := int64(1); n <= alg.Limit(); n++ {
			_, da := alg.Take(a, now+dt, n)
			_, db := alg.Take(b, now+dt, n)
			if da.Allowed != db.Allowed {
				t.Fatalf("%s %s: at now+%d n=%d: %v after refund, %v before the charge (states %v, %v)",
					alg.Name(), what, dt, n, da.Allowed, db.Allowed, a, b)
			}
		}
	}
}

// TestRefundExactWhenUntouched: a charge refunded before anything else
// touched the key leaves a state that decides like the one before it.
func TestRefundExactWhenUntouched(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, alg := range refundAlgorithms() {
		w := int64(alg.Window())
		for i := range 400 {
			// A random reachable state: a few admitted requests.
			var before State
			now := r.Int64N(10 * w)
			for range r.IntN(12) {
				now += r.Int64N(w / 4)
				if s, d := alg.Take(before, now, 1+r.Int64N(alg.Limit())); d.Allowed {
					before = s
				}
			}
			now += r.Int64N(w / 4)
			n := 1 + r.Int64N(alg.Limit())
			after, d := alg.Take(before, now, n)
			if !d.Allowed {
				continue
			}
			at := now + r.Int64N(2*w)
			if i%3 == 0 {
				at = now
			}
			got := alg.Refund(after, before, after, at)
			sameDecisions(t, alg, got, before, at, "untouched")
		}
	}
}

// TestRefundNeverOverAdmits replays random timelines in which some
// admitted requests are held and refunded later, with other requests
// admitted while they are held. Every request that is finally kept must be
// admitted by the algorithm's definition applied to the kept requests
// alone; for the window counters (exact refunds) the state after the last
// refund must also decide exactly like that replay.
func TestRefundNeverOverAdmits(t *testing.T) {
	type req struct {
		at, n int64
	}
	type held struct {
		req
		before, after State
		kept          int // index into kept when admitted
	}
	for ai, alg := range refundAlgorithms() {
		_, exact := alg.(*FixedWindow)
		if _, ok := alg.(*SlidingWindow); ok {
			exact = true
		}
		r := rand.New(rand.NewPCG(uint64(ai), 11))
		w := int64(alg.Window())
		for run := range 60 {
			var s State
			now := int64(0)
			var kept []req
			dropped := map[int]bool{}
			var pending []held
			for range 200 {
				switch r.IntN(4) {
				case 0:
					now += r.Int64N(w / 10)
				case 1:
					now += r.Int64N(w)
				}
				n := 1 + r.Int64N(max(1, alg.Limit()/3))
				switch act := r.IntN(5); {
				case act <= 1 || (act == 4 && len(pending) == 0):
					if ns, d := alg.Take(s, now, n); d.Allowed {
						s = ns
						kept = append(kept, req{now, n})
					}
				case act <= 3:
					if ns, d := alg.Take(s, now, n); d.Allowed {
						pending = append(pending, held{req: req{now, n}, before: s, after: ns, kept: len(kept)})
						kept = append(kept, req{now, n})
						s = ns
					}
				default:
					k := r.IntN(len(pending))
					h := pending[k]
					pending = append(pending[:k], pending[k+1:]...)
					s = alg.Refund(s, h.before, h.after, now)
					dropped[h.kept] = true
				}
			}
			// Replay the definition over the requests finally kept.
			var ref State
			for i, q := range kept {
				if dropped[i] {
					continue
				}
				ns, d := alg.Take(ref, q.at, q.n)
				if !d.Allowed {
					t.Fatalf("%s run %d: kept request %d (t=%d n=%d) over-admitted: the definition without the refunded requests refuses it",
						alg.Name(), run, i, q.at, q.n)
				}
				ref = ns
			}
			if exact && len(pending) == 0 {
				sameDecisions(t, alg, s, ref, now, "after refunds")
			}
		}
	}
}
