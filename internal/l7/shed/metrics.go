package shed

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports limiters' state as Prometheus metrics, read at scrape
// time. Each limiter is labelled by the name it was added under (a route or
// policy name chosen by the operator), never by a client key.
type Collector struct {
	inFlight  *prometheus.Desc
	queue     *prometheus.Desc
	limit     *prometheus.Desc
	baseline  *prometheus.Desc
	admitted  *prometheus.Desc
	shedTotal *prometheus.Desc

	mu      sync.Mutex
	sources []collectorSource // sorted by name
}

type collectorSource struct {
	name    string
	limiter *Limiter
}

// NewCollector returns a Collector with no limiters.
func NewCollector() *Collector {
	const ns, sub = "edgeguard", "l7_shed"
	name := []string{"limiter"}
	return &Collector{
		inFlight: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "in_flight"),
			"Requests holding a concurrency slot.", name, nil),
		queue: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "queue_depth"),
			"Requests waiting for a concurrency slot.", name, nil),
		limit: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "concurrency_limit"),
			"Current concurrency limit: the adaptive limit, or the static one.", name, nil),
		baseline: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "latency_baseline_seconds"),
			"Baseline service latency the adaptive limit compares against (adaptive limiters only).", name, nil),
		admitted: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "admitted_total"),
			"Requests given a concurrency slot.", []string{"limiter", "priority"}, nil),
		shedTotal: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "requests_shed_total"),
			"Requests refused a concurrency slot, by reason.", []string{"limiter", "priority", "reason"}, nil),
	}
}

// Add exports l under name.
func (c *Collector) Add(name string, l *Limiter) error {
	return c.add(collectorSource{name: name, limiter: l})
}

func (c *Collector) add(s collectorSource) error {
	if s.name == "" {
		return fmt.Errorf("shed: collector: empty limiter name")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i, found := slices.BinarySearchFunc(c.sources, s.name, func(e collectorSource, n string) int {
		return strings.Compare(e.name, n)
	})
	if found {
		return fmt.Errorf("shed: collector: limiter %q already added", s.name)
	}
	c.sources = slices.Insert(c.sources, i, s)
	return nil
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.inFlight, c.queue, c.limit, c.baseline, c.admitted, c.shedTotal} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := slices.Clone(c.sources)
	c.mu.Unlock()
	for _, src := range sources {
		var s Stats
		s = src.limiter.Stats()
		if src.limiter.adaptive != nil {
			ch <- prometheus.MustNewConstMetric(c.baseline, prometheus.GaugeValue,
				src.limiter.Baseline().Seconds(), src.name)
		}
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(s.InFlight), src.name)
		ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, float64(s.QueueDepth), src.name)
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(s.Limit), src.name)
		for p := range Priority(numPriorities) {
			ch <- prometheus.MustNewConstMetric(c.admitted, prometheus.CounterValue, float64(s.Admitted[p]),
				src.name, p.String())
			for r := range Reason(numReasons) {
				ch <- prometheus.MustNewConstMetric(c.shedTotal, prometheus.CounterValue, float64(s.Shed[r][p]),
					src.name, p.String(), r.String())
			}
		}
	}
}
