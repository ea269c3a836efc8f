package redislimit

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// roundTrips counts decide round trips attempted (the latency histogram).
func roundTrips(t *testing.T, reg *prometheus.Registry, op string) uint64 {
	t.Helper()
	return gathered(t, reg, "edgeguard_l7_redis_roundtrip_seconds", "op", op).GetHistogram().GetSampleCount()
}

// gathered is reg's series of the family name whose label is value, or nil
// (whose getters read zeros).
func gathered(t *testing.T, reg *prometheus.Registry, name, label, value string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelIs(m, label, value) {
				return m
			}
		}
	}
	return nil
}

func labelIs(m *dto.Metric, name, value string) bool {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name && lp.GetValue() == value {
			return true
		}
	}
	return false
}

func TestRedisKilledAndRestarted(t *testing.T) {
	f := newFixture(t)
	logs := &testenv.SyncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	// A: fail-open and degrade (10 per second ÷ 2 instances = 5 locally).
	regA := prometheus.NewRegistry()
	a := f.limiter(t, Config{Registerer: regA, Logger: logger, Rules: []Rule{
		{Name: "open", Algorithm: GCRA, Limit: 1000, Window: time.Second},
		{Name: "degrade", Algorithm: SlidingWindow, Limit: 10, Window: time.Second, Failure: Degrade, DegradeShards: 2},
	}})
	// B: fail-closed.
	b := f.limiter(t, Config{Registerer: prometheus.NewRegistry(), Rules: []Rule{
		{Name: "closed", Algorithm: GCRA, Limit: 1000, Window: time.Second, Failure: FailClosed},
	}})
	for _, l := range []*Limiter{a, b} {
		if res := allow(t, l, "client-1"); !res.Decision.Allowed || res.Rules[0].Source != SourceRedis {
			t.Fatalf("healthy: %+v", res)
		}
	}

	f.srv.Stop()

	// The breaker opens after Failures (3) consecutive failed round trips.
	for i := range 3 {
		if st := a.BreakerState(); st != BreakerClosed {
			t.Fatalf("breaker %s after %d failures, want closed until 3", st, i)
		}
		res := allow(t, a, "client-1")
		if res.Rules[0].Source != SourceFailOpen || res.Rules[1].Source != SourceLocal {
			t.Fatalf("failure %d: sources %s/%s, want fail_open/local", i, res.Rules[0].Source, res.Rules[1].Source)
		}
	}
	if st := a.BreakerState(); st != BreakerOpen {
		t.Fatalf("breaker %s after 3 failures, want open", st)
	}
	// Local limit is 5 per window; 3 were charged above.
	trips := roundTrips(t, regA, "decide")
	for i := range 100 {
		res := allow(t, a, "client-1")
		wantAllowed := i < 2
		if res.Decision.Allowed != wantAllowed || res.Rules[0].Source != SourceFailOpen || res.Rules[1].Source != SourceLocal {
			t.Fatalf("open breaker, request %d: %+v, want allowed=%v by the local limit", i, res, wantAllowed)
		}
	}
	if got := roundTrips(t, regA, "decide"); got != trips {
		t.Fatalf("open breaker still attempted %d round trips", got-trips)
	}
	for range 3 {
		allow(t, b, "client-1")
	}
	res := allow(t, b, "client-1")
	wantDecision(t, "fail-closed", res.Decision, l7.Decision{Limit: 1000, Window: time.Second, RetryAfter: 500 * time.Millisecond})

	// First probe at the end of the open period fails: open twice as long.
	f.advance(500 * time.Millisecond)
	allow(t, a, "client-1")
	testenv.WaitFor(t, "the failed probe to reopen the breaker", func() bool { return a.BreakerState() == BreakerOpen })
	if d := a.breaker.retryIn(); d != time.Second {
		t.Fatalf("after a failed probe the breaker reopens for %s, want 1s", d)
	}

	f.srv.Restart()
	f.advance(time.Second)
	res = allow(t, a, "client-1") // starts the probe, decides without Redis
	if res.Rules[0].Source == SourceRedis {
		t.Fatal("decided by Redis before the probe closed the breaker")
	}
	testenv.WaitFor(t, "the probe to close the breaker", func() bool { return a.BreakerState() == BreakerClosed })
	res = allow(t, a, "client-1")
	if res.Rules[0].Source != SourceRedis || res.Rules[1].Source != SourceRedis || !res.Decision.Allowed {
		t.Fatalf("after recovery: %+v, want Redis deciding again (scripts reloaded after restart)", res)
	}

	// Observable: state gauge, errors by kind, a few log lines, no client key.
	srv := httptest.NewServer(promhttp.HandlerFor(regA, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		"edgeguard_l7_redis_breaker_state 0",
		`edgeguard_l7_redis_breaker_transitions_total{to="open"} 2`,
		`edgeguard_l7_redis_breaker_transitions_total{to="closed"} 1`,
		`edgeguard_l7_redis_errors_total{kind="breaker_open",op="decide"}`,
		// Local limit 5: 3+2 allowed, 98 refused while open, 1 refused at the
		// failed probe (same window), 1 allowed at the successful probe.
		`edgeguard_l7_redis_fallback_decisions_total{policy="degrade",rule="degrade",verdict="allow"} 6`,
		`edgeguard_l7_redis_fallback_decisions_total{policy="degrade",rule="degrade",verdict="deny"} 99`,
		`edgeguard_l7_redis_roundtrip_seconds_bucket{op="decide"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q\n%s", want, text)
		}
	}
	if strings.Contains(text, "client-1") {
		t.Error("a metric label carries the client key")
	}
	if n := strings.Count(logs.String(), "deciding without redis"); n < 1 || n > 2 {
		t.Errorf("%d 'deciding without redis' lines for ~110 fallbacks in <10s, want 1 (rate-limited)\n%s", n, logs.String())
	}
}

// A hung Redis (SIGSTOP: connections stay open, nothing answers) costs the
// first requests one Timeout each; then the breaker answers without I/O.
func TestRedisHung(t *testing.T) {
	f := newFixture(t)
	reg := prometheus.NewRegistry()
	l := f.limiter(t, Config{Registerer: reg, Timeout: 50 * time.Millisecond,
		Rules: []Rule{{Name: "r", Algorithm: GCRA, Limit: 100, Window: time.Second, Failure: FailClosed}}})
	if res := allow(t, l, "k"); res.Rules[0].Source != SourceRedis {
		t.Fatalf("healthy: %+v", res)
	}
	if err := f.srv.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = f.srv.Cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	for range 3 {
		if res := allow(t, l, "k"); res.Rules[0].Source != SourceFailClosed {
			t.Fatalf("hung redis: %+v, want fail-closed", res)
		}
	}
	if l.BreakerState() != BreakerOpen {
		t.Fatalf("breaker %s after 3 timeouts, want open", l.BreakerState())
	}
	trips := roundTrips(t, reg, "decide")
	for range 50 {
		allow(t, l, "k")
	}
	if got := roundTrips(t, reg, "decide"); got != trips {
		t.Fatalf("open breaker attempted %d round trips", got-trips)
	}
	mfs, _ := reg.Gather()
	var timeouts float64
	for _, mf := range mfs {
		if mf.GetName() == "edgeguard_l7_redis_errors_total" {
			for _, m := range mf.GetMetric() {
				if labelIs(m, "kind", "timeout") {
					timeouts += m.GetCounter().GetValue()
				}
			}
		}
	}
	if timeouts != 3 {
		t.Fatalf("%v timeout errors counted, want 3", timeouts)
	}
	_ = f.srv.Cmd.Process.Signal(syscall.SIGCONT)
	resumed = true
	f.advance(500 * time.Millisecond)
	allow(t, l, "k")
	testenv.WaitFor(t, "the probe to close the breaker", func() bool { return l.BreakerState() == BreakerClosed })
	if res := allow(t, l, "k"); res.Rules[0].Source != SourceRedis {
		t.Fatalf("after SIGCONT: %+v", res)
	}
}
