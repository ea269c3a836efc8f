package shed

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCollectorExposition(t *testing.T) {
	env := newManualEnv()
	static := env.limiter(t, Config{MaxInFlight: 2, CriticalReservePercent: -1})
	adaptive := env.limiter(t, Config{Adaptive: &AdaptiveConfig{InitialLimit: 10}})

	held := mustAcquire(t, static, PriorityCritical)
	defer held.Release()
	mustAcquire(t, static, PrioritySheddable).Release()
	_, err := static.Acquire(context.Background(), PriorityDefault)
	if err != nil {
		t.Fatal(err)
	}
	_, err = static.Acquire(context.Background(), PrioritySheddable)
	wantShed(t, err, ReasonAtLimit)
	runWindow(t, env, adaptive, 10, 25*time.Millisecond) // limit 10 -> 11, baseline 25ms

	c := NewCollector()
	if err := c.Add("api", static); err != nil {
		t.Fatal(err)
	}
	if err := c.Add("adaptive", adaptive); err != nil {
		t.Fatal(err)
	}
	if err := c.Add("api", static); err == nil {
		t.Fatal("adding a name twice succeeded")
	}

	want := `
# HELP edgeguard_l7_shed_concurrency_limit Current concurrency limit: the adaptive limit, or the static one (per key for keyed limiters).
# TYPE edgeguard_l7_shed_concurrency_limit gauge
edgeguard_l7_shed_concurrency_limit{limiter="adaptive"} 11
edgeguard_l7_shed_concurrency_limit{limiter="api"} 2
# HELP edgeguard_l7_shed_in_flight Requests holding a concurrency slot (summed over keys for keyed limiters).
# TYPE edgeguard_l7_shed_in_flight gauge
edgeguard_l7_shed_in_flight{limiter="adaptive"} 0
edgeguard_l7_shed_in_flight{limiter="api"} 2
# HELP edgeguard_l7_shed_latency_baseline_seconds Baseline service latency the adaptive limit compares against (adaptive limiters only).
# TYPE edgeguard_l7_shed_latency_baseline_seconds gauge
edgeguard_l7_shed_latency_baseline_seconds{limiter="adaptive"} 0.025
# HELP edgeguard_l7_shed_queue_depth Requests waiting for a concurrency slot (summed over keys for keyed limiters).
# TYPE edgeguard_l7_shed_queue_depth gauge
edgeguard_l7_shed_queue_depth{limiter="adaptive"} 0
edgeguard_l7_shed_queue_depth{limiter="api"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"edgeguard_l7_shed_concurrency_limit", "edgeguard_l7_shed_in_flight",
		"edgeguard_l7_shed_latency_baseline_seconds", "edgeguard_l7_shed_queue_depth"); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	for _, tc := range []struct {
		metric string
		labels map[string]string
		want   float64
	}{
		{"edgeguard_l7_shed_admitted_total", map[string]string{"limiter": "api", "priority": "critical"}, 1},
		{"edgeguard_l7_shed_admitted_total", map[string]string{"limiter": "api", "priority": "sheddable"}, 1},
		{"edgeguard_l7_shed_admitted_total", map[string]string{"limiter": "api", "priority": "default"}, 1},
		{"edgeguard_l7_shed_admitted_total", map[string]string{"limiter": "adaptive", "priority": "critical"}, 10},
		{"edgeguard_l7_shed_requests_shed_total", map[string]string{"limiter": "api", "priority": "sheddable", "reason": "at_limit"}, 1},
		{"edgeguard_l7_shed_requests_shed_total", map[string]string{"limiter": "api", "priority": "default", "reason": "at_limit"}, 0},
	} {
		if got := gatheredValue(t, reg, tc.metric, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.metric, tc.labels, got, tc.want)
		}
	}

	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// gatheredValue finds one sample in the registry's real exposition.
func gatheredValue(t *testing.T, g prometheus.Gatherer, metric string, labels map[string]string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != metric {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no sample %s%v", metric, labels)
	return 0
}

// Keyed limiters are summed over keys; no label carries a key, and dropped
// keys' counters survive.
func TestCollectorKeyedSumsWithoutKeyLabels(t *testing.T) {
	env := newManualEnv()
	k, err := NewKeyed(KeyedConfig{PerKey: Config{MaxInFlight: 1, Clock: env.clock, AfterFunc: env.timers.AfterFunc}, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, err := k.Acquire(ctx, "tenant-a", PriorityDefault)
	if err != nil {
		t.Fatal(err)
	}
	b, err := k.Acquire(ctx, "tenant-b", PriorityDefault)
	if err != nil {
		t.Fatal(err)
	}
	_, err = k.Acquire(ctx, "tenant-a", PriorityDefault)
	wantShed(t, err, ReasonAtLimit)
	b.Release()
	if dropped := k.Sweep(); dropped != 1 {
		t.Fatalf("Sweep dropped %d, want 1 (tenant-b is idle)", dropped)
	}

	c := NewCollector()
	if err := c.AddKeyed("per-tenant", k); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	for metric, want := range map[string]float64{
		"edgeguard_l7_shed_in_flight":         1,
		"edgeguard_l7_shed_keys":              1,
		"edgeguard_l7_shed_concurrency_limit": 1,
	} {
		if got := gatheredValue(t, reg, metric, map[string]string{"limiter": "per-tenant"}); got != want {
			t.Errorf("%s = %v, want %v", metric, got, want)
		}
	}
	if got := gatheredValue(t, reg, "edgeguard_l7_shed_admitted_total",
		map[string]string{"limiter": "per-tenant", "priority": "default"}); got != 2 {
		t.Errorf("admitted = %v, want 2 (tenant-b's count kept after it was dropped)", got)
	}
	if got := gatheredValue(t, reg, "edgeguard_l7_shed_requests_shed_total",
		map[string]string{"limiter": "per-tenant", "priority": "default", "reason": "at_limit"}); got != 1 {
		t.Errorf("shed at_limit = %v, want 1", got)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.Contains(lp.GetValue(), "tenant-") {
					t.Errorf("%s carries a client key in label %s=%q", f.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
	a.Release()
}
