package proxy

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// Promoter marks a source address validated in the data plane's standing
// table: the opposite of an Escalator (docs/operations.md, "L7
// promotion"). The daemon implements it. Promote is called from one
// background goroutine, never on the request path; it should return
// within EscalateTimeout.
type Promoter interface {
	Promote(ctx context.Context, src netip.Addr, reason string) error
}

// PromotionReasonAuthenticated is the reason passed to Promoter.Promote:
// the request passed its route's limits, carried a credential and the
// upstream accepted it. (A request that merely passed its route's limits,
// the removed route_passed, promotes nothing: a bot's request passes them
// as easily as a user's.)
const PromotionReasonAuthenticated = "l7_authenticated"

// maxCredential is the longest credential value that can authenticate a
// request (longer than any API key, user or tenant id we know of); a
// longer one disqualifies the request.
const maxCredential = 1024

// Promotion configures promotion: off unless Enabled and a Promoter is
// given. A source is promoted for a request that passed its route's
// limits, carried a credential of its route (carriesCredential) and that
// the upstream answered with a status from 200 to 399. At most Rate promotions per Per leave the proxy in all (burst:
// one Per's worth), and each source at most once per Refresh, so a flood
// of requests is not a flood of map writes.
type Promotion struct {
	Enabled bool
	Rate    int64
	Per     time.Duration
	// Refresh is how long a promoted source is not promoted again
	// (default DefaultPromotionRefresh).
	Refresh time.Duration
	// MaxSources is how many recently promoted sources are remembered
	// (default DefaultEscalationSources).
	MaxSources int
}

// DefaultPromotionRefresh is how long a promoted source is left alone.
const DefaultPromotionRefresh = time.Minute

// promotionQueue is how many promotions may wait for the background
// goroutine; beyond that they are dropped (and counted).
const promotionQueue = 1024

// promotion hands sources whose requests passed their route's limits to
// the Promoter. A source is taken at most once per Refresh (a GCRA of one
// per Refresh in a fixed-size l7.Store: when the store has no idle slot for
// a new source, that source is not promoted until slots free up), and all
// of them together at most Rate per Per (one GCRA). A source the rate
// refuses is tried again on its next request.
type promotion struct {
	cfg   Promotion
	clock l7.Clock
	seed  maphash.Seed
	rate  *l7.Limiter
	once  *l7.Store
	pro   Promoter
	log   *slog.Logger
	queue chan netip.Addr
	desc  *prometheus.Desc

	sent, failed, limited, dropped atomic.Int64
}

func newPromotion(cfg Promotion, clock l7.Clock, pro Promoter, log *slog.Logger) (*promotion, error) {
	if cfg.Rate < 1 || cfg.Per <= 0 {
		return nil, fmt.Errorf("proxy: promotion needs a rate > 0, got %d per %v", cfg.Rate, cfg.Per)
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = DefaultPromotionRefresh
	}
	if cfg.MaxSources == 0 {
		cfg.MaxSources = DefaultEscalationSources
	}
	g, err := l7.NewGCRA(cfg.Rate, cfg.Per, cfg.Rate)
	if err != nil {
		return nil, fmt.Errorf("proxy: promotion rate: %w", err)
	}
	one, err := l7.NewGCRA(1, cfg.Refresh, 1)
	if err != nil {
		return nil, fmt.Errorf("proxy: promotion refresh: %w", err)
	}
	once, err := l7.NewStore(one, l7.StoreConfig{Capacity: cfg.MaxSources})
	if err != nil {
		return nil, fmt.Errorf("proxy: promotion table: %w", err)
	}
	return &promotion{cfg: cfg, clock: clock, seed: maphash.MakeSeed(), rate: l7.NewLimiter(g, clock), once: once,
		pro: pro, log: log, queue: make(chan netip.Addr, promotionQueue),
		desc: prometheus.NewDesc("edgeguard_l7_proxy_promotions_total",
			"Sources handed to the data plane's standing table as validated, by result "+
				"(sent, failed, rate_limited: over standing.l7_promotion.rate, dropped: queue full).", []string{"result"}, nil),
	}, nil
}

// note offers a for promotion; it never blocks.
func (pr *promotion) note(a netip.Addr) {
	key := maphash.Comparable(pr.seed, a)
	now := pr.clock.Now()
	if !pr.once.Peek(key, now).Allowed {
		return // promoted less than Refresh ago
	}
	if !pr.rate.TakeAt(now, 1).Allowed {
		pr.limited.Add(1)
		return
	}
	if !pr.once.Take(key, now, 1).Allowed {
		return // another request of a took it in between
	}
	select {
	case pr.queue <- a:
	default:
		pr.dropped.Add(1)
	}
}

// run hands queued sources to the Promoter until ctx ends.
func (pr *promotion) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-pr.queue:
			cctx, cancel := context.WithTimeout(ctx, EscalateTimeout)
			err := pr.pro.Promote(cctx, a, PromotionReasonAuthenticated)
			cancel()
			if err != nil {
				pr.failed.Add(1)
				pr.log.Warn("l7 proxy: promotion to validated failed", "src", a, "err", err)
				continue
			}
			pr.sent.Add(1)
			pr.log.Debug("l7 proxy: source promoted to validated", "src", a)
		}
	}
}

// Describe implements prometheus.Collector.
func (pr *promotion) Describe(ch chan<- *prometheus.Desc) { ch <- pr.desc }

// Collect implements prometheus.Collector.
func (pr *promotion) Collect(ch chan<- prometheus.Metric) {
	for _, c := range []struct {
		n      *atomic.Int64
		result string
	}{{&pr.sent, "sent"}, {&pr.failed, "failed"}, {&pr.limited, "rate_limited"}, {&pr.dropped, "dropped"}} {
		ch <- prometheus.MustNewConstMetric(pr.desc, prometheus.CounterValue, float64(c.n.Load()), c.result)
	}
}

// passed is called for a request that passed its route's limits: one
// that carried a credential of the route is marked, and accepted reports
// the upstream's answer. The peer, not a forwarded-for
// address: standing is about the address the data plane sees, and the peer
// is the one that completed a TCP handshake with this host. A trusted proxy
// is never promoted (it carries everyone's requests, bad ones too).
func (p *Proxy) passed(rt *route, ex *flight, r *http.Request) {
	if p.promo == nil {
		return
	}
	if ex != nil && carriesCredential(r.Header, rt.creds) {
		ex.promote = true
	}
}

// accepted offers the peer of a marked request (passed) once its response
// is known: the upstream answered it (not the proxy: a 429, a 502 when the
// upstream is down) with a status from 200 to 399. 401 and 403 (the
// upstream refused the credential), other 4xx and 5xx never promote.
func (p *Proxy) accepted(r *http.Request, status int, forwarded bool) {
	if p.promo != nil && forwarded && status >= 200 && status < 400 {
		p.promotePeer(r)
	}
}

func (p *Proxy) promotePeer(r *http.Request) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return
	}
	a := ap.Addr().Unmap()
	if p.Trusted(a) {
		return
	}
	p.promo.note(a)
}

// carriesCredential reports whether h carries a credential of a route
// whose limits key on the headers creds (canonical names): at least one of
// them, each present at most once, with a value neither empty nor longer
// than maxCredential. A duplicated, empty or oversized credential header
// disqualifies the request: which copy the upstream checked is unknown.
func carriesCredential(h http.Header, creds []string) bool {
	found := false
	for _, name := range creds {
		v, ok := h[name]
		switch {
		case !ok:
			continue
		case len(v) != 1 || v[0] == "" || len(v[0]) > maxCredential:
			return false
		}
		found = true
	}
	return found
}

// credentialHeaders are the headers the limits key on that name a client
// (header: parts, user, tenant), canonical and deduplicated.
func (km *keyMaker) credentialHeaders(limits []Limit) []string {
	var out []string
	for _, l := range limits {
		for _, part := range l.Key {
			name := ""
			switch part.Kind {
			case KeyHeader:
				name = http.CanonicalHeaderKey(part.Header)
			case KeyUser:
				name = km.user
			case KeyTenant:
				name = km.tenant
			default:
				continue
			}
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out
}
