package netns_test

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/testbed"
)

// promotePolicy: an L7 stage on every edge address, one route with one
// request a minute for everyone (so the second request is a 429 whoever
// sends it) and a per-API-key limit (the credential an authenticated
// promotion needs), and standing.l7_promotion as %s. A reload that changes the
// promotion builds a new proxy, whose limits start afresh.
const promotePolicy = `defaults:
  per_source: {packets: {rate: 10000/s, burst: 10000}}
standing:
  l7_promotion: %s
l7:
  listen: 0.0.0.0:8080
  upstream: http://%s
  routes:
    - name: api
      match: {path_prefix: /}
      limits:
        - {name: everyone, key: global, rate: 1/min, burst: 1}
        - {name: per-key, key: "header:X-API-Key", rate: 1000/s}
`

// TestL7Promotion: with standing.l7_promotion enabled, a client whose HTTP
// request carries its API key, passes its route's limits and is answered
// by the upstream is marked validated in the data
// plane's standing table (edgectl explain shows it, reason l7_promotion);
// while it is off nobody is, and turning it on is a policy reload.
func TestL7Promotion(t *testing.T) {
	s := newScenario(t, 2)
	// The upstream: a plain HTTP server inside the edge namespace.
	upAddr := serveHTTP(t, s.lab.Star.Edge, netip.AddrPortFrom(s.lab.Legit[0].EdgeAddr4, 9200),
		func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

	s.start(fmt.Sprintf(promotePolicy, "{enabled: false}", upAddr))
	waitStanding := func(a netip.Addr, want string) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, why := s.standing(a)
			if st == want || time.Now().After(deadline) {
				if st != want {
					t.Errorf("%s: standing %s (%s), want %s\n%s", a, st, why, want, s.lab.Daemon.Logs())
				}
				return why
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// Off: a passing request changes nothing.
	c0, c1 := s.lab.Legit[0], s.lab.Legit[1]
	if code := keyedGet(t, c0, c0.Src4, "/", "key-"+c0.Src4.String()); code != 200 {
		t.Fatalf("first request: %d", code)
	}
	time.Sleep(500 * time.Millisecond) // a promotion, were one sent, takes a few ms
	if st, _ := s.standing(c0.Src4); st != "new" {
		t.Errorf("promotion off: %s is %s after a request, want new", c0.Src4, st)
	}

	// On, by a reload: the next passing request validates its source.
	s.policy(fmt.Sprintf(promotePolicy, "{enabled: true, rate: 100/s}", upAddr))
	s.waitGeneration(2)
	if code := keyedGet(t, c1, c1.Src4, "/", "key-"+c1.Src4.String()); code != 200 {
		t.Fatalf("request after the reload: %d", code)
	}
	if why := waitStanding(c1.Src4, "validated"); why != "l7_promotion" {
		t.Errorf("%s validated for %q, want l7_promotion", c1.Src4, why)
	}
	// A request the route refuses (429: c1's request used the minute's
	// one) promotes nothing.
	if code := keyedGet(t, c0, c0.Src4, "/", "key-"+c0.Src4.String()); code != 429 {
		t.Fatalf("second request from %s: %d, want 429", c0.Src4, code)
	}
	time.Sleep(500 * time.Millisecond)
	if st, _ := s.standing(c0.Src4); st != "new" {
		t.Errorf("a 429 promoted %s to %s", c0.Src4, st)
	}
	// An address that made no request stays new.
	if st, _ := s.standing(c1.Alt4); st != "new" {
		t.Errorf("%s made no request and is %s", c1.Alt4, st)
	}
	report(t, "l7 promotion: %s validated after one request; a 429 and promotion off left sources new", c1.Src4)
}

// authPromotePolicy: promotion when authenticated, on a route whose limit
// keys on the API key header.
const authPromotePolicy = `defaults:
  per_source: {packets: {rate: 10000/s, burst: 10000}}
standing:
  l7_promotion: {enabled: true, rate: 100/s, when: authenticated}
l7:
  listen: 0.0.0.0:8080
  upstream: http://%s
  routes:
    - name: api
      match: {path_prefix: /}
      limits:
        - {name: per-key, key: "header:X-API-Key", rate: 1000/s}
`

// TestL7PromotionAuthenticated: with standing.l7_promotion.when:
// authenticated, only a request that carried the route's key and that the
// upstream accepted (status below 400) validates its source (why
// l7_promotion); a wrong key (the upstream's 401), a request without a key
// and an upstream error (500) leave their sources new.
func TestL7PromotionAuthenticated(t *testing.T) {
	s := newScenario(t, 2)
	upAddr := serveHTTP(t, s.lab.Star.Edge, netip.AddrPortFrom(s.lab.Legit[0].EdgeAddr4, 9200), func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("X-API-Key") != "good":
			w.WriteHeader(http.StatusUnauthorized)
		case r.URL.Path == "/fail":
			w.WriteHeader(http.StatusInternalServerError)
		default:
			io.WriteString(w, "ok")
		}
	})
	s.start(fmt.Sprintf(authPromotePolicy, upAddr))

	c0, c1 := s.lab.Legit[0], s.lab.Legit[1]
	for _, c := range []struct {
		name string
		c    *testbed.Client
		src  netip.Addr
		path string
		key  string
		code int
	}{
		{"wrong key", c0, c0.Src4, "/", "bad", 401},
		{"no key", c0, c0.Alt4, "/", "", 401},
		{"upstream error", c1, c1.Alt4, "/fail", "good", 500},
		{"accepted key", c1, c1.Src4, "/", "good", 200},
	} {
		if code := keyedGet(t, c.c, c.src, c.path, c.key); code != c.code {
			t.Fatalf("%s from %s: %d, want %d", c.name, c.src, code, c.code)
		}
	}
	// The accepted request's source is validated; one FIFO worker, so by
	// then the others, earlier, would have been too.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, why := s.standing(c1.Src4)
		if st == "validated" {
			if why != "l7_promotion" {
				t.Errorf("%s validated for %q, want l7_promotion", c1.Src4, why)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s (%s) 10 s after an accepted authenticated request, want validated\n%s", c1.Src4, st, why, s.lab.Daemon.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, a := range []netip.Addr{c0.Src4, c0.Alt4, c1.Alt4} {
		if st, why := s.standing(a); st != "new" {
			t.Errorf("%s is %s (%s): a wrong key, no key or an upstream error must not promote", a, st, why)
		}
	}
	report(t, "authenticated l7 promotion: %s validated by an accepted key; wrong key (401), no key, upstream 500 left sources new", c1.Src4)
}

// keyedGet sends GET path from src in c's namespace to the L7 stage on
// c's edge address (port 8080), with key as X-API-Key (none when empty),
// and returns the status.
func keyedGet(t *testing.T, c *testbed.Client, src netip.Addr, path, key string) int {
	t.Helper()
	tr := nsTransport(c.NS, src, 2*time.Second)
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest("GET", "http://"+netip.AddrPortFrom(c.EdgeAddr4, 8080).String()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 3 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("GET %s from %s: %v", path, src, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// standing is what edgectl explain says of a's standing and why.
func (s *scenario) standing(a netip.Addr) (string, string) {
	s.t.Helper()
	e := s.explain(a.String())
	if e.Standing == nil {
		s.t.Fatalf("explain %s: no standing", a)
	}
	return e.Standing.Standing, e.Standing.Why
}
