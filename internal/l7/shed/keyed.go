package shed

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Keyed defaults.
const (
	DefaultMaxKeys = 10000
	// keyedShards spreads keys over this many independently locked maps.
	keyedShards = 64
	// evictScan bounds how many entries one insertion into a full table
	// looks at for an idle limiter to drop.
	evictScan = 32
)

// KeyedConfig configures a Keyed limiter.
type KeyedConfig struct {
	// PerKey configures each key's limiter. Adaptive and Rand must be nil:
	// the adaptive limit is per route, and each key draws its lottery from
	// its own PCG seeded from Seed and the key.
	PerKey Config
	// MaxKeys bounds the number of keys with their own limiter. Zero means
	// DefaultMaxKeys. When the table is full and holds no idle limiter to
	// drop, new keys share one overflow limiter (same settings).
	MaxKeys int
	// Seed seeds the per-key lotteries. Zero means random.
	Seed uint64
}

// Keyed holds one Limiter per key (client, tenant, route parameter). Keys
// are spread over 64 shards, each with its own lock; a request for a known
// key takes only a read lock on its shard and then the key's own fast path.
//
// A limiter with nothing in flight and nothing queued carries no state that
// matters, so Keyed drops idle limiters freely: Sweep drops them all, and an
// insertion into a full table drops one from its shard. Their counters are
// kept for the metrics.
type Keyed struct {
	perKey   Config
	maxKeys  int64
	seed     uint64
	hashSeed maphash.Seed
	keys     atomic.Int64
	overflow *Limiter
	shards   [keyedShards]keyedShard
}

type keyedShard struct {
	mu      sync.RWMutex
	m       map[string]*Limiter
	retired Stats // counters of dropped limiters; guarded by mu
	_       [64]byte
}

// NewKeyed validates cfg and returns a Keyed limiter.
func NewKeyed(cfg KeyedConfig) (*Keyed, error) {
	if cfg.PerKey.Adaptive != nil {
		return nil, errors.New("shed: keyed limiter: adaptive limits are per route; give keys a static MaxInFlight")
	}
	if cfg.PerKey.Rand != nil {
		return nil, errors.New("shed: keyed limiter: set KeyedConfig.Seed instead of PerKey.Rand")
	}
	if cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("shed: keyed limiter: max keys %d is negative", cfg.MaxKeys)
	}
	k := &Keyed{perKey: cfg.PerKey, maxKeys: int64(cfg.MaxKeys), seed: cfg.Seed, hashSeed: maphash.MakeSeed()}
	if k.maxKeys == 0 {
		k.maxKeys = DefaultMaxKeys
	}
	if k.seed == 0 {
		k.seed = rand.Uint64()
	}
	// Validate once, and share one clock, timer source and logger rather
	// than one per key.
	probe, err := New(k.perKey)
	if err != nil {
		return nil, fmt.Errorf("shed: keyed limiter: %w", err)
	}
	k.perKey.Clock, k.perKey.AfterFunc, k.perKey.Logger = probe.clock, probe.afterFunc, probe.log
	overflow, err := k.newLimiter("\x00overflow")
	if err != nil {
		return nil, fmt.Errorf("shed: keyed limiter: %w", err)
	}
	k.overflow = overflow
	for i := range k.shards {
		k.shards[i].m = make(map[string]*Limiter)
	}
	return k, nil
}

func (k *Keyed) newLimiter(key string) (*Limiter, error) {
	cfg := k.perKey
	// FNV-1a rather than the shard hash: its seed is random per process,
	// and a fixed Seed must give the same lottery draws run after run.
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 1099511628211
	}
	cfg.Rand = rand.NewPCG(k.seed, h)
	return New(cfg)
}

// Acquire admits a request for key with priority p, or sheds it; see
// Limiter.Acquire.
func (k *Keyed) Acquire(ctx context.Context, key string, p Priority) (Permit, error) {
	for {
		l := k.limiterFor(key)
		pm, err := l.Acquire(ctx, p)
		if err != errLimiterClosed {
			return pm, err
		}
		// Dropped between lookup and Acquire: look the key up again.
	}
}

func (k *Keyed) limiterFor(key string) *Limiter {
	s := &k.shards[maphash.String(k.hashSeed, key)%keyedShards]
	s.mu.RLock()
	l := s.m[key]
	s.mu.RUnlock()
	if l != nil {
		return l
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l = s.m[key]; l != nil {
		return l
	}
	if k.keys.Load() >= k.maxKeys && s.dropIdleLocked(k, 1, evictScan) == 0 {
		return k.overflow
	}
	l, err := k.newLimiter(key)
	if err != nil {
		// The settings were validated by NewKeyed; this cannot happen.
		panic(fmt.Sprintf("shed: keyed limiter: %v", err))
	}
	s.m[key] = l
	k.keys.Add(1)
	return l
}

// dropIdleLocked drops up to want idle limiters from the shard, looking at
// no more than scan entries, and returns how many it dropped.
func (s *keyedShard) dropIdleLocked(k *Keyed, want, scan int) int {
	dropped, scanned := 0, 0
	for key, l := range s.m {
		if dropped == want || scanned == scan {
			break
		}
		scanned++
		if !l.close() {
			continue
		}
		l.addCounters(&s.retired)
		delete(s.m, key)
		k.keys.Add(-1)
		dropped++
	}
	return dropped
}

// Sweep drops every idle limiter and returns how many it dropped.
func (k *Keyed) Sweep() int {
	total := 0
	for i := range k.shards {
		s := &k.shards[i]
		s.mu.Lock()
		total += s.dropIdleLocked(k, len(s.m), len(s.m))
		s.mu.Unlock()
	}
	return total
}

// Run sweeps idle limiters every interval until ctx ends.
func (k *Keyed) Run(ctx context.Context, interval time.Duration) {
	runEvery(ctx, interval, func() { k.Sweep() })
}

// Keys returns the number of keys holding their own limiter.
func (k *Keyed) Keys() int64 { return k.keys.Load() }

// Stats sums the counters of every key's limiter, dropped ones and the
// overflow limiter included. Limit is the per-key limit.
func (k *Keyed) Stats() Stats {
	s := k.overflow.Stats()
	for i := range k.shards {
		sh := &k.shards[i]
		sh.mu.RLock()
		for _, l := range sh.m {
			s.InFlight += l.InFlight()
			s.QueueDepth += l.QueueDepth()
			l.addCounters(&s)
		}
		s.addCounters(&sh.retired)
		sh.mu.RUnlock()
	}
	return s
}
