package eventloop

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/l7/target"
)

// connState is where a client connection is in its request.
type connState uint8

const (
	stateHead    connState = iota // reading a request head (or idle)
	stateHandler                  // the handler runs on its goroutine
	stateForward                  // relaying a request and its response
	stateTunnel                   // after a 101: bytes both ways
	stateClosing                  // flushing the last bytes before closing
	stateClosed
)

// readiness is what epoll's edges said about a socket: the loop keeps it,
// as edge-triggered events come once per change.
type readiness struct {
	readable bool // there may be bytes (or the end) to read
	writable bool // the socket may take bytes
	// peerClosed: the peer closed its side (EPOLLRDHUP). A short read then
	// no longer means drained: the end is still to be read, and no new
	// edge will announce it.
	peerClosed bool
}

// note takes an epoll event in; it reports whether the peer has closed.
func (r *readiness) note(ev uint32) bool {
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		r.readable = true
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		r.writable = true
	}
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		r.peerClosed = true
	}
	return r.peerClosed
}

// ioBuf holds bytes read and not yet consumed: b[r:].
type ioBuf struct {
	b []byte
	r int
}

func (b *ioBuf) data() []byte { return b.b[b.r:] }

func (b *ioBuf) pending() int { return len(b.b) - b.r }

// consume drops n bytes; an emptied buffer goes back to the loop.
func (b *ioBuf) consume(l *loop, n int) {
	b.r += n
	if b.r == len(b.b) {
		l.putBuf(b.b)
		b.b, b.r = nil, 0
	}
}

func (b *ioBuf) release(l *loop) {
	if b.b != nil {
		l.putBuf(b.b)
		b.b, b.r = nil, 0
	}
}

// readFrom reads once from fd into b, growing it up to limit bytes of
// unconsumed data. It returns the bytes read, whether the socket is drained
// for now (a short read or EAGAIN), and whether the peer closed its side.
func (b *ioBuf) readFrom(l *loop, fd, limit int) (n int, drained, eof bool, err error) {
	if b.b == nil {
		b.b = l.getBuf()
	}
	if b.r > 0 && cap(b.b)-len(b.b) < 4096 {
		k := copy(b.b[:cap(b.b)], b.b[b.r:])
		b.b, b.r = b.b[:k], 0
	}
	if len(b.b) == cap(b.b) {
		if cap(b.b) >= limit {
			return 0, false, false, nil // full: the caller decides
		}
		nb := make([]byte, len(b.b), min(2*cap(b.b), limit))
		copy(nb, b.b)
		b.b = nb
	}
	room := cap(b.b) - len(b.b)
	n, err = rawRead(fd, b.b[len(b.b):cap(b.b)])
	switch {
	case errors.Is(err, unix.EAGAIN):
		return 0, true, false, nil
	case errors.Is(err, unix.EINTR):
		return 0, false, false, nil
	case err != nil:
		return 0, true, false, err
	case n == 0:
		return 0, true, true, nil
	}
	b.b = b.b[:len(b.b)+n]
	return n, n < room, false, nil
}

// outBuf holds bytes to write: b[w:].
type outBuf struct {
	b []byte
	w int
}

func (o *outBuf) pending() int { return len(o.b) - o.w }

func (o *outBuf) grow(l *loop) []byte {
	if o.b == nil {
		o.b = l.getBuf()
	}
	return o.b
}

// flushTo writes what is pending to fd once. It reports whether it wrote
// anything and whether the socket is full for now.
func (o *outBuf) flushTo(l *loop, fd int) (wrote, full bool, err error) {
	if o.pending() == 0 {
		return false, false, nil
	}
	n, err := rawWrite(fd, o.b[o.w:])
	switch {
	case errors.Is(err, unix.EAGAIN):
		return false, true, nil
	case errors.Is(err, unix.EINTR):
		return false, false, nil
	case err != nil:
		return false, true, err
	}
	o.w += n
	if o.w == len(o.b) {
		l.putBuf(o.b)
		o.b, o.w = nil, 0
		return n > 0, false, nil
	}
	if o.w >= len(o.b)-o.w {
		// A socket that never drains whole (a slow reader, more queued
		// behind each write) would keep everything ever queued on it:
		// move the rest to the front once it is no longer than what was
		// written, so the copying is bounded by the bytes written.
		o.b = o.b[:copy(o.b, o.b[o.w:])]
		o.w = 0
	}
	return n > 0, true, nil
}

func (o *outBuf) release(l *loop) {
	if o.b != nil {
		l.putBuf(o.b)
		o.b, o.w = nil, 0
	}
}

// bodyKind is how a message's body ends.
type bodyKind uint8

const (
	bodyNone    bodyKind = iota // no body
	bodyLength                  // Content-Length bytes
	bodyChunked                 // the chunked framing's end
	bodyEOF                     // the connection's end (responses only)
)

type bodyFraming struct {
	kind   bodyKind
	left   int64
	chunks chunkedScanner
	done   bool
}

func (b *bodyFraming) set(kind bodyKind, length int64) {
	b.kind, b.left, b.done = kind, length, false
	switch kind {
	case bodyNone:
		b.done = true
	case bodyLength:
		b.done = length == 0
	case bodyChunked:
		b.chunks.reset()
	}
}

// take returns how many bytes at the start of p belong to the body and
// notes its end.
func (b *bodyFraming) take(p []byte) (int, error) {
	switch b.kind {
	case bodyLength:
		n := min(int64(len(p)), b.left)
		b.left -= n
		b.done = b.left == 0
		return int(n), nil
	case bodyChunked:
		n, done, err := b.chunks.scan(p)
		if done {
			b.done = true
		}
		return n, err
	case bodyEOF:
		return len(p), nil
	}
	b.done = true
	return 0, nil
}

// conn is a client connection.
type conn struct {
	l          *loop
	fd         int
	peer       netip.Addr
	remoteAddr string // r.RemoteAddr: "ip:port"
	peerIP     string // for X-Forwarded-For

	in  ioBuf
	out outBuf
	readiness
	state      connState
	closeAfter bool // close once the current response is out
	headSeen   int  // input bytes known not to end a request head
	holdOut    bool // output waits for a handler on its goroutine to return
	// abandoned: the client left while the upstream had its request;
	// the relay reads the response to its end and drops it (clientGone).
	abandoned bool
	deadline  int64 // loop time; 0: none
	// The transfer periods (Config.BodyReadTimeout, ResponseTimeout,
	// MinRate): rx and tx count the bytes read from and written to the
	// client; a period starts at bodyFrom / respFrom (loop time, 0: none
	// running) with rx / tx at bodyAt / respAt.
	rx, tx           int64
	bodyFrom, bodyAt int64
	respFrom, respAt int64

	head    requestHead
	headBuf []byte // a copy of the head's bytes, which head's fields point into
	req     http.Request
	url     url.URL
	hdr     http.Header
	vals    []string // backing store of hdr's one-value slices
	w       writer
	reqBody bodyFraming
	isHEAD  bool
	retried bool
	cancel  context.CancelFunc
	// fwdTarget is the request target sent upstream (before the
	// upstream's own path is joined in front): the normal form of the
	// client's, or the client's as sent.
	fwdTarget string

	up          *upConn
	resp        responseHead
	respBody    bodyFraming
	respHead    bool // the final response head has been read
	respStarted bool // bytes of a response have been queued for the client

	// The request's observation (Decision.Observe): nil when none is
	// pending. tStart, tUp and tUpEnd are loop times (tUp 0: not
	// forwarded); status is the final status queued.
	obs                 Observer
	tStart, tUp, tUpEnd int64
	status              int
}

func newConn(l *loop, fd int, peer netip.AddrPort) *conn {
	c := &conn{l: l, fd: fd, peer: peer.Addr(), remoteAddr: peer.String(), peerIP: peer.Addr().String(),
		hdr: make(http.Header, 16), readiness: readiness{readable: true, writable: true}}
	c.w = writer{c: c, hdr: make(http.Header, 8)}
	return c
}

func (c *conn) buffered() int { return c.in.pending() }

func (c *conn) event(ev uint32) {
	if c.note(ev) {
		// The client closed (at least its sending side). Like net/http,
		// a request it is waiting for is abandoned: its handler's context
		// is cancelled, its relay is cut.
		if c.state == stateHandler && c.cancel != nil {
			c.cancel()
		}
	}
	c.step()
}

// step makes every bit of progress the sockets allow.
func (c *conn) step() {
	for c.state != stateClosed {
		progress := false
		switch c.state {
		case stateHead:
			progress = c.stepHead()
		case stateForward:
			progress = c.stepForward()
		case stateTunnel:
			progress = c.stepTunnel()
		case stateClosing:
			if c.out.pending() == 0 {
				c.close()
				return
			}
		}
		// Write to the client only once nothing more can be queued: a
		// response head and its body (and pipelined responses) go out in
		// one write.
		if !progress && !c.flush() {
			return
		}
	}
}

func (c *conn) flush() bool {
	if !c.writable || c.state == stateClosed || c.holdOut {
		return false
	}
	before := c.out.pending()
	if c.abandoned {
		return false
	}
	wrote, full, err := c.out.flushTo(c.l, c.fd)
	if err != nil {
		c.clientGone()
		return false
	}
	c.tx += int64(before - c.out.pending())
	if full {
		c.writable = false
	}
	return wrote
}

// read reads once from the client.
func (c *conn) read(limit int) (n int, eof bool) {
	n, drained, eof, err := c.in.readFrom(c.l, c.fd, limit)
	c.rx += int64(n)
	if drained && !c.peerClosed {
		// (Once the client closed its side, a short read leaves the end
		// to be read, and no new edge will announce it.)
		c.readable = false
	}
	if err != nil {
		c.close()
		return 0, true
	}
	return n, eof
}

func (c *conn) stepHead() bool {
	if c.closeAfter {
		c.closing()
		return true
	}
	if c.out.pending() >= maxPending {
		return false // answer what is queued before reading on
	}
	if data := c.in.data(); len(data) > c.headSeen {
		// Parse only once a head can have ended (a line feed arrived) or
		// grown too long: a client sending a byte at a time costs linear
		// time, not quadratic.
		if indexByte(data[c.headSeen:], '\n') < 0 && len(data) <= maxHead {
			c.headSeen = len(data)
		} else {
			c.headSeen = 0
			n, err := parseRequestHead(data, &c.head, maxHead)
			if err != nil {
				c.malformed(err)
				return true
			}
			if n > 0 {
				c.begin(data[:n])
				return true
			}
			c.headSeen = len(data)
		}
	}
	if !c.readable {
		return false
	}
	empty := c.buffered() == 0
	n, eof := c.read(maxHead + 1)
	if c.state == stateClosed {
		return false
	}
	if eof {
		// The client is done: a partial head is dropped.
		c.closing()
		return true
	}
	if n > 0 && empty {
		c.deadline = c.l.now + int64(c.l.s.cfg.ReadHeaderTimeout)
	}
	return n > 0
}

// closing flushes what is queued, then closes (bounded by
// ReadHeaderTimeout for a client that does not read).
func (c *conn) closing() {
	c.state = stateClosing
	c.deadline = c.l.now + int64(c.l.s.cfg.ReadHeaderTimeout)
}

// malformed answers a request head the parser refused, and closes.
func (c *conn) malformed(err error) {
	status := http.StatusBadRequest
	var we *wireError
	if errors.As(err, &we) && we.status != 0 {
		status = we.status
	}
	text := strconv.Itoa(status) + " " + http.StatusText(status)
	b := c.out.grow(c.l)
	b = append(b, "HTTP/1.1 "...)
	b = append(b, text...)
	b = append(b, "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(text)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, text...)
	c.out.b = b
	c.closeAfter = true
	c.closing()
	c.l.s.log.Debug("l7 event loop: malformed request", "peer", c.remoteAddr, "err", err)
}

// begin starts a request whose head is the start of the input.
func (c *conn) begin(head []byte) {
	c.deadline = 0
	c.retried = false
	if err := c.buildRequest(head); err != nil {
		c.in.consume(c.l, len(head))
		c.malformed(err)
		return
	}
	c.keepHead(head)
	c.in.consume(c.l, len(head))
	switch {
	case c.head.chunked:
		c.reqBody.set(bodyChunked, 0)
	case c.head.contentLength > 0:
		c.reqBody.set(bodyLength, c.head.contentLength)
	default:
		c.reqBody.set(bodyNone, 0)
	}
	c.w.reset()
	c.tStart, c.tUp, c.tUpEnd, c.status = c.l.now, 0, 0, 0
	c.decide(&c.req, c.l.s.cfg.Handler)
	if c.w.panicked {
		c.answerPanic()
	} else if c.w.later != nil {
		c.runAsync()
		return
	}
	c.decided()
}

// keepHead copies the request head out of the input buffer, which is
// recycled (or compacted) once consumed, and points c.head's fields at the
// copy: the upstream head is written from them later (after a handler on
// its goroutine, on a retry), and even at once it is written into the
// recycled buffer itself.
func (c *conn) keepHead(head []byte) {
	c.headBuf = append(c.headBuf[:0], head...)
	kept := c.headBuf
	at := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		off := cap(head) - cap(b)
		return kept[off : off+len(b) : off+len(b)]
	}
	h := &c.head
	h.method, h.target, h.host = at(h.method), at(h.target), at(h.host)
	for i := range h.headers {
		h.headers[i].name, h.headers[i].value = at(h.headers[i].name), at(h.headers[i].value)
	}
	for i := range h.connection {
		h.connection[i] = at(h.connection[i])
	}
}

// decide asks h for its decision on the loop and notes it in c.w; a panic
// is logged and noted in c.w.panicked (the loop answers for it).
func (c *conn) decide(r *http.Request, h Handler) {
	defer c.recoverHandler(r)
	d := h.Decide(&c.w, r)
	c.w.forward, c.w.later, c.obs = d.forward, d.later, d.obs
}

// report tells the request's Observer how it ended, once. Not while its
// decision still runs on a goroutine (handlerReturned reports then): the
// observer may be in use there.
func (c *conn) report(aborted bool) {
	o := c.obs
	if o == nil || c.w.async {
		return
	}
	c.obs = nil
	e := Exchange{Request: &c.req, Status: c.status, Total: time.Duration(c.l.now - c.tStart), Aborted: aborted}
	if c.tUp != 0 {
		e.Forwarded = true
		end := c.tUpEnd
		if end == 0 {
			end = c.l.now
		}
		e.Upstream = time.Duration(end - c.tUp)
	}
	o.Done(e)
}

// decideOffLoop runs an OffLoop decision on its goroutine; a panic is
// logged and noted in c.w.panicked (the loop answers for it).
func (c *conn) decideOffLoop(r *http.Request, h OffLoop) {
	defer c.recoverHandler(r)
	h(&c.w, r, &Relay{w: &c.w})
}

func (c *conn) recoverHandler(r *http.Request) {
	if v := recover(); v != nil {
		c.l.s.log.Error("l7 event loop: handler panicked", "path", r.URL.Path, "panic", fmt.Sprint(v))
		c.w.panicked = true
	}
}

// answerPanic replaces whatever a panicking handler left with a 500, and
// closes after it.
func (c *conn) answerPanic() {
	c.w.reset()
	c.w.panicked = false
	c.w.status = http.StatusInternalServerError
	c.closeAfter = true
}

// runAsync runs the decision Continue handed over on its own goroutine;
// handlerReturned resumes the connection on the loop.
func (c *conn) runAsync() {
	c.state = stateHandler
	c.w.async = true
	if c.w.done == nil {
		c.w.done = make(chan struct{}, 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	if c.peerClosed {
		cancel()
	}
	r := c.req.WithContext(ctx)
	h := c.w.later
	c.w.later = nil
	s := c.l.s
	s.handlers.Add(1)
	go func() {
		defer s.handlers.Done()
		c.decideOffLoop(r, h)
		c.l.post(c.handlerReturned)
	}()
}

func (c *conn) handlerReturned() {
	if c.cancel != nil {
		c.cancel()
		c.cancel = nil
	}
	c.w.async = false
	c.holdOut = false
	if c.state == stateClosed {
		c.report(true)
		return
	}
	switch {
	case c.w.forward:
		// The relay has ended (Relay.Forward returned). A panic after it
		// closes the connection: a 500 now would answer no request.
		if c.w.panicked {
			c.w.panicked = false
			c.closeAfter = true
		}
		c.endRequest()
	case c.w.panicked:
		c.answerPanic()
		c.decided()
	default:
		c.decided()
	}
	c.step()
}

// decided acts on the handler's verdict.
func (c *conn) decided() {
	if c.w.forward && c.w.status == 0 {
		c.startForward()
		return
	}
	c.respondLocal()
	c.endRequest()
}

// endRequest readies the connection for its next request.
func (c *conn) endRequest() {
	c.report(false)
	c.state = stateHead
	c.respHead, c.respStarted = false, false
	if c.l.draining {
		c.closeAfter = true
	}
	if c.buffered() == 0 {
		c.deadline = c.l.now + int64(c.l.s.cfg.IdleTimeout)
	} else {
		c.deadline = c.l.now + int64(c.l.s.cfg.ReadHeaderTimeout)
	}
}

// skipBody drops the request's body when all of it is already read; it
// reports false when the connection cannot be reused (the body is still
// on its way or malformed).
func (c *conn) skipBody() bool {
	if c.reqBody.done {
		return true
	}
	data := c.in.data()
	n, err := c.reqBody.take(data)
	if err != nil || !c.reqBody.done {
		return false
	}
	c.in.consume(c.l, n)
	return true
}

// respondLocal queues the response the handler wrote itself.
func (c *conn) respondLocal() {
	if !c.skipBody() || !c.head.keepAlive {
		c.closeAfter = true
	}
	status := c.w.status
	if status == 0 {
		status = http.StatusOK
	}
	c.status = status
	b := c.out.grow(c.l)
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(status)...)
	b = append(b, "\r\n"...)
	if _, ok := c.w.hdr["Date"]; !ok {
		b = append(b, c.l.date...)
	}
	bodyAllowed := status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
	for k, vs := range c.w.hdr {
		for _, v := range vs {
			b = appendField(b, k, v)
		}
	}
	if _, ok := c.w.hdr["Content-Length"]; !ok && bodyAllowed {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(c.w.body)), 10)
		b = append(b, "\r\n"...)
	}
	b = c.appendConnection(b)
	b = append(b, "\r\n"...)
	if bodyAllowed && !c.isHEAD {
		b = append(b, c.w.body...)
	}
	c.out.b = b
	c.respStarted = true
}

func (c *conn) appendConnection(b []byte) []byte {
	switch {
	case c.closeAfter:
		return append(b, "Connection: close\r\n"...)
	case c.head.minor == 0:
		return append(b, "Connection: keep-alive\r\n"...)
	}
	return b
}

func appendField(b []byte, k, v string) []byte {
	b = append(b, k...)
	b = append(b, ": "...)
	b = append(b, v...)
	return append(b, "\r\n"...)
}

// buildRequest fills c.req from the parsed head: one string holds the
// head, every name and value is a substring of it.
func (c *conn) buildRequest(head []byte) error {
	h := &c.head
	s := string(head)
	sub := func(b []byte) string {
		if len(b) == 0 {
			return ""
		}
		off := cap(head) - cap(b)
		return s[off : off+len(b)]
	}
	method := sub(h.method)
	t := sub(h.target)
	if method == http.MethodConnect {
		return &wireError{status: http.StatusMethodNotAllowed, reason: "CONNECT is not proxied"}
	}
	if strings.IndexByte(t, '#') >= 0 {
		// RFC 9112 3.2: a request-target has no fragment. net/http would
		// take "/exact#x" as the path "/exact#x" (no route's "/exact"),
		// and an upstream that cuts the fragment off would serve /exact.
		return &wireError{status: http.StatusBadRequest, reason: "fragment in the request target"}
	}
	if e := fieldValue(h.headers, "Expect"); e != nil && !containsToken(e, "100-continue") {
		// As net/http's server: an expectation other than 100-continue
		// is 417, never forwarded (RFC 9110 10.1.1).
		return &wireError{status: http.StatusExpectationFailed, reason: "unsupported expectation"}
	}
	c.url = url.URL{}
	host := sub(h.host)
	cfg := &c.l.s.cfg
	raw, query, hasQuery, isPath := target.Split(t)
	switch {
	case t == "*":
		if method != http.MethodOptions {
			return &wireError{status: http.StatusBadRequest, reason: "asterisk-form target is only for OPTIONS"}
		}
		c.url.Path = "*"
	case !isPath:
		return &wireError{status: http.StatusBadRequest, reason: "bad request target"}
	case t[0] != '/':
		u, err := url.ParseRequestURI(t)
		if err != nil || u.Host == "" {
			return &wireError{status: http.StatusBadRequest, reason: "bad request target"}
		}
		// The target's host replaces the Host field (RFC 9112 3.2.2),
		// so it is held to the Host field's byte set: url.Parse lets
		// "a<script>" through.
		for i := range len(u.Host) {
			if !isHostByte(u.Host[i]) {
				return &wireError{status: http.StatusBadRequest, reason: "invalid host in the request target"}
			}
		}
		host = u.Host
		c.url.Scheme, c.url.Host = u.Scheme, u.Host
	}
	// Route by, and forward, the path's normal form (internal/l7/target;
	// the net-http engine's normalizeNetHTTP does the same).
	c.fwdTarget = t
	if isPath {
		n, err := target.Normalize(raw, cfg.StrictPaths)
		if err != nil {
			return &wireError{status: http.StatusBadRequest, reason: err.Error()}
		}
		c.url.Path, c.url.RawQuery, c.url.ForceQuery = target.Decode(n), query, hasQuery && query == ""
		if n != c.url.Path {
			c.url.RawPath = n
		}
		switch {
		case cfg.PathsAsSent && t[0] == '/':
		case cfg.PathsAsSent:
			c.fwdTarget = raw
			if raw == "" {
				c.fwdTarget = "/"
			}
			if hasQuery {
				c.fwdTarget += "?" + query
			}
		case n == raw && t[0] == '/':
			// Already normal: the target as sent (no allocation).
		case hasQuery:
			c.fwdTarget = n + "?" + query
		default:
			c.fwdTarget = n
		}
	}
	clear(c.hdr)
	c.vals = c.vals[:0]
	for i := range h.headers {
		f := &h.headers[i]
		key := textproto.CanonicalMIMEHeaderKey(sub(f.name))
		if key == "Host" {
			continue
		}
		v := sub(f.value)
		if old, ok := c.hdr[key]; ok {
			c.hdr[key] = append(old[:len(old):len(old)], v)
			continue
		}
		c.vals = append(c.vals, v)
		n := len(c.vals)
		c.hdr[key] = c.vals[n-1 : n : n]
	}
	proto := "HTTP/1.1"
	if h.minor == 0 {
		proto = "HTTP/1.0"
	}
	c.req = http.Request{
		Method:        method,
		URL:           &c.url,
		Proto:         proto,
		ProtoMajor:    1,
		ProtoMinor:    h.minor,
		Header:        c.hdr,
		Body:          http.NoBody,
		ContentLength: max(h.contentLength, 0),
		Close:         !h.keepAlive,
		Host:          host,
		RemoteAddr:    c.remoteAddr,
		RequestURI:    t,
	}
	if h.chunked {
		c.req.ContentLength = -1
		c.req.TransferEncoding = []string{"chunked"}
	}
	c.isHEAD = method == http.MethodHead
	return nil
}

// startForward sends the request to an upstream connection.
func (c *conn) startForward() {
	if c.state == stateClosed {
		c.w.signal()
		return
	}
	c.state = stateForward
	c.respHead, c.respStarted = false, false
	if c.tUp == 0 {
		c.tUp = max(c.l.now, 1)
	}
	u, err := c.l.upstream()
	if err != nil {
		c.upstreamFailed(err)
		return
	}
	c.up = u
	u.client = c
	u.sent = false
	c.queueUpstreamHead()
	c.bodyFrom, c.bodyAt, c.respFrom = c.l.now, c.rx, 0
}

// periodShort reports whether a transfer period that started at from
// with the counter at at is over and moved fewer than its minimum of
// bytes (at least one); a period that is over and moved enough starts the
// next one.
func (c *conn) periodShort(from, at *int64, count int64, period time.Duration) bool {
	if c.l.now-*from < int64(period) {
		return false
	}
	least := max(c.l.s.cfg.MinRate*int64(period)/int64(time.Second), 1)
	if count-*at < least {
		return true
	}
	*from, *at = c.l.now, count
	return false
}

// bodyOverdue reports whether the client is sending its request body
// slower than the relay allows: fewer than MinRate bytes a second over a
// BodyReadTimeout period (and nothing at all). While the upstream is not
// taking the body (connecting, or its queue full), the period starts over.
func (c *conn) bodyOverdue() bool {
	if c.state != stateForward || c.reqBody.done || c.up == nil {
		return false
	}
	if c.up.connecting || c.up.out.pending() >= maxPending {
		c.bodyFrom, c.bodyAt = c.l.now, c.rx
		return false
	}
	return c.periodShort(&c.bodyFrom, &c.bodyAt, c.rx, c.l.s.cfg.BodyReadTimeout)
}

// responseOverdue reports whether the client is taking its response
// slower than the relay allows: fewer than MinRate bytes a second over a
// ResponseTimeout period while bytes wait for it (a client that stopped
// reading). The period runs only while output is pending.
func (c *conn) responseOverdue() bool {
	if c.state != stateForward || c.out.pending() == 0 {
		c.respFrom = 0
		return false
	}
	if c.respFrom == 0 {
		c.respFrom, c.respAt = c.l.now, c.tx
		return false
	}
	return c.periodShort(&c.respFrom, &c.respAt, c.tx, c.l.s.cfg.ResponseTimeout)
}

// failRequestBody answers a request whose body cannot be relayed (a
// malformed chunk, a refused trailer: 400; too slow: 408) and closes: its
// upstream connection, which holds an unfinished message, at once; the
// client's after the answer, or at once when part of a response is out.
// The net-http engine answers the same (proxy.Proxy.BadGateway).
func (c *conn) failRequestBody(status int) {
	if c.up != nil {
		c.up.client = nil
		c.up.closeFD()
		c.up = nil
	}
	if c.respStarted || c.state != stateForward {
		c.close()
		return
	}
	c.tUpEnd = c.l.now
	c.w.status = status
	c.w.body = append(c.w.body[:0], strconv.Itoa(status)+" "+http.StatusText(status)+": request body\n"...)
	c.w.hdr["Content-Type"] = []string{"text/plain; charset=utf-8"}
	c.closeAfter = true
	c.respondLocal()
	c.afterRelay()
}

// upstreamTarget is the request target sent upstream: the client's, with
// the upstream URL's path and query joined in front when it has them.
func (c *conn) upstreamTarget() string {
	s := c.l.s
	t := c.fwdTarget
	if s.basePath == "" && s.baseQ == "" && t != "" && t[0] == '/' {
		return t
	}
	if t == "*" {
		return t
	}
	p, q, hasQuery := strings.Cut(t, "?")
	switch a, b := strings.HasSuffix(s.basePath, "/"), strings.HasPrefix(p, "/"); {
	case a && b:
		p = s.basePath + p[1:]
	case !a && !b:
		p = s.basePath + "/" + p
	default:
		p = s.basePath + p
	}
	switch {
	case s.baseQ != "" && q != "":
		q = s.baseQ + "&" + q
	case s.baseQ != "":
		q = s.baseQ
	}
	if q != "" || hasQuery {
		return p + "?" + q
	}
	return p
}

// queueUpstreamHead writes the request head for the upstream: hop-by-hop
// fields dropped, Host kept, X-Forwarded-For/-Host/-Proto set.
func (c *conn) queueUpstreamHead() {
	u, h, s := c.up, &c.head, c.l.s
	b := u.out.grow(c.l)
	b = append(b, h.method...)
	b = append(b, ' ')
	b = append(b, c.upstreamTarget()...)
	if h.minor == 0 {
		b = append(b, " HTTP/1.0\r\n"...)
	} else {
		b = append(b, " HTTP/1.1\r\n"...)
	}
	host := c.req.Host
	if host == "" {
		host = s.hostPort
	}
	b = appendField(b, "Host", host)
	trusted := s.cfg.TrustedPeer != nil && s.cfg.TrustedPeer(c.peer)
	var xff []byte
	wantTrailers := false
	var upgrade []byte
	for i := range h.headers {
		f := &h.headers[i]
		switch {
		case equalFold(f.name, "X-Forwarded-For"):
			if trusted {
				xff = append(append(xff, f.value...), ", "...)
			}
			continue
		case equalFold(f.name, "Te"):
			wantTrailers = wantTrailers || containsToken(f.value, "trailers")
			continue
		case equalFold(f.name, "Upgrade"):
			upgrade = f.value
			continue
		case framingField(f.name), hopByHop(f.name, h.connection), equalFold(f.name, "Host"),
			equalFold(f.name, "X-Forwarded-Host"), equalFold(f.name, "X-Forwarded-Proto"),
			equalFold(f.name, "Forwarded"), s.identityField(f.name):
			continue
		}
		b = append(b, f.name...)
		b = append(b, ": "...)
		b = append(b, f.value...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "X-Forwarded-For: "...)
	b = append(b, xff...)
	b = append(b, c.peerIP...)
	b = append(b, "\r\n"...)
	if c.req.Host != "" {
		b = appendField(b, "X-Forwarded-Host", c.req.Host)
	}
	b = append(b, "X-Forwarded-Proto: http\r\n"...)
	b = appendFraming(b, h.chunked, h.contentLength)
	if wantTrailers {
		b = append(b, "Te: trailers\r\n"...)
	}
	switch {
	case h.upgrade && upgrade != nil:
		b = append(b, "Connection: Upgrade\r\nUpgrade: "...)
		b = append(b, upgrade...)
		b = append(b, "\r\n"...)
	case h.minor == 0:
		b = append(b, "Connection: keep-alive\r\n"...)
	}
	b = append(b, "\r\n"...)
	u.out.b = b
}

// fieldValue is the value of the first field called name (any case), nil
// when there is none.
func fieldValue(fields []header, name string) []byte {
	for i := range fields {
		if equalFold(fields[i].name, name) {
			return fields[i].value
		}
	}
	return nil
}

// hopByHop reports whether a field is for this connection only: the
// RFC 9110 7.6.1 list and whatever the Connection fields name, except the
// framing fields. Content-Length and Transfer-Encoding frame the body that
// is relayed unchanged: a Connection field naming them does not remove
// them (dropping Content-Length but relaying the body would make the body
// the upstream's next request: request smuggling). The caller writes them
// itself (framingField).
func hopByHop(name []byte, connection [][]byte) bool {
	switch {
	case equalFold(name, "Connection"), equalFold(name, "Proxy-Connection"), equalFold(name, "Keep-Alive"),
		equalFold(name, "Proxy-Authenticate"), equalFold(name, "Proxy-Authorization"),
		equalFold(name, "Te"), equalFold(name, "Upgrade"):
		return true
	}
	if framingField(name) {
		return false
	}
	for _, t := range connection {
		if len(t) == len(name) && equalFoldBytes(t, name) {
			return true
		}
	}
	return false
}

// framingField reports whether name is Content-Length or
// Transfer-Encoding. The relay never copies them as received: it writes
// the framing the parser decided on, once, in one spelling
// (appendFraming), so that a recipient cannot read "Content-Length: 005",
// a repeated Content-Length or "Transfer-Encoding: ChUnKeD" differently.
func framingField(name []byte) bool {
	return equalFold(name, "Content-Length") || equalFold(name, "Transfer-Encoding")
}

// appendFraming writes the framing fields of a relayed message: exactly
// one of "Transfer-Encoding: chunked" and "Content-Length: N" (decimal, no
// leading zeros), or neither.
func appendFraming(b []byte, chunked bool, contentLength int64) []byte {
	switch {
	case chunked:
		return append(b, "Transfer-Encoding: chunked\r\n"...)
	case contentLength >= 0:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, contentLength, 10)
		return append(b, "\r\n"...)
	}
	return b
}

// equalFold compares ASCII case-insensitively.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		if lower(b[i]) != lower(s[i]) {
			return false
		}
	}
	return true
}

func equalFoldBytes(a, b []byte) bool {
	for i := range len(a) {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// containsToken reports whether a comma-separated list holds tok.
func containsToken(list []byte, tok string) bool {
	for len(list) > 0 {
		var item []byte
		if i := indexByte(list, ','); i >= 0 {
			item, list = list[:i], list[i+1:]
		} else {
			item, list = list, nil
		}
		item = trimOWS(item)
		if equalFold(item, tok) {
			return true
		}
	}
	return false
}

func indexByte(b []byte, c byte) int {
	for i := range b {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// stepForward relays the request body up and the response down.
func (c *conn) stepForward() bool {
	u := c.up
	progress := false
	if c.peerClosed && c.reqBody.done && c.buffered() == 0 && !c.abandoned {
		// Nobody is waiting for the response.
		if !c.clientGone() {
			return false
		}
	}
	// The request body, client to upstream.
	// (Not while connecting: a connect that fails leaves the body here,
	// for the next address.)
	if !c.reqBody.done && u.out.pending() < maxPending && !u.connecting {
		if data := c.in.data(); len(data) > 0 {
			n, err := c.reqBody.take(data)
			if err != nil {
				c.l.s.log.Debug("l7 event loop: malformed request body", "peer", c.remoteAddr, "err", err)
				c.failRequestBody(http.StatusBadRequest)
				return true
			}
			u.out.b = append(u.out.grow(c.l), data[:n]...)
			c.in.consume(c.l, n)
			progress = n > 0
		} else if c.readable {
			n, eof := c.read(bufSize)
			if c.state == stateClosed {
				return false
			}
			if eof {
				c.close() // gone in the middle of its body
				return false
			}
			progress = n > 0
		}
	}
	// Upstream writes (and the end of a connect).
	wrote, err := u.flush()
	if err != nil {
		c.upstreamFailed(err)
		return true
	}
	progress = progress || wrote
	// The response, upstream to client.
	if c.out.pending() >= maxPending {
		return progress
	}
	if data := u.in.data(); len(data) > 0 {
		if !c.respHead {
			return c.responseHead(data) || progress
		}
		n, err := c.respBody.take(data)
		if err != nil {
			c.l.s.log.Debug("l7 event loop: malformed response body", "err", err)
			c.close()
			return false
		}
		if !c.abandoned {
			c.out.b = append(c.out.grow(c.l), data[:n]...)
		}
		u.in.consume(c.l, n)
		if c.respBody.done {
			c.finishForward()
		}
		return true
	}
	if !u.readable || u.connecting {
		return progress
	}
	n, eof, err := u.read()
	switch {
	case err != nil || (eof && !c.respHead):
		if err == nil {
			err = errors.New("the upstream closed the connection before a response")
		}
		c.upstreamFailed(err)
		return true
	case eof && c.respBody.kind == bodyEOF:
		c.respBody.done = true
		c.finishForward()
		return true
	case eof:
		c.l.s.log.Debug("l7 event loop: the upstream cut a response short", "peer", c.remoteAddr)
		c.close()
		return false
	}
	return progress || n > 0
}

// responseHead handles the upstream's response head at the start of data.
func (c *conn) responseHead(data []byte) bool {
	u := c.up
	n, err := parseResponseHead(data, &c.resp, maxHead)
	if err != nil {
		c.upstreamFailed(err)
		return true
	}
	if n == 0 {
		if len(data) > maxHead {
			c.upstreamFailed(errors.New("response head too large"))
			return true
		}
		if !u.readable {
			return false
		}
		m, eof, err := u.read()
		if err != nil || eof {
			if err == nil {
				err = errors.New("the upstream closed the connection in a response head")
			}
			c.upstreamFailed(err)
			return true
		}
		return m > 0
	}
	u.gotBytes = true
	status := c.resp.status
	switch {
	case status == http.StatusSwitchingProtocols:
		if c.abandoned {
			c.close() // a tunnel to nobody
			return false
		}
		if !c.head.upgrade {
			u.in.consume(c.l, n)
			c.upstreamFailed(errors.New("101 to a request without an upgrade"))
			return true
		}
		if asked, got := fieldValue(c.head.headers, "Upgrade"), fieldValue(c.resp.headers, "Upgrade"); len(got) == 0 ||
			len(asked) != len(got) || !equalFoldBytes(asked, got) {
			// As httputil.ReverseProxy: the upstream may switch only to
			// the protocol the client asked for (an h2c request answered
			// "Upgrade: websocket" is 502, never a tunnel).
			u.in.consume(c.l, n)
			c.upstreamFailed(fmt.Errorf("101 switching to %q when %q was asked for", got, asked))
			return true
		}
		c.status = status
		c.queueResponseHead(true)
		u.in.consume(c.l, n)
		c.state = stateTunnel
		c.deadline = c.l.now + int64(c.l.s.cfg.TunnelIdleTimeout)
		return true
	case status < 200:
		// Interim (100 Continue, 103 Early Hints): relayed to HTTP/1.1
		// clients, then the final response follows.
		if c.head.minor >= 1 {
			c.queueResponseHead(false)
		}
		u.in.consume(c.l, n)
		return true
	}
	if c.resp.chunked && c.head.minor == 0 {
		// The request went upstream as HTTP/1.0, so the upstream may not
		// send chunked (RFC 9112 6.1), and an HTTP/1.0 client could not
		// read it: the relay does not re-frame bodies, so this is 502.
		u.in.consume(c.l, n)
		c.upstreamFailed(errors.New("chunked response to an http/1.0 request"))
		return true
	}
	switch {
	case c.isHEAD || status == http.StatusNoContent || status == http.StatusNotModified:
		c.respBody.set(bodyNone, 0)
	case c.resp.chunked:
		c.respBody.set(bodyChunked, 0)
	case c.resp.contentLength >= 0:
		c.respBody.set(bodyLength, c.resp.contentLength)
	default:
		c.respBody.set(bodyEOF, 0)
		c.closeAfter = true
	}
	if !c.head.keepAlive || c.l.draining {
		c.closeAfter = true
	}
	c.respHead = true
	c.status = status
	c.queueResponseHead(false)
	u.in.consume(c.l, n)
	if c.respBody.done {
		c.finishForward()
	}
	return true
}

// queueResponseHead writes the upstream's response head for the client:
// hop-by-hop fields dropped, the handler's fields added.
func (c *conn) queueResponseHead(upgrade bool) {
	if c.abandoned {
		return
	}
	r := &c.resp
	b := c.out.grow(c.l)
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(r.status), 10)
	b = append(b, ' ')
	if len(r.reason) > 0 {
		b = append(b, r.reason...)
	} else {
		b = append(b, http.StatusText(r.status)...)
	}
	b = append(b, "\r\n"...)
	final := r.status >= 200
	for i := range r.headers {
		f := &r.headers[i]
		if upgrade && equalFold(f.name, "Upgrade") {
			b = appendRaw(b, f)
			continue
		}
		if framingField(f.name) || hopByHop(f.name, r.connection) {
			continue
		}
		b = appendRaw(b, f)
	}
	if final && !upgrade {
		// The framing the relay follows (a chunked response's
		// Content-Length, which RFC 9112 6.3 says chunked overrides, is
		// not relayed).
		b = appendFraming(b, r.chunked, r.contentLength)
	}
	if final {
		for k, vs := range c.w.hdr {
			for _, v := range vs {
				b = appendField(b, k, v)
			}
		}
	}
	switch {
	case upgrade:
		b = append(b, "Connection: Upgrade\r\n"...)
	case final:
		b = c.appendConnection(b)
	}
	b = append(b, "\r\n"...)
	c.out.b = b
	c.respStarted = true
}

func appendRaw(b []byte, f *header) []byte {
	b = append(b, f.name...)
	b = append(b, ": "...)
	b = append(b, f.value...)
	return append(b, "\r\n"...)
}

// finishForward ends a relayed request: the upstream connection goes back
// to the pool when both messages ended cleanly.
func (c *conn) finishForward() {
	c.tUpEnd = c.l.now
	u := c.up
	c.up = nil
	u.client = nil
	if c.reqBody.done && c.respBody.kind != bodyEOF && c.resp.keepAlive && u.in.pending() == 0 && u.out.pending() == 0 {
		c.l.release(u)
	} else {
		u.closeFD()
	}
	if c.abandoned {
		c.close() // the upstream exchange is over: the slot may go
		return
	}
	if !c.reqBody.done {
		c.closeAfter = true // the next request's start is unknown
	}
	c.afterRelay()
}

// clientGone handles a client that left (closed or reset its connection)
// during a relay. A request the upstream has (all of it, some bytes of it
// sent) is abandoned, not cut: the relay goes on reading the upstream's
// response and drops it, and the connection closes once the response has
// ended, or after Config.ResponseTimeout (the sweep cuts it then, upstream
// connection included). Until then the handler's Relay.Forward has not
// returned, so the concurrency slot it holds stays taken: an upstream that
// works on after its client left is still counted (as nginx does with
// proxy_ignore_client_abort on). A request the upstream has not seen, or
// whose body is unfinished (the upstream cannot have a whole request),
// is cut at once, and so is every exchange of an engine shutting down. It
// reports whether the relay goes on.
func (c *conn) clientGone() bool {
	u := c.up
	if c.state != stateForward || u == nil || !u.sent || !c.reqBody.done || c.respBody.done || c.l.draining {
		c.close()
		return false
	}
	c.abandoned = true
	c.deadline = c.l.now + int64(c.l.s.cfg.ResponseTimeout)
	if c.cancel != nil {
		c.cancel()
	}
	return true
}

// afterRelay hands a finished relay back to the handler's goroutine, or
// readies the connection for its next request.
func (c *conn) afterRelay() {
	if c.w.async {
		// The end of the response waits for the handler to return, so
		// what it holds (a concurrency slot) is free before the client
		// can send its next request, as under net/http.
		c.state = stateHandler
		c.holdOut = true
		c.w.signal()
		return
	}
	c.endRequest()
}

// upstreamFailed answers a request the upstream did not answer: once more
// on a fresh connection when a reused one was closed under it, else 502.
func (c *conn) upstreamFailed(err error) {
	u := c.up
	if u != nil {
		c.up = nil
		u.client = nil
		u.closeFD()
	}
	if c.state == stateClosed {
		return
	}
	if c.abandoned {
		c.close() // nobody to answer, nothing more the upstream does for it
		return
	}
	if c.respStarted {
		c.close() // the client has part of a response: cut it
		return
	}
	if u != nil && u.reused && !u.gotBytes && c.reqBody.kind == bodyNone && !c.retried && c.replayable() {
		c.retried = true
		c.startForward()
		return
	}
	if u != nil && u.connectFailed && u.addr+1 < len(c.l.s.upstreamAddrs()) {
		// The next address (an upstream named by a host with an IPv6
		// and an IPv4 address listens on one of them, say).
		c.l.s.log.Debug("l7 event loop: upstream address failed; trying the next", "err", err)
		nu, derr := c.l.dial(u.addr + 1)
		if derr == nil {
			c.up = nu
			nu.client = c
			c.queueUpstreamHead()
			return
		}
		err = derr
	}
	c.l.s.log.Debug("l7 event loop: upstream failed", "peer", c.remoteAddr, "err", err)
	c.tUpEnd = c.l.now
	c.w.status = 0
	c.w.body = c.w.body[:0]
	c.l.s.cfg.BadGateway(&c.w, &c.req, err)
	if c.w.status == 0 {
		c.w.status = http.StatusBadGateway
	}
	c.respondLocal()
	c.afterRelay()
}

// replayable reports whether the request may be sent again on a new
// upstream connection when a reused one closed before answering: as
// net/http's Transport decides (RFC 9110 9.2.2), a GET, HEAD, OPTIONS or
// TRACE, or a request carrying Idempotency-Key or X-Idempotency-Key. (The
// caller has checked that it has no body.) A POST is never re-sent: the
// upstream may have acted on it before the connection closed.
func (c *conn) replayable() bool {
	switch c.req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, a := c.req.Header["Idempotency-Key"]
	_, b := c.req.Header["X-Idempotency-Key"]
	return a || b
}

// stepTunnel moves bytes both ways after a 101, until either side closes.
func (c *conn) stepTunnel() bool {
	u := c.up
	progress := false
	if u.out.pending() < maxPending {
		if data := c.in.data(); len(data) > 0 {
			u.out.b = append(u.out.grow(c.l), data...)
			c.in.consume(c.l, len(data))
			progress = true
		} else if c.readable {
			n, eof := c.read(bufSize)
			if c.state == stateClosed {
				return false
			}
			if eof {
				_, _ = u.flush()
				c.close()
				return false
			}
			progress = n > 0
		}
	}
	wrote, err := u.flush()
	if err != nil {
		c.closing()
		return true
	}
	progress = progress || wrote
	if progress {
		c.deadline = c.l.now + int64(c.l.s.cfg.TunnelIdleTimeout)
	}
	if c.out.pending() < maxPending {
		if data := u.in.data(); len(data) > 0 {
			c.out.b = append(c.out.grow(c.l), data...)
			u.in.consume(c.l, len(data))
			progress = true
		} else if u.readable {
			n, eof, err := u.read()
			if err != nil || eof {
				c.up = nil
				u.client = nil
				u.closeFD()
				c.closing()
				return true
			}
			progress = progress || n > 0
		}
	}
	return progress
}

// close closes the connection and its upstream connection, and releases a
// handler waiting in Forward.
func (c *conn) close() {
	if c.state == stateClosed {
		return
	}
	c.state = stateClosed
	c.report(true)
	if c.up != nil {
		c.up.client = nil
		c.up.closeFD()
		c.up = nil
	}
	c.l.forget(c.fd)
	delete(c.l.conns, c)
	c.in.release(c.l)
	c.out.release(c.l)
	if c.cancel != nil {
		c.cancel()
	}
	c.w.signal()
	if c.l.draining && len(c.l.conns) == 0 {
		c.l.done = true
	}
}
