package proxy

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7/accesslog"
	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/eventloop"
)

// What the L7 stage observes of every request it routes, the same under
// both engines: the response's status class, the total and upstream
// durations and the requests in flight, per route
// (edgeguard_l7_responses_total, edgeguard_l7_request_duration_seconds,
// edgeguard_l7_upstream_duration_seconds, edgeguard_l7_in_flight), and
// one access log line (Options.AccessLog). An exchange follows one
// request from its routing to its end: the event loop reports the end
// through eventloop.Observer (the exchange is the Observer its Decision
// names), the net-http engine when ServeHTTP returns.

// DurationBuckets are the latency histograms' bucket bounds, in seconds.
var DurationBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Status classes, the code label of edgeguard_l7_responses_total.
const (
	class1xx = iota // only a 101 whose tunnel has closed
	class2xx
	class3xx
	class4xx
	class5xx
	classNone // the connection closed before any response
	numClasses
)

var classNames = [numClasses]string{"1xx", "2xx", "3xx", "4xx", "5xx", "none"}

func statusClass(status int) int {
	if status < 100 || status > 599 {
		return classNone
	}
	return status/100 - 1
}

// routeObs is one route's observations (or the unmatched requests', or the
// global exempt paths').
type routeObs struct {
	name     string
	status   [numClasses]atomic.Int64
	inFlight atomic.Int64
	total    prometheus.Observer
	upstream prometheus.Observer
}

// observations are the histogram families of a Proxy (a route's are
// children of them) and its per-route sets.
type observations struct {
	total, upstream *prometheus.HistogramVec
	responses       *prometheus.Desc
	inFlight        *prometheus.Desc
}

func newObservations() observations {
	return observations{
		total: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "edgeguard_l7_request_duration_seconds",
			Help: "Time from a request's head to the end of its response (or of its connection), by route: limits, " +
				"queueing, shaping delay and upstream included.",
			Buckets: DurationBuckets,
		}, []string{"route"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edgeguard_l7_upstream_duration_seconds",
			Help:    "Time from sending a request upstream to the end of the upstream's response, by route (forwarded requests only).",
			Buckets: DurationBuckets,
		}, []string{"route"}),
		responses: prometheus.NewDesc("edgeguard_l7_responses_total",
			"Requests the L7 stage answered, by route and status class (1xx: an upgrade whose tunnel closed; "+
				"none: the connection closed before any response).", []string{"route", "code"}, nil),
		inFlight: prometheus.NewDesc("edgeguard_l7_in_flight",
			"Requests routed and not yet answered in full, by route (queued and shaped requests included).",
			[]string{"route"}, nil),
	}
}

func (o *observations) route(name string) *routeObs {
	return &routeObs{name: name, total: o.total.WithLabelValues(name), upstream: o.upstream.WithLabelValues(name)}
}

func (o *observations) describe(ch chan<- *prometheus.Desc) {
	o.total.Describe(ch)
	o.upstream.Describe(ch)
	ch <- o.responses
	ch <- o.inFlight
}

func (o *observations) collect(ch chan<- prometheus.Metric, sets []*routeObs) {
	o.total.Collect(ch)
	o.upstream.Collect(ch)
	for _, s := range sets {
		for i := range numClasses {
			ch <- prometheus.MustNewConstMetric(o.responses, prometheus.CounterValue, float64(s.status[i].Load()), s.name, classNames[i])
		}
		ch <- prometheus.MustNewConstMetric(o.inFlight, prometheus.GaugeValue, float64(s.inFlight.Load()), s.name)
	}
}

// exchange is one request from its routing to its end.
type flight struct {
	p        *Proxy
	obs      *routeObs
	decision int
	limit    string // the limit that refused it (access log)
	// promote: the request passed its route's limits with a credential;
	// its source is promoted if the upstream accepts it (Proxy.accepted).
	promote bool
	// classed: ticket is the request's class (Proxy.classify).
	classed bool
	ticket  class.Ticket
	// relay: decided off the event loop, the engine's relay.
	relay *eventloop.Relay
	// The net-http engine's timing and status.
	start     time.Time
	upstream  time.Duration
	forwarded bool
	sw        statusWriter
	// The net-http engine's transfer rules (transfer.go): body is the
	// request body's when it has one, rw wraps the response writer.
	body    *rateBody
	rw      rateWriter
	rwInUse bool
}

var exchanges = sync.Pool{New: func() any { return new(flight) }}

// begin starts the observation of a request routed to obs.
func (p *Proxy) begin(obs *routeObs) *flight {
	ex := exchanges.Get().(*flight)
	*ex = flight{p: p, obs: obs}
	obs.inFlight.Add(1)
	return ex
}

// Done implements eventloop.Observer: the event loop's end of a request.
func (ex *flight) Done(e eventloop.Exchange) {
	ex.finish(e.Request, e.Status, e.Total, e.Upstream, e.Forwarded)
}

// finish records a request's end and recycles ex.
func (ex *flight) finish(r *http.Request, status int, total, upstream time.Duration, forwarded bool) {
	o := ex.obs
	if ex.promote {
		ex.p.accepted(r, status, forwarded)
	}
	if ex.classed {
		ex.p.classes.Done(ex.ticket, ex.decision != decisionAllowed)
	}
	o.inFlight.Add(-1)
	o.status[statusClass(status)].Add(1)
	o.total.Observe(total.Seconds())
	if forwarded {
		o.upstream.Observe(upstream.Seconds())
	}
	if l := ex.p.alog; l != nil {
		l.Log(accesslog.Entry{
			Time: time.Now(), Request: r, Route: o.name, Decision: decisionName(ex.decision), Limit: ex.limit,
			Status: status, Total: total, Upstream: upstream, Forwarded: forwarded, Class: ex.className(),
		})
	}
	*ex = flight{}
	exchanges.Put(ex)
}

// className is the request's class for the access log ("" when not
// classified).
func (ex *flight) className() string {
	if !ex.classed {
		return ""
	}
	return ex.ticket.Class.String()
}

// refused notes a 429 or 503 decision.
func (ex *flight) refused(decision int, limit string) {
	if ex != nil {
		ex.decision, ex.limit = decision, limit
	}
}

type exchangeKey struct{}

// exchangeOf is the exchange of a request handed to a route's chain of
// handlers (nil: none, a Proxy used as a plain handler in a test).
func exchangeOf(r *http.Request) *flight {
	ex, _ := r.Context().Value(exchangeKey{}).(*flight)
	return ex
}

func withExchange(r *http.Request, ex *flight) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), exchangeKey{}, ex))
}

// statusWriter is the net-http engine's ResponseWriter: it keeps the
// status written. Unwrap lets http.ResponseController reach net/http's
// writer (flush, full duplex); Hijack (an upgrade through ReverseProxy)
// and Flush are passed on.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 || w.status < 200 && code >= 200 {
		if code >= 200 || code == http.StatusSwitchingProtocols {
			w.status = code
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
