package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// deafUpstream is an upstream that goes on with a request after the proxy
// closed its connection (it never looks at the request's context), as a
// busy application server does; it counts the requests it works on at
// once.
type deafUpstream struct {
	url           string
	entered       chan string
	release       chan struct{}
	inFlight, max atomic.Int64
}

func startDeafUpstream(t *testing.T) *deafUpstream {
	t.Helper()
	u := &deafUpstream{entered: make(chan string, 16), release: make(chan struct{}, 16)}
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.inFlight.Add(1)
		defer u.inFlight.Add(-1)
		for m := u.max.Load(); n > m && !u.max.CompareAndSwap(m, n); m = u.max.Load() {
		}
		u.entered <- r.URL.Path
		select {
		case <-u.release:
		case <-done:
		}
		_, _ = io.WriteString(w, "done "+r.URL.Path)
	}))
	t.Cleanup(func() { close(done); srv.Close() })
	u.url = srv.URL
	return u
}

func (u *deafUpstream) expect(t *testing.T, path string) {
	t.Helper()
	select {
	case got := <-u.entered:
		if got != path {
			t.Fatalf("the upstream got %s, want %s", got, path)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s never reached the upstream", path)
	}
}

func (u *deafUpstream) expectNothing(t *testing.T, d time.Duration, why string) {
	t.Helper()
	select {
	case got := <-u.entered:
		t.Fatalf("the upstream got %s %s", got, why)
	case <-time.After(d):
	}
}

// sendAndLeave sends a GET for path on a connection of its own and
// returns a func that closes it (the client giving up).
func sendAndLeave(t *testing.T, base, path string) func() {
	t.Helper()
	c, err := net.Dial("tcp", base[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: a\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
	return func() { _ = c.Close() }
}

// TestAbandonedRequestKeepsItsSlot (both engines): a client that leaves
// while the upstream works on its request does not free its concurrency
// slot (global and route) before the upstream has answered, so the next
// request waits in the queue and the upstream never has more than the
// limit at once; the response is read and dropped.
func TestAbandonedRequestKeepsItsSlot(t *testing.T) {
	for _, engine := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(engine), func(t *testing.T) {
			up := startDeafUpstream(t)
			cfg := decodeYAML(t, fmt.Sprintf(`
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  engine: %s
  concurrency: {max_in_flight: 1, queue: 8, queue_timeout: 20s}
  routes:
    - name: r
      match: {path_prefix: /r/}
      concurrency: {max_in_flight: 1, queue: 8, queue_timeout: 20s}
`, engine), up.url)
			_, base := startProxy(t, cfg, Options{})
			for _, path := range []string{"/r/a", "/other"} {
				leave := sendAndLeave(t, base, path)
				up.expect(t, path)
				leave()
				got := make(chan string, 1)
				go func() {
					res, err := http.Get(base + path + "/next")
					if err != nil {
						got <- err.Error()
						return
					}
					b, _ := io.ReadAll(res.Body)
					_ = res.Body.Close()
					got <- fmt.Sprintf("%d %s", res.StatusCode, b)
				}()
				up.expectNothing(t, 500*time.Millisecond, "while the abandoned request still had its slot")
				up.release <- struct{}{} // the abandoned request ends
				up.expect(t, path+"/next")
				up.release <- struct{}{}
				if want := "200 done " + path + "/next"; <-got != want {
					t.Errorf("next request: want %q", want)
				}
			}
			if m := up.max.Load(); m != 1 {
				t.Errorf("the upstream had %d requests at once, want 1", m)
			}
		})
	}
}

// TestAbandonedRequestBound (both engines): an upstream that does not
// answer a request its client left keeps the slot for timeouts.response
// from the client's departure, no less, and then the proxy closes its
// connection and the slot is free.
func TestAbandonedRequestBound(t *testing.T) {
	for _, engine := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(engine), func(t *testing.T) {
			up := startDeafUpstream(t)
			cfg := decodeYAML(t, fmt.Sprintf(`
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  engine: %s
  timeouts: {response: 1s}
  concurrency: {max_in_flight: 1, queue: 8, queue_timeout: 20s}
`, engine), up.url)
			_, base := startProxy(t, cfg, Options{})
			leave := sendAndLeave(t, base, "/stuck")
			up.expect(t, "/stuck")
			leave()
			left := time.Now()
			go func() {
				if res, err := http.Get(base + "/next"); err == nil {
					_ = res.Body.Close()
				}
			}()
			up.expect(t, "/next")
			held := time.Since(left)
			t.Logf("%s: the slot was free %v after the client left (bound 1s)", engine, held.Round(time.Millisecond))
			if held < 900*time.Millisecond || held > 8*time.Second {
				t.Errorf("the slot was free %v after the client left, want the 1s bound (at most a sweep later)", held)
			}
			up.release <- struct{}{} // /stuck and /next
			up.release <- struct{}{}
		})
	}
}
