package grpcunary

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// stream is one call. Its state moves receiving → calling (a worker runs
// the call) → sending (the response waits for the client's window) →
// gone (deleted from conn.streams).
type stream struct {
	id       uint32
	state    uint8
	ended    bool // the client's END_STREAM arrived
	reset    bool // the client reset it while its call ran
	compress string
	length   int64     // content-length, -1: none
	deadline time.Time // zero: none
	recvd    int       // flow-controlled bytes received (padding included)
	sendWin  int64
	body     []byte // the request bytes so far (gRPC prefix and message)
	pending  []byte // response DATA not yet sent
	cancel   context.CancelFunc
}

const (
	receiving = iota
	calling
	sending
)

// connError is a connection error: GOAWAY with its code, then close.
type connError struct {
	code http2.ErrCode
	why  string
}

func (e connError) Error() string { return fmt.Sprintf("%v: %s", e.code, e.why) }

// conn is one client connection. The reader goroutine owns br and fr;
// everything else is under mu (the reader holds it while it handles a
// frame, a worker while it writes its response).
type conn struct {
	s   *Server
	raw net.Conn // what Accept returned (Stop closes it)
	nc  net.Conn // raw, or TLS over it
	br  *bufio.Reader
	fr  *http2.Framer
	hd  *headerDecoder
	// a header block being assembled from HEADERS and CONTINUATION
	hdrBlock         []byte
	hdrStream        uint32
	hdrEnd           bool
	hdrContinuations int

	mu    sync.Mutex
	wbuf  []byte
	ready bool // the preface was read and SETTINGS sent
	// waiting: the reader has flushed and waits for bytes; otherwise it
	// flushes what workers write when its batch is done
	waiting  bool
	flushing bool // a worker is about to flush
	dead     bool // a write failed or the connection was closed
	streams  map[uint32]*stream
	active   int    // streams whose call or response is not done
	maxID    uint32 // the highest client stream id seen
	away     bool   // a GOAWAY was sent; streams after lastID are ignored
	lastID   uint32
	// flow control of what the server sends
	sendWin      int64
	peerInitWin  int64
	peerMaxFrame int
	blocked      []*stream // streams whose DATA waits for a window
	blockedSince time.Time
	// flow control of what the client sends: bytes received and not yet
	// given back, and given back but not yet announced
	recvHeld, recvFree int
	// abuse accounting
	abuse       int
	abuseAt     time.Time
	pingStrikes int
	lastPing    time.Time
	// deadlines set (only moved when they change by more than a second)
	readDL, writeDL time.Time
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{s: s, raw: nc, nc: nc, streams: map[uint32]*stream{}, peerInitWin: 65535, sendWin: 65535,
		peerMaxFrame: 16384, abuse: abuseBudget}
}

// serve runs the connection's reader until it ends.
func (c *conn) serve() {
	defer c.s.forget(c)
	defer func() { _ = c.nc.Close() }()
	o := &c.s.opts
	_ = c.nc.SetDeadline(time.Now().Add(o.HandshakeTimeout))
	if o.TLS != nil {
		tc := tls.Server(c.nc, o.TLS)
		if err := tc.Handshake(); err != nil {
			c.s.log.Debug("rls grpc: tls handshake", "remote", c.nc.RemoteAddr(), "err", err)
			return
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
			c.s.log.Debug("rls grpc: ALPN h2 required", "remote", c.nc.RemoteAddr(), "alpn", p)
			return
		}
		c.nc = tc
	}
	c.br = bufio.NewReaderSize(c.nc, readBuffer)
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		return // not HTTP/2: nothing to say in its language
	}
	c.fr = http2.NewFramer(nil, c.br)
	c.fr.SetMaxReadFrameSize(16384) // what SETTINGS say (the default)
	c.hd = newHeaderDecoder(o.MaxHeaderListSize)
	c.fr.SetReuseFrames()
	c.mu.Lock()
	if c.away {
		c.mu.Unlock()
		return // stopped during the handshake
	}
	c.ready = true
	c.writeSettings()
	c.flush()
	c.mu.Unlock()
	f, err := c.fr.ReadFrame()
	if sf, ok := f.(*http2.SettingsFrame); err != nil || !ok || sf.IsAck() {
		c.fail(connError{http2.ErrCodeProtocol, "the client preface is not followed by SETTINGS"})
		return
	}
	c.mu.Lock()
	err = c.handle(f)
	c.flush()
	c.mu.Unlock()
	if err != nil {
		c.fail(err)
		return
	}
	for {
		if !c.frameBuffered() {
			c.mu.Lock()
			c.flush()
			closing := c.away && c.active == 0
			if !closing {
				c.armRead(c.readTimeout())
			}
			c.waiting = true
			c.mu.Unlock()
			if closing {
				c.closeGracefully()
				return
			}
			if _, err := c.br.Peek(1); err != nil {
				c.readFailed(err, false)
				return
			}
			if !c.frameBuffered() {
				// A frame has begun: the rest within FrameTimeout.
				c.mu.Lock()
				c.armRead(c.s.opts.FrameTimeout)
				c.mu.Unlock()
			}
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.mu.Lock()
				err = c.streamError(se.StreamID, se.Code)
				c.mu.Unlock()
				if err == nil {
					continue
				}
			}
			c.readFailed(err, true)
			return
		}
		c.mu.Lock()
		c.waiting = false
		err = c.handle(f)
		done := c.away && c.active == 0
		if done {
			c.flush()
		}
		c.mu.Unlock()
		if err != nil {
			c.fail(err)
			return
		}
		if done {
			c.closeGracefully()
			return
		}
	}
}

// closeGracefully closes after a GOAWAY: the write side first, then what
// the client still sends is read for a second, so the GOAWAY is not lost
// to a TCP reset.
func (c *conn) closeGracefully() {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, io.LimitReader(c.nc, connWindow))
}

// frameBuffered reports whether a whole frame waits in br (the next
// ReadFrame will not block); otherwise it is time to flush.
func (c *conn) frameBuffered() bool {
	n := c.br.Buffered()
	if n < 9 {
		return false
	}
	h, _ := c.br.Peek(9)
	return n >= 9+int(h[0])<<16|int(h[1])<<8|int(h[2])
}

// readTimeout is how long the reader may wait for the next frame.
func (c *conn) readTimeout() time.Duration {
	o := &c.s.opts
	if len(c.blocked) > 0 {
		return o.WriteTimeout - time.Since(c.blockedSince)
	}
	for _, st := range c.streams {
		if st.state == receiving {
			return o.FrameTimeout
		}
	}
	return o.IdleTimeout // no stream, or calls running on workers
}

// armRead sets the read deadline d from now, moving it only when it
// shortens or grows by more than an eighth of d (a deadline costs a timer
// update: a connection that keeps reading moves it a few times per d).
// Under mu: goAway may move it to now.
func (c *conn) armRead(d time.Duration) {
	want := time.Now().Add(d)
	if want.Before(c.readDL) || want.Sub(c.readDL) > d/8 {
		c.readDL = want
		_ = c.nc.SetReadDeadline(want)
	}
}

// readFailed ends the connection after a read error (midFrame: while a
// frame was being read).
func (c *conn) readFailed(err error, midFrame bool) {
	var ce http2.ConnectionError
	var ne net.Error
	switch {
	case errors.As(err, &ce):
		c.fail(connError{http2.ErrCode(ce), "frame: " + err.Error()})
	case errors.Is(err, http2.ErrFrameTooLarge):
		c.fail(connError{http2.ErrCodeFrameSize, "frame larger than SETTINGS_MAX_FRAME_SIZE"})
	case errors.As(err, &ne) && ne.Timeout():
		c.mu.Lock()
		graceful := c.away || c.active == 0 && !midFrame
		if !c.away && graceful {
			// Idle: a GOAWAY NO_ERROR, as on a graceful stop.
			c.away, c.lastID = true, c.maxID
			c.writeGoAway(c.lastID, http2.ErrCodeNo, "idle")
		}
		c.flush()
		c.mu.Unlock()
		if graceful {
			c.closeGracefully()
		} else {
			c.fail(connError{http2.ErrCodeProtocol, "stalled: no bytes within FrameTimeout or WriteTimeout"})
		}
	default:
		// EOF, a reset connection, or a close by Stop.
	}
}

// fail sends a GOAWAY with err's code and closes the connection.
func (c *conn) fail(err error) {
	var ce connError
	if !errors.As(err, &ce) {
		ce = connError{http2.ErrCodeInternal, err.Error()}
	}
	if ce.code != http2.ErrCodeNo {
		c.s.log.Debug("rls grpc: connection error", "remote", c.nc.RemoteAddr(), "code", ce.code, "why", ce.why)
	}
	c.mu.Lock()
	if !c.away {
		c.away, c.lastID = true, c.maxID
	}
	c.writeGoAway(c.lastID, ce.code, ce.why)
	c.flush()
	c.dead = true
	c.mu.Unlock()
	_ = c.nc.Close()
}

// goAway starts a graceful close: the streams so far finish, later ones
// are ignored (the client retries them elsewhere).
func (c *conn) goAway() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ready {
		c.away = true
		_ = c.raw.Close() // in its handshake: nothing to finish
		return
	}
	if !c.away {
		c.away, c.lastID = true, c.maxID
		c.writeGoAway(c.lastID, http2.ErrCodeNo, "")
		c.flush()
	}
	c.wakeIfDone()
}

// wakeIfDone wakes the reader to close the connection once a GOAWAY was
// sent and no stream is left.
func (c *conn) wakeIfDone() {
	if c.away && c.active == 0 {
		_ = c.nc.SetReadDeadline(time.Now())
	}
}

// --- writing (under mu) ---

func (c *conn) flush() {
	if len(c.wbuf) == 0 {
		return
	}
	if c.dead {
		c.wbuf = c.wbuf[:0]
		return
	}
	// The write deadline moves when less than 7/8 of WriteTimeout is
	// left (a deadline costs a timer update).
	wt := c.s.opts.WriteTimeout
	if now := time.Now(); c.writeDL.Sub(now) < wt-wt/8 {
		c.writeDL = now.Add(wt)
		_ = c.nc.SetWriteDeadline(c.writeDL)
	}
	_, err := c.nc.Write(c.wbuf)
	c.wbuf = c.wbuf[:0]
	if err != nil {
		c.dead = true
		_ = c.raw.Close()
	}
}

func (c *conn) maybeFlush() {
	if len(c.wbuf) >= flushAt {
		c.flush()
	}
}

func (c *conn) writeSettings() {
	o := &c.s.opts
	settings := []http2.Setting{
		{ID: http2.SettingMaxConcurrentStreams, Val: o.MaxConcurrentStreams},
		{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		{ID: http2.SettingMaxHeaderListSize, Val: o.MaxHeaderListSize},
		{ID: http2.SettingEnablePush, Val: 0},
	}
	c.wbuf = appendFrameHeader(c.wbuf, 6*len(settings), http2.FrameSettings, 0, 0)
	for _, s := range settings {
		c.wbuf = binary.BigEndian.AppendUint16(c.wbuf, uint16(s.ID))
		c.wbuf = binary.BigEndian.AppendUint32(c.wbuf, s.Val)
	}
	c.writeWindowUpdate(0, connWindow-65535)
}

func (c *conn) writeWindowUpdate(id uint32, n int) {
	c.wbuf = appendFrameHeader(c.wbuf, 4, http2.FrameWindowUpdate, 0, id)
	c.wbuf = binary.BigEndian.AppendUint32(c.wbuf, uint32(n))
}

func (c *conn) writeRST(id uint32, code http2.ErrCode) {
	c.wbuf = appendFrameHeader(c.wbuf, 4, http2.FrameRSTStream, 0, id)
	c.wbuf = binary.BigEndian.AppendUint32(c.wbuf, uint32(code))
}

func (c *conn) writeGoAway(last uint32, code http2.ErrCode, debug string) {
	if len(debug) > 256 {
		debug = debug[:256]
	}
	c.wbuf = appendFrameHeader(c.wbuf, 8+len(debug), http2.FrameGoAway, 0, 0)
	c.wbuf = binary.BigEndian.AppendUint32(c.wbuf, last&0x7fffffff)
	c.wbuf = binary.BigEndian.AppendUint32(c.wbuf, uint32(code))
	c.wbuf = append(c.wbuf, debug...)
}

func (c *conn) writeHeaders(id uint32, block []byte, end bool) {
	flags := http2.FlagHeadersEndHeaders
	if end {
		flags |= http2.FlagHeadersEndStream
	}
	c.wbuf = appendFrameHeader(c.wbuf, len(block), http2.FrameHeaders, flags, id)
	c.wbuf = append(c.wbuf, block...)
}

// --- reading (under mu) ---

// handle handles one frame; an error is a connection error.
func (c *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.HeadersFrame:
		if f.HasPriority() && f.Priority.StreamDep == f.StreamID {
			return c.streamError(f.StreamID, http2.ErrCodeProtocol)
		}
		if f.HeadersEnded() {
			return c.onHeaders(f.StreamID, f.StreamEnded(), f.HeaderBlockFragment())
		}
		c.hdrBlock = append(c.hdrBlock[:0], f.HeaderBlockFragment()...)
		c.hdrStream, c.hdrEnd, c.hdrContinuations = f.StreamID, f.StreamEnded(), 0
	case *http2.ContinuationFrame:
		// The Framer checks that CONTINUATION follows its HEADERS; the
		// block and the number of frames are bounded here.
		c.hdrBlock = append(c.hdrBlock, f.HeaderBlockFragment()...)
		if c.hdrContinuations++; len(c.hdrBlock) > 2*int(c.s.opts.MaxHeaderListSize) || c.hdrContinuations > maxContinuations {
			return connError{http2.ErrCodeProtocol, "CONTINUATION flood"}
		}
		if f.HeadersEnded() {
			err := c.onHeaders(c.hdrStream, c.hdrEnd, c.hdrBlock)
			if cap(c.hdrBlock) > 64<<10 {
				c.hdrBlock = nil
			}
			return err
		}
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		now := time.Now()
		if !c.lastPing.IsZero() && now.Sub(c.lastPing) < pingMinInterval {
			if c.pingStrikes++; c.pingStrikes > maxPingStrikes {
				return connError{http2.ErrCodeEnhanceYourCalm, "too_many_pings"}
			}
		}
		c.lastPing = now
		c.wbuf = appendFrameHeader(c.wbuf, 8, http2.FramePing, http2.FlagPingAck, 0)
		c.wbuf = append(c.wbuf, f.Data[:]...)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		return c.onReset(f)
	case *http2.GoAwayFrame:
		// The client goes away: it sends no new streams; the ones it has
		// are answered, then it closes.
	case *http2.PriorityFrame:
		// Priorities do not matter to one method's calls; a stream that
		// depends on itself is an error all the same (RFC 9113 §5.3.1).
		if f.StreamDep == f.StreamID {
			return c.streamError(f.StreamID, http2.ErrCodeProtocol)
		}
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE from a client"}
	default:
		// Unknown frame types are ignored (RFC 9113 §4.1).
	}
	return nil
}

// charge takes n from the connection's abuse budget.
func (c *conn) charge(n int, why string) error {
	now := time.Now()
	if el := now.Sub(c.abuseAt); el >= time.Second/abuseRefill {
		c.abuse = min(abuseBudget, c.abuse+int(el*abuseRefill/time.Second))
		c.abuseAt = now
	}
	c.abuse -= n
	if c.abuse < 0 {
		return connError{http2.ErrCodeEnhanceYourCalm, why}
	}
	return nil
}

func (c *conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	if err := c.charge(1, "SETTINGS flood"); err != nil {
		return err
	}
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return connError{http2.ErrCodeProtocol, err.Error()}
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerInitWin
			c.peerInitWin = int64(s.Val)
			for _, st := range c.streams {
				if st.sendWin += delta; st.sendWin > 1<<31-1 {
					return connError{http2.ErrCodeFlowControl, "stream window above 2^31-1"}
				}
			}
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = int(s.Val)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.wbuf = appendFrameHeader(c.wbuf, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
	c.unblock()
	return nil
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	if f.StreamID == 0 {
		if c.sendWin += int64(f.Increment); c.sendWin > 1<<31-1 {
			return connError{http2.ErrCodeFlowControl, "connection window above 2^31-1"}
		}
		c.unblock()
		return nil
	}
	st := c.streams[f.StreamID]
	if st == nil {
		if f.StreamID > c.maxID {
			return connError{http2.ErrCodeProtocol, "WINDOW_UPDATE on an idle stream"}
		}
		return nil // a closed stream
	}
	if st.sendWin += int64(f.Increment); st.sendWin > 1<<31-1 {
		return c.streamError(st.id, http2.ErrCodeFlowControl)
	}
	c.unblock()
	return nil
}

func (c *conn) onReset(f *http2.RSTStreamFrame) error {
	if f.StreamID > c.maxID {
		return connError{http2.ErrCodeProtocol, "RST_STREAM on an idle stream"}
	}
	st := c.streams[f.StreamID]
	if st == nil {
		return nil
	}
	if err := c.charge(1, "too many resets"); err != nil {
		return err
	}
	c.drop(st)
	return nil
}

// drop forgets a stream the client reset or that failed: a running call
// is cancelled and keeps its place among the active streams until it
// returns.
func (c *conn) drop(st *stream) {
	c.giveBack(st)
	switch st.state {
	case calling:
		st.reset = true
		st.cancel()
		delete(c.streams, st.id)
		return
	case sending:
		c.unblockRemove(st)
	}
	delete(c.streams, st.id)
	c.active--
}

// giveBack returns a stream's received bytes to the connection's window.
func (c *conn) giveBack(st *stream) {
	c.recvHeld -= st.recvd
	c.recvFree += st.recvd
	st.recvd = 0
	if c.recvFree >= connWindow/4 {
		c.writeWindowUpdate(0, c.recvFree)
		c.recvFree = 0
	}
}

// streamError resets a stream after its error (RFC 9113 §5.4.2).
func (c *conn) streamError(id uint32, code http2.ErrCode) error {
	if st := c.streams[id]; st != nil {
		c.drop(st)
	}
	c.writeRST(id, code)
	return c.charge(1, "too many stream errors")
}

func (c *conn) onHeaders(id uint32, ended bool, block []byte) error {
	// The block is decoded whatever becomes of the stream: HPACK's state
	// is the connection's.
	h, err := c.hd.decode(block)
	if err != nil {
		return connError{http2.ErrCodeCompression, "HPACK: " + err.Error()}
	}
	if id%2 == 0 {
		return connError{http2.ErrCodeProtocol, "a client stream id must be odd"}
	}
	if id <= c.maxID {
		if st := c.streams[id]; st != nil {
			// Request trailers, or HEADERS after END_STREAM: unary gRPC
			// has neither.
			if st.ended {
				return c.streamError(id, http2.ErrCodeStreamClosed)
			}
			return c.streamError(id, http2.ErrCodeProtocol)
		}
		// A stream id not above the last one (RFC 9113 §5.1.1).
		return connError{http2.ErrCodeProtocol, "HEADERS on a closed stream"}
	}
	c.maxID = id
	if c.away {
		return nil // after our GOAWAY: ignored, the client retries it elsewhere
	}
	if c.active >= int(c.s.opts.MaxConcurrentStreams) {
		c.writeRST(id, http2.ErrCodeRefusedStream)
		return c.charge(1, "too many streams refused")
	}
	if h.invalid != "" {
		c.writeRST(id, http2.ErrCodeProtocol)
		return c.charge(1, "too many malformed header lists")
	}
	st := &stream{id: id, sendWin: c.peerInitWin, ended: ended, compress: h.encoding, length: h.contentLength}
	c.streams[id] = st
	c.active++
	if h.truncated {
		c.abort(st, 431, codes.ResourceExhausted, fmt.Sprintf("header list larger than %d bytes", c.s.opts.MaxHeaderListSize))
		return c.charge(1, "too many oversized header lists")
	}
	method, path, ctype, timeout := h.method, h.path, h.ctype, h.timeout
	if ctype != "application/grpc" && !strings.HasPrefix(ctype, "application/grpc+") && !strings.HasPrefix(ctype, "application/grpc;") {
		c.abort(st, 415, codes.InvalidArgument, fmt.Sprintf("invalid gRPC request content-type %q", ctype))
		return nil
	}
	if method != "POST" {
		c.abort(st, 405, codes.Internal, fmt.Sprintf("Received a HEADERS frame with :method %q which should be POST", method))
		return nil
	}
	if path != c.s.m.Path {
		c.abort(st, 200, codes.Unimplemented, unknownMethod(path))
		return nil
	}
	if timeout != "" {
		d, err := decodeTimeout(timeout)
		if err != nil {
			c.abort(st, 400, codes.Internal, "malformed grpc-timeout: "+err.Error())
			return nil
		}
		st.deadline = time.Now().Add(d)
	}
	if st.ended {
		if st.length > 0 {
			return c.streamError(id, http2.ErrCodeProtocol) // content-length says more
		}
		c.complete(st, nil)
	}
	return nil
}

// unknownMethod is grpc-go's Unimplemented message for path.
func unknownMethod(path string) string {
	p := strings.TrimPrefix(path, "/")
	i := strings.LastIndex(p, "/")
	if !strings.HasPrefix(path, "/") || i < 0 {
		return fmt.Sprintf("malformed method name: %q", path)
	}
	return fmt.Sprintf("unknown method %v for service %v", p[i+1:], p[:i])
}

// decodeTimeout parses grpc-timeout: at most 8 digits and a unit.
func decodeTimeout(s string) (time.Duration, error) {
	if len(s) < 2 || len(s) > 9 {
		return 0, fmt.Errorf("%q: want 1 to 8 digits and a unit", s)
	}
	i := strings.IndexByte("HMSmun", s[len(s)-1])
	if i < 0 {
		return 0, fmt.Errorf("%q: unknown unit", s)
	}
	unit := [...]time.Duration{time.Hour, time.Minute, time.Second, time.Millisecond, time.Microsecond, time.Nanosecond}[i]
	var n int64
	for _, ch := range []byte(s[:len(s)-1]) {
		if ch < '0' || ch > '9' {
			return 0, fmt.Errorf("%q: not a number", s)
		}
		n = n*10 + int64(ch-'0')
	}
	if unit == time.Hour && n > int64(1<<63-1)/int64(time.Hour) {
		return 1<<63 - 1, nil
	}
	return time.Duration(n) * unit, nil
}

func (c *conn) onData(f *http2.DataFrame) error {
	id, n := f.StreamID, int(f.Length)
	if c.recvHeld += n; c.recvHeld+c.recvFree > connWindow {
		return connError{http2.ErrCodeFlowControl, "DATA beyond the connection's window"}
	}
	st := c.streams[id]
	if st == nil || st.ended {
		if id > c.maxID {
			return connError{http2.ErrCodeProtocol, "DATA on an idle stream"}
		}
		c.recvHeld -= n
		c.recvFree += n
		if c.away && id > c.lastID {
			return nil
		}
		if st != nil {
			return c.streamError(id, http2.ErrCodeStreamClosed)
		}
		c.writeRST(id, http2.ErrCodeStreamClosed)
		return c.charge(1, "too much DATA on closed streams")
	}
	st.recvd += n
	if st.recvd > streamWindow {
		return c.streamError(id, http2.ErrCodeFlowControl)
	}
	data := f.Data()
	st.ended = f.StreamEnded()
	if len(data) == 0 && !st.ended {
		return c.charge(1, "empty DATA frames")
	}
	if st.length >= 0 && (int64(len(st.body)+len(data)) > st.length || st.ended && int64(len(st.body)+len(data)) != st.length) {
		return c.streamError(id, http2.ErrCodeProtocol) // DATA and content-length disagree (RFC 9113 §8.1.1)
	}
	max := c.s.opts.MaxRecvMsgSize
	if len(st.body) == 0 && st.ended && len(data) >= 5 && binary.BigEndian.Uint32(data[1:5]) <= uint32(max) {
		c.complete(st, data) // the common case: the whole request in one frame
		return nil
	}
	st.body = append(st.body, data...)
	if len(st.body) >= 5 {
		if ln := binary.BigEndian.Uint32(st.body[1:5]); ln > uint32(max) {
			c.abort(st, 200, codes.ResourceExhausted, fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", ln, max))
			return nil
		}
	}
	if st.ended {
		c.complete(st, st.body)
	}
	return nil
}

// complete decides a stream whose request is whole.
func (c *conn) complete(st *stream, body []byte) {
	c.giveBack(st)
	if len(body) < 5 {
		c.abort(st, 200, codes.Internal, "grpc: the request has no whole message")
		return
	}
	switch body[0] {
	case 0:
	case 1:
		if st.compress == "" || st.compress == "identity" {
			c.abort(st, 200, codes.Internal, "grpc: compressed flag set with identity or empty encoding")
		} else {
			c.abort(st, 200, codes.Unimplemented, fmt.Sprintf("grpc: Decompressor is not installed for grpc-encoding %q", st.compress))
		}
		return
	default:
		c.abort(st, 200, codes.Internal, fmt.Sprintf("grpc: invalid compressed-flag %d", body[0]))
		return
	}
	ln := int(binary.BigEndian.Uint32(body[1:5]))
	if ln != len(body)-5 {
		c.abort(st, 200, codes.Internal, fmt.Sprintf("grpc: a unary request holds one whole message (%d bytes announced, %d sent)", ln, len(body)-5))
		return
	}
	msg := body[5:]
	if !st.deadline.IsZero() && !time.Now().Before(st.deadline) {
		c.abort(st, 200, codes.DeadlineExceeded, "context deadline exceeded")
		return
	}
	m := &c.s.m
	if m.Inline == nil || m.Inline() {
		c.callInline(st, msg, c.s.call)
		return
	}
	if m.Try != nil && c.callInline(st, msg, m.Try) {
		return
	}
	// A worker: the request is copied out of the frame.
	if len(st.body) == 0 {
		msg = bytes.Clone(msg)
	}
	st.body = nil
	st.state = calling
	ctx, cancel := context.Background(), context.CancelFunc(nil)
	if st.deadline.IsZero() {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithDeadline(ctx, st.deadline)
	}
	st.cancel = cancel
	c.s.run(func() {
		// The answer goes as the call gave it, past its deadline too
		// (what it decided is charged; the client may still read it).
		out, code, text := m.Call(ctx, msg, nil)
		cancel()
		c.mu.Lock()
		defer c.mu.Unlock()
		if st.reset {
			c.active--
		} else {
			c.respond(st, out, code, text)
		}
		if c.waiting && !c.flushing {
			// One flush for the responses of the workers that are
			// ready now (Redis answers a pipeline's calls together):
			// the others append theirs while this one yields.
			c.flushing = true
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
			c.flushing = false
			if c.waiting {
				c.flush()
			}
		}
		c.wakeIfDone()
	})
}

// callInline answers st on the reader with call, marshalling the response
// into the write buffer after its HEADERS and DATA frame headers. It
// reports false, having written nothing, when call did not answer.
func (c *conn) callInline(st *stream, msg []byte, call func(req, dst []byte) ([]byte, codes.Code, string, bool)) bool {
	start := len(c.wbuf)
	c.writeHeaders(st.id, headersOK, false)
	data := len(c.wbuf)
	c.wbuf = append(c.wbuf, make([]byte, 9+5)...)
	out, code, text, done := call(msg, c.wbuf)
	if !done {
		c.wbuf = c.wbuf[:start]
		return false
	}
	if code != codes.OK {
		c.wbuf = c.wbuf[:start]
		c.respond(st, nil, code, text)
		return true
	}
	c.wbuf = out
	n := len(out) - data - 9
	if int64(n) > min(c.sendWin, st.sendWin) || n > c.peerMaxFrame {
		// The slow way: the DATA waits for a window or takes more frames.
		st.pending = bytes.Clone(out[data+9:])
		binary.BigEndian.PutUint32(st.pending[1:5], uint32(n-5))
		st.pending[0] = 0
		c.wbuf = c.wbuf[:data]
		c.sendPending(st)
		return true
	}
	appendFrameHeader(c.wbuf[data:data], n, http2.FrameData, 0, st.id)
	c.wbuf[data+9] = 0
	binary.BigEndian.PutUint32(c.wbuf[data+10:], uint32(n-5))
	c.sendWin -= int64(n)
	st.sendWin -= int64(n)
	c.writeHeaders(st.id, trailersOK, true)
	c.finish(st)
	return true
}

// respond writes a call's response: HEADERS, DATA and trailers, or a
// Trailers-Only status.
func (c *conn) respond(st *stream, msg []byte, code codes.Code, text string) {
	if code != codes.OK {
		c.abort(st, 200, code, text)
		return
	}
	c.writeHeaders(st.id, headersOK, false)
	st.pending = make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(st.pending[1:], uint32(len(msg)))
	st.pending = append(st.pending, msg...)
	c.sendPending(st)
}

// sendPending sends what the windows allow of st's DATA, then the
// trailers; what does not fit waits in c.blocked.
func (c *conn) sendPending(st *stream) {
	for len(st.pending) > 0 {
		n := int(min(int64(len(st.pending)), c.sendWin, st.sendWin, int64(c.peerMaxFrame)))
		if n <= 0 {
			if st.state != sending {
				st.state = sending
				if len(c.blocked) == 0 {
					c.blockedSince = time.Now()
				}
				c.blocked = append(c.blocked, st)
			}
			return
		}
		c.wbuf = appendFrameHeader(c.wbuf, n, http2.FrameData, 0, st.id)
		c.wbuf = append(c.wbuf, st.pending[:n]...)
		st.pending = st.pending[n:]
		c.sendWin -= int64(n)
		st.sendWin -= int64(n)
		c.maybeFlush()
	}
	st.pending = nil
	if st.state == sending {
		c.unblockRemove(st)
	}
	c.writeHeaders(st.id, trailersOK, true)
	c.finish(st)
}

// unblock sends what waits for a window, in order.
func (c *conn) unblock() {
	for i := 0; i < len(c.blocked); {
		st := c.blocked[i]
		c.sendPending(st)
		if i < len(c.blocked) && c.blocked[i] == st {
			i++
		}
	}
}

func (c *conn) unblockRemove(st *stream) {
	for i, b := range c.blocked {
		if b == st {
			c.blocked = append(c.blocked[:i], c.blocked[i+1:]...)
			break
		}
	}
	if len(c.blocked) > 0 {
		c.blockedSince = time.Now()
	}
}

// abort answers st with a Trailers-Only status (and, when the client has
// not finished sending, RST_STREAM NO_ERROR: the rest is not needed).
func (c *conn) abort(st *stream, httpStatus int, code codes.Code, text string) {
	var block [256]byte
	c.writeHeaders(st.id, appendStatusBlock(block[:0], httpStatus, code, text), true)
	if !st.ended {
		c.writeRST(st.id, http2.ErrCodeNo)
		c.giveBack(st)
	}
	c.finish(st)
}

// finish forgets a stream whose response is written.
func (c *conn) finish(st *stream) {
	delete(c.streams, st.id)
	c.active--
	c.abuse = min(abuseBudget, c.abuse+1)
	c.pingStrikes, c.lastPing = 0, time.Time{}
	c.maybeFlush()
}
