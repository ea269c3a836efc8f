package proxy

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/shed"
)

// policyOf returns the RateLimit-Policy of a response ("" when the request
// was not limited): it names the route's rules, so it says which route
// matched.
func policyOf(resp *http.Response) string { return resp.Header.Get("RateLimit-Policy") }

func TestRouting(t *testing.T) {
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  routes:
    - name: by-host
      match: {host: api.example.com}
      limits: [{name: host-limit, key: global, rate: 1000/min}]
    - name: by-wildcard
      match: {host: "*.example.org"}
      limits: [{name: wild-limit, key: global, rate: 1000/min}]
    - name: by-method
      match: {methods: [POST, PUT], path_prefix: /write/}
      limits: [{name: method-limit, key: global, rate: 1000/min}]
    - name: by-pattern
      match: {path_pattern: '^/users/[0-9]+/orders$'}
      limits: [{name: pattern-limit, key: global, rate: 1000/min}]
    - name: by-header
      match: {header: {X-Env: canary}}
      limits: [{name: header-limit, key: global, rate: 1000/min}]
    - name: by-prefix
      match: {path_prefix: /api/}
      limits: [{name: prefix-limit, key: global, rate: 1000/min}]
`, up.srv.URL)
	_, base := startProxy(t, cfg, Options{Clock: new(l7test.ManualClock)})

	cases := []struct {
		name   string
		method string
		path   string
		opts   []reqOpt
		want   string // rule named in RateLimit-Policy; "" for unmatched
	}{
		{"host", "GET", "/anything", []reqOpt{withHost("API.example.com:8080")}, "host-limit"},
		{"host beats prefix (first match)", "GET", "/api/x", []reqOpt{withHost("api.example.com")}, "host-limit"},
		{"wildcard subdomain", "GET", "/", []reqOpt{withHost("a.b.example.org")}, "wild-limit"},
		{"wildcard excludes bare domain", "GET", "/", []reqOpt{withHost("example.org")}, ""},
		{"method and prefix", "PUT", "/write/1", nil, "method-limit"},
		{"wrong method", "GET", "/write/1", nil, ""},
		{"pattern", "GET", "/users/42/orders", nil, "pattern-limit"},
		{"pattern is anchored", "GET", "/users/42/orders/7", nil, ""},
		{"header", "GET", "/x", []reqOpt{withHeader("X-Env", "canary")}, "header-limit"},
		{"header value differs", "GET", "/x", []reqOpt{withHeader("X-Env", "prod")}, ""},
		{"prefix", "GET", "/api/v1", nil, "prefix-limit"},
		{"unmatched", "GET", "/other", nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := do(t, c.method, base+c.path, c.opts...)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d, want 200", resp.StatusCode)
			}
			if got := resp.Header.Get("X-Seen-Path"); got != c.path {
				t.Fatalf("upstream saw path %q, want %q", got, c.path)
			}
			pol := policyOf(resp)
			if c.want == "" {
				if pol != "" {
					t.Fatalf("unmatched request limited: RateLimit-Policy %q", pol)
				}
				return
			}
			if !strings.HasPrefix(pol, `"`+c.want+`";`) {
				t.Fatalf("RateLimit-Policy %q, want rule %q", pol, c.want)
			}
		})
	}
	// The upstream sees the client's Host (virtual hosting keeps working).
	if h := do(t, "GET", base+"/", withHost("api.example.com")).Header.Get("X-Seen-Host"); h != "api.example.com" {
		t.Fatalf("upstream saw host %q", h)
	}
}

func TestExemptPaths(t *testing.T) {
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  exempt_paths: [/healthz]
  routes:
    - name: all
      exempt_paths: [/ready]
      limits: [{name: tiny, key: global, rate: 1/min}]
`, up.srv.URL)
	_, base := startProxy(t, cfg, Options{Clock: new(l7test.ManualClock)})
	for i := range 5 {
		for _, path := range []string{"/healthz", "/ready"} {
			resp := do(t, "GET", base+path)
			if resp.StatusCode != 200 || policyOf(resp) != "" {
				t.Fatalf("request %d to %s: status %d, policy %q: exempt paths are never limited", i, path, resp.StatusCode, policyOf(resp))
			}
		}
	}
	if s := status(t, "GET", base+"/x"); s != 200 {
		t.Fatalf("first limited request: %d", s)
	}
	if s := status(t, "GET", base+"/x"); s != 429 {
		t.Fatalf("second limited request: %d, want 429", s)
	}
	// Exact path only: /healthz/x is limited.
	if s := status(t, "GET", base+"/healthz/x"); s != 429 {
		t.Fatalf("/healthz/x: %d, want 429", s)
	}
}

func Test429Headers(t *testing.T) {
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  headers: {draft: 10, legacy: true}
  routes:
    - name: api
      limits: [{name: per-ip, key: ip, rate: 2/min, burst: 2, algorithm: gcra}]
`, up.srv.URL)
	clock := new(l7test.ManualClock)
	_, base := startProxy(t, cfg, Options{Clock: clock})

	// GCRA 2/min: T = 30s, burst 2. Two requests at t=0 pass.
	for i, wantR := range []string{`"per-ip";r=1;t=30`, `"per-ip";r=0;t=60`} {
		resp := do(t, "GET", base+"/a")
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if got := resp.Header.Get("RateLimit"); got != wantR {
			t.Fatalf("request %d: RateLimit %q, want %q", i, got, wantR)
		}
		if got := policyOf(resp); got != `"per-ip";q=2;w=60` {
			t.Fatalf("RateLimit-Policy %q", got)
		}
	}
	resp := do(t, "GET", base+"/a")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third request: %d, want 429", resp.StatusCode)
	}
	if got := resp.Header.Get("Retry-After"); got != "30" {
		t.Fatalf("Retry-After %q, want 30", got)
	}
	if got := resp.Header.Get("RateLimit"); got != `"per-ip";r=0;t=30` {
		t.Fatalf("RateLimit %q", got)
	}
	if got := resp.Header.Get("X-RateLimit-Remaining"); got != "0" {
		t.Fatalf("X-RateLimit-Remaining %q", got)
	}
	p := problemOf(t, resp)
	if p.Type != l7.ProblemTypeQuotaExceeded || p.Status != 429 || !slices.Equal(p.ViolatedPolicies, []string{"per-ip"}) {
		t.Fatalf("problem %+v", p)
	}
	if h := up.hits.Load(); h != 2 {
		t.Fatalf("upstream got %d requests, want 2 (the 429 must not reach it)", h)
	}
	clock.Advance(30*time.Second - 1)
	if s := status(t, "GET", base+"/a"); s != 429 {
		t.Fatalf("1ns before Retry-After: %d, want 429", s)
	}
	clock.Advance(1)
	if s := status(t, "GET", base+"/a"); s != 200 {
		t.Fatalf("at Retry-After: %d, want 200", s)
	}
}

func TestAllOrNothing(t *testing.T) {
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  routes:
    - name: api
      limits:
        - {name: per-ip, key: ip, rate: 3/min, algorithm: fixed-window}
        - {name: per-user, key: user, rate: 1/min, algorithm: fixed-window}
`, up.srv.URL)
	_, base := startProxy(t, cfg, Options{Clock: new(l7test.ManualClock)})
	user := func(u string) reqOpt { return withHeader("X-User-Id", u) }
	if s := status(t, "GET", base+"/", user("a")); s != 200 {
		t.Fatalf("a #1: %d", s)
	}
	resp := do(t, "GET", base+"/", user("a"))
	mustRefuse(t, resp, "a #2", "per-user")
	// The rejected request charged nothing: the ip limit (3) still has 2.
	for _, u := range []string{"b", "c"} {
		if s := status(t, "GET", base+"/", user(u)); s != 200 {
			t.Fatalf("%s: %d, want 200 (ip charged by a rejected request?)", u, s)
		}
	}
	resp = do(t, "GET", base+"/", user("d"))
	mustRefuse(t, resp, "d", "per-ip")
	// A request without a user header skips per-user; per-ip still applies.
	if s := status(t, "GET", base+"/"); s != 429 {
		t.Fatalf("no user: %d, want 429 from per-ip", s)
	}
}

func TestTiersAndShadow(t *testing.T) {
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  routes:
    - name: api
      limits:
        - {name: watch, key: ip, rate: 1/min, shadow: true}
      tiers:
        header: X-Plan
        default: free
        levels:
          free: [{name: free-ip, key: ip, rate: 1/min}]
          pro: [{name: pro-ip, key: ip, rate: 3/min}]
`, up.srv.URL)
	reg := prometheus.NewRegistry()
	_, base := startProxy(t, cfg, Options{Clock: new(l7test.ManualClock), Registerer: reg})
	if s := status(t, "GET", base+"/"); s != 200 {
		t.Fatalf("free #1: %d", s)
	}
	resp := do(t, "GET", base+"/", withHeader("X-Plan", "unknown"))
	mustRefuse(t, resp, "unknown plan falls back to free", "free-ip")
	for i := range 3 {
		if s := status(t, "GET", base+"/", withHeader("X-Plan", "pro")); s != 200 {
			t.Fatalf("pro #%d: %d", i, s)
		}
	}
	if s := status(t, "GET", base+"/", withHeader("X-Plan", "pro")); s != 429 {
		t.Fatalf("pro #4: %d, want 429", s)
	}
	// The shadow rule (1/min) would have rejected every request after the
	// first: it never rejected, and the metric says how often it would have.
	want := map[string]float64{
		`rate_limit_shadow_would_reject_total{layer="l7",rule="watch"}`:                5,
		`rate_limit_rejected_total{layer="l7",reason="quota_exceeded",rule="free-ip"}`: 1,
		`rate_limit_rejected_total{layer="l7",reason="quota_exceeded",rule="pro-ip"}`:  1,
		`rate_limit_allowed_total{layer="l7",rule="pro-ip"}`:                           3,
		`edgeguard_l7_proxy_upstream_errors_total`:                                     0,
		`edgeguard_l7_shed_admitted_total{limiter="global",priority="default"}`:        -1, // absent: no global limit
	}
	got := gather(t, reg)
	// The text exposition a Prometheus server scrapes has the same series.
	ms := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer ms.Close()
	text, _ := io.ReadAll(do(t, "GET", ms.URL).Body)
	if line := `rate_limit_shadow_would_reject_total{layer="l7",rule="watch"} 5`; !strings.Contains(string(text), line) {
		t.Errorf("exposition lacks %q:\n%s", line, text)
	}
	for k, v := range want {
		g, ok := got[k]
		if v < 0 {
			if ok {
				t.Errorf("%s present", k)
			}
			continue
		}
		if !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}

// gather scrapes reg through the real exposition path and returns every
// sample by its series name with sorted labels.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+`="`+lp.GetValue()+`"`)
			}
			slices.Sort(labels)
			name := mf.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			out[name] = v
		}
	}
	return out
}

func TestTrustedProxyXFF(t *testing.T) {
	up := startUpstream(t)
	const routes = `
  routes:
    - name: api
      limits: [{name: per-ip, key: ip, rate: 1/min}]
`
	t.Run("trusted", func(t *testing.T) {
		cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  trusted_proxies: [127.0.0.1/32, "::1"]
`+routes, up.srv.URL)
		_, base := startProxy(t, cfg, Options{Clock: new(l7test.ManualClock)})
		xff := func(v string) reqOpt { return withHeader("X-Forwarded-For", v) }
		resp := do(t, "GET", base+"/", xff("203.0.113.1"))
		if resp.StatusCode != 200 {
			t.Fatalf("client 1: %d", resp.StatusCode)
		}
		if got := resp.Header.Get("X-Seen-Xff"); got != "203.0.113.1, 127.0.0.1" {
			t.Fatalf("upstream X-Forwarded-For %q", got)
		}
		if s := status(t, "GET", base+"/", xff("203.0.113.2")); s != 200 {
			t.Fatalf("client 2: %d, want 200 (its own key)", s)
		}
		// A spoofed leftmost entry does not help: the rightmost untrusted
		// address is the client.
		if s := status(t, "GET", base+"/", xff("198.51.100.9, 203.0.113.1")); s != 429 {
			t.Fatalf("client 1 again: %d, want 429", s)
		}
	})
	t.Run("untrusted", func(t *testing.T) {
		cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
`+routes, up.srv.URL)
		_, base := startProxy(t, cfg, Options{Clock: new(l7test.ManualClock)})
		resp := do(t, "GET", base+"/", withHeader("X-Forwarded-For", "203.0.113.1"))
		if resp.StatusCode != 200 {
			t.Fatalf("first: %d", resp.StatusCode)
		}
		if got := resp.Header.Get("X-Seen-Xff"); got != "127.0.0.1" {
			t.Fatalf("upstream X-Forwarded-For %q: an untrusted peer's header must be dropped", got)
		}
		if s := status(t, "GET", base+"/", withHeader("X-Forwarded-For", "203.0.113.2")); s != 429 {
			t.Fatalf("second: %d, want 429 (keyed by the peer, header ignored)", s)
		}
	})
}

func TestShedding(t *testing.T) {
	up := startUpstream(t)
	up.hold = make(chan struct{})
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  routes:
    - name: api
      concurrency: {max_in_flight: 2, queue: 0, priority_header: X-Priority, retry_after: 3s}
`, up.srv.URL)
	reg := prometheus.NewRegistry()
	_, base := startProxy(t, cfg, Options{Registerer: reg})

	// Limit 2 with the default 10% critical reserve: one slot for default
	// requests, the other only for critical ones.
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	held := func(opts ...reqOpt) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", base+"/slow", nil)
			for _, o := range opts {
				o(req)
			}
			resp, err := testClient.Do(req)
			if err != nil {
				codes <- -1
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
		select {
		case <-up.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("held request never reached the upstream")
		}
	}
	held()
	resp := do(t, "GET", base+"/x")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("default request with the shared slot taken: %d, want 503", resp.StatusCode)
	}
	if got := resp.Header.Get("Retry-After"); got != "3" {
		t.Fatalf("Retry-After %q, want 3", got)
	}
	if p := problemOf(t, resp); p.Type != shed.ProblemType || p.Status != 503 {
		t.Fatalf("problem %+v", p)
	}
	held(withHeader("X-Priority", "critical")) // the reserved slot
	if s := status(t, "GET", base+"/x", withHeader("X-Priority", "critical")); s != 503 {
		t.Fatalf("critical with both slots taken: %d, want 503", s)
	}
	close(up.hold)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Fatalf("held request: %d", c)
		}
	}
	if s := status(t, "GET", base+"/x"); s != 200 {
		t.Fatalf("after release: %d", s)
	}
	got := gather(t, reg)
	if v := got[`edgeguard_l7_shed_requests_shed_total{limiter="route:api",priority="default",reason="at_limit"}`]; v != 1 {
		t.Errorf("default shed count %v, want 1 (series: %v)", v, keysWith(got, "shed_total"))
	}
	if v := got[`edgeguard_l7_shed_requests_shed_total{limiter="route:api",priority="critical",reason="at_limit"}`]; v != 1 {
		t.Errorf("critical shed count %v, want 1", v)
	}
}

func keysWith(m map[string]float64, sub string) []string {
	var out []string
	for k := range m {
		if strings.Contains(k, sub) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// recordingEscalator records every call; the escalation counting in the
// proxy is what is under test.
type recordingEscalator struct {
	calls chan escalationCall
}

type escalationCall struct {
	src    netip.Prefix
	ttl    time.Duration
	reason string
}

func (r *recordingEscalator) Escalate(_ context.Context, src netip.Prefix, ttl time.Duration, reason string) error {
	r.calls <- escalationCall{src, ttl, reason}
	return nil
}

func TestEscalation(t *testing.T) {
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  trusted_proxies: [127.0.0.1/32]
  escalation: {enabled: true, rejections: 3, window: 1m, ttl: 10m, prefix_v4: 32, prefix_v6: 64}
  routes:
    - name: api
      limits: [{name: per-ip, key: ip, rate: 1/min, algorithm: fixed-window}]
`, up.srv.URL)
	clock := new(l7test.ManualClock)
	rec := &recordingEscalator{calls: make(chan escalationCall, 16)}
	reg := prometheus.NewRegistry()
	_, base := startProxy(t, cfg, Options{Clock: clock, Escalator: rec, Registerer: reg})
	from := func(ip string, want int) {
		t.Helper()
		if s := status(t, "GET", base+"/", withHeader("X-Forwarded-For", ip)); s != want {
			t.Fatalf("request from %s: %d, want %d", ip, s, want)
		}
	}
	expect := func(want string) {
		t.Helper()
		select {
		case c := <-rec.calls:
			if c.src.String() != want || c.ttl != 10*time.Minute || c.reason != "l7" {
				t.Fatalf("escalated %v ttl %v reason %q, want %s 10m0s l7", c.src, c.ttl, c.reason, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no escalation of %s", want)
		}
	}
	// sentinel makes a fresh source cross the threshold: its call comes
	// after every call queued before it (one FIFO worker), so receiving it
	// proves nothing else was escalated in between.
	sentinels := 0
	sentinel := func() {
		t.Helper()
		sentinels++
		ip := netip.AddrFrom4([4]byte{192, 0, 2, byte(sentinels)}).String()
		from(ip, 200)
		for range 4 {
			from(ip, 429)
		}
		expect(ip + "/32")
	}

	from("203.0.113.7", 200)
	for range 3 {
		from("203.0.113.7", 429) // rejections 1..3: at the threshold, not beyond
	}
	sentinel()
	from("203.0.113.7", 429) // the 4th rejection in the window
	expect("203.0.113.7/32")
	for range 5 {
		from("203.0.113.7", 429) // already escalated: no second call within the TTL
	}
	// IPv6 sources are counted and denied per /64.
	from("2001:db8::1", 200)
	for _, ip := range []string{"2001:db8::1", "2001:db8::2", "2001:db8::3"} {
		from(ip, 429)
	}
	sentinel()
	from("2001:db8::4", 429) // the 4th rejection of the /64 (the per-ip key groups by /64 too)
	expect("2001:db8::/64")

	// After the TTL the source is escalated again once it crosses the
	// threshold in a fresh window.
	clock.Advance(10 * time.Minute)
	from("203.0.113.7", 200)
	for range 3 {
		from("203.0.113.7", 429)
	}
	sentinel()
	from("203.0.113.7", 429)
	expect("203.0.113.7/32")
	// The trusted proxy itself (a request without X-Forwarded-For comes
	// from its address) is rejected like any client but never escalated.
	for range 10 {
		status(t, "GET", base+"/")
	}
	sentinel()
	select {
	case c := <-rec.calls:
		t.Fatalf("unexpected escalation %v", c)
	default:
	}
	if v := gather(t, reg)[`edgeguard_l7_proxy_escalations_total{result="sent"}`]; v != 7 {
		t.Fatalf("escalations sent %v, want 7", v)
	}
}

// blockingEscalator never returns until released: escalation must not hold
// up requests.
type blockingEscalator struct{ release chan struct{} }

func (b *blockingEscalator) Escalate(ctx context.Context, _ netip.Prefix, _ time.Duration, _ string) error {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return ctx.Err()
}

func TestEscalationNeverBlocksRequests(t *testing.T) {
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  escalation: {enabled: true, rejections: 1, window: 1m, ttl: 10m}
  routes:
    - name: api
      limits: [{name: per-ip, key: ip, rate: 1/min}]
`, up.srv.URL)
	clock := new(l7test.ManualClock)
	b := &blockingEscalator{release: make(chan struct{})}
	defer close(b.release)
	p, err := New(cfg, Options{Clock: clock, Escalator: b})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Drive the handler directly with many distinct sources: more
	// escalations than the queue holds, with the escalator stuck.
	n := escalationQueue + 200
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		for j := range 3 {
			w := &discardWriter{h: http.Header{}}
			r, _ := http.NewRequest("GET", "http://proxy/", nil)
			r.RemoteAddr = netip.AddrPortFrom(a, 1234).String()
			if j > 0 {
				p.ServeHTTP(w, r) // rejected: counted
				if w.code != 429 {
					t.Fatalf("source %v request %d: %d", a, j, w.code)
				}
			} else {
				p.limit(p.routes[0], nil, &discardWriter{h: http.Header{}}, r) // charge without proxying
			}
		}
	}
	// One is being escalated (stuck), the queue is full, the rest dropped.
	if d := p.esc.dropped.Load(); d < int64(n-escalationQueue-1) {
		t.Fatalf("dropped %d, want at least %d", d, n-escalationQueue-1)
	}
}

type discardWriter struct {
	h    http.Header
	code int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(c int)           { d.code = c }

func TestMatchDoesNotAllocate(t *testing.T) {
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: http://127.0.0.1:1
  routes:
    - {name: a, match: {host: "*.example.com", methods: [GET], path_pattern: '^/v[0-9]+/', header: {X-Env: prod}}}
    - {name: b, match: {path_prefix: /api/}}
`, "")
	var ms []matcher
	for _, r := range cfg.Routes {
		ms = append(ms, newMatcher(r.Match))
	}
	req, _ := http.NewRequest("GET", "http://x.example.com:8080/v2/items", nil)
	req.Header.Set("X-Env", "prod")
	allocs := testing.AllocsPerRun(1000, func() {
		if !ms[0].matches(req) || ms[1].matches(req) {
			t.Fatal("wrong match")
		}
	})
	if allocs != 0 {
		t.Fatalf("route matching allocates %v times per request", allocs)
	}
}

func TestGlobalConcurrency(t *testing.T) {
	up := startUpstream(t)
	up.hold = make(chan struct{})
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  exempt_paths: [/healthz]
  concurrency: {max_in_flight: 1, queue: 0}
  routes:
    - name: api
      match: {path_prefix: /api/}
`, up.srv.URL)
	_, base := startProxy(t, cfg, Options{})
	done := make(chan int, 1)
	go func() {
		resp, err := testClient.Get(base + "/unmatched")
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case <-up.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("held request never reached the upstream")
	}
	// The global limit covers unmatched requests and every route; exempt
	// paths bypass it.
	if s := status(t, "GET", base+"/other"); s != 503 {
		t.Fatalf("unmatched with the global slot taken: %d, want 503", s)
	}
	if s := status(t, "GET", base+"/api/x"); s != 503 {
		t.Fatalf("route with the global slot taken: %d, want 503", s)
	}
	// The exempt request is held by the upstream too: released below.
	exempt := make(chan int, 1)
	go func() {
		resp, err := testClient.Get(base + "/healthz")
		if err != nil {
			exempt <- -1
			return
		}
		resp.Body.Close()
		exempt <- resp.StatusCode
	}()
	close(up.hold)
	if c := <-done; c != 200 {
		t.Fatalf("held request: %d", c)
	}
	if c := <-exempt; c != 200 {
		t.Fatalf("exempt request with the global slot taken: %d, want 200", c)
	}
}

func TestUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
`, dead)
	reg := prometheus.NewRegistry()
	_, base := startProxy(t, cfg, Options{Registerer: reg})
	resp := do(t, "GET", base+"/")
	if p := problemOf(t, resp); resp.StatusCode != http.StatusBadGateway || p.Status != 502 {
		t.Fatalf("upstream down: %d %+v, want 502", resp.StatusCode, p)
	}
	if v := gather(t, reg)["edgeguard_l7_proxy_upstream_errors_total"]; v != 1 {
		t.Fatalf("upstream errors %v, want 1", v)
	}
}
