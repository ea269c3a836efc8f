package rls

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/l7test"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
)

var equivalenceAlgs = []struct{ name, spec string }{
	{"gcra", "rate: 5/min, burst: 3"},
	{"sliding-window", "rate: 5/min, algorithm: sliding-window"},
	{"token-bucket", "rate: 5/min, burst: 3, algorithm: token-bucket"},
	{"fixed-window", "rate: 5/min, algorithm: fixed-window"},
	{"leaky-bucket", "rate: 5/min, burst: 4, algorithm: leaky_bucket"},
	{"sliding-log", "rate: 5/min, algorithm: sliding_log"},
}

func equivalencePolicy(upstream string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "l7:\n  listen: 127.0.0.1:0\n  upstream: %s\n  client_prefix: {v4: 24}\n  routes:\n", upstream)
	for _, a := range equivalenceAlgs {
		fmt.Fprintf(&b, "    - name: %s\n      match: {path_prefix: /%s}\n      limits:\n        - {name: p-%s, key: ip, %s}\n", a.name, a.name, a.name, a.spec)
	}
	b.WriteString("  rls:\n    listen: 127.0.0.1:0\n    rules:\n")
	for _, a := range equivalenceAlgs {
		fmt.Fprintf(&b, "      - name: %s\n        domain: edge\n        descriptor: [generic_key=%s, remote_address]\n        limits:\n          - {name: r-%s, %s}\n",
			a.name, a.name, a.name, a.spec)
	}
	return b.String()
}

// TestEquivalence: the same request sequence through the proxy (a route
// limit keyed by ip) and through the rate-limit service (a descriptor with
// remote_address) gets the same decisions, the same RateLimit headers and
// the same Retry-After, for every algorithm, on one clock. The traffic
// comes in clumps from a few sources sharing /24s.
func TestEquivalence(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(app.Close)
	pc, rc := decodeL7(t, equivalencePolicy(app.URL))
	clock := new(l7test.ManualClock)
	clock.Set(int64(time.Hour))
	p, err := proxy.New(pc, proxy.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	svc, err := New(rc, Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	rng := rand.New(rand.NewPCG(26, 1))
	sources := []string{"198.51.100.1", "198.51.100.77", "203.0.113.5"}
	allowed, refused := 0, 0
	for step := range 600 {
		if rng.IntN(10) == 0 {
			clock.Advance(time.Duration(rng.IntN(15000)) * time.Millisecond) // a pause between clumps
		}
		a := equivalenceAlgs[rng.IntN(len(equivalenceAlgs))]
		src := sources[rng.IntN(len(sources))]

		req := httptest.NewRequest("GET", "/"+a.name+"/x", nil)
		req.RemoteAddr = src + ":40000"
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		proxyOK := rec.Code == http.StatusOK

		v, err := svc.Decide(context.Background(), &Request{Domain: "edge", Descriptors: []Descriptor{
			{Entries: []Entry{{"generic_key", a.name}, {"remote_address", src}}}}})
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		for _, kv := range v.Headers {
			h.Set(kv[0], kv[1])
		}
		if proxyOK != v.Allowed {
			t.Fatalf("step %d (%s from %s): proxy %d, rls allowed=%t", step, a.name, src, rec.Code, v.Allowed)
		}
		if !proxyOK && rec.Code != http.StatusTooManyRequests {
			t.Fatalf("step %d: proxy answered %d", step, rec.Code)
		}
		for _, f := range []string{"RateLimit", "RateLimit-Policy", "Retry-After"} {
			pv := strings.ReplaceAll(rec.Header().Get(f), `"p-`, `"r-`)
			if pv != h.Get(f) {
				t.Fatalf("step %d (%s from %s): %s proxy %q, rls %q", step, a.name, src, f, pv, h.Get(f))
			}
		}
		if v.Allowed {
			allowed++
		} else {
			refused++
		}
	}
	if allowed == 0 || refused == 0 {
		t.Fatalf("the sequence did not exercise both answers: %d allowed, %d refused", allowed, refused)
	}
	t.Logf("600 requests over 6 algorithms: %d allowed, %d refused, identical through the proxy and the rate-limit service", allowed, refused)
}

// standingsOf is a data plane standing table for tests: the addresses
// listed have their standing, every other address none.
type standingsOf map[netip.Addr]class.Standing

func (s standingsOf) Standing(a netip.Addr) (class.Standing, error) { return s[a], nil }

func classesPolicy(upstream string) string {
	var b strings.Builder
	// A small usual rate, so regulars also send above it (over_usual).
	fmt.Fprintf(&b, "l7:\n  listen: 127.0.0.1:0\n  upstream: %s\n  client_prefix: {v4: 24}\n  classes: {headroom: 1, default_usual_rate: 1}\n  routes:\n", upstream)
	for _, a := range equivalenceAlgs {
		fmt.Fprintf(&b, "    - name: %s\n      match: {path_prefix: /%s}\n      limits:\n        - {name: p-%s, key: ip, %s}\n        - {name: p-g-%s, key: global, rate: 20/min, burst: 8}\n",
			a.name, a.name, a.name, a.spec, a.name)
	}
	b.WriteString("  rls:\n    listen: 127.0.0.1:0\n    rules:\n")
	for _, a := range equivalenceAlgs {
		fmt.Fprintf(&b, "      - name: %s\n        domain: edge\n        descriptor: [generic_key=%s, remote_address]\n        limits:\n          - {name: r-%s, %s}\n",
			a.name, a.name, a.name, a.spec)
		fmt.Fprintf(&b, "      - name: g-%s\n        domain: edge\n        descriptor: [generic_key=%s]\n        limits:\n          - {name: r-g-%s, rate: 20/min, burst: 8}\n",
			a.name, a.name, a.name)
	}
	return b.String()
}

// TestEquivalenceClasses: with the class ranking on, the same request
// sequence from a mix of established clients (the data plane's standing,
// authenticated, and history earned at L7) and new ones gets the same
// decisions, headers and classes through the proxy (a per-ip limit and a
// route-wide one, whose default reserve is the first class's) and through
// the rate-limit service (a [generic_key, remote_address] descriptor and
// a [generic_key] one, whose default reserve is the same). Each path has
// its own class table, on one clock and one standing table, so each sees
// the sequence once. The service is asked over gRPC with Envoy's generated
// client.
func TestEquivalenceClasses(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(app.Close)
	pc, rc := decodeL7(t, classesPolicy(app.URL))
	for _, r := range rc.Rules {
		want := 0
		if strings.HasPrefix(r.Name, "g-") {
			want = proxy.DefaultAggregateReserve
		}
		if r.Limits[0].Reserve != want {
			t.Fatalf("rule %s: reserve %d%%, want %d%%", r.Name, r.Limits[0].Reserve, want)
		}
	}
	clock := new(l7test.ManualClock)
	clock.Set(int64(time.Hour))
	std := standingsOf{
		netip.MustParseAddr("198.51.100.1"): class.StandingEstablished,
		netip.MustParseAddr("203.0.113.5"):  class.StandingAuthenticated,
		netip.MustParseAddr("198.51.100.9"): class.StandingPenalised,
	}
	ranking := pc.Classes.Ranking(20 * time.Second)
	proxyTable := class.NewTable(1024, std, clock, ranking)
	rlsTable := class.NewTable(1024, std, clock, ranking)
	p, err := proxy.New(pc, proxy.Options{Clock: clock, Classes: proxyTable})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	rc.EstablishedAfter = 20 * time.Second
	// The service through Envoy's generated client, over gRPC.
	srv := NewServer(ServerOptions{Clock: clock, Classes: rlsTable})
	t.Cleanup(srv.Close)
	ch, err := srv.Prepare(rc)
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	envoy, _ := dial(t, srv.Addrs()["grpc"])
	rng := rand.New(rand.NewPCG(26, 2))
	// Regulars: established and authenticated by standing, a penalised
	// one, and one that earns its history at L7 (it sends from the start).
	regulars := []string{"198.51.100.1", "203.0.113.5", "198.51.100.9", "198.51.100.77"}
	newcomer := 0
	reserveRefusals := 0
	for step := range 900 {
		if rng.IntN(6) == 0 {
			clock.Advance(time.Duration(rng.IntN(12000)) * time.Millisecond) // a pause between clumps
		}
		a := equivalenceAlgs[rng.IntN(len(equivalenceAlgs))]
		var src string
		if rng.IntN(3) == 0 {
			src = regulars[rng.IntN(len(regulars))]
		} else {
			newcomer++ // a new address (a flood's), in a few /24s
			src = fmt.Sprintf("198.18.%d.%d", newcomer%4, 1+newcomer%250)
		}

		req := httptest.NewRequest("GET", "/"+a.name+"/x", nil)
		req.RemoteAddr = src + ":40000"
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		proxyOK := rec.Code == http.StatusOK

		res := ask(t, envoy, "edge", desc("generic_key="+a.name, "remote_address="+src), desc("generic_key="+a.name))
		allowed := res.GetOverallCode() == rlsv3.RateLimitResponse_OK
		h := http.Header{}
		for k, v := range headers(res) {
			h.Set(k, v)
		}
		if proxyOK != allowed {
			t.Fatalf("step %d (%s from %s): proxy %d, rls %v", step, a.name, src, rec.Code, res.GetOverallCode())
		}
		if !proxyOK && rec.Code != http.StatusTooManyRequests {
			t.Fatalf("step %d: proxy answered %d", step, rec.Code)
		}
		for _, f := range []string{"RateLimit", "RateLimit-Policy", "Retry-After"} {
			pv := strings.ReplaceAll(rec.Header().Get(f), `"p-`, `"r-`)
			if pv != h.Get(f) {
				t.Fatalf("step %d (%s from %s): %s proxy %q, rls %q", step, a.name, src, f, pv, h.Get(f))
			}
		}
		if st := res.GetStatuses()[1]; st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && st.GetLimitRemaining() > 0 {
			reserveRefusals++ // refused with room left: the reserve was not its
		}
	}
	pcnt, rcnt := proxyTable.Counts(), srv.Service().classCounts()
	for c := range class.NumClasses {
		if pcnt.Admitted[c] != rcnt.Admitted[c] || pcnt.Refused[c] != rcnt.Refused[c] {
			t.Errorf("class %s: proxy admitted %d refused %d, rls admitted %d refused %d", class.Class(c),
				pcnt.Admitted[c], pcnt.Refused[c], rcnt.Admitted[c], rcnt.Refused[c])
		}
		t.Logf("%-13s admitted %3d refused %3d (both paths)", class.Class(c), rcnt.Admitted[c], rcnt.Refused[c])
	}
	for _, c := range []class.Class{class.Established, class.Authenticated, class.New, class.OverUsual, class.Penalised} {
		if rcnt.Admitted[c]+rcnt.Refused[c] == 0 {
			t.Errorf("the sequence had no %s requests", c)
		}
	}
	if reserveRefusals == 0 || rcnt.Refused[class.New] == 0 || rcnt.Admitted[class.Established] == 0 {
		t.Fatalf("the sequence did not exercise the reserve: %d refusals inside it", reserveRefusals)
	}
	if x := rlsTable.Explain(netip.MustParseAddr("198.51.100.77"), true); !x.History {
		t.Errorf("the regular without standing earned no L7 history: %+v", x)
	}
	t.Logf("900 requests: %d refused inside a reserve; identical decisions, headers and classes through the proxy and the rate-limit service", reserveRefusals)
}

// classCounts are the service's requests by class (class.Counts'
// Admitted and Refused; the unranked ones are not in it).
func (s *Service) classCounts() class.Counts {
	var c class.Counts
	for i := range class.NumClasses {
		c.Admitted[i], c.Refused[i] = uint64(s.byClass[i][0].Load()), uint64(s.byClass[i][1].Load())
	}
	return c
}
