package redislimit

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// redisCount reads the current window's count from a sliding-window state.
func redisCount(t *testing.T, f *fixture, key, rule string) int64 {
	t.Helper()
	v, err := f.rdb.Get(context.Background(), redisKey("eg:l7:", key, rule)).Result()
	if err != nil {
		t.Fatalf("read state of %q: %v", key, err)
	}
	parts := strings.Split(v, ":")
	n, err := strconv.ParseInt(parts[len(parts)-1], 10, 64)
	if err != nil {
		t.Fatalf("state %q: %v", v, err)
	}
	return n
}

func hybridRuleFor(limit int64) Rule {
	return Rule{Name: "hot", Algorithm: SlidingWindow, Limit: limit, Window: time.Hour,
		Hybrid: &Hybrid{SyncInterval: 100 * time.Millisecond, MaxLease: 50, Share: 2}}
}

// Two instances share one Redis. Over a scripted timeline each admits from
// its own lease; together they must stay within limit + (N−1)·MaxLease and
// still reach the limit, and every admitted request is counted in Redis.
func TestHybridOvershootTwoInstances(t *testing.T) {
	f := newFixture(t)
	const limit, lease, instances = 1000, 50, 2
	newInstance := func() *Limiter {
		return f.limiter(t, Config{Client: f.srv.Client(t), Registerer: prometheus.NewRegistry(),
			Rules: []Rule{hybridRuleFor(limit)}, SyncEvery: -1})
	}
	a, b := newInstance(), newInstance()
	admitted := map[*Limiter]int64{}
	for range 3000 { // 3s of 1ms steps, 6 requests per step: 18000 offered
		f.advance(time.Millisecond)
		for _, l := range []*Limiter{a, b, a, b, a, b} {
			if allow(t, l, "hot-key").Decision.Allowed {
				admitted[l]++
			}
		}
	}
	a.Sync(context.Background())
	b.Sync(context.Background())
	total := admitted[a] + admitted[b]
	t.Logf("admitted A=%d B=%d total=%d; bound %d", admitted[a], admitted[b], total, limit+(instances-1)*lease)
	if total > limit+(instances-1)*lease {
		t.Fatalf("admitted %d, over the bound limit + (N−1)·L = %d", total, limit+(instances-1)*lease)
	}
	if total < limit {
		t.Fatalf("admitted %d, under the limit %d: leases wasted quota", total, limit)
	}
	if admitted[a] < limit/4 || admitted[b] < limit/4 {
		t.Fatalf("unfair split A=%d B=%d", admitted[a], admitted[b])
	}
	if got := redisCount(t, f, "hot-key", "hot"); got != total {
		t.Fatalf("Redis counted %d, instances admitted %d: counts lost or doubled", got, total)
	}
}

// The same bound with 8 goroutines per instance racing a moving clock.
func TestHybridOvershootConcurrent(t *testing.T) {
	f := newFixture(t)
	const limit, lease, instances = 500, 50, 2
	var total atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	go func() {
		for i := 0; i < 200_000; i++ {
			select {
			case <-done:
				return
			default:
				f.advance(10 * time.Microsecond)
			}
		}
	}()
	for range instances {
		l := f.limiter(t, Config{Client: f.srv.Client(t), Registerer: prometheus.NewRegistry(),
			Rules: []Rule{hybridRuleFor(limit)}, SyncEvery: -1})
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 400 {
					res, err := l.Allow(context.Background(), "hot-key")
					if err != nil {
						t.Error(err)
						return
					}
					if res.Decision.Allowed {
						total.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	close(done)
	n := total.Load()
	t.Logf("admitted %d of 6400 offered; bound %d", n, limit+(instances-1)*lease)
	if n > limit+(instances-1)*lease || n < limit {
		t.Fatalf("admitted %d, want within [limit %d, limit + (N−1)·L = %d]", n, limit, limit+(instances-1)*lease)
	}
}

// A request a plain rule refuses gives its lease reservation back.
func TestHybridRefundWhenAnotherRuleRefuses(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, Config{SyncEvery: -1, Rules: []Rule{
		hybridRuleFor(1000),
		{Name: "strict", Algorithm: GCRA, Limit: 2, Window: time.Hour},
	}})
	var allowed int
	for range 10 {
		res := allow(t, l, "k")
		if res.Decision.Allowed {
			allowed++
		}
		if res.Rules[0].Source != SourceLease {
			t.Fatalf("hybrid rule decided by %s, want lease", res.Rules[0].Source)
		}
	}
	l.Sync(context.Background())
	if got := redisCount(t, f, "k", "hot"); allowed != 2 || got != 2 {
		t.Fatalf("allowed %d, hybrid count %d; want 2 and 2 (refused requests never consume quota)", allowed, got)
	}
}

// With Redis down, a hybrid rule's failure policy applies and its unsynced
// counts survive until Redis is back.
func TestHybridRedisDown(t *testing.T) {
	f := newFixture(t)
	r := hybridRuleFor(1000)
	r.Failure = FailClosed
	l := f.limiter(t, Config{SyncEvery: -1, Rules: []Rule{r}})
	for range 5 {
		allow(t, l, "k")
	}
	f.srv.Stop()
	f.advance(200 * time.Millisecond) // lease expired: the next request syncs
	for range 5 {
		if res := allow(t, l, "k"); res.Decision.Allowed || res.Rules[0].Source != SourceFailClosed {
			t.Fatalf("redis down: %+v, want refused by fail-closed", res)
		}
	}
	if l.BreakerState() != BreakerOpen {
		t.Fatalf("breaker %s, want open", l.BreakerState())
	}
	f.srv.Restart()
	f.advance(time.Second)
	allow(t, l, "k") // starts the probe
	testenv.WaitFor(t, "the probe to close the breaker", func() bool { return l.BreakerState() == BreakerClosed })
	res := allow(t, l, "k")
	if !res.Decision.Allowed || res.Rules[0].Source != SourceLease {
		t.Fatalf("after recovery: %+v", res)
	}
	l.Sync(context.Background())
	// Restarted empty; the 5 counts from before the outage were kept and
	// flushed with the one after it.
	if got := redisCount(t, f, "k", "hot"); got != 6 {
		t.Fatalf("count after recovery %d, want 6", got)
	}
}
