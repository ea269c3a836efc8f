package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/accesslog"
	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/eventloop"
	"github.com/edgeguard/edgeguard/internal/l7/redislimit"
	"github.com/edgeguard/edgeguard/internal/l7/shed"
)

// Options are a Proxy's collaborators.
type Options struct {
	// Logger receives upstream errors, escalations and Redis warnings
	// (default: discard).
	Logger *slog.Logger
	// Clock times every rate-limit and escalation decision (default
	// l7.NewSystemClock()).
	Clock l7.Clock
	// Escalator, when set and Config.Escalation.Enabled, receives the
	// sources to deny at the NIC.
	Escalator Escalator
	// Promoter, when set and Promotion.Enabled, receives the sources whose
	// requests passed their route's limits, to mark them validated in the
	// data plane (promote.go).
	Promoter  Promoter
	Promotion Promotion
	// Registerer, when set, has the Proxy (a prometheus.Collector of all
	// its series) registered on it by New and unregistered by Close. The
	// L7 stage leaves it nil and collects the Proxy that serves itself, so
	// a Proxy prepared for a reload registers nothing.
	Registerer prometheus.Registerer
	// AccessLog, when set, receives one line per request (the L7 stage
	// opens it from l7.access_log and keeps it across reloads).
	AccessLog *accesslog.Log
	// ASN is the policy's asn_data, for limits keyed on asn (nil: such
	// limits are skipped by every request).
	ASN *asn.Table
	// Classes, when set, ranks every routed request's client
	// (internal/l7/class): concurrency slots and queue order prefer
	// established and authenticated clients within their usual rate. The
	// stage keeps one table across reloads.
	Classes *class.Table
	// Transport carries requests to the upstream under the net-http engine
	// and when the Proxy is used as an http.Handler (default: an
	// http.Transport keeping up to 512 idle connections to it). The
	// event-loop engine has its own upstream connections.
	Transport http.RoundTripper
}

// Proxy is the L7 reverse proxy's decisions: an http.Handler that the L7
// stage (internal/l7/stage) serves with the engine its Config names. Close
// releases its Redis clients and background goroutines.
type Proxy struct {
	cfg       *Config
	log       *slog.Logger
	clock     l7.Clock
	km        *keyMaker
	exempt    map[string]struct{}
	routes    []*route
	unmatched http.Handler
	upstream  *httputil.ReverseProxy
	forward   http.Handler // forwardFrom: the event loop's relay, else upstream
	esc       *escalation
	promo     *promotion
	rc        *redis.Client
	redisLims []*redislimit.Limiter
	adaptive  []*shed.Limiter
	mws       []*l7.Middleware
	descs     proxyDescs
	parts     *registry // the collectors of its limiters
	observ    observations
	obsSets   []*routeObs // every route's, then the unmatched and exempt requests'
	alog      *accesslog.Log
	classes   *class.Table          // Options.Classes, or nil
	reg       prometheus.Registerer // Options.Registerer, or nil

	// unmatchedOffLoop is unmatched as the event loop's decision off the
	// loop (nil without a global concurrency limit: decided on the loop).
	unmatchedOffLoop eventloop.OffLoop

	upstreamErrors atomic.Int64
	// unmatchedCounts are the decisions on requests no route matched,
	// exemptCounts those on the global exempt paths.
	unmatchedCounts, exemptCounts *routeCounters
	unmatchedObs, exemptObs       *routeObs
	acceptPauses                  atomic.Int64 // edgeguard_l7_accept_paused_total

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

type route struct {
	name    string
	match   matcher
	exempt  map[string]struct{} // nil: none beyond the global ones
	handler http.Handler
	// mw decides the local limits and the tier, and writes the headers of
	// every limit; nil when the route has no limits at all.
	mw *l7.Middleware
	// redis holds, per tier name ("" for a request in no tier), the redis
	// groups that apply: the route's redis limits and the tier's.
	redis map[string][]*redisGroup
	// redisCounters are the redis limits' counters by rule name.
	redisCounters map[string]*redisCounters
	// mayBlock: a request on this route may wait (a concurrency queue, its
	// own or the global one; Redis; a shaping limit): under the event loop
	// it is decided on a goroutine (eventloop.Go).
	mayBlock bool
	// shapes: a limit of the route or of one of its tiers has shape: true.
	shapes  bool
	counts  routeCounters
	obs     *routeObs
	offLoop eventloop.OffLoop
	// creds are the headers the route's limits (and its tiers') key on
	// that name a client, for authenticated promotion.
	creds []string
}

// redisGroup is the redis limits that apply to a request in one tier and
// share one key expression and shadow setting: one redislimit.Limiter,
// decided all-or-nothing in one EVALSHA.
type redisGroup struct {
	lim      *redislimit.Limiter
	key      func(*http.Request) (string, bool)
	shadow   bool
	policy   map[string]string         // RateLimit-Policy item by rule name
	counters map[string]*redisCounters // by rule name, shared by the route's tiers
}

type redisCounters struct {
	allowed, rejected, shadowRejected atomic.Int64
	// unavailable are refusals of a fail-closed rule without Redis (down,
	// or the breaker still open after it came back), not over any quota.
	unavailable atomic.Int64
}

// New builds a Proxy from cfg (normally from Decode). It connects nothing:
// Redis is dialled on first use, the upstream per request.
func New(cfg *Config, opts Options) (*Proxy, error) {
	if cfg == nil || cfg.Upstream == nil {
		return nil, errors.New("proxy: config without upstream")
	}
	p := &Proxy{cfg: cfg, log: opts.Logger, clock: opts.Clock, exempt: map[string]struct{}{}, descs: newProxyDescs(),
		observ: newObservations(), alog: opts.AccessLog, classes: opts.Classes}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.clock == nil {
		p.clock = l7.NewSystemClock()
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.parts = newRegistry()
	reg := prometheus.Registerer(p.parts)
	ok := false
	defer func() {
		if !ok {
			p.Close()
		}
	}()
	var err error
	if p.km, err = newKeyMaker(cfg); err != nil {
		return nil, err
	}
	p.km.asn = opts.ASN
	for _, s := range cfg.ExemptPaths {
		p.exempt[s] = struct{}{}
	}
	p.upstream = p.newReverseProxy(opts.Transport)
	p.forward = http.HandlerFunc(p.forwardFrom)
	shedMetrics := shed.NewCollector()
	var global func(onShed func(*http.Request)) func(http.Handler) http.Handler
	if cfg.Concurrency != nil {
		l, mw, err := p.newShed(*cfg.Concurrency, "global")
		if err != nil {
			return nil, err
		}
		if err := shedMetrics.Add("global", l); err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		global = mw
	}
	wrap := func(h http.Handler, c *routeCounters) http.Handler {
		if global != nil {
			return global(c.shedFunc())(h)
		}
		return h
	}
	p.unmatchedCounts = new(routeCounters)
	p.exemptCounts = new(routeCounters)
	p.unmatchedObs = p.observ.route(routeUnmatched)
	p.exemptObs = p.observ.route(routeExempt)
	p.unmatched = wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.unmatchedCounts.n[decisionAllowed].Add(1)
		p.forward.ServeHTTP(w, r)
	}), p.unmatchedCounts)
	if cfg.Concurrency != nil {
		p.unmatchedOffLoop = offLoop(p.unmatched)
	}
	if cfg.Redis != nil {
		p.rc = redis.NewClient(redislimit.ClientOptions(cfg.Redis.Addr, cfg.Redis.Timeout))
	}
	for _, rc := range cfg.Routes {
		rt, err := p.newRoute(rc, reg)
		if err != nil {
			return nil, err
		}
		rt.obs = p.observ.route(rc.Name)
		p.obsSets = append(p.obsSets, rt.obs)
		h := http.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if p.limit(rt, exchangeOf(r), w, r) {
				p.forwardFrom(w, r)
			}
		}))
		if rc.Concurrency != nil {
			l, mw, err := p.newShed(*rc.Concurrency, "route "+rc.Name)
			if err != nil {
				return nil, err
			}
			if err := shedMetrics.Add("route:"+rc.Name, l); err != nil {
				return nil, fmt.Errorf("proxy: %w", err)
			}
			h = mw(rt.counts.shedFunc())(h)
		}
		rt.handler = wrap(h, &rt.counts)
		rt.mayBlock = cfg.Concurrency != nil || rc.Concurrency != nil || len(rt.redis) > 0 || rt.shapes
		if rt.mayBlock {
			rt.offLoop = offLoop(rt.handler)
		}
		p.routes = append(p.routes, rt)
	}
	p.obsSets = append(p.obsSets, p.unmatchedObs, p.exemptObs)
	if cfg.Escalation.Enabled && opts.Escalator == nil {
		p.log.Warn("l7 proxy: escalation is enabled but there is no escalator: sources are not escalated")
	}
	if cfg.Escalation.Enabled && opts.Escalator != nil {
		if p.esc, err = newEscalation(cfg.Escalation, p.clock, opts.Escalator, p.log); err != nil {
			return nil, err
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.esc.run(p.ctx)
		}()
	}
	if opts.Promotion.Enabled && opts.Promoter != nil {
		if p.promo, err = newPromotion(opts.Promotion, p.clock, opts.Promoter, p.log); err != nil {
			return nil, err
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.promo.run(p.ctx)
		}()
	}
	for _, l := range p.adaptive {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			l.Run(p.ctx)
		}()
	}
	if err := reg.Register(shedMetrics); err != nil {
		return nil, fmt.Errorf("proxy: register shedding metrics: %w", err)
	}
	if p.promo != nil {
		if err := reg.Register(p.promo); err != nil {
			return nil, fmt.Errorf("proxy: register promotion metrics: %w", err)
		}
	}
	if err := reg.Register(p.acceptPausesMetric()); err != nil {
		return nil, fmt.Errorf("proxy: register metrics: %w", err)
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(p); err != nil {
			return nil, fmt.Errorf("proxy: register metrics: %w", err)
		}
		p.reg = opts.Registerer
	}
	ok = true
	return p, nil
}

func (p *Proxy) newReverseProxy(tr http.RoundTripper) *httputil.ReverseProxy {
	if tr == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 512
		t.MaxIdleConnsPerHost = 512
		t.ForceAttemptHTTP2 = false
		tr = t
	}
	up := p.cfg.Upstream
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// Believe the client's X-Forwarded-For only from a trusted
			// proxy; SetXForwarded then appends the peer.
			if xff, ok := pr.In.Header["X-Forwarded-For"]; ok && p.peerTrusted(pr.In) {
				pr.Out.Header["X-Forwarded-For"] = xff
			}
			if p.cfg.Paths.AsSent {
				pathAsSent(pr.Out.URL, pr.In)
			}
			p.dropIdentityFields(pr.Out.Header)
			pr.SetURL(up)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		Transport:  tr,
		BufferPool: new(bufferPool),
		// Its own complaints (a client gone during a body copy) through
		// the structured logger, never plain lines on stderr.
		ErrorLog:     slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		ErrorHandler: p.BadGateway,
		ModifyResponse: func(res *http.Response) error {
			if err := checkResponse(res); err != nil {
				return err
			}
			if res.StatusCode == http.StatusSwitchingProtocols {
				tunnelIdle(res, p.cfg.Timeouts.TunnelIdle)
				return nil
			}
			if up := upstreamExchangeOf(res.Request); up != nil {
				res.Body = &finishBody{ReadCloser: res.Body, up: up}
			}
			return nil
		},
	}
}

// forwardNetHTTP proxies r with httputil.ReverseProxy (the net-http
// engine). A request with a body is served full duplex: otherwise
// net/http's server, once the response head is written, reads what is left
// of the request body and closes it (its "consume the body before
// replying" rule in chunkWriter.writeHeader), while http.Transport's
// writeLoop, having sent Content-Length bytes, still reads the body once
// more to see its end. That read fails on the closed body, and the
// writeLoop closes the upstream connection under the response being
// copied: the client got a truncated response (the 2 MiB POST of
// TestEnginesAgree, under load). In full-duplex mode the server leaves the
// body to the handler, which closes it when the relay is over.
//
// The upstream exchange does not end with the client (upstreamExchange):
// it runs in a context of its own, so the slot the caller holds stays
// taken until the upstream has answered. It reports false for a request
// not sent: its client left before.
func (p *Proxy) forwardNetHTTP(w http.ResponseWriter, r *http.Request) bool {
	if r.Context().Err() != nil {
		return false
	}
	if r.ContentLength != 0 {
		// ErrNotSupported from a writer that is not net/http's server's
		// (a recorder in a test): nothing to protect against there.
		_ = http.NewResponseController(w).EnableFullDuplex()
	}
	up := newUpstreamExchange(r, p.cfg.Timeouts.Response)
	if ex := exchangeOf(r); ex != nil && ex.rwInUse {
		up.rw = &ex.rw
	}
	defer up.end()
	p.upstream.ServeHTTP(w, r.WithContext(up.ctx))
	return true
}

// BadGateway answers a request the upstream did not answer (both engines:
// the event loop calls it through its Config.BadGateway).
func (p *Proxy) BadGateway(w http.ResponseWriter, r *http.Request, err error) {
	if status := bodyStatus(r); status != 0 {
		// The client's body failed the exchange (net-http engine; the
		// event loop answers these itself): 400 for a malformed one, 408
		// for one below the minimum rate, and the connection closes.
		p.log.Debug("l7 proxy: request body failed", "path", r.URL.Path, "err", err)
		w.Header().Set("Connection", "close")
		refuseRequest(w, status, "request body")
		return
	}
	p.upstreamErrors.Add(1)
	if r.Context().Err() == nil {
		p.log.Warn("l7 proxy: upstream request failed", "upstream", p.cfg.Upstream.Host, "path", r.URL.Path, "err", err)
	}
	l7.WriteProblem(w, l7.Problem{
		Type:   "about:blank",
		Title:  "Bad Gateway",
		Status: http.StatusBadGateway,
		Detail: "the upstream did not answer",
	}, 0)
}

func (p *Proxy) peerTrusted(r *http.Request) bool {
	if len(p.cfg.TrustedProxies) == 0 {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	return p.Trusted(a)
}

// Trusted reports whether a is inside one of the trusted proxy prefixes
// (the event loop's Config.TrustedPeer).
func (p *Proxy) Trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, pf := range p.cfg.TrustedProxies {
		if pf.Contains(a) {
			return true
		}
	}
	return false
}

// priorityFunc is a concurrency limit's priority of a request: the
// priority header's value when the limit names one and the request carries
// a known value (critical, default, sheddable: set by a trusted layer in
// front), else the client's class (internal/l7/class): established and
// authenticated within their usual rate are critical (they may use the
// reserve and are served first from the queue), new and over-usual
// default, penalised sheddable.
func priorityFunc(header string) func(*http.Request) shed.Priority {
	return func(r *http.Request) shed.Priority {
		if header != "" {
			if v := r.Header[header]; len(v) > 0 {
				switch v[0] {
				case "critical":
					return shed.PriorityCritical
				case "sheddable":
					return shed.PrioritySheddable
				case "default":
					return shed.PriorityDefault
				}
			}
		}
		return classPriority(exchangeOf(r))
	}
}

// classPriority is the concurrency priority of a request's class
// (PriorityDefault when it was not classified).
func classPriority(ex *flight) shed.Priority {
	if ex == nil || !ex.classed {
		return shed.PriorityDefault
	}
	switch c := ex.ticket.Class; {
	case c.Priority():
		return shed.PriorityCritical
	case c == class.Penalised:
		return shed.PrioritySheddable
	}
	return shed.PriorityDefault
}

// classify charges a routed request to its client's class (Options.Classes;
// nothing without it): the client is the address the ip keys use (the
// forwarded-for client behind a trusted proxy), and the data plane's
// standing is read only for a client that is the TCP peer.
func (p *Proxy) classify(ex *flight, r *http.Request) {
	if p.classes == nil {
		return
	}
	a, ok := p.km.keys.ClientIP(r)
	if !ok {
		return
	}
	peer := len(p.cfg.TrustedProxies) == 0 // then the client is the peer
	if !peer {
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			peer = ap.Addr().Unmap() == a.Unmap()
		}
	}
	ex.ticket, ex.classed = p.classes.Classify(a, peer), true
}

// newShed builds a concurrency limiter and the constructor of its
// middleware, one per route that shares it (each counts its own sheds).
func (p *Proxy) newShed(c Concurrency, what string) (*shed.Limiter, func(onShed func(*http.Request)) func(http.Handler) http.Handler, error) {
	sc := shed.Config{
		MaxInFlight:            c.MaxInFlight,
		MaxQueue:               c.Queue,
		QueueTimeout:           c.QueueTimeout,
		CriticalReservePercent: c.CriticalReserve,
		Clock:                  p.clock,
		Logger:                 p.log,
	}
	if c.CriticalReserve == 0 {
		sc.CriticalReservePercent = -1 // shed: negative is none, 0 its default
	}
	if c.Adaptive {
		sc.Adaptive = &shed.AdaptiveConfig{InitialLimit: c.MaxInFlight, MaxLimit: max(c.AdaptiveMax, c.MaxInFlight)}
	}
	l, err := shed.New(sc)
	if err != nil {
		return nil, nil, fmt.Errorf("proxy: %s concurrency: %w", what, err)
	}
	if c.Adaptive {
		p.adaptive = append(p.adaptive, l)
	}
	mw := func(onShed func(*http.Request)) func(http.Handler) http.Handler {
		return shed.Middleware(l, shed.MiddlewareOptions{
			Priority:   priorityFunc(c.PriorityHeader),
			RetryAfter: c.RetryAfter,
			Logger:     p.log,
			OnShed:     onShed,
		})
	}
	return l, mw, nil
}

// reserveUnits is l's Reserve (a percentage) in units of what the limit
// holds at once, rounded down and at most all but one unit. What it holds
// is its burst when it has one (gcra, token-bucket, leaky_bucket), else
// the rate's count: a reserve taken from the count of a limit whose burst
// is smaller would be above what a request can ever see remaining, and
// refuse every request outside the first class. (At most all but one of
// the rate's count, too: the middleware's bound.)
func reserveUnits(l Limit, alg l7.Algorithm) int64 {
	if l.Reserve <= 0 {
		return 0
	}
	size := alg.Limit()
	if l.Burst > 0 {
		size = l.Burst
	}
	return min(size*int64(l.Reserve)/100, size-1, alg.Limit()-1)
}

func (p *Proxy) rule(l Limit, route string) (l7.Rule, error) {
	alg, err := newAlgorithm(l)
	if err != nil {
		return l7.Rule{}, fmt.Errorf("proxy: route %q limit %q: %w", route, l.Name, err)
	}
	capacity := l.Capacity
	if capacity == 0 {
		capacity = DefaultLocalCapacity
	}
	return l7.Rule{
		Name:      l.Name,
		Key:       p.km.hashFunc(l.Key, route),
		Reserve:   reserveUnits(l, alg),
		Algorithm: alg,
		Shadow:    l.Shadow,
		Shape:     l.Shape,
		Store:     l7.StoreConfig{Capacity: capacity},
	}, nil
}

func (p *Proxy) newRoute(rc Route, reg prometheus.Registerer) (*route, error) {
	rt := &route{name: rc.Name, match: newMatcher(rc.Match)}
	if len(rc.ExemptPaths) > 0 {
		rt.exempt = map[string]struct{}{}
		for _, s := range rc.ExemptPaths {
			rt.exempt[s] = struct{}{}
		}
	}
	mc := l7.Config{Clock: p.clock, LegacyHeaders: p.cfg.Headers.Legacy, Headers: l7.HeadersDraft10}
	if p.cfg.Headers.Draft == 0 {
		mc.Headers = l7.HeadersNone
	}
	all := rc.Limits
	if rc.Tiers != nil {
		for _, t := range rc.Tiers.Tiers {
			all = append(slices.Clip(all), t.Limits...)
		}
	}
	rt.creds = p.km.credentialHeaders(all)
	var routeRedis []Limit
	for _, l := range rc.Limits {
		if l.Shared() {
			routeRedis = append(routeRedis, l)
			continue
		}
		r, err := p.rule(l, rc.Name)
		if err != nil {
			return nil, err
		}
		rt.shapes = rt.shapes || l.Shape
		mc.Rules = append(mc.Rules, r)
	}
	anyRedis := len(routeRedis) > 0
	tierRedis := map[string][]Limit{}
	if rc.Tiers != nil {
		for _, t := range rc.Tiers.Tiers {
			tier := l7.Tier{Name: t.Name}
			for _, l := range t.Limits {
				if l.Shared() {
					tierRedis[t.Name] = append(tierRedis[t.Name], l)
					anyRedis = true
					continue
				}
				r, err := p.rule(l, rc.Name)
				if err != nil {
					return nil, err
				}
				rt.shapes = rt.shapes || l.Shape
				tier.Rules = append(tier.Rules, r)
			}
			mc.Tiers = append(mc.Tiers, tier)
		}
		mc.SelectTier = l7.TierByHeader(rc.Tiers.Header)
		mc.DefaultTier = rc.Tiers.Default
	}
	if len(mc.Rules) > 0 || len(mc.Tiers) > 0 || anyRedis {
		mw, err := l7.NewMiddleware(mc)
		if err != nil {
			return nil, fmt.Errorf("proxy: route %q: %w", rc.Name, err)
		}
		rt.mw = mw
		p.mws = append(p.mws, mw)
	}
	if !anyRedis {
		return rt, nil
	}
	if p.rc == nil {
		return nil, fmt.Errorf("proxy: route %q: redis limits without a redis section", rc.Name)
	}
	// One set of groups per tier a request can be decided in: the route's
	// redis limits plus the tier's, grouped by key so each key is one
	// EVALSHA. A route limit has the same Redis state in every tier (its
	// Redis key is the rule name and the client key), and a hybrid one
	// one lease state on this host whatever tier decides the request:
	// every group of the route shares it (redislimit.HybridStates).
	counters := map[string]*redisCounters{}
	states := redislimit.NewHybridStates()
	rt.redisCounters = counters
	rt.redis = map[string][]*redisGroup{}
	var base []*redisGroup
	var err error
	if rc.Tiers == nil || rc.Tiers.Default == "" || len(tierRedis) < len(rc.Tiers.Tiers) {
		if base, err = p.redisGroups(rc.Name, "", routeRedis, counters, states, reg); err != nil {
			return nil, err
		}
		rt.redis[""] = base
	}
	if rc.Tiers != nil {
		for _, t := range rc.Tiers.Tiers {
			own := tierRedis[t.Name]
			if len(own) == 0 {
				rt.redis[t.Name] = base
				continue
			}
			gs, err := p.redisGroups(rc.Name, t.Name, append(append([]Limit{}, routeRedis...), own...), counters, states, reg)
			if err != nil {
				return nil, err
			}
			rt.redis[t.Name] = gs
		}
	}
	return rt, nil
}

// redisGroups builds one redislimit.Limiter per (key, shadow) of limits,
// in the order the keys first appear.
func (p *Proxy) redisGroups(route, tier string, limits []Limit, counters map[string]*redisCounters, states *redislimit.HybridStates, reg prometheus.Registerer) ([]*redisGroup, error) {
	var groups []*redisGroup
	var labels []string
	var rules [][]redislimit.Rule
	byID := map[string]int{}
	for _, l := range limits {
		id := fmt.Sprintf("%s shadow=%t", l.Key, l.Shadow)
		gi, ok := byID[id]
		if !ok {
			label := route + ":"
			if tier != "" {
				label += "tier=" + tier + ":"
			}
			label += l.Key.String()
			if l.Shadow {
				label += ":shadow"
			}
			gi = len(groups)
			byID[id] = gi
			groups = append(groups, &redisGroup{key: p.km.stringFunc(l.Key, route), shadow: l.Shadow,
				policy: map[string]string{}, counters: counters})
			labels = append(labels, label)
			rules = append(rules, nil)
		}
		rr, err := redisRule(l, p.cfg.Redis)
		if err != nil {
			return nil, fmt.Errorf("proxy: route %q limit %q: %w", route, l.Name, err)
		}
		rules[gi] = append(rules[gi], rr)
		groups[gi].policy[l.Name] = l7.PolicyItem(l.Name, l.Count, l.Per)
		if counters[l.Name] == nil {
			counters[l.Name] = new(redisCounters)
		}
	}
	for i, g := range groups {
		var r prometheus.Registerer
		if reg != nil {
			// redislimit registers its series once per registry: each
			// group's carry a limiter label ("route:key", or
			// "route:tier=name:key" for a tier's groups).
			r = prometheus.WrapRegistererWith(prometheus.Labels{"limiter": labels[i]}, reg)
		}
		lim, err := redislimit.New(redislimit.Config{
			Client:       p.rc,
			Rules:        rules[i],
			Prefix:       p.cfg.Redis.Prefix,
			Timeout:      p.cfg.Redis.Timeout,
			Clock:        p.clock,
			Logger:       p.log.With("route", route, "tier", tier, "group", i),
			Registerer:   r,
			HybridStates: states,
		})
		if err != nil {
			return nil, fmt.Errorf("proxy: route %q: %w", route, err)
		}
		g.lim = lim
		p.redisLims = append(p.redisLims, lim)
	}
	return groups, nil
}

// ServeHTTP is the net-http engine's way in (and the Proxy as an
// http.Handler): it refuses what the event loop's parser refuses on the
// wire (refuseNetHTTP), then routes r as Decide does: exempt paths go
// straight to the upstream; the first matching route applies its
// concurrency limits and rate limits; a request no route matches gets only
// the global concurrency limit.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if refuseNetHTTP(w, r) || !p.normalizeNetHTTP(w, r) {
		return
	}
	rt, exempt := p.pick(r)
	ex := p.begin(p.obsOf(rt, exempt))
	if !exempt {
		p.classify(ex, r)
	}
	ex.start = time.Now()
	ex.sw.ResponseWriter = p.holdTransfers(ex, w, r)
	ww := &ex.sw
	r = withExchange(r, ex)
	// Deferred: ReverseProxy panics (http.ErrAbortHandler) on a response
	// it could not finish copying; the request still ends here.
	defer func() {
		ex.endTransfers()
		ex.finish(r, ex.sw.status, time.Since(ex.start), ex.upstream, ex.forwarded)
	}()
	switch {
	case exempt:
		p.countExempt(rt)
		p.forward.ServeHTTP(ww, r)
	case rt == nil:
		p.unmatched.ServeHTTP(ww, r)
	default:
		rt.handler.ServeHTTP(ww, r)
	}
}

// obsOf is the observations a request routed to rt (exempt or not) counts
// in.
func (p *Proxy) obsOf(rt *route, exempt bool) *routeObs {
	switch {
	case rt != nil:
		return rt.obs
	case exempt:
		return p.exemptObs
	}
	return p.unmatchedObs
}

// countExempt counts a request on an exempt path as allowed: on its route
// (rt), or on the global exempt paths' counters (rt nil).
func (p *Proxy) countExempt(rt *route) {
	if rt == nil {
		p.exemptCounts.n[decisionAllowed].Add(1)
		return
	}
	rt.counts.n[decisionAllowed].Add(1)
}

// pick is the routing both engines share: the first route r matches (nil:
// none), and whether r's path is exempt: globally (rt nil) or in that
// route.
func (p *Proxy) pick(r *http.Request) (rt *route, exempt bool) {
	path := r.URL.Path
	if _, ok := p.exempt[path]; ok {
		return nil, true
	}
	for _, rt := range p.routes {
		if !rt.match.matches(r) {
			continue
		}
		if rt.exempt != nil {
			if _, ok := rt.exempt[path]; ok {
				return rt, true
			}
		}
		return rt, false
	}
	return nil, false
}

// limit decides rt's limits all-or-nothing across both backends and writes
// the headers of every limit that applied; it reports true when the
// request may be proxied (the caller proxies it), false when it answered
// (429, 503) or the client left.
//
// The local limits (with tiers and shadow rules) are decided and charged
// first, under their shard locks; a request they refuse is answered at once
// and Redis is not asked. Then every enforced redis group of the request's
// tier is asked (one EVALSHA each, all-or-nothing inside it). If any group
// refuses, the local charges and the charges of the groups that admitted
// are given back (l7.Pending.Refund, redislimit.Limiter.Refund), so the
// 429 reports the longest wait over every refused limit of both backends.
// Shadow groups are charged on their own and never refuse or refund.
func (p *Proxy) limit(rt *route, ex *flight, w http.ResponseWriter, r *http.Request) bool {
	if rt.mw == nil {
		rt.counts.n[decisionAllowed].Add(1)
		return true
	}
	var lp l7.Pending
	if ex != nil && ex.classed && !ex.ticket.Class.Priority() {
		rt.mw.DecideOutsideReserve(r, &lp)
	} else {
		rt.mw.Decide(r, &lp)
	}
	if lp.Skipped() {
		rt.counts.n[decisionAllowed].Add(1)
		return true
	}
	if !lp.Allowed() {
		rt.mw.Respond(w, &lp, nil)
		p.limited(rt, ex, r, lp.Refused())
		return false
	}
	type charged struct {
		g   *redisGroup
		res redislimit.Result
		ext int // index of its first rule in ext
	}
	var ext []l7.ExternalDecision
	var took []charged
	refused := false
	refusedBy := ""
	for _, g := range rt.redis[lp.Tier()] {
		key, ok := g.key(r)
		if !ok {
			continue
		}
		res, err := g.lim.Allow(r.Context(), key)
		if err != nil {
			lp.Refund()
			for _, c := range took {
				p.refundRedis(c.g, c.res)
			}
			if r.Context().Err() != nil {
				return false // the client is gone
			}
			rt.counts.n[decisionShed].Add(1)
			ex.refused(decisionShed, "")
			shedUnavailable(w, "the rate limiter is shutting down")
			return false
		}
		if g.shadow {
			for _, rd := range res.Rules {
				if !rd.Decision.Allowed && rd.Source != redislimit.SourceSkipped {
					g.counters[rd.Rule].shadowRejected.Add(1)
				}
			}
			continue
		}
		if res.Decision.Allowed {
			took = append(took, charged{g: g, res: res, ext: len(ext)})
		} else {
			refused = true
		}
		for _, rd := range res.Rules {
			if rd.Source == redislimit.SourceSkipped {
				continue
			}
			if !rd.Decision.Allowed {
				if rd.Source == redislimit.SourceFailClosed {
					g.counters[rd.Rule].unavailable.Add(1)
				} else {
					g.counters[rd.Rule].rejected.Add(1)
				}
				if refusedBy == "" {
					refusedBy = rd.Rule
				}
			}
			ext = append(ext, l7.ExternalDecision{Name: rd.Rule, Policy: g.policy[rd.Rule], Decision: rd.Decision})
		}
	}
	if refused {
		lp.Refund()
		for _, c := range took {
			// Refund rewrites the group's decisions to its state without
			// this request, for the headers.
			p.refundRedis(c.g, c.res)
			i := c.ext
			for _, rd := range c.res.Rules {
				if rd.Source != redislimit.SourceSkipped {
					ext[i].Decision = rd.Decision
					i++
				}
			}
		}
		rt.mw.Respond(w, &lp, ext)
		p.limited(rt, ex, r, refusedBy)
		return false
	}
	lp.Commit()
	rt.counts.n[decisionAllowed].Add(1)
	for _, c := range took {
		for _, rd := range c.res.Rules {
			c.g.counters[rd.Rule].allowed.Add(1)
		}
	}
	rt.mw.Respond(w, &lp, ext)
	p.passed(rt, ex, r)
	if d := lp.Delay(); d > 0 && !p.hold(r, d) {
		return false // the client left while its request was held
	}
	return true
}

// limited counts a 429 by limit (the first that refused) and notes it for
// escalation.
func (p *Proxy) limited(rt *route, ex *flight, r *http.Request, limit string) {
	escalated := p.rejected(r)
	rt.counts.limited(escalated)
	d := decisionLimited
	if escalated {
		d = decisionEscalated
	}
	ex.refused(d, limit)
}

// hold keeps a request admitted by a shaping limit until its release slot
// (on the request's goroutine: a shaping route is decided off the event
// loop). It reports false when the client left first; the slot stays
// taken (the upstream sees a gap, never a burst).
func (p *Proxy) hold(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// refundRedis gives a group's charge back; a failure leaves the charge in
// Redis (the strict side) and is logged by the limiter's breaker and
// metrics, so it is only noted at debug level here.
func (p *Proxy) refundRedis(g *redisGroup, res redislimit.Result) {
	if err := g.lim.Refund(res); err != nil {
		p.log.Debug("l7 proxy: redis refund failed; the charge stays", "err", err)
	}
}

func shedUnavailable(w http.ResponseWriter, detail string) {
	l7.WriteProblem(w, l7.Problem{
		Type:   shed.ProblemType,
		Title:  shed.ProblemTitle,
		Status: http.StatusServiceUnavailable,
		Detail: detail,
	}, 1)
}

// rejected notes a 429 for escalation; it reports whether this rejection
// sent the source to the deny list.
func (p *Proxy) rejected(r *http.Request) bool {
	if p.esc == nil {
		return false
	}
	a, ok := p.km.keys.ClientIP(r)
	if !ok || p.Trusted(a) {
		// A trusted proxy's address (a request without forwarding headers,
		// or one naming only trusted hops) is never denied at the NIC: that
		// would drop every client behind it.
		return false
	}
	return p.esc.note(a)
}

// Close stops the background goroutines, closes the Redis limiters and
// client, and unregisters the Proxy from Options.Registerer (so the next
// Proxy can register on the same registry). It is safe to call more than once.
func (p *Proxy) Close() {
	p.closeOnce.Do(func() {
		p.cancel()
		p.wg.Wait()
		for _, l := range p.redisLims {
			l.Close()
		}
		if p.rc != nil {
			_ = p.rc.Close()
		}
		if p.reg != nil {
			p.reg.Unregister(p)
		}
	})
}

// Ranks reports whether the proxy ranks its clients (Options.Classes).
func (p *Proxy) Ranks() bool { return p.classes != nil }

// RouteNames lists the routes in match order (for status output).
func (p *Proxy) RouteNames() []string {
	out := make([]string, len(p.routes))
	for i, rt := range p.routes {
		out[i] = rt.name
	}
	return out
}

// bufferPool recycles ReverseProxy's response copy buffers (32 KiB each,
// otherwise allocated per request).
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }
