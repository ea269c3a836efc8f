package redislimit

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// t0 is a whole second, so window positions in the timelines are exact.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano()

type fixture struct {
	srv    *testenv.Redis
	rdb    *redis.Client
	clock  *l7test.ManualClock // breaker, local fallback, leases
	script *l7test.ManualClock // the scripts' time (Unix ns)
	reg    *prometheus.Registry
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	srv := testenv.StartRedis(t)
	f := &fixture{srv: srv, rdb: srv.Client(t), clock: &l7test.ManualClock{}, script: &l7test.ManualClock{}, reg: prometheus.NewRegistry()}
	f.clock.Set(1e12)
	f.script.Set(t0)
	return f
}

func (f *fixture) limiter(t *testing.T, cfg Config) *Limiter {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = f.rdb
	}
	if cfg.Clock == nil {
		cfg.Clock = f.clock
	}
	if cfg.ScriptClock == nil {
		cfg.ScriptClock = f.script
	}
	if cfg.Registerer == nil {
		cfg.Registerer = f.reg
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(l.Close)
	return l
}

// advance moves both clocks.
func (f *fixture) advance(d time.Duration) {
	f.clock.Advance(d)
	f.script.Advance(d)
}

func allow(t *testing.T, l *Limiter, key string) Result {
	t.Helper()
	res, err := l.Allow(context.Background(), key)
	if err != nil {
		t.Fatalf("Allow(%q): %v", key, err)
	}
	return res
}

func wantDecision(t *testing.T, step string, got, want l7.Decision) {
	t.Helper()
	if got != want {
		t.Fatalf("%s:\n got %+v\nwant %+v", step, got, want)
	}
}

func TestGCRATimeline(t *testing.T) {
	f := newFixture(t)
	for _, batch := range []int{1, 64} {
		t.Run(map[int]string{1: "direct", 64: "batched"}[batch], func(t *testing.T) {
			rule := Rule{Name: "gcra" + map[int]string{1: "d", 64: "b"}[batch], Algorithm: GCRA, Limit: 3, Window: time.Second}
			l := f.limiter(t, Config{Rules: []Rule{rule}, MaxBatch: batch, Registerer: prometheus.NewRegistry()})
			const T = 333333333 // 1s/3, rounded down to a nanosecond
			for i := range int64(3) {
				wantDecision(t, "burst", allow(t, l, "k").Decision, l7.Decision{
					Allowed: true, Limit: 3, Window: time.Second, Remaining: 2 - i, Reset: time.Duration((i + 1) * T),
				})
			}
			before := f.rdb.Get(context.Background(), redisKey("eg:l7:", "k", rule.Name)).Val()
			for range 5 {
				wantDecision(t, "over the limit", allow(t, l, "k").Decision, l7.Decision{
					Limit: 3, Window: time.Second, Remaining: 0, Reset: 3 * T, RetryAfter: T,
				})
			}
			if after := f.rdb.Get(context.Background(), redisKey("eg:l7:", "k", rule.Name)).Val(); after != before {
				t.Fatalf("refused requests changed the state: %q -> %q", before, after)
			}
			f.advance(T - 1)
			wantDecision(t, "1ns early", allow(t, l, "k").Decision, l7.Decision{
				Limit: 3, Window: time.Second, Remaining: 0, Reset: 2*T + 1, RetryAfter: 1,
			})
			f.advance(1)
			wantDecision(t, "on time", allow(t, l, "k").Decision, l7.Decision{
				Allowed: true, Limit: 3, Window: time.Second, Remaining: 0, Reset: 3 * T,
			})
			f.advance(10 * time.Second)
			wantDecision(t, "idle refills to the burst", allow(t, l, "k").Decision, l7.Decision{
				Allowed: true, Limit: 3, Window: time.Second, Remaining: 2, Reset: T,
			})
			if ttl := f.rdb.PTTL(context.Background(), redisKey("eg:l7:", "k", rule.Name)).Val(); ttl <= 0 || ttl > 334*time.Millisecond {
				t.Fatalf("key TTL %s, want (0, 334ms]: state must expire once it no longer limits", ttl)
			}
		})
	}
}

func TestSlidingWindowTimeline(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, Config{Rules: []Rule{{Name: "swc", Algorithm: SlidingWindow, Limit: 10, Window: time.Second}}})
	d := func(allowed bool, rem int64, reset, retry time.Duration) l7.Decision {
		return l7.Decision{Allowed: allowed, Limit: 10, Window: time.Second, Remaining: rem, Reset: reset, RetryAfter: retry}
	}
	for i := range int64(10) {
		wantDecision(t, "fill", allow(t, l, "k").Decision, d(true, 9-i, 2*time.Second, 0))
	}
	// Next window: prev = 10 weighs 10·(1−e); one more fits at e ≥ 0.1s.
	wantDecision(t, "full", allow(t, l, "k").Decision, d(false, 0, 2*time.Second, 1100*time.Millisecond))
	f.advance(1100*time.Millisecond - time.Microsecond)
	wantDecision(t, "1µs early", allow(t, l, "k").Decision, d(false, 0, 900*time.Millisecond+time.Microsecond, time.Microsecond))
	f.advance(time.Microsecond)
	wantDecision(t, "weighted previous window", allow(t, l, "k").Decision, d(true, 0, 1900*time.Millisecond, 0))
	// Now prev 10, curr 1: the next fits when 10·(1−e) ≤ 8, e ≥ 0.2s.
	wantDecision(t, "full again", allow(t, l, "k").Decision, d(false, 0, 1900*time.Millisecond, 100*time.Millisecond))
	f.advance(2 * time.Second)
	wantDecision(t, "idle", allow(t, l, "k").Decision, d(true, 9, 1900*time.Millisecond, 0))
}

func TestAllOrNothing(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, Config{Rules: []Rule{
		{Name: "per-second", Algorithm: GCRA, Limit: 5, Window: time.Second},
		{Name: "per-minute", Algorithm: SlidingWindow, Limit: 3, Window: time.Minute},
	}})
	for range 3 {
		if res := allow(t, l, "10.0.0.1"); !res.Decision.Allowed {
			t.Fatalf("under both limits, refused: %+v", res)
		}
	}
	ctx := context.Background()
	secKey := redisKey("eg:l7:", "10.0.0.1", "per-second")
	before := f.rdb.Get(ctx, secKey).Val()
	res := allow(t, l, "10.0.0.1")
	if res.Decision.Allowed || res.Decision.Limit != 3 || res.Decision.RetryAfter <= 0 {
		t.Fatalf("combined decision should be the per-minute refusal: %+v", res.Decision)
	}
	wantDecision(t, "per-second rule, not charged", res.Rules[0].Decision, l7.Decision{
		Allowed: true, Limit: 5, Window: time.Second, Remaining: 2, Reset: 3 * 200 * time.Millisecond,
	})
	if after := f.rdb.Get(ctx, secKey).Val(); after != before {
		t.Fatalf("per-second state charged by a refused request: %q -> %q", before, after)
	}
	// Both keys share the hash tag, so one EVALSHA may touch both in a cluster.
	keys, _ := f.rdb.Keys(ctx, "eg:l7:*").Result()
	if len(keys) != 2 {
		t.Fatalf("keys %v, want the two states of 10.0.0.1", keys)
	}
	for _, k := range keys {
		if hashTag(k) != "10.0.0.1" {
			t.Fatalf("key %q has hash tag %q", k, hashTag(k))
		}
	}
}

// hashTag is Redis Cluster's rule: the bytes between the first '{' and the
// next '}' if non-empty, else the whole key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

func TestRedisKeyHashTag(t *testing.T) {
	for _, client := range []string{"", "}", "}{", "a}b", "%7D", "2001:db8::1", "{x}"} {
		a, b := redisKey("eg:", client, "r1"), redisKey("eg:", client, "r2")
		if hashTag(a) != hashTag(b) || hashTag(a) == a {
			t.Errorf("client key %q: keys %q and %q do not share a non-empty hash tag", client, a, b)
		}
	}
	if redisKey("p:", "}", "r") == redisKey("p:", "%7D", "r") {
		t.Error("escaping is ambiguous: '}' and '%7D' map to the same key")
	}
}

func TestNoScriptReload(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, Config{Rules: []Rule{{Name: "r", Algorithm: GCRA, Limit: 2, Window: time.Second}}})
	allow(t, l, "k")
	if err := f.rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	res := allow(t, l, "k")
	if res.Rules[0].Source != SourceRedis || !res.Decision.Allowed || res.Decision.Remaining != 0 {
		t.Fatalf("after SCRIPT FLUSH: %+v, want the script reloaded and the second request allowed", res)
	}
	if l.BreakerState() != BreakerClosed {
		t.Fatal("NOSCRIPT counted as a Redis failure")
	}
}

func TestServerClock(t *testing.T) {
	srv := testenv.StartRedis(t)
	l, err := New(Config{Client: srv.Client(t), Rules: []Rule{{Name: "hourly", Algorithm: GCRA, Limit: 2, Window: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for range 2 {
		if res, _ := l.Allow(ctx, "k"); !res.Decision.Allowed {
			t.Fatalf("refused within the burst: %+v", res)
		}
	}
	res, _ := l.Allow(ctx, "k")
	// Real time passes between calls: allow a minute of scheduling noise.
	if r := res.Decision.RetryAfter; res.Decision.Allowed || r > 30*time.Minute || r < 29*time.Minute {
		t.Fatalf("third request: %+v, want refused with RetryAfter ≈ 30m (Redis TIME)", res.Decision)
	}
}

func TestInvalidRules(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, r := range []Rule{
		{Name: "bad name", Algorithm: GCRA, Limit: 1, Window: time.Second},
		{Name: "zero", Algorithm: GCRA, Limit: 0, Window: time.Second},
		{Name: "tiny", Algorithm: GCRA, Limit: 10, Window: 5},
		{Name: "ns", Algorithm: SlidingWindow, Limit: 1, Window: time.Second + 1},
		{Name: "big", Algorithm: SlidingWindow, Limit: 1 << 30, Window: time.Hour},
		{Name: "deg", Algorithm: GCRA, Limit: 1, Window: time.Second, Failure: Degrade},
		{Name: "hyb", Algorithm: GCRA, Limit: 1, Window: time.Second, Hybrid: &Hybrid{SyncInterval: time.Second, MaxLease: 1}},
	} {
		if _, err := New(Config{Client: c, Rules: []Rule{r}}); err == nil {
			t.Errorf("rule %+v accepted", r)
		}
	}
}

func TestAllowAfterClose(t *testing.T) {
	f := newFixture(t)
	for _, batch := range []int{1, 64} {
		l := f.limiter(t, Config{MaxBatch: batch, Registerer: prometheus.NewRegistry(),
			Rules: []Rule{{Name: "r", Algorithm: GCRA, Limit: 1, Window: time.Second}}})
		l.Close()
		if _, err := l.Allow(context.Background(), "k"); err != ErrClosed {
			t.Fatalf("MaxBatch %d: Allow after Close: %v, want ErrClosed", batch, err)
		}
	}
}
