package l7

import (
	"errors"
	"fmt"
	"hash/maphash"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"
)

// Rule is one limit the middleware applies.
type Rule struct {
	// Name identifies the rule in RateLimit headers, the problem body and
	// metrics: 1-64 characters of [A-Za-z0-9_.-], unique in a Config.
	Name string
	// Key extracts the rule's key; a request without the key skips the rule.
	Key KeyFunc
	// Algorithm is the limit. Default for new rules: GCRA or SlidingWindow.
	Algorithm Algorithm
	// Cost is the units one request takes (0 means 1).
	Cost int64
	// Shadow counts the requests the rule would reject and never rejects
	// them. A shadow rule is charged on its own, outside the all-or-nothing
	// group, and is left out of the response headers.
	Shadow bool
	// Store sizes the rule's keyed store (Capacity 0 means 1<<18 keys,
	// 6 MiB, allocated up front).
	Store StoreConfig
	// Reserve is the units of the limit (of Algorithm.Limit()) a request
	// outside the first class may not use (DecideOutsideReserve): it is
	// refused when fewer than Reserve units would be left after its
	// charge. At most Limit() minus the cost; 0: none.
	Reserve int64
	// Shape makes the rule a shaper: an admitted request is also held
	// until its release slot (Pending.Delay). It needs an Algorithm that
	// schedules (LeakyBucket) and is not for shadow rules.
	Shape bool
}

// shaper is an Algorithm that says how long a shaping rule holds an
// admitted request (LeakyBucket).
type shaper interface {
	Delay(d Decision, n int64) time.Duration
}

// Tier is a named set of extra rules (free, pro, enterprise), applied on
// top of Config.Rules to the requests SelectTier assigns to it.
type Tier struct {
	Name  string
	Rules []Rule
}

// HeaderVersion selects the RateLimit header format.
type HeaderVersion int

const (
	// HeadersDraft10 writes RateLimit-Policy and RateLimit as in
	// draft-ietf-httpapi-ratelimit-headers-10. It is the default.
	HeadersDraft10 HeaderVersion = iota
	// HeadersNone writes no RateLimit fields (Retry-After is still written
	// on 429).
	HeadersNone
)

// Config configures a Middleware.
type Config struct {
	// Rules apply to every limited request.
	Rules []Rule
	// Tiers add rules per tier; SelectTier picks the tier by name (a
	// header, an API-key lookup: see TierByHeader). A request
	// whose tier is "" or unknown gets DefaultTier, or no tier rules if
	// DefaultTier is "".
	Tiers       []Tier
	SelectTier  func(r *http.Request) string
	DefaultTier string
	// SkipPaths are URL paths never limited (health checks); Skip, if set,
	// exempts more requests.
	SkipPaths []string
	Skip      func(r *http.Request) bool
	// Headers selects the RateLimit header format.
	Headers HeaderVersion
	// LegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (delta-seconds, not an epoch) for the most
	// restrictive applicable rule.
	LegacyHeaders bool
	// RetryJitter adds a uniform random 0..ceil(RetryJitter) seconds to
	// Retry-After so rejected clients do not return in lockstep.
	RetryJitter time.Duration
	// Clock times every decision (default NewSystemClock()).
	Clock Clock
}

// ErrInvalidConfig is wrapped by NewMiddleware's configuration errors.
var ErrInvalidConfig = errors.New("invalid rate-limit configuration")

type ruleCounters struct {
	allowed        atomic.Int64
	rejected       atomic.Int64
	rejectedFull   atomic.Int64
	shadowRejected atomic.Int64
	_              [32]byte // one cache line per rule
}

type rule struct {
	name    string
	tier    string
	key     KeyFunc
	store   *Store
	cost    int64
	shadow  bool
	policy  string // `"name";q=100;w=60`
	counter *ruleCounters
	shaper  shaper // nil: not shaping
	reserve int64  // Rule.Reserve
}

type tier struct {
	name      string
	rules     []*rule
	policy    []string // RateLimit-Policy when every enforced rule applies
	nEnforced int
}

// Middleware is net/http rate-limiting middleware: Wrap it around a handler
// (plain mux, chi, echo.WrapMiddleware, gin via adapter).
type Middleware struct {
	clock      Clock
	skip       map[string]struct{}
	skipFn     func(*http.Request) bool
	selectTier func(*http.Request) string
	tiers      map[string]*tier
	base       *tier // Config.Rules only
	deflt      *tier // base plus DefaultTier's rules
	all        []*rule
	reserves   bool // a rule has a Reserve
	headers    HeaderVersion
	legacy     bool
	jitterSec  int64
	descs      metricDescs
	// values caches header values by content (see setHeaders).
	valueSeed maphash.Seed
	values    *[valueCacheSize]atomic.Pointer[[1]string]
}

// ValidName reports whether s may name a rule or tier: 1 to 64 of
// [A-Za-z0-9_.-], so it is safe in metric labels and RateLimit headers.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// NewMiddleware validates cfg and builds one keyed store per rule.
func NewMiddleware(cfg Config) (*Middleware, error) {
	m := &Middleware{
		clock:      cfg.Clock,
		skip:       make(map[string]struct{}, len(cfg.SkipPaths)),
		skipFn:     cfg.Skip,
		selectTier: cfg.SelectTier,
		tiers:      make(map[string]*tier, len(cfg.Tiers)),
		headers:    cfg.Headers,
		legacy:     cfg.LegacyHeaders,
		jitterSec:  ceilDiv(int64(cfg.RetryJitter), int64(time.Second)),
		descs:      newMetricDescs(),
		valueSeed:  maphash.MakeSeed(),
		values:     new([valueCacheSize]atomic.Pointer[[1]string]),
	}
	if m.clock == nil {
		m.clock = NewSystemClock()
	}
	if cfg.Headers != HeadersDraft10 && cfg.Headers != HeadersNone {
		return nil, fmt.Errorf("middleware: header version %d: %w", cfg.Headers, ErrInvalidConfig)
	}
	for _, p := range cfg.SkipPaths {
		m.skip[p] = struct{}{}
	}
	names := map[string]bool{}
	build := func(tierName string, rs []Rule) ([]*rule, error) {
		out := make([]*rule, 0, len(rs))
		for _, rc := range rs {
			r, err := newRule(tierName, rc)
			if err != nil {
				return nil, err
			}
			if names[r.name] {
				return nil, fmt.Errorf("middleware: rule %q defined twice: %w", r.name, ErrInvalidConfig)
			}
			names[r.name] = true
			m.all = append(m.all, r)
			m.reserves = m.reserves || r.reserve > 0
			out = append(out, r)
		}
		return out, nil
	}
	base, err := build("", cfg.Rules)
	if err != nil {
		return nil, err
	}
	m.base = newTier("", base)
	for _, tc := range cfg.Tiers {
		if !ValidName(tc.Name) {
			return nil, fmt.Errorf("middleware: tier name %q: want 1-64 of [A-Za-z0-9_.-]: %w", tc.Name, ErrInvalidConfig)
		}
		if m.tiers[tc.Name] != nil {
			return nil, fmt.Errorf("middleware: tier %q defined twice: %w", tc.Name, ErrInvalidConfig)
		}
		rs, err := build(tc.Name, tc.Rules)
		if err != nil {
			return nil, err
		}
		t := newTier(tc.Name, append(append([]*rule{}, base...), rs...))
		if len(t.rules) > MaxChecks {
			return nil, fmt.Errorf("middleware: tier %q has %d rules, at most %d: %w", tc.Name, len(t.rules), MaxChecks, ErrInvalidConfig)
		}
		m.tiers[tc.Name] = t
	}
	if len(base) > MaxChecks {
		return nil, fmt.Errorf("middleware: %d rules, at most %d: %w", len(base), MaxChecks, ErrInvalidConfig)
	}
	m.deflt = m.base
	if cfg.DefaultTier != "" {
		if m.deflt = m.tiers[cfg.DefaultTier]; m.deflt == nil {
			return nil, fmt.Errorf("middleware: default tier %q not defined: %w", cfg.DefaultTier, ErrInvalidConfig)
		}
	}
	return m, nil
}

func newRule(tierName string, rc Rule) (*rule, error) {
	if !ValidName(rc.Name) {
		return nil, fmt.Errorf("middleware: rule name %q: want 1-64 of [A-Za-z0-9_.-]: %w", rc.Name, ErrInvalidConfig)
	}
	if rc.Key == nil || rc.Algorithm == nil {
		return nil, fmt.Errorf("middleware: rule %q: key and algorithm are required: %w", rc.Name, ErrInvalidConfig)
	}
	cost := rc.Cost
	if cost == 0 {
		cost = 1
	}
	var sh shaper
	if rc.Shape {
		s, ok := rc.Algorithm.(shaper)
		if !ok || rc.Shadow {
			return nil, fmt.Errorf("middleware: rule %q: shape needs a scheduling algorithm (leaky_bucket), not %s, on an enforced rule: %w",
				rc.Name, rc.Algorithm.Name(), ErrInvalidConfig)
		}
		sh = s
	}
	if _, d := rc.Algorithm.Take(State{}, 0, cost); cost < 0 || !d.Allowed {
		return nil, fmt.Errorf("middleware: rule %q: cost %d never fits the limit: %w", rc.Name, cost, ErrInvalidConfig)
	}
	if rc.Reserve < 0 || rc.Reserve > 0 && rc.Reserve > rc.Algorithm.Limit()-cost {
		return nil, fmt.Errorf("middleware: rule %q: reserve %d of a limit of %d leaves no room for a request of cost %d: %w",
			rc.Name, rc.Reserve, rc.Algorithm.Limit(), cost, ErrInvalidConfig)
	}
	sc := rc.Store
	if sc.Capacity == 0 {
		sc.Capacity = 1 << 18
	}
	store, err := NewStore(rc.Algorithm, sc)
	if err != nil {
		return nil, fmt.Errorf("middleware: rule %q: %w", rc.Name, err)
	}
	return &rule{
		name:    rc.Name,
		tier:    tierName,
		key:     rc.Key,
		store:   store,
		cost:    cost,
		shadow:  rc.Shadow,
		policy:  PolicyItem(rc.Name, rc.Algorithm.Limit(), rc.Algorithm.Window()),
		counter: new(ruleCounters),
		shaper:  sh,
		reserve: rc.Reserve,
	}, nil
}

func newTier(name string, rules []*rule) *tier {
	t := &tier{name: name, rules: rules}
	v := ""
	for _, r := range rules {
		if r.shadow {
			continue
		}
		if t.nEnforced > 0 {
			v += ", "
		}
		v += r.policy
		t.nEnforced++
	}
	if v != "" {
		t.policy = []string{v}
	}
	return t
}

// Wrap returns next behind the limiter; it has the shape of chi, echo and
// net/http middleware: func(http.Handler) http.Handler.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.serve(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// Check is the middleware without a next handler, for frameworks with their
// own chain (gin: if !mw.Check(c.Writer, c.Request) { c.Abort() }): it
// writes the rate-limit headers and, when the request is rejected, the
// whole 429 response, and reports whether the request may proceed.
func (m *Middleware) Check(w http.ResponseWriter, r *http.Request) bool { return m.serve(w, r) }

func (m *Middleware) tierFor(r *http.Request) *tier {
	if m.selectTier == nil {
		return m.deflt
	}
	if t := m.tiers[m.selectTier(r)]; t != nil {
		return t
	}
	return m.deflt
}

// serve decides for r, writes the headers, and the 429 if rejected. It
// returns whether to call the next handler.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request) bool {
	var p verdict
	m.decide(r, &p, nil, false)
	if p.n == 0 {
		return true
	}
	p.commit()
	return m.respond(w, &p, nil)
}

// retrySeconds rounds up to whole seconds, at least 1: a client retrying
// then is never early.
func retrySeconds(d time.Duration) int64 {
	return max(1, ceilDiv(int64(d), int64(time.Second)))
}

// headerBlock holds the header values of one response that were not in
// the value cache: one allocation for all of them. The strings point into
// buf, which is never written again after they are made.
type headerBlock struct {
	vals [maxHeaderValues]string
	buf  [128]byte // fits one or two rules; more grows buf (one more allocation)
}

// smallHeaderBlock is a headerBlock for the usual miss: one or two values
// of up to 40 bytes together (a one-rule RateLimit value), 72 bytes
// instead of 208: less to allocate, clear and collect.
type smallHeaderBlock struct {
	vals [2]string
	buf  [40]byte
}

const maxHeaderValues = 5

// valueCacheSize is the number of slots of a Middleware's header value
// cache (8 KiB of pointers).
const valueCacheSize = 1024

// headerValues are one response's dynamic header values, built in a
// buffer on the stack before they are looked up in the cache.
type headerValues struct {
	n     int
	names [maxHeaderValues]string
	ends  [maxHeaderValues]int // value i is buf[ends[i-1]:ends[i]]
}

func (v *headerValues) end(name string, at int) {
	v.names[v.n] = name
	v.ends[v.n] = at
	v.n++
}

// setHeaders sets the values in h, each from the value cache when an equal
// string is there, else from one new headerBlock (then cached). Cached
// values are immutable strings shared by every response that carries the
// same value, in shared one-element slices: handlers must replace, not
// mutate, their element (as for the precomputed RateLimit-Policy).
func (m *Middleware) setHeaders(h http.Header, v *headerValues, vbuf []byte) {
	var hits [maxHeaderValues]*[1]string
	var slots [maxHeaderValues]uint64
	missing, misses := 0, 0
	start := 0
	for i := range v.n {
		b := vbuf[start:v.ends[i]]
		start = v.ends[i]
		slots[i] = maphash.Bytes(m.valueSeed, b) & (valueCacheSize - 1)
		if e := m.values[slots[i]].Load(); e != nil && e[0] == string(b) {
			hits[i] = e
			continue
		}
		missing += len(b)
		misses++
	}
	var vals []string
	var buf []byte
	if misses > 0 {
		if misses <= 2 && missing <= 40 {
			sb := new(smallHeaderBlock)
			vals, buf = sb.vals[:], sb.buf[:0]
		} else {
			hb := new(headerBlock)
			vals, buf = hb.vals[:], hb.buf[:0]
			if missing > len(hb.buf) {
				buf = make([]byte, 0, missing)
			}
		}
	}
	start = 0
	nv := 0
	for i := range v.n {
		b := vbuf[start:v.ends[i]]
		start = v.ends[i]
		e := hits[i]
		if e == nil {
			at := len(buf)
			buf = append(buf, b...)
			s := buf[at:]
			vals[nv] = unsafe.String(unsafe.SliceData(s), len(s))
			e = (*[1]string)(vals[nv : nv+1])
			nv++
			m.values[slots[i]].Store(e)
		}
		h[v.names[i]] = e[:]
	}
}

// writeHeaders writes RateLimit-Policy and RateLimit (and the legacy
// fields) for the local rules applied to p, then ext. For a rejected rule,
// t is the time until this request would be admitted (equal to Retry-After
// before jitter); otherwise t is the time until the rule's quota is fully
// restored. Values are whole seconds, rounded up.
func (m *Middleware) writeHeaders(w http.ResponseWriter, p *verdict, ext []ExternalDecision) {
	if m.headers == HeadersNone && !m.legacy {
		return
	}
	rules, ds := p.applied[:p.n], p.out[:p.n]
	var stack [192]byte
	buf := stack[:0]
	var v headerValues
	h := w.Header()
	if m.headers == HeadersDraft10 {
		allApply := p.n == p.t.nEnforced
		if allApply && len(ext) == 0 {
			h["Ratelimit-Policy"] = p.t.policy
		} else {
			start := len(buf)
			if allApply {
				if len(p.t.policy) > 0 {
					buf = append(buf, p.t.policy[0]...)
				}
			} else {
				for i, r := range rules {
					if i > 0 {
						buf = append(buf, ", "...)
					}
					buf = append(buf, r.policy...)
				}
			}
			for _, e := range ext {
				if len(buf) > start {
					buf = append(buf, ", "...)
				}
				buf = append(buf, e.Policy...)
			}
			v.end("Ratelimit-Policy", len(buf))
		}
		start := len(buf)
		item := func(name string, d Decision) {
			if len(buf) > start {
				buf = append(buf, ", "...)
			}
			buf = AppendRateLimitItem(buf, name, d)
		}
		for i, r := range rules {
			item(r.name, ds[i])
		}
		for _, e := range ext {
			item(e.Name, e.Decision)
		}
		v.end("Ratelimit", len(buf))
	}
	if m.legacy {
		// The most restrictive rule: a rejected one with the longest wait,
		// else the one with the fewest remaining units.
		var d Decision
		for i := range len(ds) + len(ext) {
			di := &d
			if i < len(ds) {
				di = &ds[i]
			} else {
				di = &ext[i-len(ds)].Decision
			}
			if i == 0 || less(*di, d) {
				d = *di
			}
		}
		buf = strconv.AppendInt(buf, d.Limit, 10)
		v.end("X-Ratelimit-Limit", len(buf))
		buf = strconv.AppendInt(buf, max(0, d.Remaining), 10)
		v.end("X-Ratelimit-Remaining", len(buf))
		buf = strconv.AppendInt(buf, resetSeconds(d), 10)
		v.end("X-Ratelimit-Reset", len(buf))
	}
	m.setHeaders(h, &v, buf)
}

// less orders decisions from most to least restrictive.
func less(a, b Decision) bool {
	if a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if !a.Allowed {
		return a.RetryAfter > b.RetryAfter
	}
	return a.Remaining < b.Remaining
}

func resetSeconds(d Decision) int64 {
	if !d.Allowed {
		return retrySeconds(d.RetryAfter)
	}
	return ceilDiv(int64(d.Reset), int64(time.Second))
}

// RuleStats are one rule's counters.
type RuleStats struct {
	Rule           string
	Tier           string // "" for rules applied to every tier
	Algorithm      string
	Shadow         bool
	Allowed        int64 // requests this rule let through (whole request passed)
	Rejected       int64 // requests this rule rejected (429) over quota
	RejectedFull   int64 // requests rejected because the rule's store was full (FailClosed)
	ShadowRejected int64 // requests a shadow rule would have rejected
	Store          StoreStats
}

// Stats returns every rule's counters.
func (m *Middleware) Stats() []RuleStats {
	out := make([]RuleStats, 0, len(m.all))
	for _, r := range m.all {
		out = append(out, RuleStats{
			Rule:           r.name,
			Tier:           r.tier,
			Algorithm:      r.store.Algorithm().Name(),
			Shadow:         r.shadow,
			Allowed:        r.counter.allowed.Load(),
			Rejected:       r.counter.rejected.Load(),
			RejectedFull:   r.counter.rejectedFull.Load(),
			ShadowRejected: r.counter.shadowRejected.Load(),
			Store:          r.store.Stats(),
		})
	}
	return out
}

// Sweep frees the idle keys of every rule's store (see Store.Sweep).
func (m *Middleware) Sweep() int {
	now := m.clock.Now()
	n := 0
	for _, r := range m.all {
		n += r.store.Sweep(now)
	}
	return n
}
