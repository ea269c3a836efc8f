package proxy

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"
)

// A request the upstream has keeps its concurrency slots (route, global,
// and its class's share) until the upstream exchange is over, even when
// its client leaves first: an upstream that ignores a closed connection
// goes on working, and a slot freed at the client's departure would let
// the proxy send it more than its configured capacity. Both engines, one
// rule (docs/l7-shedding.md, "Clients that leave"):
//
//   - the client left before the upstream got any of its request: it is
//     not sent;
//   - the client left with its request body unfinished: the upstream
//     connection is closed (the upstream cannot have a whole request);
//   - otherwise the exchange is let finish, as nginx's
//     proxy_ignore_client_abort on: the proxy waits for the response and
//     reads it to its end, dropping it, and only then frees the slot. From
//     the client's departure the upstream has Timeouts.Response to finish;
//     then its connection is closed and the slot freed.
//
// A client the proxy cuts for taking its response too slowly (the minimum
// rate) is not a departure: the upstream connection is cut with it, as
// issue 29 asks: an upstream writing a response sees that at its next
// write.
//
// The event loop does the same in conn.clientGone; this is the net-http
// engine's half.

// upstreamExchange is one request's exchange with the upstream under the
// net-http engine: its context ends when the proxy ends the exchange, not
// when the client leaves.
type upstreamExchange struct {
	ctx    context.Context
	cancel context.CancelFunc
	bound  time.Duration
	rw     *rateWriter // the client's writer, when held to the rate
	// stopWatch ends the watch on the client's context.
	stopWatch func() bool
	mu        sync.Mutex
	timer     *time.Timer // armed once the client has left
	ended     bool
}

type upstreamExchangeKey struct{}

// newUpstreamExchange starts r's upstream exchange: bound is how long the
// upstream has to finish once the client has left.
func newUpstreamExchange(r *http.Request, bound time.Duration) *upstreamExchange {
	if bound <= 0 {
		bound = DefaultResponseTimeout
	}
	up := &upstreamExchange{bound: bound}
	up.ctx, up.cancel = context.WithCancel(context.WithValue(context.WithoutCancel(r.Context()), upstreamExchangeKey{}, up))
	up.stopWatch = context.AfterFunc(r.Context(), up.clientLeft)
	return up
}

// slowClient reports whether the proxy cut the client for its slowness.
func (up *upstreamExchange) slowClient() bool { return up.rw != nil && up.rw.slow }

func upstreamExchangeOf(r *http.Request) *upstreamExchange {
	if r == nil {
		return nil
	}
	up, _ := r.Context().Value(upstreamExchangeKey{}).(*upstreamExchange)
	return up
}

// clientLeft gives the upstream its bound to finish.
func (up *upstreamExchange) clientLeft() {
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.timer == nil && !up.ended {
		up.timer = time.AfterFunc(up.bound, up.cancel)
	}
}

// end is the end of the exchange (the handler's return).
func (up *upstreamExchange) end() {
	up.stopWatch()
	up.mu.Lock()
	up.ended = true
	if up.timer != nil {
		up.timer.Stop()
	}
	up.mu.Unlock()
	up.cancel()
}

// finishBody is an upstream response's body. ReverseProxy closes it
// early when it cannot write to the client; unless the proxy cut the
// client for its slowness, Close then reads the rest and drops it (within
// the upstream's bound), so the exchange ends when the upstream's
// response does.
type finishBody struct {
	io.ReadCloser
	up  *upstreamExchange
	eof bool
}

func (b *finishBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *finishBody) Close() error {
	if !b.eof && !b.up.slowClient() {
		b.up.clientLeft() // the write to the client failed: it is gone
		_, _ = io.Copy(io.Discard, b.ReadCloser)
	}
	return b.ReadCloser.Close()
}
