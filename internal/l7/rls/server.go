package rls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeguard/edgeguard/internal/grpcunary"
	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
)

// Timeouts and bounds of the listeners.
const (
	// ShutdownTimeout bounds how long a replaced listener waits for its
	// requests, and how long a replaced Service stays usable.
	ShutdownTimeout = 10 * time.Second
	// MaxRecvMsgSize bounds one gRPC request (Envoy's are a few hundred bytes).
	MaxRecvMsgSize = 64 << 10
	// MaxConcurrentStreams bounds the streams of one gRPC connection.
	MaxConcurrentStreams = 1024
	// MaxHeaderBytes bounds the subrequest endpoint's request head.
	MaxHeaderBytes = 16 << 10
)

// ServerOptions are a Server's collaborators.
type ServerOptions struct {
	Logger    *slog.Logger
	Clock     l7.Clock
	Escalator proxy.Escalator
	// Classes is the class table shared with the L7 stage (nil: requests
	// are not ranked). A committed configuration with l7.classes enabled
	// installs its ranking settings in it (the same the stage installs).
	Classes *class.Table
}

// Server runs the rate-limit service's listeners and swaps the Service
// behind them on a reload (Prepare, then Commit or Abort).
type Server struct {
	opts ServerOptions
	log  *slog.Logger
	cur  atomic.Pointer[Service]

	mu   sync.Mutex // one change at a time (the daemon's lock)
	eps  map[string]*endpoint
	cert atomic.Pointer[tls.Config]
	cfg  *Config // what serves (nil: stopped)

	bg      sync.WaitGroup
	closing chan struct{}
	once    sync.Once
}

// endpoint is one listener and what serves it.
type endpoint struct {
	kind, addr string
	ln         net.Listener
	serve      func()
	stop       func(ctx context.Context)
}

// NewServer returns a stopped server.
func NewServer(opts ServerOptions) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{opts: opts, log: opts.Logger, eps: map[string]*endpoint{}, closing: make(chan struct{})}
}

func (s *Server) acquire() *Service { return s.cur.Load() }
func (s *Server) release(*Service)  {}

// Service is the Service serving now (nil: stopped).
func (s *Server) Service() *Service { return s.cur.Load() }

// Change is a prepared change: Commit or Abort it, once.
type Change struct {
	commit, abort func()
	once          sync.Once
}

// Commit makes the change live; it cannot fail.
func (c *Change) Commit() { c.once.Do(c.commit) }

// Abort undoes Prepare; what serves stays as it was.
func (c *Change) Abort() { c.once.Do(c.abort) }

func endpointKeys(cfg *Config) map[string]string {
	keys := map[string]string{}
	if cfg == nil {
		return keys
	}
	if cfg.Listen != "" {
		k := "grpc " + cfg.Listen
		if cfg.TLS != nil {
			k = "grpc+tls " + cfg.Listen
		}
		keys[k] = cfg.Listen
	}
	if cfg.Unix != "" {
		keys["unix "+cfg.Unix] = cfg.Unix
	}
	if cfg.HTTPListen != "" {
		keys["http "+cfg.HTTPListen] = cfg.HTTPListen
	}
	return keys
}

// Prepare readies cfg (nil: stop) without changing what serves: it builds
// the new Service, loads the TLS files and binds the listeners whose
// address changed, so a taken port or a bad certificate fails here.
func (s *Server) Prepare(cfg *Config) (*Change, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg != nil && cfg != nil && reflect.DeepEqual(*s.cfg, *cfg) {
		// The same configuration (a reload that changed another part of
		// the policy): the Service and its limits' state stay; only the
		// TLS files are read again, for a rotated certificate.
		var tc *tls.Config
		if cfg.TLS != nil {
			var err error
			if tc, err = loadTLS(cfg.TLS); err != nil {
				return nil, err
			}
		}
		return &Change{commit: func() {
			if tc != nil {
				s.cert.Store(tc)
			}
		}, abort: func() {}}, nil
	}
	var svc *Service
	var tc *tls.Config
	if cfg != nil {
		var err error
		if cfg.TLS != nil {
			if tc, err = loadTLS(cfg.TLS); err != nil {
				return nil, err
			}
		}
		if svc, err = New(cfg, Options{Logger: s.log, Clock: s.opts.Clock, Escalator: s.opts.Escalator, AccessLog: cfg.AccessLog,
			Classes: s.opts.Classes}); err != nil {
			return nil, err
		}
	}
	want := endpointKeys(cfg)
	fresh := map[string]*endpoint{}
	fail := func(err error) (*Change, error) {
		for _, ep := range fresh {
			_ = ep.ln.Close()
		}
		if svc != nil {
			svc.Close()
		}
		return nil, err
	}
	// Listeners that go away are closed before new ones bind, only at
	// commit; a new address that an old listener holds is an error
	// (switching TLS on one address needs two steps).
	for k, addr := range want {
		if s.eps[k] != nil {
			continue
		}
		ep, err := s.bind(k, addr)
		if err != nil {
			return fail(err)
		}
		fresh[k] = ep
	}
	commit := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if tc != nil {
			s.cert.Store(tc)
		}
		if cfg != nil && cfg.Classes.Enabled && s.opts.Classes != nil {
			s.opts.Classes.Configure(cfg.Classes.Ranking(cfg.EstablishedAfter))
		}
		old := s.cur.Swap(svc)
		s.cfg = cfg
		for k, ep := range s.eps {
			if _, keep := want[k]; !keep {
				delete(s.eps, k)
				s.stopLater(ep)
			}
		}
		for k, ep := range fresh {
			s.eps[k] = ep
			go ep.serve()
		}
		if old != nil {
			s.closeLater(old)
		}
	}
	abort := func() {
		for _, ep := range fresh {
			_ = ep.ln.Close()
		}
		if svc != nil {
			svc.Close()
		}
	}
	return &Change{commit: commit, abort: abort}, nil
}

func loadTLS(t *TLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("rls tls: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if t.ClientCA != "" {
		pem, err := os.ReadFile(t.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("rls tls client_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("rls tls client_ca %s: no PEM certificate", t.ClientCA)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// grpcServer serves ShouldRateLimit on one listener (grpcunary: unary
// gRPC over HTTP/2). With TLS the certificate is read per handshake: a
// reload with new files rotates it without dropping connections.
func (s *Server) grpcServer(secure bool) *grpcunary.Server {
	opts := grpcunary.Options{
		MaxRecvMsgSize:       MaxRecvMsgSize,
		MaxConcurrentStreams: MaxConcurrentStreams,
		MaxHeaderListSize:    MaxHeaderBytes,
		Logger:               s.log,
	}
	if secure {
		opts.TLS = &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"h2"},
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				return s.cert.Load(), nil
			},
		}
	}
	return grpcunary.NewServer(s.grpcMethod(), opts)
}

func (s *Server) bind(key, addr string) (*endpoint, error) {
	ep := &endpoint{addr: addr}
	var err error
	switch {
	case len(key) > 5 && key[:5] == "unix ":
		ep.kind = "unix"
		if err = removeStaleSocket(addr); err != nil {
			return nil, err
		}
		ep.ln, err = net.Listen("unix", addr)
		if err == nil {
			_ = os.Chmod(addr, 0o660)
		}
	default:
		ep.kind = key[:len(key)-len(addr)-1]
		ep.ln, err = net.Listen("tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("rls %s listener on %s: %w", ep.kind, addr, err)
	}
	switch ep.kind {
	case "http":
		hs := &http.Server{Handler: s.HTTPHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
			MaxHeaderBytes: MaxHeaderBytes, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
		ep.serve = func() { _ = hs.Serve(ep.ln) }
		ep.stop = func(ctx context.Context) {
			if hs.Shutdown(ctx) != nil {
				_ = hs.Close()
			}
		}
	default:
		gs := s.grpcServer(ep.kind == "grpc+tls")
		ep.serve = func() { _ = gs.Serve(ep.ln) }
		ep.stop = gs.GracefulStop
	}
	return ep, nil
}

// removeStaleSocket removes a Unix socket nobody listens on (left by a
// process that died); a live one, or a path that is not a socket, is an
// error.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("rls unix %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("rls unix %s: exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close()
		return fmt.Errorf("rls unix %s: another process listens on it", path)
	}
	return os.Remove(path)
}

func (s *Server) stopLater(ep *endpoint) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		go func() {
			select {
			case <-s.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		ep.stop(ctx)
		if ep.kind == "unix" {
			_ = os.Remove(ep.addr)
		}
	}()
}

// closeLater closes a replaced Service once the requests deciding on it
// are done (ShutdownTimeout later, or at Close).
func (s *Server) closeLater(svc *Service) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		t := time.NewTimer(ShutdownTimeout)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.closing:
		}
		svc.Close()
	}()
}

// Addrs are the bound addresses by kind (grpc, grpc+tls, unix, http).
func (s *Server) Addrs() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for _, ep := range s.eps {
		out[ep.kind] = ep.ln.Addr().String()
	}
	return out
}

// Close stops every listener and Service and waits for them.
func (s *Server) Close() {
	s.once.Do(func() {
		close(s.closing)
		s.mu.Lock()
		for k, ep := range s.eps {
			delete(s.eps, k)
			s.stopLater(ep)
		}
		if old := s.cur.Swap(nil); old != nil {
			s.closeLater(old)
		}
		s.cfg = nil
		s.mu.Unlock()
		s.bg.Wait()
	})
}
