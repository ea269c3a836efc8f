package shed

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// blockingHandler holds every request until released, and reports entries.
type blockingHandler struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

// open lets every held request finish. Tests defer it after srv.Close so a
// failing test does not hang in Close waiting for held handlers.
func (h *blockingHandler) open() { h.once.Do(func() { close(h.release) }) }

func newBlockingHandler() *blockingHandler {
	return &blockingHandler{entered: make(chan struct{}, 100), release: make(chan struct{})}
}

func (h *blockingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.entered <- struct{}{}
	<-h.release
	w.WriteHeader(http.StatusNoContent)
}

// startServer serves a blockingHandler behind mw on loopback until the test
// ends, releasing held requests first so Close does not wait on them.
func startServer(t *testing.T, mw func(http.Handler) http.Handler) (*blockingHandler, *httptest.Server) {
	t.Helper()
	h := newBlockingHandler()
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)
	t.Cleanup(h.open) // cleanups run last-in first-out: before Close
	return h, srv
}

// criticalByHeader classifies "X-Priority: critical" as critical and
// everything else as other.
func criticalByHeader(other Priority) func(*http.Request) Priority {
	return func(r *http.Request) Priority {
		if r.Header.Get("X-Priority") == "critical" {
			return PriorityCritical
		}
		return other
	}
}

// startHeld sends a request that the handler will hold, and waits for it to
// be inside the handler. The returned func waits for its response and
// returns its status.
func startHeld(t *testing.T, c *http.Client, h *blockingHandler, req *http.Request) func() int {
	t.Helper()
	var resp *http.Response
	var err error
	var wg sync.WaitGroup
	wg.Go(func() { resp, err = c.Do(req) })
	select {
	case <-h.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("held request never reached the handler")
	}
	return func() int {
		wg.Wait()
		if err != nil {
			t.Fatalf("held request: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
}

func get(t *testing.T, url string, header ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// checkShed asserts the complete 503 answer.
func checkShed(t *testing.T, resp *http.Response, retryAfter string, reason Reason) {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status = %d, want 503", resp.StatusCode)
	}
	for name, want := range map[string]string{
		"Content-Type":  "application/problem+json",
		"Retry-After":   retryAfter,
		"Cache-Control": "no-store",
	} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var p Problem
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("body %q: %v", raw, err)
	}
	if p.Type != ProblemType || p.Status != 503 || p.Title == "" || p.Reason != reason.String() {
		t.Fatalf("problem = %+v, want type %s, status 503, reason %s", p, ProblemType, reason)
	}
}

func TestMiddlewareAnswers503ProblemOverTheLimit(t *testing.T) {
	for _, tc := range []struct {
		retryAfter time.Duration
		want       string
	}{{0, "1"}, {10 * time.Millisecond, "1"}, {1500 * time.Millisecond, "2"}, {30 * time.Second, "30"}} {
		l, err := New(Config{MaxInFlight: 1})
		if err != nil {
			t.Fatal(err)
		}
		h, srv := startServer(t, Middleware(l, MiddlewareOptions{RetryAfter: tc.retryAfter}))
		c := srv.Client()

		wait := startHeld(t, c, h, get(t, srv.URL))
		resp, err := c.Do(get(t, srv.URL))
		if err != nil {
			t.Fatal(err)
		}
		checkShed(t, resp, tc.want, ReasonAtLimit)

		h.open()
		if code := wait(); code != http.StatusNoContent {
			t.Fatalf("held request status = %d", code)
		}
		if got := l.InFlight(); got != 0 {
			t.Fatalf("in flight after the handler returned = %d, want 0", got)
		}
	}
}

func TestMiddlewarePriorityFromRequest(t *testing.T) {
	// Limit 2 with a 50% reserve: default may hold 1 slot, critical 2.
	l, err := New(Config{MaxInFlight: 2, CriticalReservePercent: 50})
	if err != nil {
		t.Fatal(err)
	}
	h, srv := startServer(t, Middleware(l, MiddlewareOptions{Priority: criticalByHeader(PriorityDefault)}))
	c := srv.Client()

	waitDefault := startHeld(t, c, h, get(t, srv.URL))
	resp, err := c.Do(get(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	checkShed(t, resp, "1", ReasonAtLimit)
	waitCritical := startHeld(t, c, h, get(t, srv.URL, "X-Priority", "critical"))
	h.open()
	waitDefault()
	waitCritical()
	s := l.Stats()
	if s.Admitted[PriorityCritical] != 1 || s.Admitted[PriorityDefault] != 1 || s.Shed[ReasonAtLimit][PriorityDefault] != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A request that waits in the queue past QueueTimeout gets the 503 too. The
// timeout runs on real timers here; nothing is asserted about how long it
// took.
func TestMiddlewareQueueTimeoutAnswers503(t *testing.T) {
	l, err := New(Config{MaxInFlight: 1, MaxQueue: 1, QueueTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h, srv := startServer(t, Middleware(l, MiddlewareOptions{}))
	c := srv.Client()
	wait := startHeld(t, c, h, get(t, srv.URL))
	resp, err := c.Do(get(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	checkShed(t, resp, "1", ReasonQueueTimeout)
	h.open()
	wait()
}

// TestMiddlewareCriticalGetsThroughSheddableFlood floods a loopback server
// with sheddable requests that hold their slots, then checks that critical
// requests are still admitted into the reserve while sheddable ones get 503.
func TestMiddlewareCriticalGetsThroughSheddableFlood(t *testing.T) {
	l, err := New(Config{MaxInFlight: 10, CriticalReservePercent: 20, MaxQueue: 4, QueueTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	h, srv := startServer(t, Middleware(l, MiddlewareOptions{Priority: criticalByHeader(PrioritySheddable)}))
	c := srv.Client()

	// 40 sheddable requests at once: 8 run (and hold), up to 16 queue, the
	// rest are shed.
	const flood = 40
	codes := make(chan int, flood)
	var wg sync.WaitGroup
	for range flood {
		wg.Go(func() {
			resp, err := c.Do(get(t, srv.URL))
			if err != nil {
				t.Error(err)
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	// Wait until every flood request is running, queued or answered.
	testenv.WaitFor(t, "every request of the flood admitted, queued or answered", func() bool { return int(l.InFlight()+l.QueueDepth())+len(codes) == flood })
	if got := l.InFlight(); got != 8 {
		t.Fatalf("sheddable in flight = %d, want 8 (2 of 10 reserved)", got)
	}
	for range 8 {
		<-h.entered // the running sheddable requests' entries
	}
	waitCrit1 := startHeld(t, c, h, get(t, srv.URL, "X-Priority", "critical"))
	waitCrit2 := startHeld(t, c, h, get(t, srv.URL, "X-Priority", "critical"))
	if got := l.InFlight(); got != 10 {
		t.Fatalf("in flight with two critical = %d, want 10", got)
	}
	h.open()
	if waitCrit1() != http.StatusNoContent || waitCrit2() != http.StatusNoContent {
		t.Fatal("critical request failed")
	}
	wg.Wait()
	close(codes)
	served, shed := 0, 0
	for code := range codes {
		switch code {
		case http.StatusNoContent:
			served++
		case http.StatusServiceUnavailable:
			shed++
		default:
			t.Errorf("flood request status %d", code)
		}
	}
	t.Logf("flood: %d served, %d shed", served, shed)
	if served < 8 || shed == 0 {
		t.Fatalf("flood: %d served, %d shed; want at least 8 served and some shed", served, shed)
	}
}
