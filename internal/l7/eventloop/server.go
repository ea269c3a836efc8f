package eventloop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Config configures a Server.
type Config struct {
	// Upstream is where forwarded requests go: an http URL; its path, when
	// not empty, is joined in front of every request's path (as
	// httputil.ProxyRequest.SetURL does).
	Upstream *url.URL
	// Handler decides each request on its loop: it answers it itself
	// (Respond), has it proxied (Forward), or, when its decision may block
	// (a network round trip, a queue), decides on a goroutine (Continue).
	Handler Handler
	// TrustedPeer reports whether a peer's X-Forwarded-For is kept (and
	// appended to); otherwise it is replaced by the peer's address. Nil:
	// no peer is trusted.
	TrustedPeer func(netip.Addr) bool
	// BadGateway answers a request the upstream did not answer (a refused
	// connection, a malformed or missing response head). Nil: a plain 502.
	BadGateway func(w http.ResponseWriter, r *http.Request, err error)
	// Logger receives connection-level errors at debug level (default:
	// discard).
	Logger *slog.Logger
	// Loops is the number of event loops (default GOMAXPROCS). Serve
	// leaves GOMAXPROCS alone (a process-wide setting: edgectl run sets it
	// to the cores plus one and passes the cores as Loops, so a P is left
	// for handlers, the garbage collector and timers, and a loop asleep in
	// epoll_wait leaves an idle P behind; docs/l7-proxy.md, "Engines").
	Loops int
	// ReadHeaderTimeout bounds the time from a request's first byte to the
	// end of its head (default 10s); IdleTimeout bounds the wait for the
	// next request on a kept-alive connection (default 2m); DialTimeout
	// bounds a connect to the upstream (default 10s).
	ReadHeaderTimeout, IdleTimeout, DialTimeout time.Duration
	// MaxIdleUpstream bounds the idle upstream connections kept across all
	// loops (default 512); an idle one is closed after 90s.
	MaxIdleUpstream int
	// ShutdownTimeout bounds how long Serve waits for requests in flight
	// once its context ends (default 10s).
	ShutdownTimeout time.Duration
	// BodyReadTimeout and ResponseTimeout are transfer periods (defaults
	// 60s, nginx's client_body_timeout and send_timeout): while the relay
	// waits for a request body, each BodyReadTimeout must bring at least
	// MinRate bytes a second of it (and at least one byte); while a
	// response waits for the client to take it, each ResponseTimeout must
	// see MinRate bytes a second go. So a body or response of N bytes is
	// done within one period plus N/MinRate, or the connection is closed
	// (and its upstream connection): a request body that is too slow is
	// answered 408 first when nothing of the response went out. Checked
	// once a second. The body period does not run while the upstream is
	// not taking the body, the response period only while bytes wait for
	// the client.
	BodyReadTimeout, ResponseTimeout time.Duration
	// MinRate is in bytes per second (0: at least one byte per period).
	MinRate int64
	// StrictPaths refuses (400) a request path target.Normalize refuses
	// under its strict rule; otherwise the standard rule applies. Routing
	// always sees the normal path (Request.URL.Path).
	StrictPaths bool
	// PathsAsSent forwards the request target as the client sent it;
	// otherwise its normal form goes upstream.
	PathsAsSent bool
	// TunnelIdleTimeout closes a connection upgraded by a 101 (a
	// WebSocket) that carried no byte either way for that long (default
	// 5m).
	TunnelIdleTimeout time.Duration
	// IdentityFields are request fields removed before the request goes
	// upstream (any case): client-set claims of who the client is
	// (proxy.Config.IdentityFields). Fields whose name holds an
	// underscore are always removed: CGI and WSGI upstreams read
	// X_Forwarded_For as X-Forwarded-For.
	IdentityFields []string
	// AcceptPaused, when set, is called (on a loop) each time a loop stops
	// accepting for a while because accept4 ran out of file descriptors
	// or socket memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): for a metric.
	AcceptPaused func(err error)
}

// Limits of the engine (documented in docs/l7-proxy.md, "Engines").
const (
	// maxHead bounds a request or response head; a longer request head is
	// answered 431.
	maxHead = 64 << 10
	// bufSize is a connection's read buffer while it holds data.
	bufSize = 16 << 10
	// maxPending bounds the bytes queued for one socket before the loop
	// stops reading the other side (back-pressure).
	maxPending = 256 << 10
	// upstreamIdleTimeout closes an idle upstream connection.
	upstreamIdleTimeout = 90 * time.Second
)

// Server is a running engine's configuration; Serve runs it.
type Server struct {
	cfg      Config
	log      *slog.Logger
	hostPort string // the upstream's host:port
	basePath string // the upstream URL's path, "" or without a trailing slash
	baseQ    string // the upstream URL's raw query
	// identity is IdentityFields in lower case; identityLens has bit n set
	// when one of them is n bytes long (n < 64), so most fields are passed
	// without a lookup.
	identity     map[string]struct{}
	identityLens uint64
	addrs        atomic.Pointer[[]netip.AddrPort]
	next         atomic.Uint64 // round robin over loops (accept)
	handlers     sync.WaitGroup
	served       atomic.Bool
}

// New checks cfg and fills its defaults.
func New(cfg Config) (*Server, error) {
	if cfg.Upstream == nil || cfg.Upstream.Scheme != "http" || cfg.Upstream.Host == "" {
		return nil, errors.New("eventloop: the upstream must be an http:// URL with a host")
	}
	if cfg.Handler == nil {
		return nil, errors.New("eventloop: no handler")
	}
	if cfg.Loops <= 0 {
		cfg.Loops = runtime.GOMAXPROCS(0)
	}
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = 10 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 2 * time.Minute
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.MaxIdleUpstream <= 0 {
		cfg.MaxIdleUpstream = 512
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.BodyReadTimeout <= 0 {
		cfg.BodyReadTimeout = 60 * time.Second
	}
	if cfg.ResponseTimeout <= 0 {
		cfg.ResponseTimeout = 60 * time.Second
	}
	if cfg.TunnelIdleTimeout <= 0 {
		cfg.TunnelIdleTimeout = 5 * time.Minute
	}
	if cfg.BadGateway == nil {
		cfg.BadGateway = func(w http.ResponseWriter, _ *http.Request, _ error) {
			w.Header()["Content-Type"] = []string{"text/plain; charset=utf-8"}
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("bad gateway\n"))
		}
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.hostPort = cfg.Upstream.Host
	if cfg.Upstream.Port() == "" {
		s.hostPort = net.JoinHostPort(cfg.Upstream.Hostname(), "80")
	}
	s.basePath = cfg.Upstream.EscapedPath()
	if s.basePath == "/" {
		s.basePath = ""
	}
	s.baseQ = cfg.Upstream.RawQuery
	s.identity = map[string]struct{}{}
	for _, name := range cfg.IdentityFields {
		if len(name) == 0 || len(name) >= 64 {
			return nil, fmt.Errorf("eventloop: identity field %q: want 1-63 bytes", name)
		}
		s.identity[strings.ToLower(name)] = struct{}{}
		s.identityLens |= 1 << len(name)
	}
	return s, nil
}

// identityField reports whether a request field is removed before the
// request goes upstream: one of IdentityFields, or a name with an
// underscore.
func (s *Server) identityField(name []byte) bool {
	if indexByte(name, '_') >= 0 {
		return true
	}
	if len(name) >= 64 || s.identityLens&(1<<len(name)) == 0 {
		return false
	}
	var buf [64]byte
	for i, c := range name {
		buf[i] = lower(c)
	}
	_, ok := s.identity[string(buf[:len(name)])]
	return ok
}

// Serve serves ln until ctx ends, then stops accepting, lets the requests
// in flight finish (ShutdownTimeout), closes every connection and returns.
// ln must be a TCP listener; it is closed on return. A Server serves once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) (err error) {
	defer ln.Close()
	if !s.served.CompareAndSwap(false, true) {
		return errors.New("eventloop: a server serves once")
	}
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return fmt.Errorf("eventloop: listener %T has no file descriptor", ln)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return fmt.Errorf("eventloop: listener: %w", err)
	}
	lfd := -1
	if err := raw.Control(func(fd uintptr) { lfd = int(fd) }); err != nil {
		return fmt.Errorf("eventloop: listener: %w", err)
	}

	rctx, stopResolve := context.WithCancel(context.Background())
	defer stopResolve()
	s.resolve(rctx)
	go s.keepResolving(rctx)

	loops := make([]*loop, s.cfg.Loops)
	for i := range loops {
		if loops[i], err = newLoop(s, i, lfd, loops); err != nil {
			for _, l := range loops[:i] {
				l.closeFDs()
			}
			return err
		}
	}
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.run()
		}()
	}
	exited := make(chan struct{})
	go func() {
		wg.Wait()
		close(exited)
	}()
	select {
	case <-ctx.Done():
	case <-exited:
	}
	for _, l := range loops {
		l.post(l.drain)
	}
	timer := time.NewTimer(s.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-exited:
	case <-timer.C:
		err = fmt.Errorf("eventloop: requests still in flight after %v: closed", s.cfg.ShutdownTimeout)
		for _, l := range loops {
			l.post(l.closeAll)
		}
		<-exited
	}
	// Handlers on goroutines finish once their connections are closed
	// (their contexts are cancelled, their forwards answered).
	s.handlers.Wait()
	// Work posted to a loop after it ended: connections dealt to it
	// (closed, as it is draining) and handlers' last words.
	for _, l := range loops {
		l.runPosted()
	}
	for _, l := range loops {
		if l.err != nil && err == nil {
			err = l.err
		}
		l.closeFDs()
	}
	return err
}

// resolve looks the upstream's host up (bounded by 5s) and keeps the
// addresses; a failure keeps the previous ones.
func (s *Server) resolve(ctx context.Context) {
	host, portStr, err := net.SplitHostPort(s.hostPort)
	if err != nil {
		s.log.Warn("l7 event loop: bad upstream address", "upstream", s.hostPort, "err", err)
		return
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		s.log.Warn("l7 event loop: bad upstream port", "upstream", s.hostPort, "err", err)
		return
	}
	if a, err := netip.ParseAddr(host); err == nil {
		s.addrs.Store(&[]netip.AddrPort{netip.AddrPortFrom(a.Unmap(), uint16(port))})
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(ips) == 0 {
		if ctx.Err() == nil {
			s.log.Warn("l7 event loop: cannot resolve the upstream; keeping the last addresses", "upstream", host, "err", err)
		}
		return
	}
	out := make([]netip.AddrPort, len(ips))
	for i, a := range ips {
		out[i] = netip.AddrPortFrom(a.Unmap(), uint16(port))
	}
	s.addrs.Store(&out)
}

// keepResolving re-resolves a named upstream every 30s until ctx ends.
func (s *Server) keepResolving(ctx context.Context) {
	host, _, _ := net.SplitHostPort(s.hostPort)
	if _, err := netip.ParseAddr(host); err == nil {
		return
	}
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.resolve(ctx)
		}
	}
}

// upstreamAddrs returns the resolved upstream addresses, in the
// resolver's order of preference.
func (s *Server) upstreamAddrs() []netip.AddrPort {
	if p := s.addrs.Load(); p != nil {
		return *p
	}
	return nil
}
