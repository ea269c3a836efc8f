package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7/eventloop"
)

// The engine hand-off: both engines run the same routing (pick), limits
// (limit) and concurrency middlewares; only the last step, proxying,
// differs. Under net/http it is httputil.ReverseProxy (forwardNetHTTP).
// Under the event loop the Proxy is an eventloop.Handler: Decide returns
// the decision (Respond, Forward, or Continue on a goroutine when the
// route may block), and a request decided on a goroutine is proxied
// through the *eventloop.Relay the engine hands it. That relay reaches the
// innermost handler of a route's chain (under shed.Middleware, an
// http.Handler middleware) in the request's context (withRelay).

// BodyReadTimeout bounds the wait for the next bytes of a request body the
// event loop is relaying (eventloop.Config.BodyReadTimeout): nginx's
// client_body_timeout default.
const BodyReadTimeout = 60 * time.Second

// Decide is the event loop's way in: the decision for r, made on the loop.
// A route that may block (a concurrency limit, Redis) is decided on a
// goroutine; the others here, where only local limits run.
func (p *Proxy) Decide(w http.ResponseWriter, r *http.Request) eventloop.Decision {
	rt, exempt := p.pick(r)
	ex := p.begin(p.obsOf(rt, exempt))
	if !exempt {
		p.classify(ex, r)
	}
	switch {
	case exempt:
		p.countExempt(rt)
		return eventloop.Forward().Observe(ex)
	case rt == nil:
		if p.unmatchedOffLoop != nil {
			return eventloop.Continue(p.unmatchedOffLoop).Observe(ex)
		}
		p.unmatchedCounts.n[decisionAllowed].Add(1)
		return eventloop.Forward().Observe(ex)
	case rt.offLoop != nil:
		return eventloop.Continue(rt.offLoop).Observe(ex)
	case p.limit(rt, ex, w, r):
		return eventloop.Forward().Observe(ex)
	}
	return eventloop.Respond().Observe(ex)
}

// offLoop runs h (a route's chain) on the event loop's goroutine, with the
// request's exchange, holding the engine's relay, in the request's context
// for forwardFrom.
func offLoop(h http.Handler) eventloop.OffLoop {
	return func(w http.ResponseWriter, r *http.Request, relay *eventloop.Relay) {
		ex, _ := relay.Observer().(*flight)
		if ex == nil {
			ex = new(flight) // a decision without an observer: nobody reads it
		}
		ex.relay = relay
		h.ServeHTTP(w, withExchange(r, ex))
	}
}

// forwardFrom proxies a request its route let through: by the event loop's
// relay when the request was decided off the loop, else by the net-http
// engine's ReverseProxy (timed for the upstream histogram).
func (p *Proxy) forwardFrom(w http.ResponseWriter, r *http.Request) {
	ex := exchangeOf(r)
	if ex != nil && ex.relay != nil {
		ex.relay.Forward()
		return
	}
	t := time.Now()
	p.forwardNetHTTP(w, r)
	if ex != nil {
		ex.forwarded, ex.upstream = true, time.Since(t)
	}
}

// refuseNetHTTP answers 400, closing the connection, for the requests the
// event loop refuses on the wire but net/http's server lets through, so
// that both engines refuse the same messages:
//   - a target with a fragment ("/exact#x"): net/http takes "#x" into the
//     path, which misses a "/exact" route, and an upstream that cuts the
//     fragment off serves /exact;
//   - a host (from an absolute-form target, which net/http does not check)
//     with bytes a Host field may not hold ("http://a<script>/x");
//   - a version other than HTTP/1.0 and 1.1 (net/http serves any HTTP/1.x;
//     the event loop answers 505 rather than guess at 1.7's framing);
//   - CONNECT (405: the proxy does not tunnel).
//
// It reports whether it answered.
func refuseNetHTTP(w http.ResponseWriter, r *http.Request) bool {
	status, reason := http.StatusBadRequest, ""
	switch {
	case r.ProtoMajor != 1 || r.ProtoMinor > 1:
		status, reason = http.StatusHTTPVersionNotSupported, "unsupported http version "+r.Proto
	case r.Method == http.MethodConnect:
		status, reason = http.StatusMethodNotAllowed, "CONNECT is not proxied"
	case strings.IndexByte(r.RequestURI, '#') >= 0:
		reason = "fragment in the request target"
	case !validHost(r.Host):
		reason = "invalid host"
	default:
		return false
	}
	h := w.Header()
	h.Set("Connection", "close")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(strconv.Itoa(status) + " " + http.StatusText(status) + ": " + reason + "\n"))
	return true
}

// validHost reports whether every byte of h may appear in a Host field
// (uri-host and port, as net/http's server checks the Host field and the
// event loop checks both the field and an absolute-form target's host).
func validHost(h string) bool {
	for i := range len(h) {
		c := h[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!$%&'()*+,-.:;=[]_~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// acceptPauseErr reports whether an accept error is the process or the
// system running out of descriptors or socket memory: both engines back
// off (net/http's Serve 5ms doubling to 1s for a temporary error, the
// event loop the same) and the metric counts it.
func acceptPauseErr(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// CountAcceptPauses wraps the net-http engine's listener so that note is
// told of the accept errors net/http's Serve backs off on (acceptPauseErr).
func CountAcceptPauses(ln net.Listener, note func(error)) net.Listener {
	return countingListener{Listener: ln, note: note}
}

type countingListener struct {
	net.Listener
	note func(error)
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && acceptPauseErr(err) {
		l.note(err)
	}
	return c, err
}

// AcceptPaused counts an accept back-off (eventloop.Config.AcceptPaused,
// CountAcceptPauses) in edgeguard_l7_accept_paused_total.
func (p *Proxy) AcceptPaused(error) { p.acceptPauses.Add(1) }

// acceptPausesMetric is edgeguard_l7_accept_paused_total.
func (p *Proxy) acceptPausesMetric() prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "edgeguard_l7_accept_paused_total",
		Help: "Times the L7 listener stopped accepting for a while (5ms doubling to 1s) because accept ran out of " +
			"file descriptors or socket memory (EMFILE, ENFILE, ENOBUFS, ENOMEM).",
	}, func() float64 { return float64(p.acceptPauses.Load()) })
}

// checkResponse is the net-http engine's ReverseProxy.ModifyResponse: it
// holds an upstream's response to what the event loop relays. net/http's
// client takes any HTTP/1.x or HTTP/2.0 status line, a status below 100,
// control bytes in the reason phrase and header field names with spaces, and ReverseProxy copies a Content-Length field as the
// upstream spelled it ("002"): a response head that a client behind could
// read differently. A response the event loop answers 502 is an error here
// (ErrorHandler: 502); a Content-Length is written in decimal.
func checkResponse(res *http.Response) error {
	if res.ProtoMajor != 1 || res.ProtoMinor > 1 {
		return fmt.Errorf("unsupported http version %s in the upstream's response", res.Proto)
	}
	if res.StatusCode < 100 {
		return fmt.Errorf("status %d in the upstream's response", res.StatusCode)
	}
	for i := range len(res.Status) {
		if c := res.Status[i]; c < ' ' && c != '\t' || c == 0x7f {
			return fmt.Errorf("control byte in the upstream's status line")
		}
	}
	for name := range res.Header {
		if !validFieldName(name) {
			return fmt.Errorf("invalid header field name %q in the upstream's response", name)
		}
	}
	if _, ok := res.Header["Content-Length"]; ok && res.ContentLength >= 0 {
		res.Header["Content-Length"] = []string{strconv.FormatInt(res.ContentLength, 10)}
	}
	return nil
}

// validFieldName reports whether name is a token (RFC 9110 5.6.2).
func validFieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := range len(name) {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
