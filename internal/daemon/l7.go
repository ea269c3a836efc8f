package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/l7/rls"
	"github.com/edgeguard/edgeguard/internal/l7/stage"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// decodeL7 validates the policy's l7: section. Its problems are reported
// with the rest of the policy's.
func decodeL7(p *policy.Policy, source string) (*proxy.Config, *rls.Config, []byte, error) {
	if p.L7 == nil {
		if problems := p.FleetRedisFromL7("", 0); len(problems) > 0 {
			return nil, nil, nil, &policy.ValidationError{File: source, Problems: problems}
		}
		return nil, nil, nil, nil
	}
	cfg, problems := proxy.Decode(p.L7, source)
	if cfg != nil {
		var addr string
		var timeout time.Duration
		if cfg.Redis != nil {
			addr, timeout = cfg.Redis.Addr, cfg.Redis.Timeout
		}
		problems = append(problems, p.FleetRedisFromL7(addr, timeout)...)
	}
	if cfg != nil && p.ASNData.Path == "" {
		for _, name := range cfg.LimitsKeyedOn(proxy.KeyASN) {
			problems = append(problems, policy.Problem{File: source,
				Msg: fmt.Sprintf("l7 limit %q keys on asn, and the policy has no asn_data", name)})
		}
	}
	if len(problems) > 0 {
		return nil, nil, nil, &policy.ValidationError{File: source, Problems: problems}
	}
	rc, problems := rls.Decode(cfg, source)
	if len(problems) > 0 {
		return nil, nil, nil, &policy.ValidationError{File: source, Problems: problems}
	}
	raw, err := yaml.Marshal(p.L7)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("l7 section: %w", err)
	}
	return cfg, rc, raw, nil
}

// l7Run is the L7 hand-off: the L7 stage (internal/l7/stage) and the
// rate-limit service (internal/l7/rls) the daemon runs, prepared on the
// apply path and made live when the generation is pushed (followL7);
// the escalations they send to the deny list; the access log's reopen.
// The stage and the service run their own goroutines and locks.
type l7Run struct {
	log   *slog.Logger
	stage *stage.Stage
	rls   *rls.Server
	// escalations queue the sources the stage and the service escalate;
	// deny adds one to the deny list (the daemon's AddToList).
	escalations chan control.ListChange
	deny        func(control.ListChange) error
	reopen      <-chan struct{} // SIGUSR1

	mu           sync.Mutex // guards reopenFailed; a leaf
	reopenFailed string     // the last SIGUSR1 access log reopen failed: when and why ("" ok)
}

// newL7Run makes the stage and the service, sharing one class table (a
// client's history is one whichever way its requests come), promoting
// through promoter and reading standing through standings.
func newL7Run(log *slog.Logger, loops int, reopen <-chan struct{}, promoter proxy.Promoter, standings class.Standings,
	deny func(control.ListChange) error) *l7Run {
	l := &l7Run{log: log, escalations: make(chan control.ListChange, 256), deny: deny, reopen: reopen}
	classes := class.NewTable(class.DefaultClients, standings, nil, class.Config{})
	l.stage = stage.New(stage.Options{Logger: log.With("stage", "l7"), Escalator: l, Promoter: promoter, Loops: loops,
		Classes: classes})
	l.rls = rls.NewServer(rls.ServerOptions{Logger: log.With("stage", "l7-rls"), Escalator: l, Classes: classes})
	return l
}

// collectors are the stage's and the service's metrics.
func (l *l7Run) collectors() []prometheus.Collector {
	return []prometheus.Collector{l.stage.Collector(), l.rls.Collector()}
}

// close drains the stage and the service.
func (l *l7Run) close() {
	l.stage.Close()
	l.rls.Close()
}

// prepare readies the L7 stage (internal/l7/stage) for next without
// changing what serves now: it builds next's proxy and, when the stage is
// new or its listen address changes, binds the new listener, so a taken
// port fails here. commit makes it live and cannot fail (it does not wait
// for a replaced engine to drain); abort undoes prepare. next.l7 == nil
// stops the stage at commit. Caller holds changeMu.
func (l *l7Run) prepare(ctx context.Context, next *running) (commit, abort func(), err error) {
	// An l7: section with only the rate-limit service serves no proxy; the
	// stage still owns its access log.
	ch, err := l.stage.Prepare(ctx, next.l7, next.l7raw, stage.Standing{Promotion: promotion(next.compiled),
		EstablishedAfter: next.compiled.Standing.EstablishedAfter, ASN: next.asn})
	if err != nil {
		return nil, nil, fmt.Errorf("l7 stage: %w", err)
	}
	// The rate-limit service (internal/l7/rls): the same limits behind
	// Envoy's RLS and the subrequest endpoint.
	rcfg := next.rls
	if rcfg != nil {
		c := *rcfg
		c.EstablishedAfter = next.compiled.Standing.EstablishedAfter
		c.AccessLog = ch.AccessLog() // one writer per file: the stage's
		rcfg = &c
	}
	rch, err := l.rls.Prepare(rcfg)
	if err != nil {
		ch.Abort()
		return nil, nil, fmt.Errorf("l7 rate-limit service: %w", err)
	}
	return func() { ch.Commit(); rch.Commit() }, func() { ch.Abort(); rch.Abort() }, nil
}

// l7Status is the L7 stage's part of the status (nil: not serving).
func (l *l7Run) status() *control.L7Status {
	st := l.stage.Status()
	addrs := l.rls.Addrs()
	if !st.Running && len(addrs) == 0 {
		return nil
	}
	l.mu.Lock()
	out := &control.L7Status{RLS: addrs, AccessLogReopenFailed: l.reopenFailed}
	l.mu.Unlock()
	if st.Running {
		out.Engine, out.Listen, out.Upstream, out.Routes = string(st.Engine), st.Addr, st.Upstream, st.Routes
		out.Classes = l.classes()
	}
	return out
}

// l7Classes are the L7 stage's requests by client class since the daemon
// started (nil: the ranking is off).
func (l *l7Run) classes() []control.L7ClassStat {
	c, ok := l.stage.ClassCounts()
	if !ok {
		return nil
	}
	out := make([]control.L7ClassStat, 0, class.NumClasses)
	for i := range class.NumClasses {
		out = append(out, control.L7ClassStat{Class: class.Class(i).String(), Admitted: c.Admitted[i], Refused: c.Refused[i]})
	}
	return out
}

// explainL7 is the L7 class table's view of ip as a TCP peer (nil: the
// ranking is off).
func (l *l7Run) explain(ip netip.Addr) *control.ExplainL7 {
	x, ok := l.stage.ExplainClient(ip)
	if !ok {
		return nil
	}
	return &control.ExplainL7{Next: x.Next.String(), Tracked: x.Tracked, History: x.History, Learned: x.Learned,
		Usual: x.Usual, Clump: x.Clump, InWindow: x.InWindow, Budget: x.Budget, Window: x.Window.Seconds()}
}

// classStandings is the data plane's standing as the L7 class ranking
// reads it (docs/operations.md, "Class ranking at L7"): established (or
// standing.known_good) is history; validated by an L7 promotion (only
// authenticated ones since route_passed was removed) is authenticated;
// validated by a TCP handshake or a SYN cookie is an address, not intent:
// none, as new.
type classStandings struct{ w *standingWatch }

func (s classStandings) Standing(a netip.Addr) (class.Standing, error) {
	st := s.w.store()
	if st == nil {
		return class.StandingNone, errors.New("no data plane loaded")
	}
	e, err := st.Lookup(a)
	if err != nil {
		return class.StandingNone, err
	}
	switch e.Standing {
	case maps.StandingEstablished:
		return class.StandingEstablished, nil
	case maps.StandingValidated:
		if e.Why == maps.WhyL7 {
			return class.StandingAuthenticated, nil
		}
	case maps.StandingPenalised:
		return class.StandingPenalised, nil
	}
	return class.StandingNone, nil
}

// l7Stats are the L7 stage's request counts by route and decision (nil:
// not serving).
func (l *l7Run) stats() []control.L7RouteStat {
	var out []control.L7RouteStat
	for _, r := range l.stage.Decisions() {
		out = append(out, control.L7RouteStat{Route: r.Route, Allowed: r.Allowed, Limited: r.Limited, Shed: r.Shed, Escalated: r.Escalated})
	}
	return out
}

// Escalate implements proxy.Escalator: a source the L7 stage keeps
// rejecting is denied at the NIC for ttl. It never waits for the daemon's
// lock (a reload may hold it while closing the proxy that is calling): the
// request is queued for the daemon's escalation loop, or dropped with an
// error when the queue is full.
func (l *l7Run) Escalate(ctx context.Context, src netip.Prefix, ttl time.Duration, reason string) error {
	select {
	case l.escalations <- control.ListChange{Prefix: src, TTL: control.Duration(ttl), Reason: reason, Origin: "l7"}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	default:
		return errors.New("escalation queue full")
	}
}

// applyEscalations adds the L7 stage's escalations to the deny list.
func (l *l7Run) applyEscalations(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ch := <-l.escalations:
			if err := l.deny(ch); err != nil {
				l.log.Error("escalate to the deny list", "prefix", ch.Prefix, "err", err)
			}
		}
	}
}

// reopenLogs reopens the L7 access log on ReopenLogs (SIGUSR1): logrotate
// renames the file, then signals; the next lines go to a new file at the
// configured path. A failure is logged and the old file kept.
func (l *l7Run) reopenLogs(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.reopen:
			err := l.stage.ReopenAccessLog() // the rate-limit service writes through it
			l.mu.Lock()
			if err != nil {
				l.reopenFailed = fmt.Sprintf("%s: %v", time.Now().UTC().Format(time.RFC3339), err)
			} else {
				l.reopenFailed = ""
			}
			l.mu.Unlock()
			if err != nil {
				l.log.Error("reopen the l7 access log; still writing the old file", "err", err)
				continue
			}
			l.log.Info("l7 access log reopened", "trigger", "sigusr1")
		}
	}
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
		cfg, problems := proxy.Decode(m.Content[i+1], source)
		if len(problems) == 0 {
			_, problems = rls.Decode(cfg, source)
		}
		if len(problems) > 0 {
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
