package proxy

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"context"
	"net/http"
	"net/netip"
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

// TestPromotion drives the proxy's handler with requests from distinct
// peers: sources whose requests pass their route's limits are promoted, at
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
      limits: [{name: per-ip, key: ip, rate: 2/min}]
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
		p.ServeHTTP(w, r)
		if w.code == 0 {
			w.code = http.StatusOK
		}
		if w.code != want {
			t.Fatalf("request from %s: %d, want %d", ip, w.code, want)
		}
	}
	// expect receives the next promotion: one FIFO worker, so receiving a
	// sentinel's promotion proves nothing else was promoted before it.
	expect := func(want string) {
		t.Helper()
		select {
		case c := <-rec.calls:
			if c.src.String() != want || c.reason != PromotionReason {
				t.Fatalf("promoted %v (%q), want %s (%q)", c.src, c.reason, want, PromotionReason)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no promotion of %s", want)
		}
	}
	// Ten new sources in one instant: the rate lets three through.
	for i := 1; i <= 10; i++ {
		from("10.0.0."+strconv.Itoa(i), 200)
	}
	for i := 1; i <= 3; i++ {
		expect("10.0.0." + strconv.Itoa(i))
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
	expect("10.0.0.4")
	expect("10.0.0.50")
	// After Refresh a promoted source is promoted again.
	clock.Advance(time.Minute)
	from("10.0.0.1", 200)
	expect("10.0.0.1")
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
