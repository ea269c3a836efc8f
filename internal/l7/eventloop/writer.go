package eventloop

import (
	"net/http"
	"time"
)

// writer is the http.ResponseWriter the handler gets: it keeps the status,
// header fields and body of a response the handler writes itself, and the
// header fields to add to the upstream's response when it decides Forward.
type writer struct {
	c      *conn
	hdr    http.Header
	status int
	body   []byte
	// forward: the handler decided Forward (or called Relay.Forward).
	// async: the handler runs on its own goroutine; Relay.Forward then
	// waits on done for the relay's end.
	forward, async bool
	done           chan struct{}
	// later is the decision Continue handed to a goroutine; panicked: the
	// handler panicked (the loop answers for it).
	later    OffLoop
	panicked bool
}

func (w *writer) reset() {
	clear(w.hdr)
	w.status = 0
	w.body = w.body[:0]
	w.forward = false
	w.later = nil
}

// Header returns the header fields of the response (sent with the
// upstream's on Forward).
func (w *writer) Header() http.Header { return w.hdr }

// WriteHeader sets the status of a response the handler answers itself.
func (w *writer) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

// Write appends to the body of a response the handler answers itself.
func (w *writer) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.body = append(w.body, p...)
	return len(p), nil
}

// signal ends an async Forward's wait (at most one is pending).
func (w *writer) signal() {
	if w.done == nil {
		return
	}
	select {
	case w.done <- struct{}{}:
	default:
	}
}

// Handler decides the requests a Server reads. Decide runs on the event
// loop and must not block: it answers the request itself (writes a
// response on w and returns Respond), has it proxied (Forward), or hands
// a decision that may block (a Redis round trip, a concurrency queue) to
// a goroutine (Continue), so the loop goes on with its other connections.
type Handler interface {
	Decide(w http.ResponseWriter, r *http.Request) Decision
}

// Decision is a Handler's verdict on one request: Respond, Forward or
// Continue.
type Decision struct {
	forward bool
	later   OffLoop
	obs     Observer
}

// Observe returns d with o to be told how the request ended (Observer.Done):
// its status and durations, once, on the loop.
func (d Decision) Observe(o Observer) Decision {
	d.obs = o
	return d
}

// Observer is told, once per request whose Decision named it, how the
// request ended: after its response is queued for the client in full, or
// when the connection closed first (Exchange.Aborted). Done runs on the
// loop and must not block; e.Request is valid only during the call.
type Observer interface {
	Done(e Exchange)
}

// Exchange is what the engine saw of one request, for metrics and the
// access log. Durations are read on the loop's clock, which advances once
// per epoll wake-up: each is accurate to the time the loop spends on one
// batch of events.
type Exchange struct {
	Request *http.Request
	// Status is the final status sent (the handler's, or the upstream's;
	// 101 for an upgrade, reported when the tunnel closes); 0 when the
	// connection closed before any response.
	Status int
	// Total runs from the request head's arrival to the end of the
	// response (or of the connection).
	Total time.Duration
	// Upstream runs from the first upstream dial or send (retries
	// included) to the end of the upstream's response, 0 when the request
	// was never forwarded.
	Upstream time.Duration
	// Forwarded: the request was sent to the upstream.
	Forwarded bool
	// Aborted: the connection closed before the response was complete.
	Aborted bool
}

// Respond is the decision of a handler that wrote the response on w (a
// 429, a 503): status, header fields, body. A handler that wrote nothing
// answers 200 with an empty body.
func Respond() Decision { return Decision{} }

// Forward is the decision to proxy the request to the upstream; the header
// fields set on w (RateLimit, RateLimit-Policy) are added to the
// upstream's response. A handler that also wrote a status on w is answered
// with what it wrote instead: a response written is never dropped.
func Forward() Decision { return Decision{forward: true} }

// Continue is the decision to decide off the loop: h runs on its own
// goroutine with a request whose context ends when the client leaves, and
// the loop resumes the connection when h returns. A nil h is Respond.
func Continue(h OffLoop) Decision { return Decision{later: h} }

// OffLoop decides a request on a goroutine: it writes a response on w, or
// calls relay.Forward to have the request proxied. Forward returns once
// the response has been relayed (or failed), so what h holds across the
// call (a concurrency slot) is held for the whole exchange, as under
// net/http; the client's next request is read once h has returned.
type OffLoop func(w http.ResponseWriter, r *http.Request, relay *Relay)

// Relay proxies a request decided off the loop (OffLoop).
type Relay struct {
	w    *writer
	used bool
}

// Observer is the Observer the Continue decision named (Decision.Observe),
// or nil: the off-loop decision notes what it decides there.
func (rl *Relay) Observer() Observer {
	if rl == nil {
		return nil
	}
	return rl.w.c.obs
}

// Forward proxies the request to the upstream, with the header fields set
// on the handler's writer added to the upstream's response, and returns
// when the response has been relayed or has failed. Only the first call
// does anything; a response written on the writer before it is dropped.
func (rl *Relay) Forward() {
	if rl == nil || rl.used {
		return
	}
	rl.used = true
	ew := rl.w
	ew.forward = true
	ew.status = 0
	ew.body = ew.body[:0]
	c := ew.c
	c.l.post(func() {
		c.startForward()
		c.step()
	})
	<-ew.done
}
