package proxy

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestLeakyBucketPolicing: algorithm: leaky_bucket as a policer admits
// the bucket's size at once, then one request per interval, with the same
// RateLimit fields and 429 as the other algorithms; the alias spelling
// leaky-bucket is the same algorithm. Both engines.
func TestLeakyBucketPolicing(t *testing.T) {
	up := startUpstream(t)
	for _, engine := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(engine), func(t *testing.T) {
			cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  headers: {draft: 10}
  routes:
    - name: api
      limits:
        - {name: lb, key: ip, rate: 10/s, burst: 3, algorithm: leaky-bucket}
`, up.srv.URL)
			if got := cfg.Routes[0].Limits[0].Algorithm; got != AlgLeakyBucket {
				t.Fatalf("alias decoded as %q", got)
			}
			cfg.Engine = engine
			clock := new(l7test.ManualClock)
			clock.Set(1e12)
			_, base := startProxy(t, cfg, Options{Clock: clock})
			for i := range 3 {
				if c := status(t, "GET", base+"/x"); c != 200 {
					t.Fatalf("request %d of the bucket's 3: %d", i+1, c)
				}
			}
			resp := do(t, "GET", base+"/x")
			if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" ||
				resp.Header.Get("RateLimit-Policy") != `"lb";q=10;w=1` {
				t.Fatalf("fourth: %d, Retry-After %q, RateLimit-Policy %q", resp.StatusCode,
					resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit-Policy"))
			}
			if p := problemOf(t, resp); p.Status != 429 {
				t.Fatalf("problem %+v", p)
			}
			clock.Advance(100*time.Millisecond - 1)
			if c := status(t, "GET", base+"/x"); c != 429 {
				t.Fatalf("1ns before the next slot: %d, want 429", c)
			}
			clock.Advance(1)
			if c := status(t, "GET", base+"/x"); c != 200 {
				t.Fatalf("at the next slot: %d, want 200", c)
			}
		})
	}
}

// TestLeakyBucketShaping: with shape: true the admitted requests are
// held until their release slots, so the upstream sees them one interval
// apart (timers never fire early: the spacing is a lower bound, whatever
// the load), and one past the bucket's size is refused. Both engines (under the event loop a shaping route is decided off the loop).
func TestLeakyBucketShaping(t *testing.T) {
	var mu sync.Mutex
	var arrivals []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	for _, engine := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(engine), func(t *testing.T) {
			mu.Lock()
			arrivals = nil
			mu.Unlock()
			cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  routes:
    - name: api
      limits:
        - {name: shaped, key: global, rate: 10/s, burst: 3, algorithm: leaky_bucket, shape: true}
`, srv.URL)
			cfg.Engine = engine
			// Decisions on a manual clock (admission is exact whatever the
			// load); the holds are real timers of the computed waits.
			clock := new(l7test.ManualClock)
			clock.Set(1e12)
			_, base := startProxy(t, cfg, Options{Clock: clock})
			codes := make(chan int, 4)
			start := time.Now() // before every decision
			var wg sync.WaitGroup
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					codes <- status(t, "GET", base+"/x")
				}()
			}
			wg.Wait()
			// The bucket holds 3 (one released at once, two waiting).
			var got []int
			for range 3 {
				got = append(got, <-codes)
			}
			if slices.Max(got) != 200 || slices.Min(got) != 200 {
				t.Fatalf("the bucket's 3 requests: %v, want 200s", got)
			}
			mu.Lock()
			times := slices.Clone(arrivals)
			mu.Unlock()
			slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
			if len(times) != 3 {
				t.Fatalf("upstream saw %d requests, want 3", len(times))
			}
			// Waits of 0, 100 and 200ms from decisions made after start.
			if last := times[2].Sub(start); last < 200*time.Millisecond {
				t.Fatalf("the third shaped request reached the upstream %v after the burst began, want >= 200ms", last)
			} // Four at once from an empty bucket: one is refused.
			clock.Advance(time.Second) // the bucket drains
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					codes <- status(t, "GET", base+"/x")
				}()
			}
			wg.Wait()
			n429 := 0
			for range 4 {
				if <-codes == 429 {
					n429++
				}
			}
			if n429 != 1 {
				t.Fatalf("4 at once into a bucket of 3: %d refused, want 1", n429)
			}

		})
	}
}

// TestLeakyBucketInRedis: a leaky_bucket limit with backend redis is
// decided in Redis (the GCRA script: the same meter) with the bucket's size
// as its burst, its state under the prefix, the same 429.
func TestLeakyBucketInRedis(t *testing.T) {
	srv := testenv.StartRedis(t)
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  redis: {addr: `+srv.Addr()+`, timeout: 200ms, prefix: "eg:lb:"}
  routes:
    - name: api
      limits:
        - {name: r-lb, key: "header:X-API-Key", rate: 2/min, burst: 2, algorithm: leaky_bucket, backend: redis}
`, up.srv.URL)
	_, base := startProxy(t, cfg, Options{})
	key := withHeader("X-API-Key", "k1")
	for i := range 2 {
		if s := status(t, "GET", base+"/x", key); s != 200 {
			t.Fatalf("#%d: %d", i+1, s)
		}
	}
	mustRefuse(t, do(t, "GET", base+"/x", key), "#3", "r-lb")
	keys, err := srv.Client(t).Keys(context.Background(), "eg:lb:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(keys, " "), "r-lb") {
		t.Fatalf("redis keys %v: want r-lb's", keys)
	}
}
