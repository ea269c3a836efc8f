package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7/eventloop"
	"github.com/edgeguard/edgeguard/internal/l7/target"
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

// Head bounds of the net-http engine, the event loop's: a request head of
// at most 64 KiB (http.Server.MaxHeaderBytes, to which net/http adds 4 KiB
// of slack) and 128 fields, else 431 and the connection closed.
const (
	MaxHeaderBytes = 60 << 10
	maxHeadFields  = 128
)

// ApplyRules sets the fields of an event loop's configuration that follow
// the policy's request rules (paths, identity fields, timeouts), for the L7
// stage (and the tests) that build it.
func (c *Config) ApplyRules(ec *eventloop.Config) {
	ec.StrictPaths = c.Paths.Strict
	ec.PathsAsSent = c.Paths.AsSent
	ec.IdentityFields = c.IdentityFields
	ec.TunnelIdleTimeout = c.Timeouts.TunnelIdle
	ec.MinRate = c.Timeouts.MinRate
	if c.Timeouts.Body > 0 {
		ec.BodyReadTimeout = c.Timeouts.Body
	}
	ec.ResponseTimeout = c.Timeouts.Response
}

// dropIdentityFields removes from a request going upstream under the
// net-http engine the client-set identity fields (Config.IdentityFields)
// and every field whose name holds an underscore, as the event loop does
// (eventloop.Config.IdentityFields).
func (p *Proxy) dropIdentityFields(h http.Header) {
	for _, name := range p.cfg.IdentityFields {
		delete(h, name)
	}
	for name := range h {
		if strings.IndexByte(name, '_') >= 0 {
			delete(h, name)
		}
	}
}

// Decide is the event loop's way in: the decision for r, made on the loop.
// A route that may block (a concurrency limit, Redis) is decided on a
// goroutine; the others here, where only local limits run.
func (p *Proxy) Decide(w http.ResponseWriter, r *http.Request) eventloop.Decision {
	if r.RequestURI == "*" {
		// OPTIONS * (the event loop refuses any other method with "*"):
		// a question about the proxy, answered here as net/http's server
		// answers it, never forwarded.
		w.Header()["Content-Length"] = []string{"0"}
		w.WriteHeader(http.StatusOK)
		return eventloop.Respond()
	}
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
	if !p.forwardNetHTTP(w, r) {
		return
	}
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
	case headFields(r) > maxHeadFields:
		status, reason = http.StatusRequestHeaderFieldsTooLarge, "more than 128 header fields"
	case r.RequestURI == "*":
		// net/http's server answers OPTIONS * itself (200, as the event
		// loop's Decide does); any other method is 400 under both.
		reason = "asterisk-form target is only for OPTIONS"
	case !validHost(r.Host):
		reason = "invalid host"
	default:
		return false
	}
	refuseRequest(w, status, reason)
	return true
}

// headFields counts the fields of r's head as the event loop does (Host
// included).
func headFields(r *http.Request) int {
	n := 0
	for _, vs := range r.Header {
		n += len(vs)
	}
	if r.Host != "" {
		n++
	}
	return n
}

// refuseRequest answers a request the proxy refuses before routing, closing the
// connection.
func refuseRequest(w http.ResponseWriter, status int, reason string) {
	h := w.Header()
	h.Set("Connection", "close")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(strconv.Itoa(status) + " " + http.StatusText(status) + ": " + reason + "\n"))
}

// normalizeNetHTTP puts the normal form of r's path (target.Normalize,
// from the target as sent) in r.URL, where routing reads it decoded
// (Path) and ReverseProxy forwards it encoded (RawPath, which
// url.URL.EscapedPath returns as is: a normal path holds only bytes it
// accepts). A path the rule refuses is answered 400 (false). The event
// loop does the same in its buildRequest.
func (p *Proxy) normalizeNetHTTP(w http.ResponseWriter, r *http.Request) bool {
	raw, _, _, ok := target.Split(r.RequestURI)
	if !ok {
		return true // "*" for OPTIONS (answered by net/http)
	}
	n, err := target.Normalize(raw, p.cfg.Paths.Strict)
	if err != nil {
		refuseRequest(w, http.StatusBadRequest, err.Error())
		return false
	}
	r.URL.Path, r.URL.RawPath = target.Decode(n), n
	return true
}

// pathAsSent puts the path of in's target as the client sent it back into
// out (l7.paths.forward: as-sent), before ReverseProxy joins the upstream's
// path in front. Bytes that may not stand raw in a path (a backslash, raw
// UTF-8) are percent-encoded by net/url; the event loop sends them raw.
func pathAsSent(out *url.URL, in *http.Request) {
	raw, _, _, ok := target.Split(in.RequestURI)
	if !ok {
		return
	}
	if raw == "" {
		raw = "/"
	}
	dec, err := url.PathUnescape(raw)
	if err != nil {
		return
	}
	out.Path, out.RawPath = dec, raw
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
