package l7

import "github.com/prometheus/client_golang/prometheus"

// metricDescs are the collector's descriptors, made per Middleware (no
// package-level state).
type metricDescs struct {
	allowed, rejected, shadow, keys, capacity, evictions, full *prometheus.Desc
}

func newMetricDescs() metricDescs {
	return metricDescs{
		allowed: prometheus.NewDesc("rate_limit_allowed_total",
			"Requests a rule let through.", []string{"layer", "rule"}, nil),
		rejected: prometheus.NewDesc("rate_limit_rejected_total",
			"Requests rejected, by rule and reason.", []string{"layer", "rule", "reason"}, nil),
		shadow: prometheus.NewDesc("rate_limit_shadow_would_reject_total",
			"Requests a shadow rule would have rejected (never rejected).", []string{"layer", "rule"}, nil),
		keys: prometheus.NewDesc("rate_limit_store_keys",
			"Keys held in a rule's keyed store (idle keys included until reused or swept).", []string{"layer", "rule"}, nil),
		capacity: prometheus.NewDesc("rate_limit_store_capacity_keys",
			"Key slots allocated for a rule's keyed store (its hard bound).", []string{"layer", "rule"}, nil),
		evictions: prometheus.NewDesc("rate_limit_store_evictions_total",
			"Idle keys evicted from a rule's keyed store.", []string{"layer", "rule"}, nil),
		full: prometheus.NewDesc("rate_limit_store_full_total",
			"New keys that found their bucket full of active keys.", []string{"layer", "rule"}, nil),
	}
}

// Reason labels of rate_limit_rejected_total.
const (
	// ReasonQuotaExceeded: the key is over the rule's quota.
	ReasonQuotaExceeded = "quota_exceeded"
	// ReasonStoreFull: a new key found no room in a FailClosed store.
	ReasonStoreFull = "store_full"
)

// Describe implements prometheus.Collector.
func (m *Middleware) Describe(ch chan<- *prometheus.Desc) {
	d := &m.descs
	for _, d := range []*prometheus.Desc{d.allowed, d.rejected, d.shadow, d.keys, d.capacity, d.evictions, d.full} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it reads the counters and store
// sizes at scrape time. No label ever holds a client key.
func (m *Middleware) Collect(ch chan<- prometheus.Metric) {
	const layer = "l7"
	d := &m.descs
	for _, s := range m.Stats() {
		ch <- prometheus.MustNewConstMetric(d.allowed, prometheus.CounterValue, float64(s.Allowed), layer, s.Rule)
		ch <- prometheus.MustNewConstMetric(d.rejected, prometheus.CounterValue, float64(s.Rejected), layer, s.Rule, ReasonQuotaExceeded)
		ch <- prometheus.MustNewConstMetric(d.rejected, prometheus.CounterValue, float64(s.RejectedFull), layer, s.Rule, ReasonStoreFull)
		ch <- prometheus.MustNewConstMetric(d.shadow, prometheus.CounterValue, float64(s.ShadowRejected), layer, s.Rule)
		ch <- prometheus.MustNewConstMetric(d.keys, prometheus.GaugeValue, float64(s.Store.Keys), layer, s.Rule)
		ch <- prometheus.MustNewConstMetric(d.capacity, prometheus.GaugeValue, float64(s.Store.Capacity), layer, s.Rule)
		ch <- prometheus.MustNewConstMetric(d.evictions, prometheus.CounterValue, float64(s.Store.Evictions), layer, s.Rule)
		ch <- prometheus.MustNewConstMetric(d.full, prometheus.CounterValue, float64(s.Store.Full), layer, s.Rule)
	}
}
