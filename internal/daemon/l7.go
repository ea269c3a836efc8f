package daemon

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// decodeL7 validates the policy's l7: section. Its problems are reported
// with the rest of the policy's.
func decodeL7(p *policy.Policy, source string) (*proxy.Config, []byte, error) {
	if p.L7 == nil {
		return nil, nil, nil
	}
	cfg, problems := proxy.Decode(p.L7, source)
	if len(problems) > 0 {
		return nil, nil, &policy.ValidationError{File: source, Problems: problems}
	}
	raw, err := yaml.Marshal(p.L7)
	if err != nil {
		return nil, nil, fmt.Errorf("l7 section: %w", err)
	}
	return cfg, raw, nil
}

// l7Stage is the HTTP stage: one listener whose handler is the current
// proxy. A reload that changes the l7: section builds a new proxy and swaps
// it in; the listener stays, so connections are never refused. Rate-limit
// state of the L7 stage starts afresh on such a reload (XDP state does not).
type l7Stage struct {
	d       *Daemon
	current atomic.Pointer[proxy.Proxy]
	raw     []byte // the l7: section in force
	promo   proxy.Promotion
	listen  string
	srv     *http.Server
	done    chan error
}

func (s *l7Stage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := s.current.Load()
	if p == nil {
		http.Error(w, "edgeguard l7 stage not configured", http.StatusServiceUnavailable)
		return
	}
	p.ServeHTTP(w, r)
}

// syncL7 makes the L7 stage match the running policy. Caller holds d.mu.
func (d *Daemon) syncL7(ctx context.Context) error {
	cfg, raw := d.cur.l7, d.cur.l7raw
	s := d.l7
	if cfg == nil {
		if s != nil {
			d.stopL7()
		}
		return nil
	}
	promo := promotion(d.cur.compiled)
	if s != nil && bytes.Equal(s.raw, raw) && s.promo == promo {
		return nil
	}
	if s != nil && s.listen != cfg.Listen {
		d.stopL7()
		s = nil
	}
	// The old proxy unregisters its metrics on Close, which the new one
	// needs; requests in between are served by the old proxy's handler
	// with its limiters still in memory.
	if s != nil {
		if old := s.current.Load(); old != nil {
			old.Close()
		}
	}
	p, err := proxy.New(cfg, proxy.Options{Logger: d.log.With("stage", "l7"), Escalator: d, Registerer: d.reg,
		Promoter: d, Promotion: promo})
	if err != nil {
		return fmt.Errorf("l7 stage: %w", err)
	}
	if s == nil {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
		if err != nil {
			p.Close()
			return fmt.Errorf("l7 stage: listen on %s: %w", cfg.Listen, err)
		}
		s = &l7Stage{d: d, listen: cfg.Listen, done: make(chan error, 1)}
		s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
		go func() { s.done <- s.srv.Serve(ln) }()
		d.l7 = s
		d.log.Info("l7 stage listening", "addr", ln.Addr().String(), "upstream", cfg.Upstream.String())
	}
	s.current.Store(p)
	s.raw, s.promo = raw, promo
	return nil
}

// stopL7 shuts the L7 stage down gracefully. Caller holds d.mu.
func (d *Daemon) stopL7() {
	s := d.l7
	if s == nil {
		return
	}
	d.l7 = nil
	ctx, cancel := context.WithTimeout(context.Background(), proxy.ShutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
	if err := <-s.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		d.log.Error("l7 stage", "err", err)
	}
	if p := s.current.Load(); p != nil {
		p.Close()
	}
}

// Escalate implements proxy.Escalator: a source the L7 stage keeps
// rejecting is denied at the NIC for ttl. It never waits for the daemon's
// lock (a reload may hold it while closing the proxy that is calling): the
// request is queued for the daemon's escalation loop, or dropped with an
// error when the queue is full.
func (d *Daemon) Escalate(ctx context.Context, src netip.Prefix, ttl time.Duration, reason string) error {
	select {
	case d.escalations <- control.ListChange{Prefix: src, TTL: control.Duration(ttl), Reason: reason, Origin: "l7"}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	default:
		return errors.New("escalation queue full")
	}
}

// applyEscalations adds the L7 stage's escalations to the deny list.
func (d *Daemon) applyEscalations(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ch := <-d.escalations:
			if _, err := d.AddToList(control.Deny, ch); err != nil {
				d.log.Error("escalate to the deny list", "prefix", ch.Prefix, "err", err)
			}
		}
	}
}

// Validate checks a policy file as the daemon would before applying it
// (without loading its ASN data): the XDP side compiled, and the l7:
// section decoded.
func Validate(path string) (*policy.Compiled, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	p, err := policy.Parse(path, raw, os.ReadFile)
	if err != nil {
		return nil, withL7Problems(err, raw, path)
	}
	c, err := policy.Compile(p, nil)
	if err != nil {
		return nil, err
	}
	if _, _, err := decodeL7(p, path); err != nil {
		return nil, err
	}
	return c, nil
}

// withL7Problems adds the l7: section's problems to a policy validation
// error, so one look shows everything wrong with a file even when its XDP
// part already failed.
func withL7Problems(err error, raw []byte, source string) error {
	var ve *policy.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	var doc yaml.Node
	if yaml.Unmarshal(raw, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return err
	}
	m := doc.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value != "l7" {
			continue
		}
		if _, problems := proxy.Decode(m.Content[i+1], source); len(problems) > 0 {
			ve.Problems = append(ve.Problems, problems...)
			slices.SortStableFunc(ve.Problems, func(a, b policy.Problem) int {
				if a.File != b.File {
					return 0
				}
				return cmp.Or(cmp.Compare(a.Pos.Line, b.Pos.Line), cmp.Compare(a.Pos.Column, b.Pos.Column))
			})
		}
	}
	return ve
}

// --- Minimal prepareL7, by the control branch so that its atomic apply
// works; l7stage's implementation replaces everything below at merge. ---

// prepareL7 readies the L7 stage for next without changing what serves
// now: it checks that a proxy can be built from the section and binds a
// new listener when the stage is new or its address changes, so a taken
// port fails here. commit makes it live and cannot fail (a proxy that
// fails to build there, which the check makes unlikely, is logged and the
// stage answers 503); abort undoes prepare. Caller holds changeMu.
func (d *Daemon) prepareL7(ctx context.Context, next *running) (commit, abort func(), err error) {
	noop := func() {}
	d.mu.Lock()
	s := d.l7
	d.mu.Unlock()
	cfg := next.l7
	if cfg == nil {
		if s == nil {
			return noop, noop, nil
		}
		return func() { d.shutdownL7(d.takeL7()) }, noop, nil
	}
	if s != nil && bytes.Equal(s.raw, next.l7raw) {
		return noop, noop, nil
	}
	trial, err := proxy.New(cfg, proxy.Options{Logger: d.log.With("stage", "l7"), Escalator: d, Registerer: prometheus.NewRegistry()})
	if err != nil {
		return nil, nil, fmt.Errorf("l7 stage: %w", err)
	}
	trial.Close()
	var ln net.Listener
	if s == nil || s.listen != cfg.Listen {
		var lc net.ListenConfig
		if ln, err = lc.Listen(ctx, "tcp", cfg.Listen); err != nil {
			return nil, nil, fmt.Errorf("l7 stage: listen on %s (l7.listen): %w", cfg.Listen, err)
		}
	}
	abort = func() {
		if ln != nil {
			ln.Close()
		}
	}
	raw := next.l7raw
	commit = func() {
		if ln != nil {
			d.shutdownL7(d.takeL7())
		} else if old := s.current.Load(); old != nil {
			// The old proxy unregisters its metrics on Close, which the
			// new one needs.
			old.Close()
		}
		p, err := proxy.New(cfg, proxy.Options{Logger: d.log.With("stage", "l7"), Escalator: d, Registerer: d.reg})
		if err != nil {
			d.log.Error("l7 stage: the new proxy failed to build; the stage answers 503", "err", err)
		}
		st := s
		if ln != nil {
			st = &l7Stage{d: d, listen: cfg.Listen, done: make(chan error, 1)}
			st.srv = &http.Server{Handler: st, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
			go func() { st.done <- st.srv.Serve(ln) }()
			d.log.Info("l7 stage listening", "addr", ln.Addr().String(), "upstream", cfg.Upstream.String())
		}
		if p != nil {
			st.current.Store(p)
		} else {
			st.current.Store(nil)
		}
		d.mu.Lock()
		st.raw = raw
		d.l7 = st
		d.mu.Unlock()
	}
	return commit, abort, nil
}

// takeL7 removes the L7 stage from the daemon's state, for shutdownL7.
func (d *Daemon) takeL7() *l7Stage {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.l7
	d.l7 = nil
	return s
}

// shutdownL7 drains and closes a stage taken with takeL7, with no lock
// held: status and scrapes answer meanwhile.
func (d *Daemon) shutdownL7(s *l7Stage) {
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), proxy.ShutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
	if err := <-s.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		d.log.Error("l7 stage", "err", err)
	}
	if p := s.current.Load(); p != nil {
		p.Close()
	}
}
