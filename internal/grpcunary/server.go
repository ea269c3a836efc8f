// Package grpcunary serves one unary gRPC method over HTTP/2 (RFC 9113),
// without grpc-go's server transport: one reader per connection decodes
// frames (golang.org/x/net/http2's Framer, HPACK with a bounded header
// list) and answers a call inline, or on a pooled worker when the method
// says the call may wait on the network; responses are written into one
// buffer per connection, flushed once per batch of frames read.
//
// What unary gRPC does not need is refused cleanly: server push, request
// trailers, compressed messages, more than one request message, another
// method (Unimplemented, as grpc-go). Every resource a client can make the
// server hold is bounded: streams (MaxConcurrentStreams), request bytes
// (the connection's receive window, MaxRecvMsgSize), header lists
// (MaxHeaderListSize, CONTINUATION included), resets, refusals, pings and
// SETTINGS (an abuse budget per connection), time (handshake, stalled
// frames, idle, writes).
package grpcunary

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
)

// Method is the one method a Server serves.
type Method struct {
	// Path is the method's :path, "/package.Service/Method".
	Path string
	// Inline reports whether calls may be answered on the connection's
	// reader now (they will not wait on the network); false runs each
	// call on a worker.
	Inline func() bool
	// Call answers one request message (req is valid only during the
	// call): it appends the response message to dst and returns it with
	// codes.OK, or returns another code and its message.
	Call func(ctx context.Context, req, dst []byte) ([]byte, codes.Code, string)
	// Try, when set, is offered on the reader each call Inline sends to a
	// worker: it answers as Call does (req valid only during the call,
	// the response appended to dst) and returns done, or returns done
	// false having decided nothing (it would wait on the network): the
	// call then runs on a worker with Call.
	Try func(req, dst []byte) (out []byte, code codes.Code, text string, done bool)
}

// Options bound a Server. Zero fields take the defaults below.
type Options struct {
	// MaxRecvMsgSize bounds one request message (default 4 MiB, as grpc-go).
	MaxRecvMsgSize int
	// MaxConcurrentStreams bounds the streams of one connection, counted
	// until their call has returned (a reset stream whose call still runs
	// counts: CVE-2023-44487). Default 100.
	MaxConcurrentStreams uint32
	// MaxHeaderListSize bounds a request's header list (HPACK-decoded,
	// RFC 9113 §6.5.2 sizes). Default 16 KiB.
	MaxHeaderListSize uint32
	// TLS, when set, is the listener's TLS configuration: ALPN h2 is
	// required.
	TLS *tls.Config
	// HandshakeTimeout bounds the TLS handshake, the client preface and
	// its first SETTINGS (default 10s).
	HandshakeTimeout time.Duration
	// FrameTimeout bounds the silence while a frame or a request body is
	// incomplete (default 10s): a half-written frame then silence closes
	// the connection.
	FrameTimeout time.Duration
	// IdleTimeout closes a connection with no stream and no frame for
	// that long, with a GOAWAY (default 10 minutes).
	IdleTimeout time.Duration
	// WriteTimeout bounds one write to the client and the time a response
	// waits for the client's flow-control window (default 10s): a client
	// that does not read is disconnected.
	WriteTimeout time.Duration
	Logger       *slog.Logger
}

// Defaults of Options.
const (
	DefaultMaxRecvMsgSize       = 4 << 20
	DefaultMaxConcurrentStreams = 100
	DefaultMaxHeaderListSize    = 16 << 10
	DefaultHandshakeTimeout     = 10 * time.Second
	DefaultFrameTimeout         = 10 * time.Second
	DefaultIdleTimeout          = 10 * time.Minute
	DefaultWriteTimeout         = 10 * time.Second
)

// Fixed sizes of the transport.
const (
	// connWindow is the connection's receive window: it bounds the
	// request bytes a connection may have buffered (bytes are given back
	// when their stream's request is complete or dropped).
	connWindow = 1 << 20
	// streamWindow is a stream's receive window (never replenished: a
	// request fits in it, with room for padding).
	streamWindow = 1 << 18
	// readBuffer is the size of a connection's read buffer: the largest
	// batch of frames answered before one flush.
	readBuffer = 32 << 10
	// flushAt flushes the write buffer within a batch once it holds that
	// much.
	flushAt = 64 << 10
	// abuseBudget is the number of resets, refused streams, stream
	// errors, SETTINGS and empty DATA frames a connection may cause
	// beyond what it earns back: one per answered call and abuseRefill
	// per second. Past it: GOAWAY ENHANCE_YOUR_CALM.
	abuseBudget = 1000
	abuseRefill = 100
	// pingMinInterval and maxPingStrikes are grpc-go's keepalive
	// enforcement (what the daemon enforced before): pings more often
	// than every 10s while no response is written earn a strike; the
	// third strike is GOAWAY ENHANCE_YOUR_CALM "too_many_pings".
	pingMinInterval = 10 * time.Second
	maxPingStrikes  = 2
	// maxContinuations bounds the CONTINUATION frames of one header
	// block (empty ones included: x/net's Framer would take them
	// without end).
	maxContinuations = 64
	// maxStatusMessage bounds a grpc-message sent.
	maxStatusMessage = 1024
	// workerIdle is how long an idle worker waits for another call.
	workerIdle = 10 * time.Second
)

// Server serves Method on listeners.
type Server struct {
	m    Method
	call func(req, dst []byte) ([]byte, codes.Code, string, bool) // m.Call on the reader
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	lns      map[net.Listener]struct{}
	conns    map[*conn]struct{}
	stopping bool
	wg       sync.WaitGroup // connections

	work     chan func()   // idle workers wait here
	stopped  chan struct{} // closed by Stop: idle workers leave
	stopOnce sync.Once
}

// NewServer returns a Server for m.
func NewServer(m Method, opts Options) *Server {
	if opts.MaxRecvMsgSize <= 0 {
		opts.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if opts.MaxConcurrentStreams == 0 {
		opts.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if opts.MaxHeaderListSize == 0 {
		opts.MaxHeaderListSize = DefaultMaxHeaderListSize
	}
	for _, d := range []struct {
		p *time.Duration
		v time.Duration
	}{{&opts.HandshakeTimeout, DefaultHandshakeTimeout}, {&opts.FrameTimeout, DefaultFrameTimeout},
		{&opts.IdleTimeout, DefaultIdleTimeout}, {&opts.WriteTimeout, DefaultWriteTimeout}} {
		if *d.p <= 0 {
			*d.p = d.v
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{m: m, opts: opts, log: log, lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{},
		work: make(chan func()), stopped: make(chan struct{})}
	s.call = func(req, dst []byte) ([]byte, codes.Code, string, bool) {
		out, code, text := m.Call(context.Background(), req, dst)
		return out, code, text, true
	}
	return s
}

// ErrServerStopped is Serve's error once the Server stopped.
var ErrServerStopped = errors.New("grpcunary: server stopped")

// Serve accepts connections on ln until the Server stops (ErrServerStopped)
// or ln fails.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerStopped
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.stopping
			s.mu.Unlock()
			if stopping {
				return ErrServerStopped
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of descriptors and alike: back off and go on (as
			// net/http), the listener stays.
			s.log.Warn("rls grpc: accept", "err", err)
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			time.Sleep(delay)
			continue
		}
		delay = 0
		c := newConn(s, nc)
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			_ = nc.Close()
			return ErrServerStopped
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// GracefulStop stops accepting, sends every connection a GOAWAY (its
// streams so far finish; the client retries later ones elsewhere) and
// waits for them; when ctx ends first, the remaining connections are
// closed.
func (s *Server) GracefulStop(ctx context.Context) {
	s.mu.Lock()
	s.stopping = true
	for ln := range s.lns {
		_ = ln.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	// Concurrently: a connection whose client does not read holds its
	// lock up to WriteTimeout.
	for _, c := range conns {
		go c.goAway()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	s.Stop()
	<-done
}

// Stop closes the listeners and every connection now.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopping = true
	for ln := range s.lns {
		_ = ln.Close()
	}
	for c := range s.conns {
		_ = c.raw.Close()
	}
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stopped) })
}

// run runs f on an idle worker, or a new one. Workers are bounded by the
// calls in flight, which MaxConcurrentStreams bounds per connection.
func (s *Server) run(f func()) {
	select {
	case s.work <- f:
	default:
		go s.worker(f)
	}
}

func (s *Server) worker(f func()) {
	f()
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		select {
		case f := <-s.work:
			f()
			t.Reset(workerIdle)
		case <-t.C:
			return
		case <-s.stopped:
			return
		}
	}
}
