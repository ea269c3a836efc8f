package rls

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/accesslog"
	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/l7/redislimit"
)

// Request is one rate-limit question: Envoy's RateLimitRequest, or the
// subrequest endpoint's.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// HitsAddend is what each descriptor takes (0 means 1), unless the
	// descriptor sets its own.
	HitsAddend uint64
}

// Descriptor is one descriptor: its entries, and its own hits_addend when
// set (HasHits; 0 then only reads the state).
type Descriptor struct {
	Entries []Entry
	Hits    uint64
	HasHits bool
}

// Entry is one descriptor entry.
type Entry struct{ Key, Value string }

// ErrInvalid is wrapped by the errors of a malformed request (gRPC
// InvalidArgument, HTTP 400).
var ErrInvalid = errors.New("invalid rate-limit request")

// ErrUnavailable is wrapped when no decision could be made (the request's
// context ended while Redis was asked, or the service is closing): gRPC
// Unavailable, HTTP 503. Envoy then applies its failure_mode_deny.
var ErrUnavailable = errors.New("rate-limit decision unavailable")

// LimitStatus is one limit's decision on one descriptor.
type LimitStatus struct {
	Name    string
	Count   int64
	Per     time.Duration
	Backend string
	Shadow  bool
	// Reserve is the units of the limit only the first class may use
	// (the limit's reserve; 0 for none).
	Reserve  int64
	Decision l7.Decision
}

// Status is one descriptor's answer.
type Status struct {
	// Rule is the rule that matched ("" for none: the descriptor is not
	// limited and answers OK).
	Rule   string
	Tier   string
	Key    string // the key it was counted under
	Over   bool   // an enforced limit of this descriptor refused
	Limits []LimitStatus
	// Decision is the most restrictive enforced limit's (the refused one
	// with the longest wait, else the one with the fewest remaining).
	Decision l7.Decision
	Current  *LimitStatus // the limit Decision is from (nil: no limit)
}

// Verdict is the answer to a Request.
type Verdict struct {
	Allowed  bool
	Statuses []Status
	// Headers are the response fields for the client: RateLimit-Policy,
	// RateLimit (draft 10, as the proxy writes them) and, when refused,
	// Retry-After.
	Headers [][2]string
	// Refused is the first enforced limit that refused ("" when allowed).
	Refused string
	// Escalated: this refusal sent the descriptor's remote_address to the
	// deny list.
	Escalated bool
	// Ranked: the request was charged as its client's Class (l7.classes
	// on, a descriptor matched a rule and one names remote_address); a
	// request that is not ranked may use the limits' reserves, as before
	// the ranking. For Explain, Class is the class the client's next
	// request would be charged as.
	Ranked bool
	Class  class.Class
	// Client is the address the request was ranked by.
	Client netip.Addr
}

// Options are a Service's collaborators.
type Options struct {
	Logger *slog.Logger
	Clock  l7.Clock
	// Escalator, with the l7 escalation enabled, receives the
	// remote_address of descriptors that keep being refused.
	Escalator proxy.Escalator
	// AccessLog, when set, receives one line per decision.
	AccessLog *accesslog.Log
	// Classes is the class table the L7 stage ranks its clients in
	// (shared, so a client's history is one whichever way its requests
	// come); used while Config.Classes is enabled.
	Classes *class.Table

	// limiterConfig, in tests, adjusts each Redis limiter's configuration
	// (the scripts' clock, the background flush).
	limiterConfig func(*redislimit.Config)
}

// Service decides rate-limit requests with one configuration. A reload
// builds a new Service; Close releases its Redis client and goroutines.
type Service struct {
	cfg      *Config
	log      *slog.Logger
	clock    l7.Clock
	seed     maphash.Seed
	byDomain map[string][]*rule
	rules    []*rule
	rc       *redis.Client
	redis    []*redislimit.Limiter
	tries    bool // a Redis group may decide without a round trip (tryDecide)
	esc      *proxy.Escalations
	alog     *accesslog.Log
	draft10  bool
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
	// limiterConfig: Options.limiterConfig
	limiterConfig func(*redislimit.Config)

	scratch   sync.Pool       // *scratch
	requests  [3]atomic.Int64 // ok, over_limit, error
	escalated atomic.Int64
	classes   *class.Table // nil: no ranking
	// byClass counts decided requests by class (index class.NumClasses:
	// not ranked) and answer (0 admitted, 1 refused).
	byClass [class.NumClasses + 1][2]atomic.Int64
}

type rule struct {
	Rule
	tierEntry int // index of the tier entry in Entries, -1 for none
	base      *limitSet
	deflt     *limitSet
	tiers     map[string]*limitSet
	all       []*limit
	// hybrid is the lease state of its hybrid limits, one per limit
	// whatever set decides it (newSet).
	hybrid *redislimit.HybridStates
}

// limitSet is what applies to a descriptor in one tier.
type limitSet struct {
	tier   string
	local  []*limit // enforced then shadow
	groups []*group // redis: enforced, shadow
	policy []string // RateLimit-Policy items of its enforced limits
}

type limit struct {
	proxy.Limit
	store   *l7.Store // local backend
	reserve int64     // the reserve in units (proxy.ReserveUnits)
	policy  string
	counts  [4]atomic.Int64 // allowed, rejected, shadow_rejected, full
}

const (
	cAllowed = iota
	cRejected
	cShadowRejected
)

// group is the redis limits of one set with one shadow setting: one
// redislimit.Limiter, decided all-or-nothing in one EVALSHA.
type group struct {
	lim    *redislimit.Limiter
	shadow bool
	limits map[string]*limit
}

// New builds a Service for cfg. It connects nothing: Redis is dialled on
// first use.
func New(cfg *Config, opts Options) (*Service, error) {
	s := &Service{cfg: cfg, log: opts.Logger, clock: opts.Clock, seed: maphash.MakeSeed(),
		byDomain: map[string][]*rule{}, alog: opts.AccessLog, draft10: cfg.Headers.Draft == 10,
		done: make(chan struct{}), limiterConfig: opts.limiterConfig}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.clock == nil {
		s.clock = l7.NewSystemClock()
	}
	if cfg.Classes.Enabled {
		s.classes = opts.Classes
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	if cfg.Redis != nil {
		s.rc = redis.NewClient(redislimit.ClientOptions(cfg.Redis.Addr, cfg.Redis.Timeout))
	}
	for _, rc := range cfg.Rules {
		r, err := s.newRule(rc)
		if err != nil {
			return nil, err
		}
		s.rules = append(s.rules, r)
		s.byDomain[r.Domain] = append(s.byDomain[r.Domain], r)
	}
	if cfg.Escalation.Enabled && opts.Escalator != nil {
		e, err := proxy.NewEscalations(cfg.Escalation, s.clock, opts.Escalator, s.log)
		if err != nil {
			return nil, fmt.Errorf("rls: %w", err)
		}
		s.esc = e
		go func() {
			defer close(s.done)
			e.Run(s.ctx)
		}()
	} else {
		close(s.done)
	}
	ok = true
	return s, nil
}

func (s *Service) newRule(rc Rule) (*rule, error) {
	r := &rule{Rule: rc, tierEntry: -1, hybrid: redislimit.NewHybridStates()}
	base, err := s.newSet(rc.Name, "", rc.Limits, r)
	if err != nil {
		return nil, err
	}
	r.base, r.deflt = base, base
	if rc.Tiers != nil {
		for i, e := range rc.Entries {
			if e.Key == rc.Tiers.Entry {
				r.tierEntry = i
			}
		}
		r.tiers = map[string]*limitSet{}
		for _, t := range rc.Tiers.Levels {
			ls := append(append([]proxy.Limit{}, rc.Limits...), t.Limits...)
			set, err := s.newSet(rc.Name, t.Name, ls, r)
			if err != nil {
				return nil, err
			}
			r.tiers[t.Name] = set
		}
		if rc.Tiers.Default != "" {
			r.deflt = r.tiers[rc.Tiers.Default]
		}
	}
	return r, nil
}

// newSet builds the limits of one tier of a rule. A rule limit in several
// tiers is one limit (one store, one Redis key): built once, in base; a
// hybrid one is decided in each tier's limiter with one lease state
// (r.hybrid, redislimit.HybridStates).
func (s *Service) newSet(ruleName, tier string, ls []proxy.Limit, r *rule) (*limitSet, error) {
	set := &limitSet{tier: tier}
	var enforced, shadow []*limit
	var redisEnf, redisShadow []*limit
	for _, l := range ls {
		var lim *limit
		for _, have := range r.all {
			if have.Name == l.Name {
				lim = have
			}
		}
		if lim == nil {
			lim = &limit{Limit: l, policy: l7.PolicyItem(l.Name, l.Count, l.Per)}
			if !l.Shared() {
				alg, err := proxy.NewAlgorithm(l)
				if err != nil {
					return nil, fmt.Errorf("rls: rule %q limit %q: %w", ruleName, l.Name, err)
				}
				capacity := l.Capacity
				if capacity == 0 {
					capacity = proxy.DefaultLocalCapacity
				}
				lim.reserve = proxy.ReserveUnits(l, alg)
				if lim.store, err = l7.NewStore(alg, l7.StoreConfig{Capacity: capacity}); err != nil {
					return nil, fmt.Errorf("rls: rule %q limit %q: %w", ruleName, l.Name, err)
				}
			}
			r.all = append(r.all, lim)
		}
		switch {
		case l.Shared() && l.Shadow:
			redisShadow = append(redisShadow, lim)
		case l.Shared():
			redisEnf = append(redisEnf, lim)
		case l.Shadow:
			shadow = append(shadow, lim)
		default:
			enforced = append(enforced, lim)
		}
		if !l.Shadow {
			set.policy = append(set.policy, lim.policy)
		}
	}
	set.local = append(enforced, shadow...)
	for _, g := range []struct {
		ls     []*limit
		shadow bool
	}{{redisEnf, false}, {redisShadow, true}} {
		if len(g.ls) == 0 {
			continue
		}
		if s.rc == nil {
			return nil, fmt.Errorf("rls: rule %q: redis limits without an l7 redis section", ruleName)
		}
		var rules []redislimit.Rule
		grp := &group{shadow: g.shadow, limits: map[string]*limit{}}
		for _, l := range g.ls {
			rr, err := proxy.RedisRule(l.Limit, s.cfg.Redis)
			if err != nil {
				return nil, fmt.Errorf("rls: rule %q limit %q: %w", ruleName, l.Name, err)
			}
			rules = append(rules, rr)
			grp.limits[l.Name] = l
		}
		lc := redislimit.Config{
			Client:  s.rc,
			Rules:   rules,
			Prefix:  s.cfg.Redis.Prefix,
			Timeout: s.cfg.Redis.Timeout,
			Clock:   s.clock,
			Logger:  s.log.With("rls_rule", ruleName, "tier", tier),

			HybridStates: r.hybrid,
		}
		if s.limiterConfig != nil {
			s.limiterConfig(&lc)
		}
		lim, err := redislimit.New(lc)
		if err != nil {
			return nil, fmt.Errorf("rls: rule %q: %w", ruleName, err)
		}
		grp.lim = lim
		s.tries = s.tries || lim.Inline()
		s.redis = append(s.redis, lim)
		set.groups = append(set.groups, grp)
	}
	return set, nil
}

// Close stops the escalation goroutine and closes the Redis limiters and
// client. It is safe to call more than once.
func (s *Service) Close() {
	s.cancel()
	<-s.done
	for _, l := range s.redis {
		l.Close()
	}
	s.redis = nil
	if s.rc != nil {
		_ = s.rc.Close()
		s.rc = nil
	}
}

// Validate checks a request against the bounds (ErrInvalid).
func Validate(req *Request) error {
	switch {
	case req.Domain == "":
		return fmt.Errorf("%w: domain is empty", ErrInvalid)
	case len(req.Domain) > MaxValue:
		return fmt.Errorf("%w: domain longer than %d bytes", ErrInvalid, MaxValue)
	case len(req.Descriptors) == 0:
		return fmt.Errorf("%w: no descriptors", ErrInvalid)
	case len(req.Descriptors) > MaxDescriptors:
		return fmt.Errorf("%w: %d descriptors, at most %d", ErrInvalid, len(req.Descriptors), MaxDescriptors)
	case req.HitsAddend > MaxHitsAddend:
		return fmt.Errorf("%w: hits_addend %d above %d", ErrInvalid, req.HitsAddend, uint64(MaxHitsAddend))
	}
	for i, d := range req.Descriptors {
		if len(d.Entries) == 0 || len(d.Entries) > MaxEntries {
			return fmt.Errorf("%w: descriptor %d has %d entries, want 1 to %d", ErrInvalid, i, len(d.Entries), MaxEntries)
		}
		if d.HasHits && d.Hits > MaxHitsAddend {
			return fmt.Errorf("%w: descriptor %d hits_addend %d above %d", ErrInvalid, i, d.Hits, uint64(MaxHitsAddend))
		}
		for _, e := range d.Entries {
			if e.Key == "" || len(e.Key) > MaxValue || len(e.Value) > MaxValue {
				return fmt.Errorf("%w: descriptor %d: entry keys must be 1 to %d bytes and values at most %d", ErrInvalid, i, MaxValue, MaxValue)
			}
		}
	}
	return nil
}

// match is the rule deciding d (nil: none).
func (s *Service) match(domain string, d *Descriptor) *rule {
	for _, r := range s.byDomain[domain] {
		if len(r.Entries) != len(d.Entries) {
			continue
		}
		ok := true
		for i, e := range r.Entries {
			if d.Entries[i].Key != e.Key || (e.Value != "" && d.Entries[i].Value != e.Value) {
				ok = false
				break
			}
		}
		if ok {
			return r
		}
	}
	return nil
}

// appendKey appends the counting key of d under r to b: the rule and
// every entry, with remote_address grouped by the l7 client_prefix as the
// proxy's ip key. ok is false for a remote_address that is not an
// address.
func (s *Service) appendKey(b []byte, r *rule, d *Descriptor) ([]byte, bool) {
	b = append(b, r.Name...)
	for _, e := range d.Entries {
		b = append(b, '|')
		b = append(b, e.Key...)
		b = append(b, '=')
		if e.Key == "remote_address" {
			a, err := netip.ParseAddr(e.Value)
			if err != nil {
				return b, false
			}
			src := a.Unmap()
			bits := s.cfg.ClientPrefixV6
			if src.Is4() {
				bits = s.cfg.ClientPrefixV4
			}
			p, _ := src.Prefix(bits)
			b = p.AppendTo(b)
			continue
		}
		b = appendStable(b, e.Value)
	}
	return b, true
}

// appendStable keeps keys short: long values are replaced by a hash (as
// the proxy's Redis keys).
func appendStable(b []byte, v string) []byte {
	if len(v) <= 64 {
		return append(b, v...)
	}
	b = append(b, "h:"...)
	b = strconv.AppendUint(b, fnv64(v), 16)
	b = append(b, ':')
	return strconv.AppendInt(b, int64(len(v)), 10)
}

// fnv64 is FNV-1a: stable across processes (Redis keys are shared).
func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// scratch is one decision's fixed-size arrays (Service.scratch).
type scratch struct {
	checks  [l7.MaxChecks]l7.Check
	out     [l7.MaxChecks]l7.Decision
	owner   [l7.MaxChecks]*limit
	charges l7.Charges
	ps      []prepared
	results []redisResult // decide's enforced redis results and those taken
	taken   []redisResult
	key     []byte // a descriptor's key being built
	policy  []byte // the RateLimit-Policy and RateLimit values being built
	limit   []byte
}

// redisResult is a Redis group's result for descriptor desc.
type redisResult struct {
	desc int
	g    *group
	res  redislimit.Result
}

// prepared is one matched descriptor.
type prepared struct {
	r    *rule
	set  *limitSet
	key  string
	hkey uint64
	n    int64
	// lo, hi: its enforced local limits are checks[lo:hi]
	lo, hi int
}

// Decide answers req. Local limits of every descriptor are decided
// all-or-nothing together first; then the Redis groups; a refusal by any
// enforced limit refunds every charge of this request, so a refused
// request takes nothing (as a proxy route's limits). Shadow limits are
// charged on their own and never refuse.
func (s *Service) Decide(ctx context.Context, req *Request) (Verdict, error) {
	v, err := s.decide(ctx, req, false, false)
	s.count(v, err)
	return v, err
}

// count counts a decided request in the service's requests.
func (s *Service) count(v Verdict, err error) {
	switch {
	case err != nil && errors.Is(err, ErrInvalid):
		s.requests[2].Add(1)
	case err != nil:
		s.requests[2].Add(1)
	case v.Allowed:
		s.requests[0].Add(1)
	default:
		s.requests[1].Add(1)
	}
}

// waits reports whether a decision may wait on the network (Redis limits).
func (s *Service) waits() bool { return len(s.redis) > 0 }

// Explain is Decide without charging anything: every limit's state for
// req's descriptors now (Redis limits are not read: their Decision is
// empty and Backend says redis).
func (s *Service) Explain(req *Request) (Verdict, error) {
	return s.decide(context.Background(), req, true, false)
}

// decide decides req (peek: Explain). With try it first asks every Redis
// group it would charge whether it decides without a round trip
// (redislimit.Limiter.Ready), and returns errWouldWait, having charged,
// ranked and counted nothing, when one would not.
func (s *Service) decide(ctx context.Context, req *Request, peek, try bool) (Verdict, error) {
	if err := Validate(req); err != nil {
		return Verdict{}, err
	}
	v := Verdict{Allowed: true, Statuses: make([]Status, len(req.Descriptors))}
	// The arrays of one decision live in a pooled scratch, not on the
	// stack: a gRPC handler runs on a fresh goroutine, whose small stack
	// would be grown (copied) for them on every request.
	sc, _ := s.scratch.Get().(*scratch)
	if sc == nil {
		sc = new(scratch)
	}
	defer s.scratch.Put(sc)
	ps := slices.Grow(sc.ps[:0], len(req.Descriptors))[:len(req.Descriptors)]
	clear(ps)
	defer func() { clear(ps); sc.ps = ps[:0] }()
	checks, out, owner := &sc.checks, &sc.out, &sc.owner
	nc := 0
	base := int64(req.HitsAddend)
	if base == 0 {
		base = 1
	}
	// First every descriptor is matched and checked, so a malformed
	// request is refused before anything is charged.
	nlocal := 0
	matched := false
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		r := s.match(req.Domain, d)
		if r == nil {
			continue
		}
		kb, ok := s.appendKey(sc.key[:0], r, d)
		sc.key = kb
		if !ok {
			return Verdict{}, fmt.Errorf("%w: descriptor %d: remote_address is not an IP address", ErrInvalid, i)
		}
		p := &ps[i]
		key := string(kb)
		p.r, p.key, p.n = r, key, base
		if d.HasHits {
			p.n = int64(d.Hits)
		}
		if peek {
			p.n = 0
		}
		p.set = r.deflt
		if r.tierEntry >= 0 {
			if t := r.tiers[d.Entries[r.tierEntry].Value]; t != nil {
				p.set = t
			}
		}
		for _, l := range p.set.local {
			if !l.Shadow {
				nlocal++
			}
		}
		if nlocal > l7.MaxChecks {
			return Verdict{}, fmt.Errorf("%w: more than %d local limits apply to one request", ErrInvalid, l7.MaxChecks)
		}
		p.hkey = maphash.String(s.seed, key)
		matched = true
	}
	if try && !s.ready(ps) {
		return Verdict{}, errWouldWait
	}
	// The request's class: the client is the first remote_address of its
	// descriptors. The address is the calling proxy's claim: the ranking
	// reads the data plane's standing for it and keeps its L7 history,
	// and never promotes it.
	var tk class.Ticket
	if s.classes != nil && matched {
		if a, ok := client(req); ok {
			v.Ranked, v.Client = true, a
			if peek {
				v.Class = s.classes.Explain(a, true).Next
			} else {
				tk = s.classes.Classify(a, true)
				v.Class = tk.Class
			}
		}
	}
	outside := v.Ranked && !v.Class.Priority() && !peek
	now := s.clock.Now()
	for i := range ps {
		p := &ps[i]
		if p.r == nil {
			continue
		}
		st := &v.Statuses[i]
		st.Rule, st.Tier, st.Key = p.r.Name, p.set.tier, p.key
		p.lo = nc
		for _, l := range p.set.local {
			if l.Shadow {
				d := l.store.Take(p.hkey, now, p.n)
				if !d.Allowed && !peek {
					l.counts[cShadowRejected].Add(1)
				}
				st.Limits = append(st.Limits, LimitStatus{Name: l.Name, Count: l.Count, Per: l.Per, Backend: proxy.BackendLocal, Shadow: true, Reserve: l.reserve, Decision: d})
				continue
			}
			checks[nc] = l7.Check{Store: l.store, Key: p.hkey, N: p.n, Reserve: l.reserve}
			owner[nc] = l
			nc++
		}
		p.hi = nc
	}
	charges := &sc.charges
	*charges = l7.Charges{}
	// A request outside the first class may not use the limits' reserves:
	// the proxy's own decision (l7.TakeAllOutsideReserve is
	// Middleware.DecideOutsideReserve's). Explain reads the state alone.
	var localOK bool
	if outside {
		localOK = l7.TakeAllOutsideReserve(s.clock, checks[:nc], out[:nc], charges)
	} else {
		localOK = l7.TakeAll(s.clock, checks[:nc], out[:nc], charges)
	}
	if !localOK {
		v.Allowed = false
		for i := range nc {
			if !out[i].Allowed && !peek {
				owner[i].counts[cRejected].Add(1)
			}
		}
	}
	// The enforced redis results, in descriptor order (their Rules share
	// the backing arrays that Refund rewrites to the state without this
	// request), and those that took something.
	results, taken := sc.results[:0], sc.taken[:0]
	defer func() {
		clear(results)
		clear(taken)
		sc.results, sc.taken = results[:0], taken[:0]
	}()
	undo := func() {
		charges.Refund(s.clock, out[:nc])
		for _, t := range taken {
			_ = t.g.lim.Refund(t.res)
		}
	}
	if localOK && !peek {
	redisLoop:
		for i := range ps {
			p := &ps[i]
			if p.r == nil {
				continue
			}
			for _, g := range p.set.groups {
				if p.n == 0 {
					continue // a descriptor's explicit 0 only reads: Redis is not asked
				}
				res, err := g.lim.AllowN(ctx, p.key, p.n)
				if err != nil {
					undo()
					return Verdict{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
				}
				if g.shadow {
					for _, rd := range res.Rules {
						if !rd.Decision.Allowed && rd.Source != redislimit.SourceSkipped {
							g.limits[rd.Rule].counts[cShadowRejected].Add(1)
						}
					}
					v.Statuses[i].Limits = appendRedis(v.Statuses[i].Limits, g, res, true)
					continue
				}
				if res.Decision.Allowed {
					taken = append(taken, redisResult{g: g, res: res})
				} else {
					v.Allowed = false
					for _, rd := range res.Rules {
						if !rd.Decision.Allowed && rd.Source != redislimit.SourceSkipped {
							g.limits[rd.Rule].counts[cRejected].Add(1)
						}
					}
				}
				results = append(results, redisResult{desc: i, res: res})
				if !v.Allowed {
					break redisLoop
				}
			}
		}
		if !v.Allowed {
			undo()
		}
	}
	if v.Allowed && !peek {
		for i := range nc {
			owner[i].counts[cAllowed].Add(1)
		}
		for _, t := range taken {
			for _, rd := range t.res.Rules {
				t.g.limits[rd.Rule].counts[cAllowed].Add(1)
			}
		}
	}
	pending := results // those of the descriptors not yet listed
	// Statuses, in descriptor order: local then redis limits.
	hdrPolicy, hdrLimit := sc.policy[:0], sc.limit[:0]
	defer func() { sc.policy, sc.limit = hdrPolicy[:0], hdrLimit[:0] }()
	var retry time.Duration
	for i := range ps {
		p := &ps[i]
		if p.r == nil {
			continue
		}
		st := &v.Statuses[i]
		// this descriptor's results: results are in descriptor order
		end := 0
		for end < len(pending) && pending[end].desc == i {
			end++
		}
		rres := pending[:end]
		pending = pending[end:]
		size := p.hi - p.lo + len(st.Limits)
		for _, r := range rres {
			size += len(r.res.Rules)
		}
		if peek {
			for _, g := range p.set.groups {
				size += len(g.limits)
			}
		}
		enforced := make([]LimitStatus, 0, size)
		for ci := p.lo; ci < p.hi; ci++ {
			l := owner[ci]
			enforced = append(enforced, LimitStatus{Name: l.Name, Count: l.Count, Per: l.Per, Backend: proxy.BackendLocal, Reserve: l.reserve, Decision: out[ci]})
		}
		for _, r := range rres {
			for _, rd := range r.res.Rules {
				if rd.Source == redislimit.SourceSkipped {
					continue
				}
				l := p.findRedis(rd.Rule)
				enforced = append(enforced, LimitStatus{Name: rd.Rule, Count: l.Count, Per: l.Per, Backend: l.Backend, Decision: rd.Decision})
			}
		}
		if peek {
			for _, g := range p.set.groups {
				for _, l := range g.limits {
					enforced = append(enforced, LimitStatus{Name: l.Name, Count: l.Count, Per: l.Per, Backend: l.Backend, Shadow: g.shadow})
				}
			}
		}
		st.Limits = append(enforced, st.Limits...)
		for j := range enforced {
			ls := &st.Limits[j]
			if ls.Shadow {
				continue
			}
			d := ls.Decision
			if st.Current == nil || moreRestrictive(d, st.Decision) {
				st.Current, st.Decision = ls, d
			}
			if !d.Allowed {
				st.Over = true
				retry = max(retry, d.RetryAfter)
				if v.Refused == "" {
					v.Refused = ls.Name
				}
			}
			if s.draft10 && ls.Backend == proxy.BackendLocal || s.draft10 && !peek {
				if len(hdrLimit) > 0 {
					hdrLimit = append(hdrLimit, ", "...)
					hdrPolicy = append(hdrPolicy, ", "...)
				}
				hdrPolicy = append(hdrPolicy, p.r.limitPolicy(ls.Name)...)
				hdrLimit = l7.AppendRateLimitItem(hdrLimit, ls.Name, d)
			}
		}
	}
	if len(hdrLimit) > 0 {
		v.Headers = make([][2]string, 0, 3)
		v.Headers = append(v.Headers, [2]string{"RateLimit-Policy", string(hdrPolicy)}, [2]string{"RateLimit", string(hdrLimit)})
	}
	if !v.Allowed {
		v.Headers = append(v.Headers, [2]string{"Retry-After", strconv.FormatInt(l7.RetryAfterSeconds(retry), 10)})
		// Escalation as the proxy's: every refused request counts once
		// against its client (the first remote_address), whichever limit
		// refused it (a descriptor without the address too: an aggregate's
		// reserve), except an address of l7.trusted_proxies (denying it
		// at the NIC would drop every client behind it).
		if s.esc != nil && !peek {
			if a, ok := client(req); ok && !s.trusted(a) && s.esc.Note(a) {
				v.Escalated = true
				s.escalated.Add(1)
			}
		}
	}
	if !peek {
		refused := 0
		if !v.Allowed {
			refused = 1
		}
		if v.Ranked {
			// A refusal restarts a new client's clean history, as a
			// refusal by the proxy does; the table's own counts are the
			// L7 stage's, the service counts its requests in byClass.
			s.classes.Settle(tk, !v.Allowed)
			s.byClass[v.Class][refused].Add(1)
		} else {
			s.byClass[class.NumClasses][refused].Add(1)
		}
	}
	return v, nil
}

// trusted reports whether a is in l7.trusted_proxies.
func (s *Service) trusted(a netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// client is the first remote_address of req's descriptors that is an
// address.
func client(req *Request) (netip.Addr, bool) {
	for i := range req.Descriptors {
		for _, e := range req.Descriptors[i].Entries {
			if e.Key != "remote_address" {
				continue
			}
			if a, err := netip.ParseAddr(e.Value); err == nil {
				return a.Unmap(), true
			}
		}
	}
	return netip.Addr{}, false
}

func (p *prepared) findRedis(name string) *limit {
	for _, g := range p.set.groups {
		if l := g.limits[name]; l != nil {
			return l
		}
	}
	return &limit{}
}

func (r *rule) limitPolicy(name string) string {
	for _, l := range r.all {
		if l.Name == name {
			return l.policy
		}
	}
	return ""
}

func appendRedis(ls []LimitStatus, g *group, res redislimit.Result, shadow bool) []LimitStatus {
	for _, rd := range res.Rules {
		l := g.limits[rd.Rule]
		ls = append(ls, LimitStatus{Name: rd.Rule, Count: l.Count, Per: l.Per, Backend: l.Backend, Shadow: shadow, Decision: rd.Decision})
	}
	return ls
}

// moreRestrictive orders decisions as the proxy's headers do: a refusal
// with a longer wait, else fewer remaining.
func moreRestrictive(a, b l7.Decision) bool {
	if a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if !a.Allowed {
		return a.RetryAfter > b.RetryAfter
	}
	return a.Remaining < b.Remaining
}
