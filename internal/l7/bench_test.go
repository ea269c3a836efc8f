package l7

import (
	"context"
	"hash/maphash"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-chi/httprate"
	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"
)

// The limits below are high so the benchmarks measure the admitting path,
// which reads and writes the state (a rejection only reads it).

// cpuPerOp reports process CPU time (user+system, all threads, GC
// included) per operation as "cpu-ns/op": on a shared machine it is far
// steadier than wall time, which counts the time other jobs held the CPU.
// Call it right before the timed loop and run the returned func after it.
func cpuPerOp(b *testing.B) func() {
	start := processCPU()
	return func() { b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op") }
}

func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkL7Allow: one key, serial and parallel, beside x/time/rate.
func BenchmarkL7Allow(b *testing.B) {
	algs := map[string]Algorithm{
		"gcra":           mustAlg(NewGCRA(1_000_000_000, time.Second, 1_000_000)),
		"sliding_window": mustAlg(NewSlidingWindow(1<<31, time.Second)),
		"token_bucket":   mustAlg(NewTokenBucket(1_000_000_000, time.Second, 1_000_000)),
	}
	for _, name := range []string{"gcra", "sliding_window", "token_bucket"} {
		l := NewLimiter(algs[name], NewSystemClock())
		b.Run("edgeguard_"+name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			defer cpuPerOp(b)()
			for b.Loop() {
				l.Allow()
			}
		})
		b.Run("edgeguard_"+name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			defer cpuPerOp(b)()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					l.Allow()
				}
			})
		})
	}
	// The same GCRA without reading a clock: the cost of the algorithm and
	// its lock alone (time.Now is most of the above on a VM's kvm-clock).
	nl := NewLimiter(algs["gcra"], NewSystemClock())
	b.Run("edgeguard_gcra_no_clock/serial", func(b *testing.B) {
		b.ReportAllocs()
		now := int64(0)
		defer cpuPerOp(b)()
		for b.Loop() {
			now++
			nl.TakeAt(now, 1)
		}
	})
	xl := rate.NewLimiter(rate.Limit(1e9), 1_000_000)
	b.Run("x_time_rate/serial", func(b *testing.B) {
		b.ReportAllocs()
		defer cpuPerOp(b)()
		for b.Loop() {
			xl.Allow()
		}
	})
	b.Run("x_time_rate/parallel", func(b *testing.B) {
		b.ReportAllocs()
		defer cpuPerOp(b)()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				xl.Allow()
			}
		})
	})
}

const benchKeys = 1 << 20 // 1,048,576 distinct keys

func benchKeyStrings() []string {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	return keys
}

// heapInUse returns live heap bytes after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// keyedParallel runs take over all keys from every goroutine, each starting
// at its own offset, and reports bytes per key measured after warming every
// key once (heap growth from before the store was made).
func keyedParallel(b *testing.B, keys []string, before uint64, take func(i int)) {
	for i := range keys {
		take(i)
	}
	perKey := float64(heapInUse()-before) / float64(len(keys))
	var seq atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	report := cpuPerOp(b)
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(1) * 7919)
		for pb.Next() {
			i++
			if i >= len(keys) {
				i = 0
			}
			take(i)
		}
	})
	// After the timed loop: ResetTimer drops metrics reported before it.
	report()
	b.ReportMetric(perKey, "bytes/key")
}

// BenchmarkL7Keyed: 1M distinct string keys, parallel, beside
// sethvargo/go-limiter (memorystore) and go-chi/httprate (its local
// LimitCounter, used as httprate's handler does). The edgeguard runs include
// hashing each string key with maphash.
func BenchmarkL7Keyed(b *testing.B) {
	keys := benchKeyStrings()
	seed := maphash.MakeSeed()
	for _, name := range []string{"gcra", "sliding_window"} {
		b.Run("edgeguard_"+name, func(b *testing.B) {
			var alg Algorithm = mustAlg(NewGCRA(1_000_000_000, time.Second, 1_000_000))
			if name == "sliding_window" {
				alg = mustAlg(NewSlidingWindow(1<<31, time.Second))
			}
			before := heapInUse()
			// 1.25x the keys, the sizing the docs recommend.
			s, err := NewStore(alg, StoreConfig{Capacity: benchKeys * 5 / 4})
			if err != nil {
				b.Fatal(err)
			}
			clock := NewSystemClock()
			keyedParallel(b, keys, before, func(i int) {
				s.Take(maphash.String(seed, keys[i]), clock.Now(), 1)
			})
			if st := s.Stats(); st.Full > 0 {
				b.Logf("%d keys found both their buckets full", st.Full)
			}
		})
	}
	b.Run("sethvargo_go_limiter", func(b *testing.B) {
		before := heapInUse()
		store, err := memorystore.New(&memorystore.Config{Tokens: 1_000_000, Interval: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close(context.Background())
		ctx := context.Background()
		keyedParallel(b, keys, before, func(i int) {
			_, _, _, _, _ = store.Take(ctx, keys[i])
		})
	})
	b.Run("go_chi_httprate", func(b *testing.B) {
		before := heapInUse()
		const window = time.Second
		rl := httprate.NewRateLimiter(1_000_000_000, window)
		counter := rl.Counter()
		keyedParallel(b, keys, before, func(i int) {
			if ok, _, _ := rl.Status(keys[i]); ok {
				_ = counter.IncrementBy(keys[i], time.Now().UTC().Truncate(window), 1)
			}
		})
	})
	runtime.KeepAlive(keys)
}

// BenchmarkL7Middleware: the full middleware (per-IP GCRA, draft-10
// RateLimit-Policy and RateLimit headers) around an empty handler.
// serveSerial serves one client's GET through h, b.N times.
func serveSerial(b *testing.B, h http.Handler) {
	r := httptest.NewRequest(http.MethodGet, "/v1/items", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		clear(w.h)
		h.ServeHTTP(w, r)
	}
}

func BenchmarkL7Middleware(b *testing.B) {
	k, err := NewKeys(KeyConfig{})
	if err != nil {
		b.Fatal(err)
	}
	for _, legacy := range []bool{false, true} {
		name := "draft10"
		if legacy {
			name = "draft10+legacy"
		}
		mw, err := NewMiddleware(Config{
			Rules: []Rule{{
				Name: "per-ip", Key: k.IP(),
				Algorithm: mustAlg(NewGCRA(1_000_000_000, time.Second, 1_000_000)),
				Store:     StoreConfig{Capacity: 1 << 16},
			}},
			LegacyHeaders: legacy,
		})
		if err != nil {
			b.Fatal(err)
		}
		h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		if !legacy {
			// The same with a RateLimit value that changes on (almost)
			// every request, so the header value cache misses: T = 100µs
			// is longer than a request takes, and r falls.
			cmw, err := NewMiddleware(Config{Rules: []Rule{{
				Name: "per-ip", Key: k.IP(),
				Algorithm: mustAlg(NewGCRA(10_000, time.Second, 1<<40)),
				Store:     StoreConfig{Capacity: 1 << 16},
			}}})
			if err != nil {
				b.Fatal(err)
			}
			ch := cmw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			b.Run(name+"_changing/serial", func(b *testing.B) { serveSerial(b, ch) })
		}
		b.Run(name+"/serial", func(b *testing.B) { serveSerial(b, h) })
		b.Run(name+"/parallel", func(b *testing.B) {
			var n atomic.Int64
			b.ReportAllocs()
			defer cpuPerOp(b)()
			b.RunParallel(func(pb *testing.PB) {
				r := httptest.NewRequest(http.MethodGet, "/v1/items", nil)
				r.RemoteAddr = "192.0.2." + strconv.Itoa(int(n.Add(1))%250) + ":1234"
				w := &discardWriter{h: http.Header{}}
				for pb.Next() {
					clear(w.h)
					h.ServeHTTP(w, r)
				}
			})
		})
	}
}
