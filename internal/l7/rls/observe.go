package rls

import (
	"errors"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7/accesslog"
	"github.com/edgeguard/edgeguard/internal/l7/class"
)

// logStart is when a decision starts, for its access-log line: the zero
// time without an access log (the clock is not read for nothing).
func (s *Service) logStart() time.Time {
	if s.alog == nil {
		return time.Time{}
	}
	return time.Now()
}

// logDecision writes one access-log line for a decision (nothing without
// an access log): route "rls:RULE" (the first matched rule), decision
// allowed, limited, escalated, invalid or unavailable, the refusing limit,
// the status the client sees (200, 429, 400, 503), method the transport
// (grpc, http), host the domain, path the descriptors ("k=v,k=v|k=v") and
// peer the first remote_address. start is the decision's (logStart).
func (s *Service) logDecision(via string, req *Request, v *Verdict, err error, start time.Time) {
	if s.alog == nil {
		return
	}
	now := time.Now()
	e := accesslog.Entry{Time: now, Total: now.Sub(start), Decision: "allowed", Status: http.StatusOK}
	switch {
	case errors.Is(err, ErrInvalid):
		e.Decision, e.Status = "invalid", http.StatusBadRequest
	case err != nil:
		e.Decision, e.Status = "unavailable", http.StatusServiceUnavailable
	case v.Escalated:
		e.Decision, e.Status, e.Limit = "escalated", http.StatusTooManyRequests, v.Refused
	case !v.Allowed:
		e.Decision, e.Status, e.Limit = "limited", http.StatusTooManyRequests, v.Refused
	}
	var b strings.Builder
	peer := ""
	for i, d := range req.Descriptors {
		if i > 0 {
			b.WriteByte('|')
		}
		for j, en := range d.Entries {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(en.Key + "=" + en.Value)
			if en.Key == "remote_address" && peer == "" {
				peer = en.Value
			}
		}
	}
	for _, st := range v.Statuses {
		if st.Rule != "" {
			e.Route = "rls:" + st.Rule
			break
		}
	}
	if v.Ranked {
		e.Class = v.Class.String()
	}
	e.Request = &http.Request{Method: via, Host: req.Domain, URL: &url.URL{Path: b.String()}, RemoteAddr: peer}
	s.alog.Log(e)
}

// Collector is the rate-limit service's metrics, read from the Service
// that serves at scrape time (a reload starts them afresh, as the proxy's).
func (s *Server) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Server }

var (
	descRequests = prometheus.NewDesc("edgeguard_l7_rls_requests_total",
		"Rate-limit service requests (gRPC and subrequest) by answer: ok, over_limit, error (malformed or undecided).",
		[]string{"code"}, nil)
	descLimit = prometheus.NewDesc("edgeguard_l7_rls_limit_decisions_total",
		"Rate-limit service decisions per limit: allowed (the whole request passed), rejected, shadow_rejected.",
		[]string{"rule", "limit", "decision"}, nil)
	descEscalated = prometheus.NewDesc("edgeguard_l7_rls_escalations_total",
		"Sources the rate-limit service queued for the XDP deny list.", nil, nil)
	descClass = prometheus.NewDesc("edgeguard_l7_rls_class_requests_total",
		"Rate-limit service requests by the client's class (unranked: no remote_address) and result: admitted, refused.",
		[]string{"class", "result"}, nil)
	descKeys = prometheus.NewDesc("edgeguard_l7_rls_store_keys",
		"Keys held by a local limit's store (and its capacity).", []string{"rule", "limit", "what"}, nil)
	descLeases = prometheus.NewDesc("edgeguard_l7_rls_hybrid_leases",
		"Leases a hybrid limit holds on this host (and its capacity): one lease map per limit, shared by the rule's tiers.",
		[]string{"rule", "limit", "what"}, nil)
	descEvictions = prometheus.NewDesc("edgeguard_l7_rls_hybrid_evictions_total",
		"Leases a hybrid limit evicted for a new key at capacity (their unsynced counts reported to Redis first), summed over the rule's tiers.",
		[]string{"rule", "limit"}, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRequests
	ch <- descLimit
	ch <- descEscalated
	ch <- descKeys
	ch <- descClass
	ch <- descLeases
	ch <- descEvictions
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	svc := c.s.cur.Load()
	if svc == nil {
		return
	}
	for i, code := range []string{"ok", "over_limit", "error"} {
		ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(svc.requests[i].Load()), code)
	}
	ch <- prometheus.MustNewConstMetric(descEscalated, prometheus.CounterValue, float64(svc.escalated.Load()))
	if svc.classes != nil {
		for i := range svc.byClass {
			name := "unranked"
			if i < class.NumClasses {
				name = class.Class(i).String()
			}
			ch <- prometheus.MustNewConstMetric(descClass, prometheus.CounterValue, float64(svc.byClass[i][0].Load()), name, "admitted")
			ch <- prometheus.MustNewConstMetric(descClass, prometheus.CounterValue, float64(svc.byClass[i][1].Load()), name, "refused")
		}
	}
	for _, r := range svc.rules {
		for _, l := range r.all {
			for i, d := range []string{"allowed", "rejected", "shadow_rejected"} {
				ch <- prometheus.MustNewConstMetric(descLimit, prometheus.CounterValue, float64(l.counts[i].Load()), r.Name, l.Name, d)
			}
			if l.store != nil {
				st := l.store.Stats()
				ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(st.Keys), r.Name, l.Name, "keys")
				ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(st.Capacity), r.Name, l.Name, "capacity")
			}
		}
		collectLeases(ch, r)
	}
}

// collectLeases sums r's hybrid limits' lease maps over its sets (the
// base and each tier): a map its sets' limiters share (one lease state per
// limit, r.hybrid) is reported once, by the limiter that flushes it.
func collectLeases(ch chan<- prometheus.Metric, r *rule) {
	type sum struct {
		leases, capacity int
		evictions        int64
	}
	var names []string
	sums := map[string]*sum{}
	for _, set := range append([]*limitSet{r.base}, slices.Collect(maps.Values(r.tiers))...) {
		for _, g := range set.groups {
			for _, st := range g.lim.HybridLeases() {
				if sums[st.Rule] == nil {
					sums[st.Rule] = &sum{}
					names = append(names, st.Rule)
				}
				s := sums[st.Rule]
				s.leases, s.capacity, s.evictions = s.leases+st.Leases, s.capacity+st.Capacity, s.evictions+st.Evictions
			}
		}
	}
	for _, n := range names {
		s := sums[n]
		ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(s.leases), r.Name, n, "leases")
		ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(s.capacity), r.Name, n, "capacity")
		ch <- prometheus.MustNewConstMetric(descEvictions, prometheus.CounterValue, float64(s.evictions), r.Name, n)
	}
}
