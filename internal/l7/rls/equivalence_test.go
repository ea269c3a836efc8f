package rls

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
