package rls

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/l7test"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
)

const classesRLSPolicy = `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  routes:
    - name: api
      limits: [{name: p-per-ip, key: ip, rate: 1000/min}]
  rls:
    listen: 127.0.0.1:0
    http_listen: 127.0.0.1:0
    rules:
      - name: everyone
        domain: edge
        descriptor: [generic_key=api]
        limits: [{name: everyone, rate: 10/min, algorithm: fixed-window}]
      - name: per-ip
        domain: edge
        descriptor: [remote_address]
        limits: [{name: per-ip, rate: 100/min, algorithm: fixed-window}]
      - name: tight
        domain: edge
        descriptor: [generic_key=tight, remote_address]
        limits: [{name: tight, rate: 1/min, algorithm: fixed-window}]
`

var (
	estAddr = netip.MustParseAddr("198.18.0.7")
	penAddr = netip.MustParseAddr("198.18.0.9")
)

// startClasses serves classesRLSPolicy with a class table on clock
// (198.18.0.7 established and 198.18.0.9 penalised at the data plane;
// established_after 5s) and returns the server, the table and the
// proxy config (for a proxy sharing the table).
func startClasses(t *testing.T, clock *l7test.ManualClock) (*Server, *class.Table, *proxy.Config) {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(app.Close)
	pc, cfg := decodeL7(t, strings.Replace(classesRLSPolicy, "UPSTREAM", app.URL, 1))
	cfg.EstablishedAfter = 5 * time.Second
	tb := class.NewTable(1024, standingsOf{estAddr: class.StandingEstablished, penAddr: class.StandingPenalised}, clock, class.Config{})
	s := NewServer(ServerOptions{Clock: clock, Classes: tb})
	t.Cleanup(s.Close)
	ch, err := s.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	return s, tb, pc
}

// TestClassesThroughRLS (Envoy's generated client over gRPC, and the
// subrequest endpoint): a request that names its client is charged as the
// client's class; an aggregate descriptor's limit keeps its default
// reserve (half) for the first class: new clients are refused once only
// the reserve is left, an established one uses it to the last unit, a
// request without remote_address is not ranked and may use it (as before
// the ranking). The service counts its requests per class (the class
// table's own counts stay the stage's); explain shows the class and
// charges nothing.
func TestClassesThroughRLS(t *testing.T) {
	clock := new(l7test.ManualClock)
	clock.Set(int64(time.Hour))
	s, tb, _ := startClasses(t, clock)
	c, _ := dial(t, s.Addrs()["grpc"])
	code := func(ds ...string) (rlsv3.RateLimitResponse_Code, map[string]string) {
		res := ask(t, c, "edge", desc("generic_key=api"), desc(ds...))
		return res.GetOverallCode(), headers(res)
	}
	for i := range 5 {
		if got, _ := code(fmt.Sprintf("remote_address=198.18.1.%d", i+1)); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("new client %d: %v, want OK (5 of 10 are not reserved)", i, got)
		}
	}
	got, h := code("remote_address=198.18.1.100")
	if got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a new client with only the reserve left: %v, want OVER_LIMIT", got)
	}
	if h["Retry-After"] == "" || !strings.Contains(h["RateLimit"], `"everyone";r=5;`) {
		t.Errorf("reserve refusal headers %v: want Retry-After and everyone with 5 remaining", h)
	}
	if got, _ := code("remote_address=" + penAddr.String()); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("a penalised client in the reserve: %v, want OVER_LIMIT", got)
	}
	// Without remote_address: not ranked, as before the ranking.
	if res := ask(t, c, "edge", desc("generic_key=api")); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a request without remote_address: %v, want OK (not ranked)", res.GetOverallCode())
	}
	// The subrequest endpoint ranks its descriptor's remote_address too.
	hs := httptest.NewServer(s.HTTPHandler())
	t.Cleanup(hs.Close)
	sub := func(addr string) int {
		req, _ := http.NewRequest("GET", hs.URL+"/v1/check/edge", nil)
		req.Header.Add(DescriptorHeader, "generic_key=api")
		req.Header.Add(DescriptorHeader, "remote_address="+addr)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if st := sub("198.18.1.200"); st != http.StatusTooManyRequests {
		t.Errorf("subrequest for a new client in the reserve: %d, want 429", st)
	}
	if st := sub(estAddr.String()); st != http.StatusOK {
		t.Errorf("subrequest for an established client in the reserve: %d, want 200", st)
	}
	for i := range 3 {
		if got, _ := code("remote_address=" + estAddr.String()); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("established request %d in the reserve: %v, want OK", i, got)
		}
	}
	if got, _ := code("remote_address=" + estAddr.String()); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("established past the whole limit: %v, want OVER_LIMIT", got)
	}

	svc := s.Service()
	before := tb.Explain(netip.MustParseAddr("198.18.1.100"), true)
	v, err := svc.Explain(&Request{Domain: "edge", Descriptors: []Descriptor{{Entries: []Entry{{"remote_address", "198.18.1.100"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !v.Ranked || v.Class != class.New || v.Client != netip.MustParseAddr("198.18.1.100") {
		t.Errorf("explain: ranked %t as %v (%v), want new", v.Ranked, v.Class, v.Client)
	}
	if after := tb.Explain(netip.MustParseAddr("198.18.1.100"), true); after.InWindow != before.InWindow {
		t.Errorf("explain charged the class table: %d requests in the window, then %d", before.InWindow, after.InWindow)
	}

	want := map[string]float64{
		"new/admitted": 5, "new/refused": 2, "penalised/refused": 1, "unranked/admitted": 1,
		"established/admitted": 4, "established/refused": 1,
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range mfs {
		if mf.GetName() != "edgeguard_l7_rls_class_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var cl, res string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "class":
					cl = lp.GetValue()
				case "result":
					res = lp.GetValue()
				default:
					t.Errorf("label %s on the class metric", lp.GetName())
				}
			}
			seen++
			if got := m.GetCounter().GetValue(); got != want[cl+"/"+res] {
				t.Errorf("class %s %s: %v, want %v", cl, res, got, want[cl+"/"+res])
			}
		}
	}
	if seen != 2*(class.NumClasses+1) {
		t.Errorf("%d class series, want %d", seen, 2*(class.NumClasses+1))
	}
	if n := tb.Counts(); n.Admitted != [class.NumClasses]uint64{} || n.Refused != [class.NumClasses]uint64{} {
		t.Errorf("the class table counted the service's requests (they are the stage's counts): %+v", n)
	}
}

// TestClassesHistoryShared: the proxy and the rate-limit service share
// the class table, so history earned through either counts for the other;
// a refusal by the service restarts a new client's clean history, as the
// proxy's does; the committed configuration installs its ranking
// (established_after from the standing section).
func TestClassesHistoryShared(t *testing.T) {
	clock := new(l7test.ManualClock)
	clock.Set(int64(time.Hour))
	s, tb, pc := startClasses(t, clock)
	p, err := proxy.New(pc, proxy.Options{Clock: clock, Classes: tb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	svc := s.Service()
	viaProxy := func(a string) {
		req := httptest.NewRequest("GET", "/x", nil)
		req.RemoteAddr = a + ":40000"
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("proxy answered %d for %s", rec.Code, a)
		}
	}
	viaRLS := func(ds ...Descriptor) Verdict {
		v, err := svc.Decide(context.Background(), &Request{Domain: "edge", Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	ip := func(a string) Descriptor { return Descriptor{Entries: []Entry{{"remote_address", a}}} }
	tight := func(a string) Descriptor {
		return Descriptor{Entries: []Entry{{"generic_key", "tight"}, {"remote_address", a}}}
	}
	const (
		proxyUser = "198.18.2.1" // sends through the proxy, then asks through RLS
		rlsUser   = "198.18.2.2" // the other way round
	)
	for range 6 {
		viaProxy(proxyUser)
		if v := viaRLS(ip(rlsUser)); !v.Allowed || v.Class != class.New && v.Class != class.Established {
			t.Fatalf("rls user: allowed %t as %v", v.Allowed, v.Class)
		}
		clock.Advance(time.Second)
	}
	if v := viaRLS(ip(proxyUser)); v.Class != class.Established {
		t.Errorf("a client with 6s of history through the proxy is %v through the service, want established", v.Class)
	}
	if x := tb.Explain(netip.MustParseAddr(rlsUser), true); x.Next != class.Established {
		t.Errorf("a client with 6s of history through the service would be %v at the proxy, want established", x.Next)
	}

	c2 := "198.18.2.4"
	viaRLS(tight(c2))
	clock.Advance(3 * time.Second)
	if v := viaRLS(tight(c2)); v.Allowed || v.Class != class.New {
		t.Fatalf("second tight request: allowed %t as %v, want refused as new", v.Allowed, v.Class)
	}
	clock.Advance(3 * time.Second) // 6s since its first request, 3s since its refusal
	if v := viaRLS(ip(c2)); v.Class != class.New {
		t.Errorf("a client refused 3s ago is %v, want new (a refusal restarts its history)", v.Class)
	}
	clock.Advance(3 * time.Second)
	if v := viaRLS(ip(c2)); v.Class != class.Established {
		t.Errorf("a client clean for 6s since its refusal is %v, want established", v.Class)
	}
}

// TestEscalationAsTheProxy (Envoy's generated client): a refused request
// counts against its client whichever limit refused it, as a 429 of the
// proxy does: an aggregate descriptor's limit (its reserve included)
// escalates the request's remote_address; an address of
// l7.trusted_proxies is never escalated.
func TestEscalationAsTheProxy(t *testing.T) {
	const policy = `
l7:
  trusted_proxies: [198.18.9.0/24]
  escalation: {enabled: true, rejections: 3, window: 1m, ttl: 10m}
  rls:
    listen: 127.0.0.1:0
    rules:
      - name: everyone
        domain: edge
        descriptor: [generic_key=api]
        limits: [{name: everyone, rate: 4/min, algorithm: fixed-window}]
`
	esc := &escalations{}
	clock := new(l7test.ManualClock)
	clock.Set(int64(time.Hour))
	s, _ := startServer(t, policy, clock, esc)
	c, _ := dial(t, s.Addrs()["grpc"])
	for _, a := range []string{"198.18.1.1", "198.18.1.1", "198.18.9.1", "198.18.9.1"} {
		if res := ask(t, c, "edge", desc("generic_key=api"), desc("remote_address="+a)); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: %v, want OK", a, res.GetOverallCode())
		}
	}
	for range 4 {
		for _, a := range []string{"198.18.1.1", "198.18.9.1"} {
			if res := ask(t, c, "edge", desc("generic_key=api"), desc("remote_address="+a)); res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("%s: %v, want OVER_LIMIT", a, res.GetOverallCode())
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(esc.list()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a wrong second escalation would show by now
	if got := esc.list(); len(got) != 1 || got[0] != netip.MustParsePrefix("198.18.1.1/32") {
		t.Errorf("escalated %v, want [198.18.1.1/32] (the trusted proxy never)", got)
	}
}
