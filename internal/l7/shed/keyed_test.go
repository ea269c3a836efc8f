package shed

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

func TestKeyedConfigErrors(t *testing.T) {
	for name, cfg := range map[string]KeyedConfig{
		"adaptive": {PerKey: Config{Adaptive: &AdaptiveConfig{}}},
		"rand":     {PerKey: Config{MaxInFlight: 1, Rand: alwaysLose{}}},
		"no limit": {PerKey: Config{}},
		"negative": {PerKey: Config{MaxInFlight: 1}, MaxKeys: -1},
	} {
		if _, err := NewKeyed(cfg); err == nil {
			t.Errorf("%s: NewKeyed accepted %+v", name, cfg)
		}
	}
}

// A full table drops an idle key from the inserting key's shard to make
// room; with none idle there, new keys share the overflow limiter.
func TestKeyedFullTableDropsIdleThenOverflows(t *testing.T) {
	env := newManualEnv()
	k, err := NewKeyed(KeyedConfig{
		PerKey:  Config{MaxInFlight: 1, Clock: env.clock, AfterFunc: env.timers.AfterFunc},
		MaxKeys: 1, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	shard := func(key string) uint64 { return maphash.String(k.hashSeed, key) % keyedShards }
	// b lives in another shard than a; c shares a's shard.
	a, b, c := "a", "", ""
	for i := 0; b == "" || c == ""; i++ {
		key := fmt.Sprint("k", i)
		switch {
		case b == "" && shard(key) != shard(a):
			b = key
		case c == "" && shard(key) == shard(a):
			c = key
		}
	}
	ctx := context.Background()
	pa, err := k.Acquire(ctx, a, PriorityDefault)
	if err != nil {
		t.Fatal(err)
	}
	// Table full, nothing idle in b's shard: b gets the overflow slot...
	pb, err := k.Acquire(ctx, b, PriorityDefault)
	if err != nil {
		t.Fatalf("b on the overflow limiter: %v", err)
	}
	// ...which is now taken, for b and for c (a, in c's shard, is busy).
	_, err = k.Acquire(ctx, b, PriorityDefault)
	wantShed(t, err, ReasonAtLimit)
	_, err = k.Acquire(ctx, c, PriorityDefault)
	wantShed(t, err, ReasonAtLimit)
	if got := k.Keys(); got != 1 {
		t.Fatalf("keys = %d, want 1", got)
	}
	// Once a is idle, c takes its place in the table.
	pa.Release()
	pc, err := k.Acquire(ctx, c, PriorityDefault)
	if err != nil {
		t.Fatalf("c after a went idle: %v", err)
	}
	if got := k.Keys(); got != 1 {
		t.Fatalf("keys = %d, want 1", got)
	}
	pb.Release()
	pc.Release()
	s := k.Stats()
	if s.InFlight != 0 || s.Admitted[PriorityDefault] != 3 || s.Shed[ReasonAtLimit][PriorityDefault] != 2 {
		t.Fatalf("stats after releases: %+v", s)
	}
}

// Sweep racing with Acquire on the same keys must never let a key exceed its
// limit: a dropped limiter refuses work and Acquire looks the key up again.
func TestKeyedSweepRacingAcquireKeepsPerKeyLimit(t *testing.T) {
	k, err := NewKeyed(KeyedConfig{PerKey: Config{MaxInFlight: 2}, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	const keys, workers, rounds = 4, 8, 300
	var inUse [keys]atomic.Int64
	var over atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var sweeper sync.WaitGroup
	sweeper.Go(func() {
		for ctx.Err() == nil {
			k.Sweep()
		}
	})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				key := (w + i) % keys
				p, err := k.Acquire(context.Background(), fmt.Sprint("key-", key), PriorityDefault)
				if err != nil {
					continue
				}
				if inUse[key].Add(1) > 2 {
					over.Add(1)
				}
				inUse[key].Add(-1)
				p.Release()
			}
		})
	}
	wg.Wait()
	cancel()
	sweeper.Wait()
	if n := over.Load(); n != 0 {
		t.Fatalf("a key exceeded its limit of 2 in flight %d times", n)
	}
	s := k.Stats()
	admitted, shed := s.Totals()
	if admitted+shed != workers*rounds {
		t.Fatalf("admitted %d + shed %d != %d requests (counters lost on drop?)", admitted, shed, workers*rounds)
	}
	if s.InFlight != 0 || s.QueueDepth != 0 {
		t.Fatalf("in flight %d, queue %d after the run", s.InFlight, s.QueueDepth)
	}
}

// TestKeyedMemoryPerKey measures the heap cost of one idle key (limiter,
// lottery source, map slot; the key's bytes are allocated beforehand), the
// figure docs/l7-shedding.md quotes. The bound is loose on purpose: it
// catches a per-key regression, not noise.
func TestKeyedMemoryPerKey(t *testing.T) {
	const n = 10000
	k, err := NewKeyed(KeyedConfig{PerKey: Config{MaxInFlight: 4}, MaxKeys: 2 * n, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%06d", i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, key := range keys {
		p, err := k.Acquire(context.Background(), key, PriorityDefault)
		if err != nil {
			t.Fatal(err)
		}
		p.Release()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perKey := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	t.Logf("%d bytes per idle key (Limiter struct %d, PCG %d, waiter %d while queued)",
		perKey, unsafe.Sizeof(Limiter{}), unsafe.Sizeof(rand.PCG{}), unsafe.Sizeof(waiter{}))
	if perKey > 1024 {
		t.Fatalf("%d bytes per key, want at most 1024", perKey)
	}
	runtime.KeepAlive(k)
}
