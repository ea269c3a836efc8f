package l7

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type testServer struct {
	t     *testing.T
	clock *l7test.ManualClock
	mw    *Middleware
	srv   *httptest.Server
}

func newTestServer(t *testing.T, cfg Config) *testServer {
	t.Helper()
	clock := new(l7test.ManualClock)
	clock.Set(int64(1000 * time.Second))
	cfg.Clock = clock
	mw, err := NewMiddleware(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	srv := httptest.NewServer(mw.Wrap(mux))
	t.Cleanup(srv.Close)
	return &testServer{t: t, clock: clock, mw: mw, srv: srv}
}

func (s *testServer) get(path string, hdr ...string) *http.Response {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.srv.URL+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(body)))
	return resp
}

func wantHeader(t *testing.T, resp *http.Response, name, want string) {
	t.Helper()
	if got := resp.Header.Get(name); got != want {
		t.Errorf("%s: got %q, want %q", name, got, want)
	}
}

func perIPRule(t *testing.T, k *Keys, name string, alg Algorithm) Rule {
	t.Helper()
	return Rule{Name: name, Key: k.IP(), Algorithm: alg, Store: StoreConfig{Capacity: 1024}}
}

func TestMiddlewareHeadersAnd429(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	s := newTestServer(t, Config{
		Rules:         []Rule{perIPRule(t, k, "per-ip", mustAlg(NewGCRA(2, 10*time.Second, 0)))}, // T = 5s
		SkipPaths:     []string{"/healthz"},
		LegacyHeaders: true,
	})
	resp := s.get("/a")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	wantHeader(t, resp, "RateLimit-Policy", `"per-ip";q=2;w=10`)
	wantHeader(t, resp, "RateLimit", `"per-ip";r=1;t=5`)
	wantHeader(t, resp, "X-RateLimit-Limit", "2")
	wantHeader(t, resp, "X-RateLimit-Remaining", "1")
	wantHeader(t, resp, "X-RateLimit-Reset", "5")
	s.clock.Advance(2 * time.Second)
	resp = s.get("/a")
	wantHeader(t, resp, "RateLimit", `"per-ip";r=0;t=8`)

	resp = s.get("/a")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	// TAT = 1010s, now 1002s: admitted at 1005s, in exactly 3s.
	wantHeader(t, resp, "Retry-After", "3")
	wantHeader(t, resp, "RateLimit", `"per-ip";r=0;t=3`)
	wantHeader(t, resp, "Cache-Control", "no-store")
	wantHeader(t, resp, "Content-Type", "application/problem+json")
	var p map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	if p["type"] != ProblemTypeQuotaExceeded || p["status"] != float64(429) {
		t.Errorf("problem %v", p)
	}
	if v, ok := p["violated-policies"].([]any); !ok || len(v) != 1 || v[0] != "per-ip" {
		t.Errorf("violated-policies %v", p["violated-policies"])
	}
	// One nanosecond early: still rejected, Retry-After rounds up to 1.
	s.clock.Advance(3*time.Second - 1)
	resp = s.get("/a")
	if resp.StatusCode != 429 {
		t.Fatalf("admitted 1ns before Retry-After")
	}
	wantHeader(t, resp, "Retry-After", "1")
	s.clock.Advance(1)
	if resp = s.get("/a"); resp.StatusCode != 200 {
		t.Fatalf("not admitted at Retry-After: %d", resp.StatusCode)
	}
	// Health checks are never limited and carry no headers.
	for range 5 {
		resp = s.get("/healthz")
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
			t.Fatalf("health check limited: %d %v", resp.StatusCode, resp.Header)
		}
	}
	st := s.mw.Stats()[0]
	if st.Allowed != 3 || st.Rejected != 2 || st.Store.Keys != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMiddlewareRetryJitter(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	s := newTestServer(t, Config{
		Rules:       []Rule{perIPRule(t, k, "per-ip", mustAlg(NewFixedWindow(1, 10*time.Second)))},
		RetryJitter: 3 * time.Second,
	})
	s.get("/") // at 1000s: window [1000s, 1010s)
	seen := map[int]bool{}
	for range 40 {
		resp := s.get("/")
		ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if err != nil || ra < 10 || ra > 13 {
			t.Fatalf("Retry-After %q, want 10..13", resp.Header.Get("Retry-After"))
		}
		// t is the exact wait, never after Retry-After.
		wantHeader(t, resp, "RateLimit", `"per-ip";r=0;t=10`)
		seen[ra] = true
	}
	if len(seen) < 2 {
		t.Fatalf("no jitter in 40 rejections: %v", seen)
	}
}

func TestMiddlewareMultiLimitAllOrNothing(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	s := newTestServer(t, Config{Rules: []Rule{
		perIPRule(t, k, "per-ip", mustAlg(NewSlidingWindow(5, time.Minute))),
		{Name: "per-user", Key: k.User(), Algorithm: mustAlg(NewSlidingWindow(2, time.Minute)), Store: StoreConfig{Capacity: 64}},
	}})
	for i := range 2 {
		resp := s.get("/", "X-User-Id", "alice")
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	resp := s.get("/", "X-User-Id", "alice")
	if resp.StatusCode != 429 {
		t.Fatalf("alice's third request: %d", resp.StatusCode)
	}
	// per-ip was not charged for the rejected request: 5-2 = 3 left. The
	// clock is 40s into a minute window: per-ip restores fully at the end of
	// the next window (80s); alice's requests weigh 2*(1-e/60) next window,
	// so one more fits 30s into it (50s).
	wantHeader(t, resp, "RateLimit", `"per-ip";r=3;t=80, "per-user";r=0;t=50`)
	wantHeader(t, resp, "RateLimit-Policy", `"per-ip";q=5;w=60, "per-user";q=2;w=60`)
	// Without a user the per-user rule does not apply.
	resp = s.get("/")
	if resp.StatusCode != 200 {
		t.Fatalf("anonymous: %d", resp.StatusCode)
	}
	wantHeader(t, resp, "RateLimit-Policy", `"per-ip";q=5;w=60`)
	wantHeader(t, resp, "RateLimit", `"per-ip";r=2;t=80`)
}

func TestMiddlewareShadowRule(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	shadow := perIPRule(t, k, "strict", mustAlg(NewGCRA(1, time.Minute, 0)))
	shadow.Shadow = true
	s := newTestServer(t, Config{Rules: []Rule{shadow}})
	for range 3 {
		resp := s.get("/")
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
			t.Fatalf("shadow rule acted: %d %v", resp.StatusCode, resp.Header)
		}
	}
	if st := s.mw.Stats()[0]; st.ShadowRejected != 2 || st.Rejected != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMiddlewareTiers(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	apiKey := k.Header("X-Api-Key")
	s := newTestServer(t, Config{
		Tiers: []Tier{
			{Name: "free", Rules: []Rule{{Name: "free-key", Key: apiKey, Algorithm: mustAlg(NewGCRA(1, time.Minute, 0)), Store: StoreConfig{Capacity: 64}}}},
			{Name: "pro", Rules: []Rule{{Name: "pro-key", Key: apiKey, Algorithm: mustAlg(NewGCRA(3, time.Minute, 0)), Store: StoreConfig{Capacity: 64}}}},
		},
		SelectTier: func(r *http.Request) string { // an API-key lookup, as an auth layer would do
			return map[string]string{"k-pro": "pro", "k-free": "free"}[r.Header.Get("X-Api-Key")]
		},
		DefaultTier: "free",
	})
	count := func(key string) int {
		n := 0
		for range 5 {
			if s.get("/", "X-Api-Key", key).StatusCode == 200 {
				n++
			}
		}
		return n
	}
	if n := count("k-pro"); n != 3 {
		t.Errorf("pro admitted %d of 5, want 3", n)
	}
	if n := count("k-free"); n != 1 {
		t.Errorf("free admitted %d of 5, want 1", n)
	}
	if n := count("unknown"); n != 1 {
		t.Errorf("unknown key (default tier free) admitted %d of 5, want 1", n)
	}
	resp := s.get("/", "X-Api-Key", "k-pro")
	wantHeader(t, resp, "RateLimit-Policy", `"pro-key";q=3;w=60`)
}

func TestMiddlewareMetricsExposition(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	shadow := Rule{Name: "shadow-ip", Key: k.IP(), Algorithm: mustAlg(NewGCRA(1, time.Minute, 0)), Shadow: true, Store: StoreConfig{Capacity: 64}}
	s := newTestServer(t, Config{Rules: []Rule{perIPRule(t, k, "per-ip", mustAlg(NewGCRA(2, time.Minute, 0))), shadow}})
	for range 5 {
		s.get("/")
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(s.mw); err != nil {
		t.Fatal(err)
	}
	msrv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer msrv.Close()
	resp, err := msrv.Client().Get(msrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`rate_limit_allowed_total{layer="l7",rule="per-ip"} 2`,
		`rate_limit_rejected_total{layer="l7",reason="quota_exceeded",rule="per-ip"} 3`,
		`rate_limit_rejected_total{layer="l7",reason="store_full",rule="per-ip"} 0`,
		`rate_limit_shadow_would_reject_total{layer="l7",rule="shadow-ip"} 4`,
		`rate_limit_store_keys{layer="l7",rule="per-ip"} 1`,
		`rate_limit_store_capacity_keys{layer="l7",rule="per-ip"} 1024`,
		`rate_limit_store_evictions_total{layer="l7",rule="per-ip"} 0`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("exposition lacks %s", want)
		}
	}
	if strings.Contains(text, "127.0.0.1") {
		t.Error("a client address leaked into a label")
	}
}

func TestMiddlewareConfigErrors(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	g := mustAlg(NewGCRA(2, time.Minute, 0))
	bad := []Config{
		{Rules: []Rule{{Name: "bad name", Key: k.IP(), Algorithm: g}}},
		{Rules: []Rule{{Name: "a", Key: k.IP(), Algorithm: g}, {Name: "a", Key: k.IP(), Algorithm: g}}},
		{Rules: []Rule{{Name: "a", Key: k.IP(), Algorithm: g, Cost: 3}}},
		{Rules: []Rule{{Name: "a", Algorithm: g}}},
		{DefaultTier: "missing"},
	}
	for i, c := range bad {
		if _, err := NewMiddleware(c); err == nil {
			t.Errorf("config %d accepted", i)
		}
	}
}

// discardWriter is a ResponseWriter reused across requests, so allocation
// counts are the middleware's own.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(s int)           { w.status = s }

func TestMiddlewareAllocations(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	clock := new(l7test.ManualClock)
	mw, err := NewMiddleware(Config{
		Rules: []Rule{
			perIPRule(t, k, "per-ip", mustAlg(NewGCRA(1<<20, time.Second, 0))),
			{Name: "per-user", Key: Compose(k.Endpoint(), k.User()), Algorithm: mustAlg(NewSlidingWindow(1<<20, time.Second)), Store: StoreConfig{Capacity: 64}},
		},
		LegacyHeaders: true,
		Clock:         clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest(http.MethodGet, "/v1/x", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	r.Header.Set("X-User-Id", "alice")
	w := &discardWriter{h: http.Header{}}
	allocs := testing.AllocsPerRun(200, func() {
		clear(w.h)
		h.ServeHTTP(w, r)
	})
	if allocs > 1 {
		t.Fatalf("%.1f allocs per request, want at most 1", allocs)
	}
	if w.h.Get("RateLimit") == "" || w.h.Get("X-RateLimit-Remaining") == "" {
		t.Fatalf("headers missing: %v", w.h)
	}
}

func TestMiddlewareTierByHeaderAndNoHeaders(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	s := newTestServer(t, Config{
		Rules: []Rule{perIPRule(t, k, "per-ip", mustAlg(NewSlidingWindow(100, time.Minute)))},
		Tiers: []Tier{{Name: "free", Rules: []Rule{{Name: "free-user", Key: k.User(),
			Algorithm: mustAlg(NewFixedWindow(1, time.Minute)), Store: StoreConfig{Capacity: 64}}}}},
		SelectTier: TierByHeader("X-Tier"),
		Headers:    HeadersNone,
	})
	for i := range 3 {
		resp := s.get("/", "X-Tier", "free", "X-User-Id", "u1")
		if want := map[bool]int{true: 200, false: 429}[i == 0]; resp.StatusCode != want {
			t.Fatalf("free request %d: %d, want %d", i, resp.StatusCode, want)
		}
		if resp.Header.Get("RateLimit") != "" || resp.Header.Get("RateLimit-Policy") != "" {
			t.Fatalf("HeadersNone wrote RateLimit fields: %v", resp.Header)
		}
		if i > 0 && resp.Header.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
	}
	// No tier header: only the base rule applies.
	if resp := s.get("/", "X-User-Id", "u1"); resp.StatusCode != 200 {
		t.Fatalf("untiered request: %d", resp.StatusCode)
	}
}

// TestMiddlewareExactUnderConcurrency: concurrent clients over real
// loopback connections; exactly the quota passes.
func TestMiddlewareExactUnderConcurrency(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	s := newTestServer(t, Config{Rules: []Rule{
		perIPRule(t, k, "per-ip", mustAlg(NewSlidingWindow(50, time.Hour))),
		{Name: "per-user", Key: k.User(), Algorithm: mustAlg(NewGCRA(1000, time.Hour, 0)), Store: StoreConfig{Capacity: 64}},
	}})
	codes := make(chan int, 160)
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 20 {
				req, _ := http.NewRequest(http.MethodGet, s.srv.URL+"/", nil)
				req.Header.Set("X-User-Id", "u"+strconv.Itoa(g))
				resp, err := s.srv.Client().Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes <- resp.StatusCode
			}
		}()
	}
	for range 8 {
		<-done
	}
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	if count[200] != 50 || count[429] != 110 {
		t.Fatalf("status counts %v, want 50 x 200 and 110 x 429", count)
	}
	var users int64
	for _, st := range s.mw.Stats() {
		if st.Rule == "per-user" {
			users = st.Allowed
		}
	}
	if users != 50 {
		t.Fatalf("per-user counted %d allowed, want 50", users)
	}
}

func TestMiddlewareFailClosedStoreFull(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	s := newTestServer(t, Config{Rules: []Rule{{
		Name: "per-user", Key: k.User(), Algorithm: mustAlg(NewGCRA(1, time.Hour, 0)),
		Store: StoreConfig{Capacity: 8, Shards: 1, FailClosed: true},
	}}})
	for u := range 8 {
		if resp := s.get("/", "X-User-Id", "u"+strconv.Itoa(u)); resp.StatusCode != 200 {
			t.Fatalf("user %d: %d", u, resp.StatusCode)
		}
	}
	if resp := s.get("/", "X-User-Id", "u-new"); resp.StatusCode != 429 {
		t.Fatalf("new user in a full fail-closed store: %d", resp.StatusCode)
	}
	if st := s.mw.Stats()[0]; st.RejectedFull != 1 || st.Rejected != 0 || st.Store.Full != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMiddlewareCheckForOtherFrameworks(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	mw, err := NewMiddleware(Config{Rules: []Rule{perIPRule(t, k, "per-ip", mustAlg(NewGCRA(1, time.Hour, 0)))}, Clock: new(l7test.ManualClock)})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	if !mw.Check(w, r) || w.Header().Get("RateLimit") == "" {
		t.Fatalf("first request: %v", w.Header())
	}
	w = httptest.NewRecorder()
	if mw.Check(w, r) || w.Code != http.StatusTooManyRequests {
		t.Fatalf("second request: %d", w.Code)
	}
}

// TestMiddlewareTrustedProxyClients: behind a trusted proxy (the loopback
// test client), X-Forwarded-For clients are limited apart, and IPv6 clients
// in one /64 share a limit.
func TestMiddlewareTrustedProxyClients(t *testing.T) {
	k := newKeys(t, KeyConfig{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}})
	s := newTestServer(t, Config{Rules: []Rule{perIPRule(t, k, "per-ip", mustAlg(NewFixedWindow(1, time.Hour)))}})
	for _, c := range []struct {
		xff  string
		want int
	}{
		{"203.0.113.1", 200},
		{"203.0.113.2", 200},
		{"203.0.113.1", 429},
		{"2001:db8:0:1::1", 200},
		{"2001:db8:0:1::2", 429}, // same /64
		{"2001:db8:0:2::1", 200},
		{"198.51.100.9, 203.0.113.2", 429}, // the rightmost untrusted hop
	} {
		if resp := s.get("/", "X-Forwarded-For", c.xff); resp.StatusCode != c.want {
			t.Errorf("XFF %q: %d, want %d", c.xff, resp.StatusCode, c.want)
		}
	}
}

// TestMiddlewareHeaderValueCache: a response whose header values were
// already made reuses them without allocating, and a value that changes
// is never served stale from the cache.
func TestMiddlewareHeaderValueCache(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	clock := new(l7test.ManualClock)
	mw, err := NewMiddleware(Config{
		Rules:         []Rule{perIPRule(t, k, "per-ip", mustAlg(NewGCRA(10, time.Second, 0)))}, // T = 100ms
		LegacyHeaders: true,
		Clock:         clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	w := &discardWriter{h: http.Header{}}
	// One request per emission interval: the same values every time.
	// (AllocsPerRun rounds down, so count the mallocs of 1000 requests.)
	serve := func() {
		clock.Advance(100 * time.Millisecond)
		clear(w.h)
		h.ServeHTTP(w, r)
	}
	serve()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 1000 {
		serve()
	}
	runtime.ReadMemStats(&after)
	if n := after.Mallocs - before.Mallocs; n > 10 {
		t.Fatalf("%d allocations for 1000 requests with repeating header values, want none", n)
	}
	if got := w.h.Get("RateLimit"); got != `"per-ip";r=9;t=1` {
		t.Fatalf("RateLimit %q", got)
	}
	// Values that change on every request are always the current ones.
	for i := range 9 {
		clear(w.h)
		h.ServeHTTP(w, r)
		want := `"per-ip";r=` + strconv.Itoa(8-i) + `;t=1`
		if got := w.h.Get("RateLimit"); got != want || w.h.Get("X-RateLimit-Remaining") != strconv.Itoa(8-i) {
			t.Fatalf("request %d: RateLimit %q, X-RateLimit-Remaining %q, want %q", i, got, w.h.Get("X-RateLimit-Remaining"), want)
		}
	}
}
