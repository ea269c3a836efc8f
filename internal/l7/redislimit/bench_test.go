package redislimit

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// BenchmarkL7Redis measures decisions per second from 64 goroutines against
// a local redis-server: Edgeguard's backend (batched and one round trip per
// decision) beside github.com/go-redis/redis_rate/v10 on the same server and
// client. Every decision is a real GCRA script run on Redis' clock; keys are
// spread over 1024 clients with a limit high enough that all are allowed.
//
//	go test -run '^$' -bench BenchmarkL7Redis -benchtime 3s ./internal/l7/redislimit
func BenchmarkL7Redis(b *testing.B) {
	srv := testenv.StartRedis(b)
	// Generous timeouts: the benchmark measures throughput, and a shared
	// 2-core machine can stall a reply past a production-grade timeout.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 64, ReadTimeout: 2 * time.Second,
		WriteTimeout: 2 * time.Second, PoolTimeout: 4 * time.Second, MaxRetries: -1})
	defer rdb.Close()
	const goroutines = 64
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
	}
	rule := Rule{Name: "bench", Algorithm: GCRA, Limit: 1_000_000_000, Window: time.Second}
	run := func(b *testing.B, decide func(ctx context.Context, key string) bool) {
		b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		var next, refused atomic.Int64
		start := time.Now()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if !decide(ctx, keys[next.Add(1)%int64(len(keys))]) {
					refused.Add(1)
				}
			}
		})
		b.StopTimer()
		if n := refused.Load(); n > 0 {
			b.Fatalf("%d decisions refused or failed: the benchmark would measure the wrong path", n)
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
	}
	for _, bc := range []struct {
		name     string
		maxBatch int
	}{{"edgeguard-batched", 64}, {"edgeguard-direct", 1}} {
		b.Run(bc.name, func(b *testing.B) {
			l, err := New(Config{Client: rdb, Rules: []Rule{rule}, MaxBatch: bc.maxBatch, Timeout: 2 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			run(b, func(ctx context.Context, key string) bool {
				res, err := l.Allow(ctx, key)
				return err == nil && res.Decision.Allowed && res.Rules[0].Source == SourceRedis
			})
		})
	}
	b.Run("redis_rate", func(b *testing.B) {
		rl := redis_rate.NewLimiter(rdb)
		limit := redis_rate.PerSecond(1_000_000_000)
		run(b, func(ctx context.Context, key string) bool {
			res, err := rl.Allow(ctx, key, limit)
			return err == nil && res.Allowed == 1
		})
	})
}

// BenchmarkL7RedisBreakerOpen measures one decision while Redis is known
// down: the breaker answers without network I/O.
//
//	go test -run '^$' -bench BenchmarkL7RedisBreakerOpen ./internal/l7/redislimit
func BenchmarkL7RedisBreakerOpen(b *testing.B) {
	srv := testenv.StartRedis(b)
	rdb := srv.Client(b)
	l, err := New(Config{Client: rdb, Rules: []Rule{{Name: "r", Algorithm: GCRA, Limit: 10, Window: time.Second}},
		Breaker: BreakerConfig{OpenFor: time.Hour}})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	srv.Stop()
	ctx := context.Background()
	for l.BreakerState() != BreakerOpen {
		if _, err := l.Allow(ctx, "k"); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		if res, _ := l.Allow(ctx, "k"); res.Rules[0].Source != SourceFailOpen {
			b.Fatalf("source %s, want fail_open", res.Rules[0].Source)
		}
	}
}
