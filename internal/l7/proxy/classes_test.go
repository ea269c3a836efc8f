package proxy

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

// classTable is a class table whose clients named by forwarded-for (the
// tests' requests all come from loopback, a trusted proxy) earn history
// after 1 s of its manual clock; est has it.
func classTable(t *testing.T, est netip.Addr) *class.Table {
	t.Helper()
	clock := new(l7test.ManualClock)
	tb := class.NewTable(1024, nil, clock, class.Config{EstablishedAfter: time.Second})
	tb.Classify(est, false)
	clock.Advance(time.Second)
	if c := tb.Classify(est, false).Class; c != class.Established {
		t.Fatalf("%s is %s, want established", est, c)
	}
	return tb
}

// TestClassesRankConcurrency (both engines): at a full concurrency limit
// an established client takes the slot reserved from new clients and is
// served before the new clients queued ahead of it; the per-class counts
// say who was admitted and refused.
func TestClassesRankConcurrency(t *testing.T) {
	for _, engine := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(engine), func(t *testing.T) {
			up := startUpstream(t)
			up.hold = make(chan struct{})
			cfg := decodeYAML(t, fmt.Sprintf(`
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  engine: %s
  trusted_proxies: [127.0.0.0/8]
  concurrency: {max_in_flight: 2, queue: 8, queue_timeout: 10s}
`, engine), up.srv.URL)
			est := netip.MustParseAddr("198.18.0.7")
			tb := classTable(t, est)
			_, base := startProxy(t, cfg, Options{Classes: tb})
			var wg sync.WaitGroup
			defer wg.Wait()
			codes := make(chan string, 8)
			send := func(client string) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					codes <- fmt.Sprintf("%s %d", client, status(t, "GET", base+"/", withHeader("X-Forwarded-For", client)))
				}()
			}
			entered := func(what string) {
				t.Helper()
				select {
				case <-up.entered:
				case <-time.After(10 * time.Second):
					t.Fatalf("%s never reached the upstream", what)
				}
			}
			// A new client takes the one shared slot (the other is the
			// first class's reserve); two more new requests queue.
			send("198.18.1.1")
			entered("the first new request")
			send("198.18.1.2")
			send("198.18.1.3")
			time.Sleep(200 * time.Millisecond)
			select {
			case <-up.entered:
				t.Fatal("a new client's request took the reserved slot")
			default:
			}
			// The established client gets the reserved slot at once.
			send(est.String())
			entered("the established client's request")
			close(up.hold)
			wg.Wait()
			close(codes)
			n := 0
			for c := range codes {
				if !strings.HasSuffix(c, " 200") {
					t.Errorf("%s, want 200", c)
				}
				n++
			}
			// An exchange ends (and is counted) just after its response
			// leaves.
			deadline := time.Now().Add(5 * time.Second)
			c := tb.Counts()
			for c.Admitted[class.Established]+c.Admitted[class.New] < 4 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
				c = tb.Counts()
			}
			if c.Admitted[class.Established] != 1 || c.Admitted[class.New] != 3 || n != 4 {
				t.Errorf("counts: established %d, new %d admitted of %d, want 1 and 3 of 4", c.Admitted[class.Established], c.Admitted[class.New], n)
			}
		})
	}
}

// TestClassesAggregateReserve (both engines): an aggregate limit (key
// prefix, default reserve 50%) lets new clients use half of it; an
// established client the rest.
func TestClassesAggregateReserve(t *testing.T) {
	for _, engine := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(engine), func(t *testing.T) {
			up := startUpstream(t)
			cfg := decodeYAML(t, fmt.Sprintf(`
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  engine: %s
  trusted_proxies: [127.0.0.0/8]
  routes:
    - name: api
      limits: [{name: per-24, key: prefix, rate: 10/min}]
`, engine), up.srv.URL)
			if r := cfg.Routes[0].Limits[0].Reserve; r != DefaultAggregateReserve {
				t.Fatalf("reserve %d, want the default %d", r, DefaultAggregateReserve)
			}
			est := netip.MustParseAddr("198.18.0.7")
			_, base := startProxy(t, cfg, Options{Classes: classTable(t, est)})
			get := func(client string) int { return status(t, "GET", base+"/", withHeader("X-Forwarded-For", client)) }
			for i := 0; i < 5; i++ {
				if s := get(fmt.Sprintf("198.18.0.%d", 100+i)); s != 200 {
					t.Fatalf("new client %d of the /24: %d, want 200", i, s)
				}
			}
			if s := get("198.18.0.200"); s != http.StatusTooManyRequests {
				t.Fatalf("a new client past the /24's unreserved half: %d, want 429", s)
			}
			for i := 0; i < 5; i++ {
				if s := get(est.String()); s != 200 {
					t.Fatalf("established request %d in the reserve: %d, want 200", i, s)
				}
			}
			if s := get(est.String()); s != http.StatusTooManyRequests {
				t.Fatalf("established past the whole limit: %d, want 429", s)
			}
			// Another /24 has its own budget.
			if s := get("198.18.9.1"); s != 200 {
				t.Fatalf("another /24: %d, want 200", s)
			}
		})
	}
}

// TestClassesFields: l7.classes and a limit's reserve decode with their
// defaults and bounds; route_passed-like mistakes are problems.
func TestClassesFields(t *testing.T) {
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: http://127.0.0.1:1
  classes: {window: 30s, headroom: 3, default_usual_rate: 5, cache_ttl: 500ms}
  routes:
    - name: api
      limits:
        - {name: per-ip, key: ip, rate: 10/s}
        - {name: per-asn, key: asn, rate: 100/s, reserve: 20%}
        - {name: everyone, key: global, rate: 100/s}
`, "")
	want := Classes{Enabled: true, Window: 30 * time.Second, Headroom: 3, DefaultUsualRate: 5, CacheTTL: 500 * time.Millisecond}
	if cfg.Classes != want {
		t.Errorf("classes %+v, want %+v", cfg.Classes, want)
	}
	for i, r := range []int{0, 20, DefaultAggregateReserve} {
		if got := cfg.Routes[0].Limits[i].Reserve; got != r {
			t.Errorf("limit %s: reserve %d, want %d", cfg.Routes[0].Limits[i].Name, got, r)
		}
	}
	if got := cfg.LimitsKeyedOn(KeyASN); len(got) != 1 || got[0] != "per-asn" {
		t.Errorf("limits keyed on asn: %v", got)
	}
	off := decodeYAML(t, "l7:\n  listen: 127.0.0.1:0\n  upstream: http://127.0.0.1:1\n  classes: {enabled: false}\n", "")
	if off.Classes.Enabled {
		t.Error("classes enabled: false decoded as enabled")
	}
	for _, bad := range []string{
		"classes: {window: 100ms}", "classes: {headroom: 0}", "classes: {cache_ttl: 2m}", "classes: {bogus: 1}",
		"routes: [{name: a, limits: [{name: x, key: global, rate: 1/s, reserve: 100%}]}]",
		"routes: [{name: a, limits: [{name: x, key: global, rate: 1/s, reserve: \"50\"}]}]",
		"routes: [{name: a, limits: [{name: x, key: nope, rate: 1/s}]}]",
	} {
		var doc yaml.Node
		src := "l7:\n  listen: 127.0.0.1:1\n  upstream: http://127.0.0.1:2\n  " + bad + "\n"
		if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
			t.Fatal(err)
		}
		if _, probs := Decode(l7Node(&doc), "p.yaml"); len(probs) == 0 {
			t.Errorf("%s: no problem", bad)
		}
	}
}

// TestReserveOfABurst: a limit's reserve is a share of what it holds at
// once: its burst when it has one. A route-wide limit of 100/min with a
// burst of 8 keeps 4 for the first class (not 50, which no request could
// ever see remaining: every new client was refused).
func TestReserveOfABurst(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want int64
	}{
		{"rate: 100/min, burst: 8", 4},
		{"rate: 100/min, burst: 8, algorithm: token-bucket", 4},
		{"rate: 100/min, burst: 8, algorithm: leaky_bucket", 4},
		{"rate: 100/min", 50},
		{"rate: 100/min, algorithm: sliding-window", 50},
		{"rate: 10/min, burst: 100, reserve: 99%", 9}, // at most all but one of the rate's count
		{"rate: 2/min, burst: 1", 0},
	} {
		cfg := decodeYAML(t, "l7:\n  listen: 127.0.0.1:0\n  upstream: http://127.0.0.1:1\n  routes:\n    - name: api\n      limits: [{name: all, key: global, "+tc.spec+"}]\n", "")
		l := cfg.Routes[0].Limits[0]
		alg, err := newAlgorithm(l)
		if err != nil {
			t.Fatal(err)
		}
		if got := reserveUnits(l, alg); got != tc.want {
			t.Errorf("%s: reserve %d units, want %d", tc.spec, got, tc.want)
		}
	}
}
