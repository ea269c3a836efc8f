package metrics_test

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/metrics"
)

// newL7 builds a real L7 middleware (per-IP GCRA, 2 requests per minute on
// a manual clock), serves it on loopback and sends n requests; it returns
// the middleware and how many were rejected with 429.
func newL7(t *testing.T, n int) (*l7.Middleware, int) {
	t.Helper()
	keys, err := l7.NewKeys(l7.KeyConfig{})
	if err != nil {
		t.Fatal(err)
	}
	alg, err := l7.NewGCRA(2, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := l7.NewMiddleware(l7.Config{
		Rules: []l7.Rule{{Name: "per-ip", Key: keys.IP(), Algorithm: alg, Store: l7.StoreConfig{Capacity: 64}}},
		Clock: new(l7test.ManualClock),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	rejected := 0
	for range n {
		resp, err := srv.Client().Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			rejected++
		}
	}
	return mw, rejected
}

// TestSharedRejectedFamily registers the XDP collector and a real L7
// middleware in one registry (plain and pedantic) and gathers: both layers
// land in one rate_limit_rejected_total family with one help text.
func TestSharedRejectedFamily(t *testing.T) {
	sc := runScenario(t)
	mw, l7Rejected := newL7(t, 5)
	if l7Rejected != 3 {
		t.Fatalf("l7 rejected %d of 5 requests, want 3 (burst 2)", l7Rejected)
	}
	for _, reg := range map[string]*prometheus.Registry{
		"plain":    prometheus.NewRegistry(),
		"pedantic": prometheus.NewPedanticRegistry(),
	} {
		reg.MustRegister(mw)
		reg.MustRegister(metrics.NewXDPCollector(sc.src, nil))
		if _, err := reg.Gather(); err != nil {
			t.Fatalf("gather: %v", err)
		}
		text := scrape(t, reg)
		e := parse(t, text)
		f := e["rate_limit_rejected_total"]
		if f == nil || f.GetHelp() != metrics.RejectedHelp {
			t.Fatalf("rate_limit_rejected_total missing or with another help: %v", f)
		}
		for _, c := range []struct {
			labels []string
			want   float64
		}{
			{[]string{"layer", "l7", "rule", "per-ip", "reason", l7.ReasonQuotaExceeded}, float64(l7Rejected)},
			{[]string{"layer", "xdp", "rule", "default", "reason", metrics.ReasonRule}, 3},
			{[]string{"layer", "xdp", "rule", "", "reason", "deny_list"}, 2},
		} {
			if v, ok := e.value("rate_limit_rejected_total", c.labels...); !ok || v != c.want {
				t.Errorf("rate_limit_rejected_total%v = %v (present %v), want %v", c.labels, v, ok, c.want)
			}
		}
		if got := e.sum("rate_limit_rejected_total", "layer", "xdp"); got != 9 {
			t.Errorf("xdp rejections sum to %v, want 9", got)
		}
		promtoolCheckMetrics(t, text)
	}
}

// TestCollectorLintsAlone runs the XDP collector through prometheus/testutil
// (a pedantic registry of its own, no L7 collector) and its linter.
func TestCollectorLintsAlone(t *testing.T) {
	sc := runScenario(t)
	c := metrics.NewXDPCollector(sc.src, nil)
	// 22 reasons x 3 actions x 2 interfaces x (packets, bytes), 3 rules x
	// 3 actions x 2, 3 rule and 8 non-rule rejection series, 4 tables x 2
	// (sources, aggregates, standing, lists), 5 policy series, 4 error
	// series.
	const want = 22*3*2*2 + 3*3*2 + 3 + 8 + 4*2 + 5 + 4
	if n := testutil.CollectAndCount(c); n != want {
		t.Errorf("collected %d series, want %d", n, want)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
