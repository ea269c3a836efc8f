package l7

import (
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// decideInPlace is alg.Take writing the decision through d, for the
// algorithms that can (a type switch, not an interface: d must not escape
// to the heap). Returning a State and a 48-byte Decision by value through
// the Algorithm interface costs more than their arithmetic. ok is false
// for the other algorithms.
func decideInPlace(alg Algorithm, s State, now, n int64, d *Decision) (next State, ok bool) {
	switch a := alg.(type) {
	case *GCRA:
		return a.decideInto(s, now, n, d), true
	case *SlidingWindow:
		return a.decideInto(s, now, n, d), true
	case *TokenBucket:
		return a.decideInto(s, now, n, d), true
	}
	return s, false
}

// Limiter applies an Algorithm to one key (one State) behind a mutex; for
// GCRA, whose state is one word, it is lock-free (compare-and-swap on TAT).
type Limiter struct {
	alg   Algorithm
	gcra  *GCRA
	clock Clock

	tat   atomic.Int64 // GCRA only
	mu    sync.Mutex
	state State
}

// NewLimiter returns a single-key limiter.
func NewLimiter(alg Algorithm, clock Clock) *Limiter {
	g, _ := alg.(*GCRA)
	return &Limiter{alg: alg, gcra: g, clock: clock}
}

// Allow takes one unit now.
func (l *Limiter) Allow() Decision { return l.TakeAt(l.clock.Now(), 1) }

// TakeAt takes n units at time now.
func (l *Limiter) TakeAt(now, n int64) (d Decision) {
	if g := l.gcra; g != nil {
		for {
			old := l.tat.Load()
			tat := g.decide(old, now, n, &d)
			if tat == old || l.tat.CompareAndSwap(old, tat) {
				return d
			}
		}
	}
	l.mu.Lock()
	st, ok := decideInPlace(l.alg, l.state, now, n, &d)
	if !ok {
		st, d = l.alg.Take(l.state, now, n)
	}
	if d.Allowed {
		l.state = st
	}
	l.mu.Unlock()
	return d
}

// StoreConfig sizes a Store.
type StoreConfig struct {
	// Capacity is the hard maximum number of keys, fixed at creation: the
	// store allocates 24 bytes per key slot up front and never grows. Size
	// it about 1.25x the expected number of concurrently active keys: each
	// key may live in one of two 8-way buckets, and a key whose two buckets
	// are full of active keys cannot be tracked (see FailClosed).
	Capacity int
	// Shards is the number of independently locked shards, a power of two
	// (0 means 256, fewer for tiny stores).
	Shards int
	// FailClosed rejects a new key that finds both its buckets full of active
	// keys (RetryAfter = Window, not exact). The default admits it without
	// tracking it and counts it in StoreStats.Full: an attacker spraying
	// keys then gets through this rule, never evicts a limited key.
	FailClosed bool
}

// StoreStats are a Store's counters.
type StoreStats struct {
	Keys      int64 // occupied slots (idle keys stay until reused or swept)
	Capacity  int64 // slots allocated
	Evictions int64 // idle keys replaced by new ones or swept
	Full      int64 // new keys that found both buckets full of active keys
}

const bucketWays = 8

// bucket is 8 keys (one cache line) then their 8 states: 192 bytes, 24 per key.
type bucket struct {
	keys   [bucketWays]uint64 // 0 marks an empty slot
	states [bucketWays]State
}

// storeShard is one cache line (64 bytes, TestStoreShardIsOneCacheLine):
// shards side by side must not share a line, or every take on one shard
// invalidates its neighbours' locks on the other cores. (The sliding log's
// rings once sat here as a 24-byte slice header: 88-byte shards straddled
// lines and BenchmarkL7Keyed's GCRA store went from ~0.7x to ~1.05x of
// sethvargo/go-limiter's time.)
type storeShard struct {
	mu      sync.Mutex
	buckets []bucket
	// logs are the sliding log's rings by slot (bucket*8+way), allocated
	// on a slot's first logged units; nil for the other algorithms.
	logs      *[][]int64
	keys      int64
	evictions int64
	full      int64
}

// Store applies one Algorithm to millions of keys in a fixed amount of
// memory: keys are 64-bit hashes (KeyHash), sharded by their top bits, each
// shard an array of 8-way buckets (two candidates per key) behind its own mutex (no global lock).
// Idle keys (Algorithm.Idle: indistinguishable from fresh) are replaced when
// a new key needs their slot, so eviction never resets a limited key.
//
// Two distinct clients whose 64-bit hashes collide share one state; with k
// active keys the chance of any collision is about k^2/2^65 (1e6 keys:
// 3e-8).
type Store struct {
	alg        Algorithm
	log        *SlidingLog // alg, when it keeps a log per key
	id         uint64      // random; orders shard locks across stores in takeAll
	shift      uint
	failClosed bool
	shards     []storeShard
}

// NewStore returns a keyed store for alg.
func NewStore(alg Algorithm, cfg StoreConfig) (*Store, error) {
	if alg == nil {
		return nil, fmt.Errorf("store: nil algorithm: %w", ErrInvalidLimit)
	}
	if cfg.Capacity < 1 {
		return nil, fmt.Errorf("store: capacity %d: must be at least 1: %w", cfg.Capacity, ErrInvalidLimit)
	}
	nbuckets := (cfg.Capacity + bucketWays - 1) / bucketWays
	shards := cfg.Shards
	if shards == 0 {
		shards = 256
		for shards > 1 && shards > nbuckets {
			shards /= 2
		}
	}
	if shards < 1 || shards&(shards-1) != 0 || shards > 1<<16 {
		return nil, fmt.Errorf("store: %d shards: must be a power of two up to 65536: %w", shards, ErrInvalidLimit)
	}
	perShard := (nbuckets + shards - 1) / shards
	bits := uint(0)
	for 1<<bits < shards {
		bits++
	}
	s := &Store{
		alg:        alg,
		id:         maphash.Comparable(maphash.MakeSeed(), 0),
		shift:      64 - bits,
		failClosed: cfg.FailClosed,
		shards:     make([]storeShard, shards),
	}
	if bits == 0 {
		s.shift = 63 // key>>63 is 0 or 1; mask below keeps shard 0
	}
	s.log, _ = alg.(*SlidingLog)
	for i := range s.shards {
		s.shards[i].buckets = make([]bucket, perShard)
		if s.log != nil {
			rings := make([][]int64, perShard*bucketWays)
			s.shards[i].logs = &rings
		}
	}
	return s, nil
}

// Algorithm returns the store's algorithm.
func (s *Store) Algorithm() Algorithm { return s.alg }

func (s *Store) shardIndex(key uint64) int {
	return int(key>>s.shift) & (len(s.shards) - 1)
}

// bucketIndexes returns the key's two candidate buckets (two-choice hashing: a
// new key goes to the emptier one, which keeps overflow negligible up to
// ~90% fill). Lemire's multiply-shift maps 32 hash bits to a bucket index.
func (sh *storeShard) bucketIndexes(key uint64) (int, int) {
	n := uint64(len(sh.buckets))
	k2 := key * 0x9e3779b97f4a7c15
	return int((key & 0xffffffff) * n >> 32), int((k2 >> 32) * n >> 32)
}

// ring is the sliding log of slot (bucket bi, way i), allocated on first
// use.
func (s *Store) ring(sh *storeShard, bi, i int) []int64 {
	r := &(*sh.logs)[bi*bucketWays+i]
	if *r == nil {
		*r = make([]int64, s.log.limit)
	}
	return *r
}

func (b *bucket) find(key uint64) int {
	for i := range b.keys {
		if b.keys[i] == key {
			return i
		}
	}
	return -1
}

func (b *bucket) free() (slot, n int) {
	slot = -1
	for i := range b.keys {
		if b.keys[i] == 0 {
			if slot < 0 {
				slot = i
			}
			n++
		}
	}
	return slot, n
}

func (s *Store) idleSlot(b *bucket, now int64) int {
	for i := range b.keys {
		if s.alg.Idle(b.states[i], now) {
			return i
		}
	}
	return -1
}

func normKey(key uint64) uint64 {
	if key == 0 {
		return 1
	}
	return key
}

// Take takes n units for key at time now.
func (s *Store) Take(key uint64, now, n int64) Decision {
	key = normKey(key)
	sh := &s.shards[s.shardIndex(key)]
	sh.mu.Lock()
	var d Decision
	s.takeLocked(sh, key, now, n, nil, &d)
	sh.mu.Unlock()
	return d
}

// Peek reports key's state at now without taking anything.
func (s *Store) Peek(key uint64, now int64) Decision { return s.Take(key, now, 0) }

// undo records a slot's previous content so takeAll can roll back, and
// what the charge wrote (after) so a later refund can give it back.
type undo struct {
	b     *bucket
	sh    *storeShard
	key   uint64 // the slot's previous key (rollback)
	state State  // the slot's previous state
	after State  // what the charge wrote
	i     int32
	kind  uint8 // undoUpdate, undoInsert or undoEvict
}

const (
	undoUpdate = iota
	undoInsert
	undoEvict
)

// takeLocked decides and, when allowed, writes. If u is not nil the slot's
// previous content is saved in it (u.b == nil when nothing was written).
func (s *Store) takeLocked(sh *storeShard, key uint64, now, n int64, u *undo, d *Decision) bool {
	i1, i2 := sh.bucketIndexes(key)
	b1, b2 := &sh.buckets[i1], &sh.buckets[i2]
	b, bi, i := b1, i1, b1.find(key)
	if i < 0 {
		b, bi, i = b2, i2, b2.find(key)
	}
	if i >= 0 {
		var st State
		if s.log != nil {
			// (A fresh key's take, below, reads no ring: a new key never
			// needs its slot's log until its second take.)
			st = s.log.takeLog(b.states[i], s.ring(sh, bi, i), now, n, d)
		} else {
			st = s.take(b.states[i], now, n, d)
		}
		if d.Allowed && st != b.states[i] {
			if u != nil {
				*u = undo{b: b, sh: sh, key: key, state: b.states[i], after: st, i: int32(i), kind: undoUpdate}
			}
			b.states[i] = st
		}
		return true
	}
	st := s.take(State{}, now, n, d)
	if !d.Allowed || st == (State{}) {
		return true
	}
	f1, n1 := b1.free()
	f2, n2 := b2.free()
	b, free, evict := b1, f1, false
	if n2 > n1 {
		b, free = b2, f2
	}
	if free < 0 {
		if free = s.idleSlot(b1, now); free >= 0 {
			b = b1
		} else if free = s.idleSlot(b2, now); free >= 0 {
			b = b2
		}
		evict = free >= 0
	}
	if free < 0 {
		sh.full++
		if s.failClosed {
			*d = Decision{Limit: d.Limit, Window: d.Window, RetryAfter: d.Window, Reset: d.Window}
			return false
		}
		return true
	}
	if u != nil {
		kind := uint8(undoInsert)
		if evict {
			kind = undoEvict
		}
		*u = undo{b: b, sh: sh, key: b.keys[free], state: b.states[free], after: st, i: int32(free), kind: kind}
	}
	if evict {
		sh.evictions++
	} else {
		sh.keys++
	}
	b.keys[free] = key
	b.states[free] = st
	return true
}

// take is s.alg.Take writing the decision through d.
func (s *Store) take(st State, now, n int64, d *Decision) State {
	if next, ok := decideInPlace(s.alg, st, now, n, d); ok {
		return next
	}
	var next State
	next, *d = s.alg.Take(st, now, n)
	return next
}

// before is the key's state before the charge: the slot's previous state
// for an update, a fresh state for a key the charge inserted.
func (u *undo) before() State {
	if u.kind == undoUpdate {
		return u.state
	}
	return State{}
}

// refundLocked gives back a charge recorded in u (for key) at now; the
// caller holds the key's shard lock. The key may have moved to another
// slot (evicted when idle, then inserted again) or be gone: then its
// charge has drained and the refund finds nothing or gives back nothing.
func (s *Store) refundLocked(sh *storeShard, key uint64, u *undo, now int64) {
	if u.b == nil {
		return
	}
	b, i := u.b, int(u.i)
	bi := -1
	if b.keys[i] != key {
		i1, i2 := sh.bucketIndexes(key)
		if b, bi, i = &sh.buckets[i1], i1, sh.buckets[i1].find(key); i < 0 {
			if b, bi, i = &sh.buckets[i2], i2, sh.buckets[i2].find(key); i < 0 {
				return
			}
		}
	}
	if s.log != nil {
		if bi < 0 {
			// The slot the charge wrote: one of the key's two buckets.
			i1, _ := sh.bucketIndexes(key)
			if bi = i1; &sh.buckets[i1] != b {
				_, bi = sh.bucketIndexes(key)
			}
		}
		var ring []int64
		if (*sh.logs)[bi*bucketWays+i] != nil {
			ring = s.ring(sh, bi, i)
		}
		b.states[i] = s.log.refundLog(b.states[i], u.before(), u.after, ring, now)
		return
	}
	b.states[i] = s.alg.Refund(b.states[i], u.before(), u.after, now)
}

func (u *undo) rollback() {
	if u.b == nil {
		return
	}
	u.b.keys[u.i] = u.key
	u.b.states[u.i] = u.state
	switch u.kind {
	case undoInsert:
		u.sh.keys--
	case undoEvict:
		u.sh.evictions--
	}
}

// Sweep empties the slots of idle keys and returns how many it freed. The
// store works without it; call it to make StoreStats.Keys count only
// non-idle keys. It locks one shard at a time.
func (s *Store) Sweep(now int64) int {
	freed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for j := range sh.buckets {
			b := &sh.buckets[j]
			for k := range b.keys {
				if b.keys[k] != 0 && s.alg.Idle(b.states[k], now) {
					b.keys[k], b.states[k] = 0, State{}
					sh.keys--
					sh.evictions++
					freed++
				}
			}
		}
		sh.mu.Unlock()
	}
	return freed
}

// Stats returns the store's counters, locking one shard at a time.
func (s *Store) Stats() StoreStats {
	var st StoreStats
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.Keys += sh.keys
		st.Capacity += int64(len(sh.buckets) * bucketWays)
		st.Evictions += sh.evictions
		st.Full += sh.full
		sh.mu.Unlock()
	}
	return st
}

// Window returns the store algorithm's window (for callers building
// headers).
func (s *Store) Window() time.Duration { return s.alg.Window() }
