package proxy

import (
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// proxyDescs are the proxy's own series. The local rate-limit series
// (rate_limit_*{layer="l7"}) come from each route's l7.Middleware; the redis
// limits report into the same families with the same help text.
type proxyDescs struct {
	upstreamErrors, escalations, redisAllowed, redisRejected, redisShadow, requests *prometheus.Desc
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
		requests: prometheus.NewDesc("edgeguard_l7_requests_total",
			"Requests the L7 stage decided, by route ((unmatched), (exempt) for the global exempt paths) and decision "+
				"(allowed, limited: 429, shed: 503, escalated: the 429 that sent the source to the XDP deny list).",
			[]string{"route", "decision"}, nil),
	}
}

// Describe implements prometheus.Collector. The routes' middlewares share
// their descriptors (same names and labels): one describes them all.
func (p *Proxy) Describe(ch chan<- *prometheus.Desc) {
	d := &p.descs
	for _, desc := range []*prometheus.Desc{d.upstreamErrors, d.escalations, d.redisAllowed, d.redisRejected, d.redisShadow, d.requests} {
		ch <- desc
	}
	if len(p.mws) > 0 {
		p.mws[0].Describe(ch)
	}
	p.observ.describe(ch)
	for _, c := range p.parts.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector; it reads counters at scrape
// time: the Proxy's own series, its routes' and its parts'.
func (p *Proxy) Collect(ch chan<- prometheus.Metric) {
	for _, c := range p.parts.collectors() {
		c.Collect(ch)
	}
	for _, mw := range p.mws {
		mw.Collect(ch)
	}
	d := &p.descs
	ch <- prometheus.MustNewConstMetric(d.upstreamErrors, prometheus.CounterValue, float64(p.upstreamErrors.Load()))
	for _, rt := range p.routes {
		rt.counts.collect(ch, d.requests, rt.name)
	}
	p.unmatchedCounts.collect(ch, d.requests, routeUnmatched)
	p.exemptCounts.collect(ch, d.requests, routeExempt)
	p.observ.collect(ch, p.obsSets)
	if p.esc != nil {
		ch <- prometheus.MustNewConstMetric(d.escalations, prometheus.CounterValue, float64(p.esc.sent.Load()), "sent")
		ch <- prometheus.MustNewConstMetric(d.escalations, prometheus.CounterValue, float64(p.esc.failed.Load()), "failed")
		ch <- prometheus.MustNewConstMetric(d.escalations, prometheus.CounterValue, float64(p.esc.dropped.Load()), "dropped")
	}
	const layer = "l7_redis"
	for _, rt := range p.routes {
		for name, c := range rt.redisCounters {
			ch <- prometheus.MustNewConstMetric(d.redisAllowed, prometheus.CounterValue, float64(c.allowed.Load()), layer, name)
			ch <- prometheus.MustNewConstMetric(d.redisRejected, prometheus.CounterValue, float64(c.rejected.Load()), layer, name, "quota_exceeded")
			ch <- prometheus.MustNewConstMetric(d.redisRejected, prometheus.CounterValue, float64(c.unavailable.Load()), layer, name, "redis_unavailable")
			ch <- prometheus.MustNewConstMetric(d.redisShadow, prometheus.CounterValue, float64(c.shadowRejected.Load()), layer, name)
		}
	}
}

// registry holds the collectors of a Proxy's parts (its shedding
// limiters, its redis limiters): a private prometheus.Registry checks them
// as they are added (a name or label clash is an error of New), and the
// Proxy collects them with its own series. Nothing outside the Proxy sees
// them until the Proxy itself is registered (Options.Registerer) or
// collected (the L7 stage collects the Proxy that serves).
type registry struct {
	check *prometheus.Registry

	mu         sync.Mutex
	registered []prometheus.Collector
}

func newRegistry() *registry { return &registry{check: prometheus.NewRegistry()} }

func (r *registry) Register(c prometheus.Collector) error {
	if err := r.check.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	r.registered = append(r.registered, c)
	r.mu.Unlock()
	return nil
}

func (r *registry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *registry) Unregister(c prometheus.Collector) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, rc := range r.registered {
		if rc == c {
			r.registered = append(r.registered[:i], r.registered[i+1:]...)
			return r.check.Unregister(c)
		}
	}
	return false
}

func (r *registry) collectors() []prometheus.Collector {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]prometheus.Collector(nil), r.registered...)
}

// Decisions of the L7 stage on a request, the decision label of
// edgeguard_l7_requests_total. Exclusive: a request counts once.
const (
	decisionAllowed   = iota // passed to the upstream (exempt and unlimited requests included)
	decisionLimited          // answered 429
	decisionShed             // answered 503 (concurrency limits; a rate limiter shutting down)
	decisionEscalated        // answered 429, and that rejection sent the source to the XDP deny list
	numDecisions
)

// decisionName is a decision's label value.
func decisionName(i int) string {
	switch i {
	case decisionAllowed:
		return "allowed"
	case decisionLimited:
		return "limited"
	case decisionShed:
		return "shed"
	}
	return "escalated"
}

// Route labels of requests no route decides.
const (
	routeUnmatched = "(unmatched)" // no route matched (a route name cannot hold parentheses)
	routeExempt    = "(exempt)"    // a global exempt path
)

// routeCounters count one route's decisions.
type routeCounters struct {
	n [numDecisions]atomic.Int64
}

func (c *routeCounters) limited(escalated bool) {
	if escalated {
		c.n[decisionEscalated].Add(1)
		return
	}
	c.n[decisionLimited].Add(1)
}

func (c *routeCounters) shedFunc() func(*http.Request) {
	return func(r *http.Request) {
		c.n[decisionShed].Add(1)
		exchangeOf(r).refused(decisionShed, "")
	}
}

func (c *routeCounters) collect(ch chan<- prometheus.Metric, desc *prometheus.Desc, route string) {
	for i := range numDecisions {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(c.n[i].Load()), route, decisionName(i))
	}
}

// RouteDecisions are one route's request counts by decision, for
// `edgectl stats`.
type RouteDecisions struct {
	Route                             string
	Allowed, Limited, Shed, Escalated int64
}

func (c *routeCounters) decisions(route string) RouteDecisions {
	return RouteDecisions{Route: route, Allowed: c.n[decisionAllowed].Load(), Limited: c.n[decisionLimited].Load(),
		Shed: c.n[decisionShed].Load(), Escalated: c.n[decisionEscalated].Load()}
}

// Decisions are the request counts by route (in match order, then the
// unmatched and exempt requests) and decision since the Proxy was built.
func (p *Proxy) Decisions() []RouteDecisions {
	out := make([]RouteDecisions, 0, len(p.routes)+2)
	for _, rt := range p.routes {
		out = append(out, rt.counts.decisions(rt.name))
	}
	return append(out, p.unmatchedCounts.decisions(routeUnmatched), p.exemptCounts.decisions(routeExempt))
}
