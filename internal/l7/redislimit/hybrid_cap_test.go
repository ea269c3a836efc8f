package redislimit

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/testenv"
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
	reg, logs := prometheus.NewRegistry(), &testenv.SyncBuffer{}
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
	t.Logf("share %d: %d keys × %d requests, capacity %d: %d leases at the end, %.0f evictions, %d decisions in foreign mode, %.0f foreign counts, %.2f lease round trips per request",
		share, keys, limit+1, capacity, leaseCount(l), ev, foreign, foreignCounts(t, reg, "hot"), float64(roundTrips(t, reg, "lease"))/float64(requests))
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

// A hot key evicted every half window by a spray of capacity fresh keys
// returns within its window, over 10 windows of bursty clumps: every
// admission is within the documented bound over all true admissions (one
// host at hosts: 1: the limit; two hosts at share 2: limit + lease), and
// Redis's window equals what was admitted. A single host's returning key
// finds its own counts, takes them as foreign (fixed grants until they
// slide out), and neither counts nor warns of them.
func TestHybridCapacityEvictedKeyReturns(t *testing.T) {
	for _, hosts := range []int64{1, 2} {
		t.Run(fmt.Sprintf("hosts %d", hosts), func(t *testing.T) { testHybridCapacityReturns(t, hosts) })
	}
}

func testHybridCapacityReturns(t *testing.T, hosts int64) {
	f := newFixture(t)
	const limit, capacity, window = 20, 8, time.Second
	lease := SingleLease(limit)
	if hosts > 1 {
		lease = FleetLease(limit, hosts)
	}
	rule := Rule{Name: "hot", Algorithm: SlidingWindow, Limit: limit, Window: window,
		Hybrid: &Hybrid{SyncInterval: time.Second, MaxLease: lease, Share: hosts, Capacity: capacity}}
	reg, logs := prometheus.NewRegistry(), &testenv.SyncBuffer{}
	var ls []*Limiter
	for i := range hosts {
		cfg := Config{Client: f.srv.Client(t), Registerer: prometheus.NewRegistry(), Rules: []Rule{rule}, SyncEvery: -1}
		if i == 0 {
			cfg.Registerer, cfg.Logger = reg, slog.New(slog.NewTextHandler(logs, nil))
		}
		ls = append(ls, f.limiter(t, cfg))
	}
	sprays, evicted, foreign := 0, 0, 0
	spray := func(s int) []*Limiter {
		if s%10 == 5 { // every half window: the first host's key k is evicted
			for i := range capacity {
				allow(t, ls[0], fmt.Sprintf("spray-%d-%d", s, i))
			}
			sprays++
			h := ls[0].hybrid[0]
			h.mu.Lock()
			if h.leases["k"] == nil {
				evicted++
			}
			h.mu.Unlock()
		}
		if foreignMode(ls[0], "k") {
			foreign++
		}
		return ls
	}
	bound := limit + (hosts-1)*lease
	admitted, prev, curr := hybridTimeline(t, f, spray, window, always(bound), time.Second, offered(200))
	ev, fc := evictions(t, reg, "hot"), foreignCounts(t, reg, "hot")
	t.Logf("hosts %d: admitted %d in 10 windows (bound %d per window); k evicted by %d of %d sprays; %.0f evictions; k in foreign mode at %d of 200 steps; %.0f foreign counts; %d lease round trips (the sprays' included)",
		hosts, admitted, bound, evicted, sprays, ev, foreign, fc, roundTrips(t, reg, "lease"))
	if evicted != sprays || ev < float64(sprays*capacity) {
		t.Fatalf("k evicted by %d of %d sprays, %.0f evictions counted (want at least %d)", evicted, sprays, ev, sprays*capacity)
	}
	if rp, rc := redisWindow(t, f, "k", "hot", window); rp != prev || rc != curr {
		t.Fatalf("Redis's window holds %d, %d; admitted %d, %d in the last two windows", rp, rc, prev, curr)
	}
	if admitted < 10*limit*85/100 {
		t.Fatalf("admitted %d in 10 windows, under 85%% of the limit's %d: eviction lost quota", admitted, 10*limit)
	}
	if hosts == 1 {
		if fc != 0 || strings.Contains(logs.String(), foreignWarning) {
			t.Fatalf("a host alone counted %.0f foreign counts across evictions; log:\n%s", fc, logs)
		}
		if foreign == 0 {
			t.Fatalf("k never decided in foreign mode after a return: the test does not exercise it")
		}
	}
}

// Goroutines race a spray of distinct keys (each asked twice, the second
// time after others evicted it) against a moving clock at a capacity of
// 16: the leases never exceed it, and after a flush Redis holds exactly
// what was admitted (evictions that wait for a sync in flight, and flushes
// that race requests for the victim's key, lose nothing).
func TestHybridCapacityConcurrent(t *testing.T) {
	f := newFixture(t)
	const capacity, workers, perWorker = 16, 8, 200
	rule := Rule{Name: "hot", Algorithm: SlidingWindow, Limit: 1000, Window: time.Hour,
		Hybrid: &Hybrid{SyncInterval: 10 * time.Millisecond, MaxLease: 4, Share: 1, Capacity: capacity}}
	reg := prometheus.NewRegistry()
	l := f.limiter(t, Config{Registerer: reg, Rules: []Rule{rule}, SyncEvery: -1})
	var mu sync.Mutex
	admitted := map[string]int64{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				f.advance(time.Millisecond)
				// Keys shared by neighbouring workers: requests for a
				// victim's key race its flush.
				key := fmt.Sprintf("src-%d", (w/2*perWorker+i)/2)
				res, err := l.Allow(context.Background(), key)
				if err != nil {
					t.Errorf("Allow(%q): %v", key, err)
					return
				}
				if n := leaseCount(l); n > capacity {
					t.Errorf("%d leases, over the capacity %d", n, capacity)
					return
				}
				if res.Decision.Allowed {
					mu.Lock()
					admitted[key]++
					mu.Unlock()
				}
				if i%50 == 49 {
					l.Sync(context.Background())
				}
			}
		}()
	}
	wg.Wait()
	l.Sync(context.Background())
	var total int64
	for key, n := range admitted {
		total += n
		if got := redisCount(t, f, key, "hot"); got != n {
			t.Fatalf("key %s: Redis counted %d, admitted %d", key, got, n)
		}
	}
	t.Logf("%d keys, %d admitted, %.0f evictions, %d leases at the end", len(admitted), total, evictions(t, reg, "hot"), leaseCount(l))
	if total != workers*perWorker {
		t.Fatalf("admitted %d of %d under a limit of 1000 per key", total, workers*perWorker)
	}
}
