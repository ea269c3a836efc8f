package eventloop

import (
	"net/http"
)

// writer is the http.ResponseWriter the handler gets: it keeps the status,
// header fields and body of a response the handler writes itself, and the
// header fields to add to the upstream's response when it calls Forward.
type writer struct {
	c      *conn
	hdr    http.Header
	status int
	body   []byte
	// forward: the handler called Forward. async: the handler runs on its
	// own goroutine; Forward then waits on done for the relay's end.
	forward, async bool
	done           chan struct{}
	// later is the handler Go asked to run on a goroutine; panicked: the
	// handler panicked (the loop answers for it).
	later    http.Handler
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

// Forward has the request proxied to the upstream when w is the engine's
// writer: the header fields set on w are added to the upstream's response.
// On a request whose handler runs on its own goroutine (Go), Forward
// returns when the response has been relayed (or failed). It
// reports false, doing nothing, for any other writer: the caller then
// proxies by other means.
func Forward(w http.ResponseWriter, r *http.Request) bool {
	ew, ok := w.(*writer)
	if !ok {
		return false
	}
	ew.forward = true
	if ew.async {
		c := ew.c
		c.l.post(func() {
			c.startForward()
			c.step()
		})
		<-ew.done
	}
	return true
}

// Go has h decide the request on its own goroutine when w is the engine's
// writer and the caller runs on the loop: for a decision that may block (a
// Redis round trip, a concurrency queue), so the loop goes on with its other
// connections meanwhile. h gets a request whose context ends when the client
// leaves. The caller must return at once and must not have written a
// response. Go reports false, doing nothing, for any other writer or when
// already on a goroutine: the caller then runs h itself.
func Go(w http.ResponseWriter, r *http.Request, h http.Handler) bool {
	ew, ok := w.(*writer)
	if !ok || ew.async {
		return false
	}
	ew.later = h
	return true
}
