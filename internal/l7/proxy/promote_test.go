package proxy

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type recordingPromoter struct{ calls chan promotionCall }

type promotionCall struct {
	src    netip.Addr
	reason string
}

func (r *recordingPromoter) Promote(_ context.Context, src netip.Addr, reason string) error {
	r.calls <- promotionCall{src, reason}
	return nil
}

// expect receives the next promotion and fails t unless it is of want,
// authenticated: one FIFO worker, so receiving a sentinel's promotion
// proves nothing else was promoted before it.
func (r *recordingPromoter) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case c := <-r.calls:
		if c.src.String() != want || c.reason != PromotionReasonAuthenticated {
			t.Fatalf("promoted %v (%q), want %s (%q)", c.src, c.reason, want, PromotionReasonAuthenticated)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no promotion of %s", want)
	}
}

// TestPromotion drives the proxy's handler with authenticated requests
// from distinct peers: sources whose requests pass their route's limits
// with a credential, and that the upstream accepts, are promoted, at
// most Rate per second in all and each once per Refresh; a 429, a trusted
// proxy and a disabled promotion promote nobody.
func TestPromotion(t *testing.T) {
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  trusted_proxies: [10.9.0.0/16]
  routes:
    - name: api
      limits: [{name: per-ip, key: ip, rate: 2/min}, {name: per-key, key: "header:X-API-Key", rate: 1000/s}]
`, up.srv.URL)
	clock := new(l7test.ManualClock)
	rec := &recordingPromoter{calls: make(chan promotionCall, 64)}
	reg := prometheus.NewRegistry()
	p, err := New(cfg, Options{Clock: clock, Promoter: rec, Registerer: reg,
		Promotion: Promotion{Enabled: true, Rate: 3, Per: time.Second, Refresh: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	from := func(ip string, want int) {
		t.Helper()
		w := &discardWriter{h: http.Header{}}
		r, _ := http.NewRequest("GET", "http://proxy/", nil)
		r.RemoteAddr = netip.AddrPortFrom(netip.MustParseAddr(ip), 40000).String()
		r.Header.Set("X-API-Key", "key-"+ip)
		p.ServeHTTP(w, r)
		if w.code == 0 {
			w.code = http.StatusOK
		}
		if w.code != want {
			t.Fatalf("request from %s: %d, want %d", ip, w.code, want)
		}
	}
	// Ten new sources in one instant: the rate lets three through.
	for i := 1; i <= 10; i++ {
		from("10.0.0."+strconv.Itoa(i), 200)
	}
	for i := 1; i <= 3; i++ {
		rec.expect(t, "10.0.0."+strconv.Itoa(i))
	}
	if n := p.promo.limited.Load(); n != 7 {
		t.Errorf("%d promotions refused by the rate, want 7", n)
	}
	// A second later the rate has room again: a source refused before is
	// taken on its next request; one promoted already is not, and a 429
	// (10.0.0.1's third request within the minute) promotes nothing.
	clock.Advance(time.Second)
	from("10.0.0.1", 200)
	from("10.0.0.1", 429)
	from("10.0.0.4", 200)
	from("10.9.0.1", 200) // a trusted proxy's own request
	from("10.0.0.50", 200)
	rec.expect(t, "10.0.0.4")
	rec.expect(t, "10.0.0.50")
	// After Refresh a promoted source is promoted again.
	clock.Advance(time.Minute)
	from("10.0.0.1", 200)
	rec.expect(t, "10.0.0.1")
	select {
	case c := <-rec.calls:
		t.Errorf("unexpected promotion of %v", c.src)
	default:
	}
	want := `
# HELP edgeguard_l7_proxy_promotions_total Sources handed to the data plane's standing table as validated, by result (sent, failed, rate_limited: over standing.l7_promotion.rate, dropped: queue full).
# TYPE edgeguard_l7_proxy_promotions_total counter
edgeguard_l7_proxy_promotions_total{result="dropped"} 0
edgeguard_l7_proxy_promotions_total{result="failed"} 0
edgeguard_l7_proxy_promotions_total{result="rate_limited"} 7
edgeguard_l7_proxy_promotions_total{result="sent"} 6
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "edgeguard_l7_proxy_promotions_total"); err != nil {
		t.Error(err)
	}

	// Off unless enabled.
	q, err := New(cfg, Options{Clock: clock, Promoter: rec, Promotion: Promotion{Rate: 3, Per: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if q.promo != nil {
		t.Error("promotion runs without being enabled")
	}
	if _, err := New(cfg, Options{Promoter: rec, Promotion: Promotion{Enabled: true}}); err == nil {
		t.Error("enabled promotion without a rate accepted")
	}
}

// statusUpstream answers the status its path names (/s/401 -> 401).
func statusUpstream(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(path.Base(r.URL.Path))
		if err != nil || code < 200 || code > 599 {
			code = http.StatusOK
		}
		if code >= 300 && code < 400 {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// rawFrom sends one raw request from the local address src (any of
// 127.0.0.0/8 is this host's) and returns the response status.
func rawFrom(t *testing.T, addr, src, raw string) int {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q from %s: %v", raw, src, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitIdle waits until no request is in flight on p: each request's end
// (where an authenticated promotion is offered) has run.
func waitIdle(t *testing.T, p *Proxy) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := p.unmatchedObs.inFlight.Load() + p.exemptObs.inFlight.Load()
		for _, rt := range p.routes {
			n += rt.obs.inFlight.Load()
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests still in flight after 10s", n)
		}
		time.Sleep(time.Millisecond)
	}
}

const authPromotionConfig = `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  engine: ENGINE
  routes:
    - name: api
      match: {path_prefix: /api/}
      limits: [{name: per-key, key: "header:X-API-Key", rate: 1000/s}]
    - name: tight
      match: {path_prefix: /tight/}
      limits: [{name: tight-key, key: "header:X-API-Key", rate: 1/h, burst: 1}]
    - name: users
      match: {path_prefix: /users/}
      limits: [{name: per-user, key: "endpoint+user", rate: 1000/s}]
    - name: open
      match: {path_prefix: /open/}
      limits: [{name: per-ip, key: ip, rate: 1000/s}]
`

// TestAuthenticatedPromotion (both engines): with Authenticated, a source
// is promoted only by a request that passed its route's limits, carried a
// credential the route keys on exactly once (non-empty, at most
// maxCredential bytes) and that the upstream answered with 200-399. 401,
// 403, 404, 5xx, a 429, a missing, empty, duplicated or oversized key, and
// a route keyed by ip alone promote nobody; the promotion rate still
// applies.
func TestAuthenticatedPromotion(t *testing.T) {
	up := statusUpstream(t)
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(e), func(t *testing.T) {
			cfg := decodeYAML(t, strings.ReplaceAll(authPromotionConfig, "ENGINE", string(e)), up)
			rec := &recordingPromoter{calls: make(chan promotionCall, 64)}
			clock := new(l7test.ManualClock)
			p, base := startProxy(t, cfg, Options{Clock: clock, Promoter: rec,
				Promotion: Promotion{Enabled: true, Rate: 100, Per: time.Second}})
			addr := strings.TrimPrefix(base, "http://")
			req := func(path string, headers ...string) string {
				return "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + strings.Join(headers, "") + "\r\n"
			}
			key := "X-API-Key: k-123\r\n"
			long := "X-API-Key: " + strings.Repeat("k", maxCredential+1) + "\r\n"
			atMax := "X-API-Key: " + strings.Repeat("k", maxCredential) + "\r\n"
			for i, c := range []struct {
				name, raw string
				status    int
				promoted  bool
			}{
				{"key, 200", req("/api/s/200", key), 200, true},
				{"key, 204", req("/api/s/204", key), 204, true},
				{"key, 302", req("/api/s/302", key), 302, true},
				{"key of the maximum length, 200", req("/api/s/200", atMax), 200, true},
				{"user header, 200", req("/users/s/200", "X-User-Id: alice\r\n"), 200, true},
				{"key, 401", req("/api/s/401", key), 401, false},
				{"key, 403", req("/api/s/403", key), 403, false},
				{"key, 404", req("/api/s/404", key), 404, false},
				{"key, 500", req("/api/s/500", key), 500, false},
				{"key, 503", req("/api/s/503", key), 503, false},
				{"no key", req("/api/s/200"), 200, false},
				{"empty key", req("/api/s/200", "X-API-Key: \r\n"), 200, false},
				{"duplicated key", req("/api/s/200", key, "X-API-Key: k-456\r\n"), 200, false},
				{"oversized key", req("/api/s/200", long), 200, false},
				{"route keyed by ip", req("/open/s/200", key), 200, false},
				{"tight key, first", req("/tight/s/200", key), 200, true},
				{"tight key, 429", req("/tight/s/200", key), 429, false},
			} {
				src := "127.0.0." + strconv.Itoa(10+i)
				if got := rawFrom(t, addr, src, c.raw); got != c.status {
					t.Fatalf("%s: status %d, want %d", c.name, got, c.status)
				}
				waitIdle(t, p)
				if c.promoted {
					rec.expect(t, src)
				}
			}
			// One FIFO worker: the sentinel's promotion coming next proves
			// none of the refused cases was queued.
			rawFrom(t, addr, "127.0.0.200", req("/api/s/200", key))
			waitIdle(t, p)
			rec.expect(t, "127.0.0.200")
			// The rate still applies: 100 per second, burst 100; 7 used.
			for i := 0; i < 100; i++ {
				rawFrom(t, addr, "127.0.1."+strconv.Itoa(1+i), req("/api/s/200", key))
			}
			waitIdle(t, p)
			for i := 0; i < 93; i++ {
				rec.expect(t, "127.0.1."+strconv.Itoa(1+i))
			}
			if n := p.promo.limited.Load(); n != 7 {
				t.Errorf("%d promotions refused by the rate, want 7", n)
			}
			select {
			case c := <-rec.calls:
				t.Errorf("unexpected promotion of %v", c.src)
			default:
			}
		})
	}
}
