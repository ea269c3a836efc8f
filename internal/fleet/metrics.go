package fleet

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metrics are the fleet's Prometheus series (docs/metrics.md). None is
// labelled by source or aggregate: the per-aggregate shares are in
// 'edgectl fleet status'.
type metrics struct {
	redisDown      prometheus.Counter
	fallback       prometheus.Gauge
	members        prometheus.Gauge
	active         prometheus.Gauge
	lastSync       prometheus.Gauge
	syncs          *prometheus.CounterVec
	published      prometheus.Counter
	publishFailed  prometheus.Counter
	publishDropped prometheus.Counter
	applied        prometheus.Counter
	refused        prometheus.Counter
	malformed      prometheus.Counter
	lag            prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		redisDown: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeguard_fleet_redis_unreachable_total",
			Help: "Times the fleet lost Redis (each starts a period of static shares)."}),
		fallback: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeguard_fleet_fallback",
			Help: "1 while Redis is unreachable and scope: fleet aggregates run on static shares (budget / fleet size)."}),
		members: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeguard_fleet_members",
			Help: "Hosts of the fleet with a fresh heartbeat (this one included; last known while Redis is away)."}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeguard_fleet_active_aggregates",
			Help: "scope: fleet aggregate instances this host publishes demand for and takes a share of."}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeguard_fleet_last_sync_timestamp_seconds",
			Help: "When the last share sync reached Redis (unix seconds)."}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "edgeguard_fleet_syncs_total",
			Help: "Share syncs by result (ok, failed)."}, []string{"result"}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeguard_fleet_list_published_total",
			Help: "List changes this host published to the fleet."}),
		publishFailed: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeguard_fleet_list_publish_failed_total",
			Help: "List changes whose publication failed (the next resync publishes them)."}),
		publishDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeguard_fleet_list_publish_dropped_total",
			Help: "List changes dropped because the publish queue was full (the next resync publishes them)."}),
		applied: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeguard_fleet_list_applied_total",
			Help: "Other hosts' list changes applied to this host's data plane."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeguard_fleet_list_refused_total",
			Help: "Other hosts' list entries refused by this host's checks (width, lists.protected)."}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{Name: "edgeguard_fleet_malformed_total",
			Help: "Entries read from Redis that do not parse or fail their bounds (skipped)."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "edgeguard_fleet_list_lag_seconds",
			Help: "Delay from another host publishing the last list change to this host applying it (includes clock skew)."}),
	}
	m.syncs.WithLabelValues("ok")
	m.syncs.WithLabelValues("failed")
	return m
}

// Collector returns the fleet's metrics for the daemon's registry.
func (f *Fleet) Collector() prometheus.Collector { return collector{f} }

type collector struct{ f *Fleet }

var redisUpDesc = prometheus.NewDesc("edgeguard_fleet_redis_up", "1 when the last exchange with the fleet's Redis succeeded.", nil, nil)

func (c collector) all() []prometheus.Collector {
	m := c.f.stats
	return []prometheus.Collector{m.redisDown, m.fallback, m.members, m.active, m.lastSync, m.syncs, m.published,
		m.publishFailed, m.publishDropped, m.applied, m.refused, m.malformed, m.lag}
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- redisUpDesc
	for _, x := range c.all() {
		x.Describe(ch)
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.f.mu.Lock()
	up := c.f.st.redisUp
	c.f.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(redisUpDesc, prometheus.GaugeValue, boolGauge(up))
	for _, x := range c.all() {
		x.Collect(ch)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if c.Write(&m) != nil || m.Counter == nil {
		return 0
	}
	return m.Counter.GetValue()
}
