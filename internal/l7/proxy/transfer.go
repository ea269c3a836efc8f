package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// The net-http engine's transfer periods (Config.Timeouts), the rule the
// event loop applies in its sweep (eventloop.Config.BodyReadTimeout,
// ResponseTimeout, MinRate): while the proxy waits for the client, inside
// a read of the request body or a write of the response, each period must
// move at least MinRate bytes a second (and one byte). The time counted
// is the time spent waiting inside those reads and writes, so a slow
// upstream (which holds the copy elsewhere) never counts against the
// client.

// errSlowBody and errSlowClient end a transfer that fell below its rate.
var (
	errSlowBody   = errors.New("request body slower than the minimum rate")
	errSlowClient = errors.New("client takes its response slower than the minimum rate")
)

// leastPerPeriod is the bytes a period must move.
func (t Timeouts) leastPerPeriod(period time.Duration) int64 {
	return max(t.MinRate*int64(period)/int64(time.Second), 1)
}

// rateBody is a request body held to Timeouts.Body and MinRate. Its err,
// when set, is why it ended early: BadGateway answers 408 (too slow) or
// 400 (malformed: a bad chunk) instead of 502, and closes the connection.
type rateBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	period time.Duration
	least  int64
	waited time.Duration
	got    int64
	done   bool
	err    error
}

func (b *rateBody) Read(p []byte) (int, error) {
	if b.done {
		if b.err != nil {
			return 0, b.err
		}
		return b.ReadCloser.Read(p)
	}
	start := time.Now()
	_ = b.rc.SetReadDeadline(start.Add(b.period - b.waited))
	n, err := b.ReadCloser.Read(p)
	b.waited += time.Since(start)
	b.got += int64(n)
	switch {
	case errors.Is(err, io.EOF):
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.done, b.err = true, fmt.Errorf("%w: %d bytes in %v", errSlowBody, b.got, b.period)
		return n, b.err
	case err != nil:
		b.done, b.err = true, err
	case b.waited >= b.period:
		if b.got < b.least {
			b.done, b.err = true, fmt.Errorf("%w: %d bytes in %v", errSlowBody, b.got, b.period)
			return n, b.err
		}
		b.waited, b.got = 0, 0
	}
	return n, err
}

// bodyStatus is the answer to a request whose upstream exchange failed
// because of its own body (0: it did not).
func bodyStatus(r *http.Request) int {
	ex := exchangeOf(r)
	switch {
	case ex == nil || ex.body == nil || ex.body.err == nil:
		return 0
	case errors.Is(ex.body.err, errSlowBody):
		return http.StatusRequestTimeout
	}
	return http.StatusBadRequest
}

// rateWriter is a response writer held to Timeouts.Response and MinRate.
type rateWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	period  time.Duration
	least   int64
	blocked time.Duration
	got     int64
	// slow: the writer cut the client for its slowness (a period below
	// the rate, or a write past its deadline): the upstream exchange is
	// cut with it (abandon.go).
	slow bool
}

func (w *rateWriter) Write(p []byte) (int, error) {
	start := time.Now()
	_ = w.rc.SetWriteDeadline(start.Add(w.period - w.blocked))
	n, err := w.ResponseWriter.Write(p)
	return n, w.account(start, n, err)
}

// Flush writes what net/http buffered, under the same rule.
func (w *rateWriter) Flush() {
	start := time.Now()
	_ = w.rc.SetWriteDeadline(start.Add(w.period - w.blocked))
	_ = w.account(start, 0, w.rc.Flush())
}

func (w *rateWriter) account(start time.Time, n int, err error) error {
	w.blocked += time.Since(start)
	w.got += int64(n)
	if err != nil || w.blocked < w.period {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.slow = true
		}
		return err
	}
	if w.got < w.least {
		w.slow = true
		return fmt.Errorf("%w: %d bytes in %v", errSlowClient, w.got, w.period)
	}
	w.blocked, w.got = 0, 0
	return nil
}

// Unwrap lets http.ResponseController reach net/http's writer (hijacking
// for an upgrade, full duplex).
func (w *rateWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// holdTransfers wraps r's body and w for the net-http engine (the writer
// in ex, which is pooled).
func (p *Proxy) holdTransfers(ex *flight, w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	t := p.cfg.Timeouts
	if t.Body <= 0 || t.Response <= 0 {
		return w
	}
	ex.rw = rateWriter{ResponseWriter: w, rc: http.NewResponseController(w), period: t.Response,
		least: t.leastPerPeriod(t.Response)}
	if ex.rw.rc.SetWriteDeadline(time.Now().Add(t.Response)) != nil {
		return w // not net/http's server (a test's recorder)
	}
	ex.rwInUse = true
	if r.Body != nil && r.Body != http.NoBody {
		// Not in the pooled flight: http.Transport may still read a
		// request body after the handler returned.
		ex.body = &rateBody{ReadCloser: r.Body, rc: ex.rw.rc, period: t.Body, least: t.leastPerPeriod(t.Body)}
		r.Body = ex.body
	}
	return &ex.rw
}

// endTransfers gives the response's last bytes, which net/http writes
// after the handler returned, one more period.
func (ex *flight) endTransfers() {
	if ex.rwInUse {
		_ = ex.rw.rc.SetWriteDeadline(time.Now().Add(ex.rw.period))
	}
}

// tunnelIdle closes an upgraded exchange (a 101: ReverseProxy copies
// bytes both ways between the client and res.Body, the upstream
// connection) that carried nothing either way for idle; closing the
// upstream side ends ReverseProxy's copy, which closes the client's.
func tunnelIdle(res *http.Response, idle time.Duration) {
	rwc, ok := res.Body.(io.ReadWriteCloser)
	if !ok || idle <= 0 {
		return
	}
	t := &idleTunnel{ReadWriteCloser: rwc, idle: idle}
	t.timer = time.AfterFunc(idle, func() { _ = rwc.Close() })
	res.Body = t
}

// idleTunnel is the upstream side of a tunnel; every byte either way
// restarts its timer.
type idleTunnel struct {
	io.ReadWriteCloser
	idle  time.Duration
	timer *time.Timer
}

func (t *idleTunnel) Read(p []byte) (int, error) {
	n, err := t.ReadWriteCloser.Read(p)
	if n > 0 {
		t.timer.Reset(t.idle)
	}
	return n, err
}

func (t *idleTunnel) Write(p []byte) (int, error) {
	n, err := t.ReadWriteCloser.Write(p)
	if n > 0 {
		t.timer.Reset(t.idle)
	}
	return n, err
}

func (t *idleTunnel) Close() error {
	t.timer.Stop()
	return t.ReadWriteCloser.Close()
}
