package redislimit

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// evictions reads edgeguard_l7_redis_hybrid_evictions_total for a rule.
func evictions(t *testing.T, reg *prometheus.Registry, rule string) float64 {
	t.Helper()
	return gathered(t, reg, "edgeguard_l7_redis_hybrid_evictions_total", "rule", rule).GetCounter().GetValue()
}

// leaseCount is how many leases l's first hybrid rule holds.
func leaseCount(l *Limiter) int {
	h := l.hybrid[0]
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.leases)
}

// A spray of 10 × capacity distinct keys, each asked limit + 1 times in
// rounds (every key is evicted between two of its requests, and returns
// within its window): the leases never exceed capacity; every key admits
// exactly its limit (eviction neither loses nor frees quota: each
// admission is one the sliding window at the limit over the key's true
// admissions admits); Redis's window of every key equals what was
// admitted (the evicted leases' unsynced counts were reported); every new
// key at capacity counts one eviction; and a single host (share 1) never
// takes its own counts, found by a returning key's new lease, for another
// host's: no foreign counts, no warning. They make the returning key
// decide with fixed grants (foreign mode) until they slide out.
func TestHybridCapacitySpray(t *testing.T) {
	for _, share := range []int64{1, 2} {
		t.Run(fmt.Sprintf("share %d", share), func(t *testing.T) { testHybridCapacitySpray(t, share) })
	}
}

func testHybridCapacitySpray(t *testing.T, share int64) {
	f := newFixture(t)
	const limit, capacity, keys = 3, 32, 320
	const window = time.Second
	rule := Rule{Name: "hot", Algorithm: SlidingWindow, Limit: limit, Window: window,
		Hybrid: &Hybrid{SyncInterval: time.Second, MaxLease: SingleLease(limit), Share: share, Capacity: capacity}}
	reg, logs := prometheus.NewRegistry(), &syncBuffer{}
	l := f.limiter(t, Config{Registerer: reg, Rules: []Rule{rule}, SyncEvery: -1, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	judge, err := l7.NewSlidingWindow(limit, window)
	if err != nil {
		t.Fatal(err)
	}
	truth := make([]l7.State, keys)
	admitted := make([]int64, keys)
	requests, foreign := 0, 0
	for range limit + 1 {
		for i := range keys {
			f.advance(100 * time.Microsecond)
			key := fmt.Sprintf("src-%d", i)
			res := allow(t, l, key)
			requests++
			if n := leaseCount(l); n > capacity {
				t.Fatalf("request %d: %d leases, over the capacity %d", requests, n, capacity)
			}
			if foreignMode(l, key) {
				foreign++
			}
			if !res.Decision.Allowed {
				continue
			}
			admitted[i]++
			var d l7.Decision
			if truth[i], d = judge.Take(truth[i], f.script.Now(), 1); !d.Allowed {
				t.Fatalf("key %s: admission %d is over the sliding window at %d over its true admissions", key, admitted[i], limit)
			}
		}
	}
	l.Sync(context.Background())
	for i := range keys {
		key := fmt.Sprintf("src-%d", i)
		if admitted[i] != limit {
			t.Fatalf("key %s admitted %d of %d, want the limit %d", key, admitted[i], limit+1, limit)
		}
		if _, curr := redisWindow(t, f, key, "hot", window); curr != admitted[i] {
			t.Fatalf("key %s: Redis's window holds %d, admitted %d: counts of evicted leases lost", key, curr, admitted[i])
		}
	}
	ev := evictions(t, reg, "hot")
	t.Logf("share %d: %d keys × %d requests, capacity %d: %d leases at the end, %.0f evictions, %d decisions in foreign mode, %.0f foreign counts",
		share, keys, limit+1, capacity, leaseCount(l), ev, foreign, foreignCounts(t, reg, "hot"))
	if want := float64(requests - capacity); ev != want {
		t.Fatalf("%.0f evictions, want %.0f (every request after the first %d was a new key at capacity)", ev, want, capacity)
	}
	if n := foreignCounts(t, reg, "hot"); n != 0 || strings.Contains(logs.String(), foreignWarning) {
		t.Fatalf("a host alone counted %.0f foreign counts across evictions; log:\n%s", n, logs)
	}
	if share == 1 && foreign == 0 {
		t.Fatalf("no returning key decided in foreign mode: the test does not exercise what it claims")
	}
}
