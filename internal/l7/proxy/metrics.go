package proxy

import "github.com/prometheus/client_golang/prometheus"

// proxyDescs are the proxy's own series. The local rate-limit series
// (rate_limit_*{layer="l7"}) come from each route's l7.Middleware; the redis
// limits report into the same families with the same help text.
type proxyDescs struct {
	upstreamErrors, escalations, redisAllowed, redisRejected, redisShadow *prometheus.Desc
}

func newProxyDescs() proxyDescs {
	return proxyDescs{
		upstreamErrors: prometheus.NewDesc("edgeguard_l7_proxy_upstream_errors_total",
			"Proxied requests that got no answer from the upstream (answered 502).", nil, nil),
		escalations: prometheus.NewDesc("edgeguard_l7_proxy_escalations_total",
			"Sources handed to the XDP deny list, by result (sent, failed, dropped: queue full).", []string{"result"}, nil),
		redisAllowed: prometheus.NewDesc("rate_limit_allowed_total",
			"Requests a rule let through.", []string{"layer", "rule"}, nil),
		redisRejected: prometheus.NewDesc("rate_limit_rejected_total",
			"Requests rejected, by rule and reason.", []string{"layer", "rule", "reason"}, nil),
		redisShadow: prometheus.NewDesc("rate_limit_shadow_would_reject_total",
			"Requests a shadow rule would have rejected (never rejected).", []string{"layer", "rule"}, nil),
	}
}

// Describe sends nothing: the Proxy is an unchecked collector, because the
// routes' middlewares share metric families that a checked collector could
// describe only once.
func (p *Proxy) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector; it reads counters at scrape time.
func (p *Proxy) Collect(ch chan<- prometheus.Metric) {
	for _, mw := range p.mws {
		mw.Collect(ch)
	}
	d := &p.descs
	ch <- prometheus.MustNewConstMetric(d.upstreamErrors, prometheus.CounterValue, float64(p.upstreamErrors.Load()))
	if p.esc != nil {
		ch <- prometheus.MustNewConstMetric(d.escalations, prometheus.CounterValue, float64(p.esc.sent.Load()), "sent")
		ch <- prometheus.MustNewConstMetric(d.escalations, prometheus.CounterValue, float64(p.esc.failed.Load()), "failed")
		ch <- prometheus.MustNewConstMetric(d.escalations, prometheus.CounterValue, float64(p.esc.dropped.Load()), "dropped")
	}
	const layer = "l7_redis"
	for _, rt := range p.routes {
		for _, g := range rt.redis {
			for name, c := range g.counters {
				ch <- prometheus.MustNewConstMetric(d.redisAllowed, prometheus.CounterValue, float64(c.allowed.Load()), layer, name)
				ch <- prometheus.MustNewConstMetric(d.redisRejected, prometheus.CounterValue, float64(c.rejected.Load()), layer, name, "quota_exceeded")
				ch <- prometheus.MustNewConstMetric(d.redisShadow, prometheus.CounterValue, float64(c.shadowRejected.Load()), layer, name)
			}
		}
	}
}
