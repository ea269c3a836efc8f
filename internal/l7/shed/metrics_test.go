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
# HELP edgeguard_l7_shed_concurrency_limit Current concurrency limit: the adaptive limit, or the static one.
# TYPE edgeguard_l7_shed_concurrency_limit gauge
edgeguard_l7_shed_concurrency_limit{limiter="adaptive"} 11
edgeguard_l7_shed_concurrency_limit{limiter="api"} 2
# HELP edgeguard_l7_shed_in_flight Requests holding a concurrency slot.
# TYPE edgeguard_l7_shed_in_flight gauge
edgeguard_l7_shed_in_flight{limiter="adaptive"} 0
edgeguard_l7_shed_in_flight{limiter="api"} 2
# HELP edgeguard_l7_shed_latency_baseline_seconds Baseline service latency the adaptive limit compares against (adaptive limiters only).
# TYPE edgeguard_l7_shed_latency_baseline_seconds gauge
edgeguard_l7_shed_latency_baseline_seconds{limiter="adaptive"} 0.025
# HELP edgeguard_l7_shed_queue_depth Requests waiting for a concurrency slot.
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
