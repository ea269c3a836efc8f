package l7

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

func newStore(t *testing.T, alg Algorithm, cfg StoreConfig) *Store {
	t.Helper()
	s, err := NewStore(alg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStoreEvictionNeverResetsLimitedKey fills one 8-way bucket with limited
// keys, then shows a ninth key neither evicts them (fail open, counted) nor,
// once some are idle, evicts anything but the idle ones.
func TestStoreEvictionNeverResetsLimitedKey(t *testing.T) {
	g := mustAlg(NewGCRA(2, time.Second, 0)) // T = 500ms
	s := newStore(t, g, StoreConfig{Capacity: 8, Shards: 1})
	if c := s.Stats().Capacity; c != 8 {
		t.Fatalf("capacity %d, want 8", c)
	}
	// Every key lands in the single bucket.
	for k := uint64(1); k <= 8; k++ {
		s.Take(k, 0, 2) // exhaust: TAT = 1s
	}
	if d := s.Take(99, 0, 1); !d.Allowed {
		t.Fatal("fail-open store rejected a new key")
	}
	st := s.Stats()
	if st.Full != 1 || st.Evictions != 0 || st.Keys != 8 {
		t.Fatalf("stats %+v, want full=1 evictions=0 keys=8", st)
	}
	for k := uint64(1); k <= 8; k++ {
		if d := s.Take(k, 0, 1); d.Allowed {
			t.Fatalf("key %d was reset by a new key", k)
		}
	}
	// Keys 1-4 take more at 600ms (TAT -> 1.6s... rejected: still limited)
	// while at 1s every key is idle; refresh keys 1-4 first.
	for k := uint64(1); k <= 4; k++ {
		if d := s.Take(k, 1000*ms, 2); !d.Allowed {
			t.Fatalf("key %d not admitted after its reset", k)
		}
	}
	// Keys 5-8 are idle at 1s, keys 1-4 limited until 2s.
	for k := uint64(100); k < 104; k++ {
		if d := s.Take(k, 1000*ms, 1); !d.Allowed {
			t.Fatal("new key rejected")
		}
	}
	st = s.Stats()
	if st.Evictions != 4 || st.Full != 1 {
		t.Fatalf("stats %+v, want 4 evictions", st)
	}
	for k := uint64(1); k <= 4; k++ {
		if d := s.Take(k, 1000*ms, 1); d.Allowed {
			t.Fatalf("limited key %d was evicted", k)
		}
	}
	for k := uint64(100); k < 104; k++ {
		if d := s.Take(k, 1000*ms, 2); d.Allowed {
			t.Fatalf("new key %d not tracked", k)
		}
	}
	// Sweep at 5s frees everything.
	if n := s.Sweep(5000 * ms); n != 8 {
		t.Fatalf("sweep freed %d, want 8", n)
	}
	if st := s.Stats(); st.Keys != 0 {
		t.Fatalf("keys %d after sweep", st.Keys)
	}
}

func TestStoreFailClosed(t *testing.T) {
	g := mustAlg(NewGCRA(1, time.Second, 0))
	s := newStore(t, g, StoreConfig{Capacity: 8, Shards: 1, FailClosed: true})
	for k := uint64(1); k <= 8; k++ {
		s.Take(k, 0, 1)
	}
	if d := s.Take(9, 0, 1); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("fail-closed store: %+v", d)
	}
}

// TestStoreConcurrentNoLostUpdates races goroutines on shared keys: exactly
// the quota passes, whatever the interleaving.
func TestStoreConcurrentNoLostUpdates(t *testing.T) {
	w := mustAlg(NewSlidingWindow(1000, time.Hour))
	s := newStore(t, w, StoreConfig{Capacity: 1 << 12})
	var allowed [4]atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := uint64(i%4) + 1
				if s.Take(k, int64(g), 1).Allowed {
					allowed[k-1].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for k := range allowed {
		if got := allowed[k].Load(); got != 1000 {
			t.Errorf("key %d: %d allowed, want exactly 1000", k+1, got)
		}
	}
}

// TestTakeAllAllOrNothing: per-IP 100, per-tenant 50: exactly 50 pass, and
// the per-IP limit is charged only for those 50.
func TestTakeAllAllOrNothing(t *testing.T) {
	perIP := newStore(t, mustAlg(NewGCRA(100, time.Hour, 0)), StoreConfig{Capacity: 64})
	perTenant := newStore(t, mustAlg(NewFixedWindow(50, time.Hour)), StoreConfig{Capacity: 64})
	var passed atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out [2]Decision
			for range 100 {
				checks := []Check{{Store: perIP, Key: 7, N: 1}, {Store: perTenant, Key: 9, N: 1}}
				if takeAllTest(0, checks, out[:]) {
					passed.Add(1)
				} else if out[1].Allowed || !out[0].Allowed {
					t.Error("rejection blamed on the wrong limit")
					return
				}
			}
		}()
	}
	// A second group takes the locks in the other order: no deadlock.
	wg.Add(1)
	go func() {
		defer wg.Done()
		var out [2]Decision
		for range 100 {
			checks := []Check{{Store: perTenant, Key: 1, N: 1}, {Store: perIP, Key: 1, N: 1}}
			takeAllTest(0, checks, out[:])
		}
	}()
	wg.Wait()
	if got := passed.Load(); got != 50 {
		t.Fatalf("%d passed, want exactly the tenant quota 50", got)
	}
	if d := perIP.Peek(7, 0); d.Remaining != 50 {
		t.Fatalf("per-IP remaining %d, want 50: rejected requests were charged", d.Remaining)
	}
	// A rejected TakeAll reports the uncharged state of the passing limit.
	var out [2]Decision
	if takeAllTest(0, []Check{{perIP, 7, 1, 0}, {perTenant, 9, 1, 0}}, out[:]) {
		t.Fatal("tenant quota exceeded but passed")
	}
	if out[0].Remaining != 50 || out[1].Allowed {
		t.Fatalf("decisions %+v", out)
	}
}

// TestTakeAllSameKeyTwice: two checks on the same store and key see each
// other's charge and roll back together.
func TestTakeAllSameKeyTwice(t *testing.T) {
	s := newStore(t, mustAlg(NewFixedWindow(3, time.Hour)), StoreConfig{Capacity: 64})
	var out [2]Decision
	if !takeAllTest(0, []Check{{s, 1, 1, 0}, {s, 1, 1, 0}}, out[:]) || out[1].Remaining != 1 {
		t.Fatalf("first: %+v", out)
	}
	if takeAllTest(0, []Check{{s, 1, 1, 0}, {s, 1, 1, 0}}, out[:]) {
		t.Fatal("4 units passed a limit of 3")
	}
	if d := s.Peek(1, 0); d.Remaining != 1 {
		t.Fatalf("remaining %d after rollback, want 1", d.Remaining)
	}
}

func TestStoreTakeDoesNotAllocate(t *testing.T) {
	s := newStore(t, mustAlg(NewGCRA(1000, time.Second, 0)), StoreConfig{Capacity: 1 << 10})
	other := newStore(t, mustAlg(NewSlidingWindow(1000, time.Second)), StoreConfig{Capacity: 1 << 10})
	var out [2]Decision
	checks := []Check{{s, 5, 1, 0}, {other, 6, 1, 0}}
	if a := testing.AllocsPerRun(100, func() {
		s.Take(42, 0, 1)
		takeAllTest(0, checks, out[:])
	}); a != 0 {
		t.Fatalf("%.1f allocs per take", a)
	}
}

// TestLimiterConcurrentExact races the lock-free GCRA path and the mutex
// path: exactly the burst passes at one instant.
func TestLimiterConcurrentExact(t *testing.T) {
	for _, alg := range []Algorithm{mustAlg(NewGCRA(500, time.Hour, 0)), mustAlg(NewTokenBucket(500, time.Hour, 0))} {
		l := NewLimiter(alg, new(l7test.ManualClock))
		var passed atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 {
					if l.Allow().Allowed {
						passed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if got := passed.Load(); got != 500 {
			t.Errorf("%s: %d passed, want exactly 500", alg.Name(), got)
		}
	}
}

// TestStaleNowNeverRollsWindowsBack: a request that read the clock just
// before a concurrent one moved the key into the next window must not reset
// the key's counts.
func TestStaleNowNeverRollsWindowsBack(t *testing.T) {
	for _, alg := range []Algorithm{mustAlg(NewFixedWindow(2, time.Second)), mustAlg(NewSlidingWindow(2, time.Second))} {
		s := newStore(t, alg, StoreConfig{Capacity: 64})
		s.Take(1, 1000*ms, 2) // the new window is full
		if d := s.Take(1, 999*ms, 1); d.Allowed {
			t.Errorf("%s: stale request reset the window", alg.Name())
		}
		if d := s.Take(1, 1000*ms, 1); d.Allowed {
			t.Errorf("%s: window lost its count", alg.Name())
		}
	}
}

// TestTakeAllRollbackRestoresInsertAndEviction: a rejected TakeAll leaves
// no new key behind and undoes an eviction, counters included.
func TestTakeAllRollbackRestoresInsertAndEviction(t *testing.T) {
	g := mustAlg(NewGCRA(1, time.Second, 0))
	a := newStore(t, g, StoreConfig{Capacity: 8, Shards: 1})
	full := newStore(t, mustAlg(NewFixedWindow(1, time.Hour)), StoreConfig{Capacity: 8})
	full.Take(1, 0, 1)
	var out [2]Decision
	if takeAllTest(0, []Check{{a, 100, 1, 0}, {full, 1, 1, 0}}, out[:]) {
		t.Fatal("passed an exhausted limit")
	}
	if st := a.Stats(); st.Keys != 0 {
		t.Fatalf("rolled-back insert left %d keys", st.Keys)
	}
	for k := uint64(1); k <= 8; k++ {
		a.Take(k, 0, 1) // fill the one bucket; idle again at 1s
	}
	if takeAllTest(2000*ms, []Check{{a, 100, 1, 0}, {full, 1, 1, 0}}, out[:]) {
		t.Fatal("passed an exhausted limit")
	}
	if st := a.Stats(); st.Keys != 8 || st.Evictions != 0 {
		t.Fatalf("rolled-back eviction: %+v", st)
	}
	for k := uint64(1); k <= 8; k++ {
		if d := a.Peek(k, 2000*ms); !d.Allowed {
			t.Fatalf("key %d lost", k)
		}
	}
	if d := a.Peek(100, 2000*ms); d.Remaining != 1 {
		t.Fatalf("rolled-back key 100 charged: %+v", d)
	}
}

// takeAllTest is takeAll without the store-full marks and refund records.
func takeAllTest(now int64, checks []Check, out []Decision) bool {
	return takeAll(now, checks, out, nil, nil)
}

// TestStoreShardIsOneCacheLine: a shard that grows past 64 bytes shares
// cache lines with its neighbours (false sharing between the cores' locks:
// the BenchmarkL7Keyed regression of issue 29).
func TestStoreShardIsOneCacheLine(t *testing.T) {
	if n := unsafe.Sizeof(storeShard{}); n != 64 {
		t.Fatalf("storeShard is %d bytes, want 64", n)
	}
}
