// Package stage is the L7 stage the daemon runs: it owns the listener, the
// engine that serves it (the event loop or net/http, as the policy's
// l7.engine says), the hot swap of the proxy on a reload, and the graceful
// shutdown. The daemon calls only this package; internal/l7/proxy decides
// each request, and internal/l7/eventloop or net/http carries it.
//
// A change is prepared, then committed or aborted (Prepare, Change): Prepare
// builds the new proxy and binds a new listener when the stage is new or its
// address changes, so a taken port fails there, before anything changes;
// Commit makes it serve and cannot fail; Abort undoes Prepare.
//
// What a reload does (docs/l7-proxy.md, "Reloads"):
//   - same engine, upstream and loops: the new proxy takes over every
//     connection at once (its handler is swapped; connections stay open);
//   - another engine, upstream or loops: a new engine instance starts on
//     the same socket (a duplicate of its descriptor), and the old one stops
//     accepting and finishes its requests in the background (ShutdownTimeout);
//   - another listen address: as above, on a new socket; the old one closes;
//   - no l7: section: the stage stops in the background.
//
// A replaced proxy is closed once its engine instance drained, or, after a
// handler swap, ShutdownTimeout later (requests still deciding on it finish
// first); Close waits for all of it.
package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/l7/accesslog"
	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/eventloop"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
)

// Timeouts of both engines (docs/l7-proxy.md, "Engines").
const (
	// ShutdownTimeout bounds how long a stopping engine waits for the
	// requests in flight.
	ShutdownTimeout = 10 * time.Second
	// ReadHeaderTimeout bounds a request head, IdleTimeout a kept-alive
	// connection's wait for its next request.
	ReadHeaderTimeout = 10 * time.Second
	IdleTimeout       = 2 * time.Minute
	// (Request bodies, responses and tunnels: the policy's l7.timeouts,
	// proxy.Config.Timeouts.)
)

// Options are the stage's collaborators.
type Options struct {
	Logger *slog.Logger
	// Escalator receives the sources the proxy escalates.
	Escalator proxy.Escalator
	// Promoter receives the sources the proxy promotes (the policy's
	// standing.l7_promotion, passed to Prepare).
	Promoter proxy.Promoter
	// Classes is the client ranking every proxy uses while l7.classes is
	// enabled (nil: none); the stage configures it at each commit and it
	// keeps what it knows of clients across reloads.
	Classes *class.Table
	// Loops is the number of event loops when the policy sets no l7.loops
	// (0: GOMAXPROCS at New). edgectl run passes the number of cores it
	// found before raising GOMAXPROCS by one.
	Loops int
}

// Stage is the L7 stage. Its zero value is not usable: call New.
type Stage struct {
	opts Options
	log  *slog.Logger

	mu    sync.Mutex // guards run and raw; a change is prepared and committed by one caller at a time (the daemon's lock)
	run   *instance  // nil: the stage is stopped
	raw   []byte     // the l7: section of run's proxy
	promo Standing   // and its standing settings

	// alog is the access log the serving proxy writes (nil: none); it
	// stays open across reloads that keep its path.
	alog *accesslog.Log

	bg      sync.WaitGroup // engines stopping, proxies closing
	closing chan struct{}  // closed by Close: replaced proxies close at once
	closed  sync.Once
	started atomic.Uint64 // engine instances started
	failed  atomic.Uint64 // engine instances that ended with an error
}

// New returns a stopped stage.
func New(opts Options) *Stage {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Stage{opts: opts, log: opts.Logger, closing: make(chan struct{})}
}

// Collector is the stage's metrics: the engine serving, engine starts and
// failures, and every series of the proxy that serves (a reload swaps
// them; nothing is registered per proxy). Register it once.
func (s *Stage) Collector() prometheus.Collector { return collector{s} }

// instance is one engine serving one socket with the proxy in cur.
type instance struct {
	engine   proxy.Engine
	key      string // what a handler swap cannot change: engine, upstream, loops
	listen   string // the configured address
	sock     *socket
	cur      atomic.Pointer[proxy.Proxy]
	log      *slog.Logger
	serve    func(ctx context.Context) error // runs the engine until ctx ends
	discard  func()                          // undoes newInstance when it never serves
	cancel   context.CancelFunc
	done     chan struct{}
	upstream string
}

// socket is a bound listener shared by the engine instances on it: each
// instance serves its own duplicate of the descriptor (engines close what
// they serve) and holds a reference from Prepare until it stops; the
// socket closes when the last reference goes (a Prepare that bound it
// holds one until its Commit or Abort).
type socket struct {
	ln   *net.TCPListener
	mu   sync.Mutex
	refs int
}

func (s *socket) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refs--
	if s.refs == 0 {
		_ = s.ln.Close()
	}
}

// dup returns a listener on a duplicate of the socket's descriptor.
func (s *socket) dup() (net.Listener, error) {
	f, err := s.ln.File()
	if err != nil {
		return nil, fmt.Errorf("duplicate the listener: %w", err)
	}
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("duplicate the listener: %w", err)
	}
	s.mu.Lock()
	s.refs++
	s.mu.Unlock()
	return ln, nil
}

// Change is a prepared change of the stage: Commit or Abort it, once.
type Change struct {
	s      *Stage
	commit func()
	abort  func()
	once   sync.Once
	noop   bool // nothing changes (the access log is kept as it is)
	alog   *accesslog.Log
}

// AccessLog is the access log the stage writes once the change is
// committed (nil: none): the rate-limit service writes through it, so the
// l7: section has one writer per file, reopened (SIGUSR1) and closed by
// the stage.
func (c *Change) AccessLog() *accesslog.Log { return c.alog }

// Commit makes the prepared change live. It cannot fail and does not wait
// for what it replaces to stop.
func (c *Change) Commit() { c.once.Do(c.commit) }

// Abort undoes Prepare: the prepared proxy is closed, a socket it bound is
// closed, and what serves stays as it was.
func (c *Change) Abort() { c.once.Do(c.abort) }

func noChange(s *Stage) *Change {
	return &Change{s: s, commit: func() {}, abort: func() {}, noop: true}
}

// loops is the event loops a config asks for.
func (s *Stage) loops(cfg *proxy.Config) int {
	if cfg.Loops > 0 {
		return cfg.Loops
	}
	if s.opts.Loops > 0 {
		return s.opts.Loops
	}
	return 0 // eventloop.New's default
}

func (s *Stage) engineKey(cfg *proxy.Config) string {
	e := cfg.ServingEngine()
	if e == proxy.EngineNetHTTP {
		return string(e)
	}
	return string(e) + " " + cfg.Upstream.String() + " " + strconv.Itoa(s.loops(cfg)) +
		// The request rules the event loop holds (proxy.Config.ApplyRules).
		fmt.Sprintf(" %+v %q %+v", cfg.Paths, cfg.IdentityFields, cfg.Timeouts)
}

// Standing is what the stage takes from the policy's standing: section.
type Standing struct {
	// Promotion is standing.l7_promotion.
	Promotion proxy.Promotion
	// EstablishedAfter is standing.established_after: the L7 history a
	// client needs to rank as established (internal/l7/class).
	EstablishedAfter time.Duration
	// ASN is the policy's asn_data (limits keyed on asn), or nil.
	ASN *asn.Table
}

// classConfig is the ranking's configuration for cfg and std.
func classConfig(cfg *proxy.Config, std Standing) class.Config {
	return cfg.Classes.Ranking(std.EstablishedAfter)
}

// Prepare readies the stage to serve cfg (nil: no L7 stage) without
// changing what serves now. raw is the l7: section as written: an equal one
// is no change. It builds the new proxy and, when the stage is stopped or
// its listen address changes, binds the new address (a taken port fails
// here). promo is the policy's L7 promotion (standing.l7_promotion), which
// lives outside the l7: section: a change of it alone rebuilds the proxy.
// A cfg that serves no proxy (an l7: section with only the rate-limit
// service) stops the proxy and keeps the access log: the stage owns the
// section's one access log, which the rate-limit service writes through
// (Change.AccessLog).
func (s *Stage) Prepare(ctx context.Context, cfg *proxy.Config, raw []byte, promo Standing) (*Change, error) {
	s.mu.Lock()
	cur := s.alog
	s.mu.Unlock()
	alog, opened := cur, false
	switch {
	case cfg == nil || cfg.AccessLog == "":
		alog = nil
	case cur == nil || cur.Path() != cfg.AccessLog:
		l, err := accesslog.Open(cfg.AccessLog)
		if err != nil {
			return nil, err
		}
		alog, opened = l, true
	}
	serve := cfg
	if cfg != nil && !cfg.ServesProxy() {
		serve = nil
	}
	ch, err := s.prepare(ctx, serve, raw, promo, alog)
	switch {
	case err != nil:
		if opened {
			alog.Close()
		}
		return nil, err
	case ch.noop && alog == cur:
		ch.alog = alog
		return ch, nil
	case ch.noop:
		// The proxy stays as it is (or stopped); only the log changes.
		ch = &Change{s: s, commit: func() {}, abort: func() {}}
	}
	ch.alog = alog
	commit, abort := ch.commit, ch.abort
	ch.commit = func() {
		commit()
		s.mu.Lock()
		old := s.alog
		s.alog = alog
		s.mu.Unlock()
		if old != nil && old != alog {
			s.closeLogLater(old)
		}
	}
	ch.abort = func() {
		abort()
		if opened {
			alog.Close()
		}
	}
	return ch, nil
}

// closeLogLater closes an access log no longer written once the proxies
// that may still write it are closed (ShutdownTimeout, as closeLater).
func (s *Stage) closeLogLater(l *accesslog.Log) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		t := time.NewTimer(ShutdownTimeout + time.Second)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.closing:
			// Lines still logged to it after this are dropped, safely.
		}
		l.Close()
	}()
}

// ReopenAccessLog reopens the access log's file (SIGUSR1, after logrotate
// renamed it); nil when there is no access log.
func (s *Stage) ReopenAccessLog() error {
	s.mu.Lock()
	l := s.alog
	s.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.Reopen()
}

// AccessLogStats are the access log's counters (zero without one).
func (s *Stage) AccessLogStats() accesslog.Stats {
	s.mu.Lock()
	l := s.alog
	s.mu.Unlock()
	if l == nil {
		return accesslog.Stats{}
	}
	return l.Stats()
}

func (s *Stage) prepare(ctx context.Context, cfg *proxy.Config, raw []byte, promo Standing, alog *accesslog.Log) (*Change, error) {
	select {
	case <-s.closing:
		return nil, errors.New("the l7 stage is closed")
	default:
	}
	s.mu.Lock()
	run, curRaw, curPromo := s.run, s.raw, s.promo
	s.mu.Unlock()
	if cfg == nil {
		if run == nil {
			return noChange(s), nil
		}
		return &Change{s: s, abort: func() {}, commit: func() {
			s.mu.Lock()
			s.run, s.raw = nil, nil
			s.mu.Unlock()
			s.log.Info("l7 stage stopping: the policy has no l7 section", "addr", run.sock.ln.Addr().String())
			s.stopInBackground(run)
		}}, nil
	}
	if run != nil && string(curRaw) == string(raw) && curPromo == promo {
		return noChange(s), nil
	}
	opts := proxy.Options{Logger: s.log, Escalator: s.opts.Escalator,
		Promoter: s.opts.Promoter, Promotion: promo.Promotion, AccessLog: alog, ASN: promo.ASN}
	// rank installs the ranking's settings with the proxy that uses them.
	rank := func() {}
	if cfg.Classes.Enabled && s.opts.Classes != nil {
		opts.Classes = s.opts.Classes
		ranking := classConfig(cfg, promo)
		rank = func() { s.opts.Classes.Configure(ranking) }
	}
	p, err := proxy.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	key := s.engineKey(cfg)
	if run != nil && run.listen == cfg.Listen && run.key == key {
		return &Change{s: s, abort: p.Close, commit: func() {
			rank()
			old := run.cur.Swap(p)
			s.mu.Lock()
			s.raw, s.promo = raw, promo
			s.mu.Unlock()
			s.log.Info("l7 stage: new policy serving", "engine", run.engine, "addr", run.sock.ln.Addr().String())
			s.closeLater(old)
		}}, nil
	}
	var sock *socket
	if run != nil && run.listen == cfg.Listen {
		sock = run.sock
	} else {
		var lc net.ListenConfig
		// Plain TCP, not Go's default MPTCP: the kernel refuses SYN-cookie
		// requests (the syn: section's, docs/tcp.md) for MPTCP listeners.
		lc.SetMultipathTCP(false)
		ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
		}
		sock = &socket{ln: ln.(*net.TCPListener), refs: 1}
	}
	next, err := s.newInstance(cfg, key, sock, p)
	if err != nil {
		p.Close()
		if run == nil || sock != run.sock {
			sock.release()
		}
		return nil, err
	}
	newSock := run == nil || sock != run.sock
	return &Change{s: s,
		abort: func() {
			next.discard()
			p.Close()
			if newSock {
				sock.release()
			}
		},
		commit: func() {
			rank()
			s.start(next)
			s.mu.Lock()
			s.run, s.raw, s.promo = next, raw, promo
			s.mu.Unlock()
			if newSock {
				sock.release() // the instances hold it from here
			}
			if run != nil {
				s.stopInBackground(run)
			}
		}}, nil
}

// newInstance builds (does not start) an engine instance for cfg on sock,
// serving p. Every error an engine can report before serving is reported
// here.
func (s *Stage) newInstance(cfg *proxy.Config, key string, sock *socket, p *proxy.Proxy) (*instance, error) {
	in := &instance{engine: cfg.ServingEngine(), key: key, listen: cfg.Listen, sock: sock, done: make(chan struct{}),
		upstream: cfg.Upstream.Redacted()}
	in.log = s.log.With("engine", string(in.engine))
	in.cur.Store(p)
	ln, err := sock.dup()
	if err != nil {
		return nil, err
	}
	switch in.engine {
	case proxy.EngineEventLoop:
		ec := eventloop.Config{
			Upstream:          cfg.Upstream,
			Handler:           in,
			TrustedPeer:       in.trusted,
			BadGateway:        in.badGateway,
			Logger:            in.log,
			Loops:             s.loops(cfg),
			ReadHeaderTimeout: ReadHeaderTimeout,
			IdleTimeout:       IdleTimeout,
			ShutdownTimeout:   ShutdownTimeout,
			AcceptPaused:      func(err error) { in.cur.Load().AcceptPaused(err) },
		}
		cfg.ApplyRules(&ec)
		srv, err := eventloop.New(ec)
		if err != nil {
			_ = ln.Close()
			sock.release()
			return nil, err
		}
		in.serve = func(ctx context.Context) error { return srv.Serve(ctx, ln) }
	case proxy.EngineNetHTTP:
		srv := &http.Server{
			Handler:           in,
			ReadHeaderTimeout: ReadHeaderTimeout,
			IdleTimeout:       IdleTimeout,
			MaxHeaderBytes:    proxy.MaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(in.log.Handler(), slog.LevelDebug),
		}
		in.serve = func(ctx context.Context) error {
			done := make(chan error, 1)
			go func() {
				done <- srv.Serve(proxy.CountAcceptPauses(ln, func(err error) { in.cur.Load().AcceptPaused(err) }))
			}()
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
			defer cancel()
			err := srv.Shutdown(sctx)
			if err != nil {
				_ = srv.Close()
				err = fmt.Errorf("requests still in flight after %v: closed", ShutdownTimeout)
			}
			if serr := <-done; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
				err = serr
			}
			return err
		}
	default:
		_ = ln.Close()
		sock.release()
		return nil, fmt.Errorf("unknown engine %q", in.engine)
	}
	in.discard = func() {
		_ = ln.Close()
		sock.release()
	}
	return in, nil
}

// start runs an instance's engine until it is stopped.
func (s *Stage) start(in *instance) {
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	s.started.Add(1)
	go func() {
		defer close(in.done)
		if err := in.serve(ctx); err != nil {
			s.failed.Add(1)
			in.log.Error("l7 stage: engine ended", "err", err)
		}
		if ctx.Err() == nil {
			in.log.Error("l7 stage: engine stopped serving before it was asked to", "addr", in.sock.ln.Addr().String())
		}
	}()
	in.log.Info("l7 stage listening", "addr", in.sock.ln.Addr().String(), "upstream", in.upstream)
}

// stopInBackground stops an instance gracefully and closes its proxy,
// without waiting; Close waits.
func (s *Stage) stopInBackground(in *instance) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		in.stop()
	}()
}

// closeLater closes a proxy replaced by a handler swap once the requests
// that may still be deciding on it had ShutdownTimeout to finish.
func (s *Stage) closeLater(p *proxy.Proxy) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		t := time.NewTimer(ShutdownTimeout)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.closing:
		}
		p.Close()
	}()
}

// stop stops the instance gracefully: it lets go of its socket at once
// (the socket closes unless a newer instance serves it; an engine still
// holds its own descriptor until it returns), waits for the engine to
// finish its requests, then closes the proxy.
func (in *instance) stop() {
	in.cancel()
	in.sock.release()
	<-in.done
	in.cur.Load().Close()
}

// Close stops the stage gracefully (ShutdownTimeout) and waits for
// everything it started (engines draining, replaced proxies) to end.
// Prepare fails after Close.
func (s *Stage) Close() {
	s.closed.Do(func() { close(s.closing) })
	s.mu.Lock()
	run := s.run
	s.run, s.raw = nil, nil
	s.mu.Unlock()
	if run != nil {
		run.stop()
	}
	s.bg.Wait()
	s.mu.Lock()
	l := s.alog
	s.alog = nil
	s.mu.Unlock()
	if l != nil {
		l.Close()
	}
}

// Status is what the stage serves now.
type Status struct {
	// Running: an l7: section is served.
	Running  bool
	Engine   proxy.Engine
	Addr     string // the bound address
	Upstream string
	Routes   []string
}

// Status reports what the stage serves.
func (s *Stage) Status() Status {
	s.mu.Lock()
	run := s.run
	s.mu.Unlock()
	if run == nil {
		return Status{}
	}
	return Status{Running: true, Engine: run.engine, Addr: run.sock.ln.Addr().String(), Upstream: run.upstream,
		Routes: run.cur.Load().RouteNames()}
}

// Decisions are the serving proxy's request counts by route and decision
// (nil when the stage is stopped).
func (s *Stage) Decisions() []proxy.RouteDecisions {
	s.mu.Lock()
	run := s.run
	s.mu.Unlock()
	if run == nil {
		return nil
	}
	return run.cur.Load().Decisions()
}

// ClassCounts are the requests by client class since the stage was made;
// false when the stage is stopped or its proxy does not rank clients
// (l7.classes disabled).
func (s *Stage) ClassCounts() (class.Counts, bool) {
	s.mu.Lock()
	run := s.run
	s.mu.Unlock()
	if run == nil || s.opts.Classes == nil || !run.cur.Load().Ranks() {
		return class.Counts{}, false
	}
	return s.opts.Classes.Counts(), true
}

// ExplainClient is the class table's view of a client that is the TCP
// peer (class.Table.Explain); false when ClassCounts would be.
func (s *Stage) ExplainClient(a netip.Addr) (class.Explanation, bool) {
	if _, ok := s.ClassCounts(); !ok {
		return class.Explanation{}, false
	}
	return s.opts.Classes.Explain(a, true), true
}

// ServeHTTP hands the request to the instance's current proxy.
func (in *instance) ServeHTTP(w http.ResponseWriter, r *http.Request) { in.cur.Load().ServeHTTP(w, r) }

// Decide is the event loop's way in: the serving proxy's decision.
func (in *instance) Decide(w http.ResponseWriter, r *http.Request) eventloop.Decision {
	return in.cur.Load().Decide(w, r)
}

func (in *instance) trusted(a netip.Addr) bool { return in.cur.Load().Trusted(a) }

func (in *instance) badGateway(w http.ResponseWriter, r *http.Request, err error) {
	in.cur.Load().BadGateway(w, r, err)
}
