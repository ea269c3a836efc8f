package proxy

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// Escalator adds a source prefix to the XDP deny list for ttl. The daemon
// implements it (a deny entry with origin "l7", shown by edgectl deny list).
// Escalate is called from one background goroutine, never on the request
// path; it should return within EscalateTimeout.
type Escalator interface {
	Escalate(ctx context.Context, src netip.Prefix, ttl time.Duration, reason string) error
}

// EscalationReason is the reason passed to Escalator.Escalate.
const EscalationReason = "l7"

// EscalateTimeout bounds one Escalate call.
const EscalateTimeout = 5 * time.Second

// escalationQueue is how many escalations may wait for the background
// goroutine; beyond that they are dropped (and counted).
const escalationQueue = 1024

// escalation counts 429s per source prefix and hands the sources that cross
// the threshold to the Escalator, at most once per TTL each.
//
// Both tables are l7.Stores with a fixed number of slots (MaxSources each,
// 24 bytes per slot, allocated up front): counts runs a sliding window of
// Rejections per Window (a source is escalated at the first rejection that
// window does not admit, i.e. the (Rejections+1)th); once runs a GCRA of one
// per TTL, so a source is escalated again only after its deny entry has
// expired. When a table has no idle slot for a new source, that source is
// not tracked (never escalated) until slots free up: a flood of distinct
// sources cannot evict the ones being counted.
type escalation struct {
	cfg    Escalation
	clock  l7.Clock
	seed   maphash.Seed
	counts *l7.Store
	once   *l7.Store
	esc    Escalator
	log    *slog.Logger
	queue  chan netip.Prefix

	sent, failed, dropped atomic.Int64
}

func newEscalation(cfg Escalation, clock l7.Clock, esc Escalator, log *slog.Logger) (*escalation, error) {
	if cfg.Rejections < 1 || cfg.Window <= 0 || cfg.TTL <= 0 {
		return nil, fmt.Errorf("proxy: escalation needs rejections >= 1, window > 0, ttl > 0")
	}
	if cfg.PrefixV4 < 1 || cfg.PrefixV4 > 32 || cfg.PrefixV6 < 1 || cfg.PrefixV6 > 128 {
		return nil, fmt.Errorf("proxy: escalation prefixes /%d and /%d out of range", cfg.PrefixV4, cfg.PrefixV6)
	}
	if cfg.MaxSources == 0 {
		cfg.MaxSources = DefaultEscalationSources
	}
	win, err := l7.NewSlidingWindow(cfg.Rejections, cfg.Window)
	if err != nil {
		return nil, fmt.Errorf("proxy: escalation window: %w", err)
	}
	one, err := l7.NewGCRA(1, cfg.TTL, 1)
	if err != nil {
		return nil, fmt.Errorf("proxy: escalation ttl: %w", err)
	}
	counts, err := l7.NewStore(win, l7.StoreConfig{Capacity: cfg.MaxSources})
	if err != nil {
		return nil, fmt.Errorf("proxy: escalation table: %w", err)
	}
	once, err := l7.NewStore(one, l7.StoreConfig{Capacity: cfg.MaxSources})
	if err != nil {
		return nil, fmt.Errorf("proxy: escalation table: %w", err)
	}
	return &escalation{cfg: cfg, clock: clock, seed: maphash.MakeSeed(), counts: counts, once: once,
		esc: esc, log: log, queue: make(chan netip.Prefix, escalationQueue)}, nil
}

func (e *escalation) prefix(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := e.cfg.PrefixV6
	if a.Is4() {
		bits = e.cfg.PrefixV4
	}
	p, _ := a.Prefix(bits) // bits are validated in newEscalation
	return p
}

// note counts one rejection of a; it never blocks. It reports whether this
// rejection queued a for the deny list.
func (e *escalation) note(a netip.Addr) bool {
	p := e.prefix(a)
	key := maphash.Comparable(e.seed, p)
	now := e.clock.Now()
	if e.counts.Take(key, now, 1).Allowed {
		return false // still within the threshold
	}
	if !e.once.Take(key, now, 1).Allowed {
		return false // escalated less than TTL ago
	}
	select {
	case e.queue <- p:
		return true
	default:
		e.dropped.Add(1)
		return false
	}
}

// run hands queued sources to the Escalator until ctx ends.
func (e *escalation) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-e.queue:
			cctx, cancel := context.WithTimeout(ctx, EscalateTimeout)
			err := e.esc.Escalate(cctx, p, e.cfg.TTL, EscalationReason)
			cancel()
			if err != nil {
				e.failed.Add(1)
				e.log.Warn("l7 proxy: escalation to the XDP deny list failed", "src", p, "ttl", e.cfg.TTL, "err", err)
				continue
			}
			e.sent.Add(1)
			e.log.Info("l7 proxy: source escalated to the XDP deny list", "src", p, "ttl", e.cfg.TTL,
				"rejections", e.cfg.Rejections, "window", e.cfg.Window)
		}
	}
}
