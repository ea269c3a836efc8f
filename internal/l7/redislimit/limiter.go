// Package redislimit is the Redis backend of Edgeguard's L7 limits: limits
// shared by every instance of the daemon, decided by Lua scripts that run
// atomically inside Redis on the Redis server's clock.
//
// One request costs one EVALSHA over all of its limits (keys share a Redis
// Cluster hash tag), and concurrent requests are coalesced into pipelined
// round trips. When Redis is unreachable a circuit breaker answers within
// microseconds and each rule's FailurePolicy applies. See docs/l7-redis.md.
package redislimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// Config configures a Limiter. Client and Rules are required.
type Config struct {
	// Client is a pooled go-redis client (*redis.Client or
	// *redis.ClusterClient). Its DialTimeout/ReadTimeout should be short:
	// they bound how long the requests in flight when Redis dies wait.
	Client redis.UniversalClient
	// Rules apply to every key passed to Allow, all or nothing.
	Rules []Rule
	// Prefix starts every Redis key. Default "eg:l7:". No braces.
	Prefix string
	// Timeout bounds one round trip (one pipelined batch). Default 100ms.
	Timeout time.Duration
	// MaxBatch caps the decisions coalesced into one pipelined round trip.
	// Default 64; 1 sends every decision on its own.
	MaxBatch int
	// Workers is the number of round trips in flight at once. Default 4.
	Workers int
	// Breaker tunes the circuit breaker.
	Breaker BreakerConfig
	// Clock times the breaker, the local fallback, hybrid leases and log
	// throttling. Default l7.NewSystemClock().
	Clock l7.Clock
	// ScriptClock, when set, supplies the scripts' time (nanoseconds since
	// the Unix epoch) instead of the Redis server's TIME. For tests that
	// script a timeline; leave nil in production.
	ScriptClock l7.Clock
	// Logger receives rate-limited warnings. Default: discard.
	Logger *slog.Logger
	// LogEvery is the minimum interval between two identical warnings.
	// Default 10s.
	LogEvery time.Duration
	// Registerer receives the metrics. Nil: metrics are kept unregistered.
	Registerer prometheus.Registerer
	// LocalMaxKeys caps the keys each Degrade rule tracks locally.
	// Default 100000.
	LocalMaxKeys int
	// SyncEvery is how often hybrid counts are flushed in the background.
	// Default: the smallest SyncInterval; negative disables the background
	// flush (call Sync yourself).
	SyncEvery time.Duration
	// HybridStates, when set, shares hybrid rules' lease state with the
	// other Limiters given the same set (a limit decided in several
	// tiers: one lease per host and key). Nil: each rule its own.
	HybridStates *HybridStates
}

// Source says who decided a rule.
type Source int

const (
	// SourceRedis: the Redis script decided.
	SourceRedis Source = iota
	// SourceLease: a hybrid rule decided from its local lease.
	SourceLease
	// SourceFailOpen: Redis was unreachable and the rule fails open.
	SourceFailOpen
	// SourceFailClosed: Redis was unreachable and the rule fails closed.
	SourceFailClosed
	// SourceLocal: Redis was unreachable and the rule's local limit decided.
	SourceLocal
	// SourceSkipped: another rule refused first; this one was neither asked
	// nor charged.
	SourceSkipped
)

func (s Source) String() string {
	return [...]string{"redis", "lease", "fail_open", "fail_closed", "local", "skipped"}[s]
}

// RuleDecision is one rule's part of a Result.
type RuleDecision struct {
	Rule     string
	Source   Source
	Decision l7.Decision
}

// Result is the answer for one request. Decision combines the rules: when
// any rule refuses, the refusal with the longest RetryAfter; otherwise the
// rule with the fewest requests remaining.
type Result struct {
	Decision l7.Decision
	Rules    []RuleDecision

	charge *charge // what an admitted request took, for Refund
}

// charge is what an admitted request took, to give back on Refund.
type charge struct {
	key      string
	n        int64        // units taken from each rule
	hybrid   []func()     // lease reservations
	local    []localCheck // Degrade rules' local charges
	remote   bool         // the decide script committed
	t0s      int64        // the script's time (seconds, nanoseconds)
	t0ns     int64
	before   []int64 // per remote rule: GCRA TAT before the charge minus t0
	refunds  []int64 // per remote rule: GCRA refund count
	refunded bool
}

// ErrClosed is returned by Allow after Close.
var ErrClosed = errors.New("redis limiter closed")

// Limiter decides requests against limits kept in Redis.
type Limiter struct {
	cfg      Config
	client   redis.UniversalClient
	rules    []Rule
	remote   []int // indexes of rules decided by the decide script
	merge    bool  // one EVALSHA per batch (single node); else one per request
	hybrid   []*hybridRule
	local    []*localRule // per rule; nil unless Degrade
	args     []any        // decide script's per-rule ARGV (without time)
	breaker  *breaker
	metrics  *metrics
	warn     *logThrottle
	queue    chan *call
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	closeMu  sync.Once
	decideSH string
	leaseSH  string
	refundSH string
}

// New validates cfg and starts the batching workers. Redis need not be up:
// the scripts are loaded on first use (and again after a NOSCRIPT).
func New(cfg Config) (*Limiter, error) {
	if cfg.Client == nil {
		return nil, errors.New("redis limiter: no client")
	}
	if len(cfg.Rules) == 0 {
		return nil, errors.New("redis limiter: no rules")
	}
	seen := map[string]bool{}
	for _, r := range cfg.Rules {
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("redis limiter: %w", err)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("redis limiter: rule %q: %w: duplicate name", r.Name, ErrInvalidRule)
		}
		seen[r.Name] = true
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "eg:l7:"
	}
	for _, c := range cfg.Prefix {
		if c == '{' || c == '}' {
			return nil, fmt.Errorf("redis limiter: prefix %q must not contain braces (they are the hash tag)", cfg.Prefix)
		}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 100 * time.Millisecond
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 64
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Clock == nil {
		cfg.Clock = l7.NewSystemClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.LogEvery <= 0 {
		cfg.LogEvery = 10 * time.Second
	}
	if cfg.LocalMaxKeys <= 0 {
		cfg.LocalMaxKeys = 100_000
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Limiter{
		cfg:      cfg,
		client:   cfg.Client,
		rules:    cfg.Rules,
		local:    make([]*localRule, len(cfg.Rules)),
		metrics:  m,
		warn:     newLogThrottle(cfg.Logger, cfg.Clock, int64(cfg.LogEvery)),
		queue:    make(chan *call, cfg.MaxBatch*cfg.Workers),
		ctx:      ctx,
		cancel:   cancel,
		decideSH: redis.NewScript(decideSource).Hash(),
		leaseSH:  redis.NewScript(leaseSource).Hash(),
		refundSH: redis.NewScript(refundSource).Hash(),
	}
	// Keys of different clients may live on different nodes of a cluster
	// or ring: there, each request is its own EVALSHA in the pipeline.
	_, l.merge = cfg.Client.(*redis.Client)
	l.breaker = newBreaker(cfg.Breaker, cfg.Clock, l.breakerChanged)
	l.cfg.Breaker = l.breaker.cfg
	minSync := time.Duration(0)
	for i, r := range cfg.Rules {
		if r.Failure == Degrade {
			if l.local[i], err = newLocalRule(r, cfg.LocalMaxKeys); err != nil {
				cancel()
				for _, h := range l.hybrid {
					h.release(l)
				}
				return nil, fmt.Errorf("redis limiter: %w", err)
			}
		}
		if r.Hybrid != nil {
			h := &hybridRule{index: i, hybridState: cfg.HybridStates.state(r, l, cfg.Clock.Now()),
				decided: [2]prometheus.Counter{m.hybridLocal.WithLabelValues(r.Name, "allow"), m.hybridLocal.WithLabelValues(r.Name, "deny")}}
			if l.local[i] != nil {
				l.local[i] = h.degrade(l.local[i])
			}
			l.hybrid = append(l.hybrid, h)
			if minSync == 0 || r.Hybrid.SyncInterval < minSync {
				minSync = r.Hybrid.SyncInterval
			}
			continue
		}
		if len(l.remote) == 0 {
			l.args = append(l.args, 0) // k, set below
		}
		l.remote = append(l.remote, i)
		switch r.Algorithm {
		case GCRA:
			l.args = append(l.args, 1, r.interval(), r.burst(), 1)
		case SlidingWindow:
			l.args = append(l.args, 2, r.windowMicros(), r.Limit, 1)
		}
	}
	if len(l.remote) > 0 {
		l.args[0] = len(l.remote)
	}
	if cfg.MaxBatch > 1 && (len(l.remote) > 0 || len(l.hybrid) > 0) {
		for range cfg.Workers {
			l.wg.Add(1)
			go l.batchWorker()
		}
	}
	if len(l.hybrid) > 0 && cfg.SyncEvery >= 0 {
		every := cfg.SyncEvery
		if every == 0 {
			every = minSync
		}
		l.wg.Add(1)
		go l.syncLoop(every)
	}
	return l, nil
}

// Close flushes hybrid counts (bounded by Timeout per batch), then stops
// the workers and background sync. It does not close Client. A hybrid
// state shared with other Limiters (HybridStates) keeps its leases for
// them, and the next of them flushes it in the background.
func (l *Limiter) Close() {
	l.closeMu.Do(func() {
		if len(l.hybrid) > 0 {
			l.Sync(l.ctx)
		}
		l.cancel()
		l.wg.Wait()
		for _, h := range l.hybrid {
			h.release(l)
		}
	})
}

// BreakerState reports the circuit breaker's state.
func (l *Limiter) BreakerState() BreakerState { return l.breaker.State() }

// Allow decides one request for key against every rule and charges all of
// them, or none if any refuses. err is nil whenever a decision was made,
// including by a failure policy; it is non-nil only if ctx ended first or
// the Limiter is closed.
func (l *Limiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN is Allow for a request that takes n units of every rule (the
// rate-limit service's hits_addend), n >= 1: the scripts, hybrid leases
// and Degrade rules' local limits all charge (and refund) n.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (Result, error) {
	if l.ctx.Err() != nil {
		return Result{}, ErrClosed
	}
	if n < 1 {
		return Result{}, fmt.Errorf("redis limiter: cost %d: want at least 1", n)
	}
	res := Result{Rules: make([]RuleDecision, len(l.rules))}
	for i, r := range l.rules {
		res.Rules[i].Rule = r.Name
	}
	// Hybrid rules first: they reserve from local leases, and give the
	// reservation back below if another rule refuses. The charge is made
	// when something is taken (a refused request takes nothing).
	refund := func() {
		if res.charge != nil {
			for _, f := range res.charge.hybrid {
				f()
			}
		}
	}
	hybridOK := true
	for _, h := range l.hybrid {
		rd, undo, err := l.hybridReserve(ctx, h, key, n)
		if err != nil {
			refund()
			return Result{}, err
		}
		res.Rules[h.index] = rd
		if undo != nil {
			if res.charge == nil {
				res.charge = &charge{key: key, n: n}
			}
			res.charge.hybrid = append(res.charge.hybrid, undo)
		}
		hybridOK = hybridOK && rd.Decision.Allowed
	}
	if !hybridOK {
		// Nothing else is asked (or charged): the request is refused.
		refund()
		for _, i := range l.remote {
			res.Rules[i].Source = SourceSkipped
			res.Rules[i].Decision = l7.Decision{Limit: l.rules[i].Limit, Window: l.rules[i].Window}
		}
		res.charge = nil
		return combine(res), nil
	}
	if len(l.remote) > 0 {
		if res.charge == nil {
			res.charge = &charge{key: key, n: n}
		}
		if err := l.decideRemote(ctx, key, &res, n); err != nil {
			refund()
			return Result{}, err
		}
	}
	if !allAllowed(res) {
		refund()
		res.charge = nil
	}
	return combine(res), nil
}

// Refund gives back what Allow charged for an admitted request that
// another limit refused (the proxy's other Redis groups or its local
// rules): hybrid lease reservations, Degrade rules' local charges (both
// at once, in process), and the decide script's charge through one
// refund script run (an atomic EVALSHA on the same keys and hash tag).
// Refund also rewrites the decisions of res.Rules to the state without the
// request (one more remaining, the reset before the charge), for the
// headers of the response that refuses it. Refunding a refused Result, or
// one already refunded, does nothing. If
// Redis cannot be reached (breaker open, round trip failed) the remote
// charge stays, which errs on the strict side, and the error says so.
func (l *Limiter) Refund(res Result) error {
	c := res.charge
	if c == nil || c.refunded {
		return nil
	}
	c.refunded = true
	for _, f := range c.hybrid {
		f()
	}
	for _, lc := range c.local {
		lc.undo(l.cfg.Clock)
	}
	if !c.remote {
		return nil
	}
	for j, i := range l.remote {
		d := &res.Rules[i].Decision
		d.Remaining += c.n
		d.Reset = time.Duration(c.before[j])
	}
	l.metrics.refunds.Inc()
	if ok, probe := l.breaker.allow(); !ok {
		if probe {
			l.startProbe()
		}
		l.metrics.errors.WithLabelValues("refund", "breaker_open").Inc()
		return fmt.Errorf("redis limiter: refund: %w", ErrBreakerOpen)
	}
	keys := make([]string, len(l.remote))
	args := make([]any, 0, 3+6*len(l.remote))
	args = append(args, len(l.remote), c.t0s, c.t0ns)
	for j, i := range l.remote {
		r := l.rules[i]
		keys[j] = redisKey(l.cfg.Prefix, c.key, r.Name)
		switch r.Algorithm {
		case GCRA:
			args = append(args, 1, r.interval(), r.burst(), c.n)
		case SlidingWindow:
			args = append(args, 2, r.windowMicros(), r.Limit, c.n)
		}
		args = append(args, c.before[j], c.refunds[j])
	}
	rc := &call{script: l.refundSH, src: refundSource, keys: keys, args: l.scriptArgs(args)}
	l.runBatch([]*call{rc}, "refund")
	if rc.err != nil {
		return fmt.Errorf("redis limiter: refund: %w", rc.err)
	}
	return nil
}

func allAllowed(res Result) bool {
	for _, rd := range res.Rules {
		if !rd.Decision.Allowed {
			return false
		}
	}
	return true
}

// combine fills res.Decision from the rules that were asked.
func combine(res Result) Result {
	var best *l7.Decision
	for i := range res.Rules {
		d := &res.Rules[i].Decision
		if res.Rules[i].Source == SourceSkipped {
			continue
		}
		switch {
		case best == nil:
			best = d
		case best.Allowed && !d.Allowed:
			best = d
		case !best.Allowed && !d.Allowed && d.RetryAfter > best.RetryAfter:
			best = d
		case best.Allowed && d.Allowed && d.Remaining < best.Remaining:
			best = d
		}
	}
	if best != nil {
		res.Decision = *best
	}
	return res
}

// decideRemote runs the decide script for the non-hybrid rules.
func (l *Limiter) decideRemote(ctx context.Context, key string, res *Result, n int64) error {
	ok, probe := l.breaker.allow()
	if probe {
		l.startProbe()
	}
	if !ok {
		l.metrics.errors.WithLabelValues("decide", "breaker_open").Inc()
		l.fallback(key, res, ErrBreakerOpen, n)
		return nil
	}
	keys := make([]string, len(l.remote))
	for j, i := range l.remote {
		keys[j] = redisKey(l.cfg.Prefix, key, l.rules[i].Name)
	}
	c := &call{script: l.decideSH, src: decideSource, keys: keys, args: l.scriptArgs(l.args), done: make(chan struct{})}
	if n != 1 {
		// Each limit's cost is the fourth of its four arguments (after
		// k); such a call is not merged with the others of its batch.
		args := slices.Clone(l.args)
		for j := range l.remote {
			args[1+4*j+3] = n
		}
		c.args, c.custom = l.scriptArgs(args), true
	}
	if err := l.roundTrip(ctx, c); err != nil {
		return err
	}
	if c.err != nil {
		l.fallback(key, res, c.err, n)
		return nil
	}
	vals, perr := intReply(c.reply, decideReplyLen(len(l.remote)))
	if perr != nil {
		l.failed("decide", perr)
		l.fallback(key, res, perr, n)
		return nil
	}
	if vals[0] == 1 {
		ch := res.charge
		ch.remote, ch.t0s, ch.t0ns = true, vals[1], vals[2]
		ch.before = make([]int64, len(l.remote))
		ch.refunds = make([]int64, len(l.remote))
		for j := range l.remote {
			ch.before[j], ch.refunds[j] = vals[3+6*j+4], vals[3+6*j+5]
		}
	}
	for j, i := range l.remote {
		r := l.rules[i]
		v := vals[3+6*j : 7+6*j]
		res.Rules[i].Source = SourceRedis
		res.Rules[i].Decision = l7.Decision{
			Allowed:    vals[0] == 1,
			Limit:      r.Limit,
			Window:     r.Window,
			Remaining:  v[1],
			Reset:      time.Duration(v[2]),
			RetryAfter: time.Duration(v[3]),
		}
		if vals[0] != 1 && v[0] == 1 {
			// This rule would have allowed; another refused. Not charged.
			res.Rules[i].Decision.Allowed = true
		}
	}
	return nil
}

// scriptArgs prepends the time arguments: empty (use TIME) or ScriptClock.
func (l *Limiter) scriptArgs(rest []any) []any {
	args := make([]any, 0, 2+len(rest))
	if l.cfg.ScriptClock == nil {
		args = append(args, "", "")
	} else {
		ns := l.cfg.ScriptClock.Now()
		args = append(args, ns/1e9, ns%1e9)
	}
	return append(args, rest...)
}

// decideReplyLen is the decide script's reply length for one request of k
// limits: committed, the time (two values), and six values per limit.
func decideReplyLen(k int) int { return 3 + 6*k }

func intReply(reply any, n int) ([]int64, error) {
	arr, ok := reply.([]any)
	if !ok || len(arr) != n {
		return nil, fmt.Errorf("decode script reply: want %d integers, got %T (%v)", n, reply, reply)
	}
	out := make([]int64, n)
	for i, v := range arr {
		switch x := v.(type) {
		case int64:
			out[i] = x
		case string:
			p, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("decode script reply %d: %w", i, err)
			}
			out[i] = p
		default:
			return nil, fmt.Errorf("decode script reply %d: unexpected %T", i, v)
		}
	}
	return out, nil
}

// ErrBreakerOpen is the cause recorded when the breaker skipped Redis.
var ErrBreakerOpen = errors.New("redis circuit breaker open")

// fallback applies every remote rule's failure policy, all or nothing for
// the Degrade rules' local limits.
func (l *Limiter) fallback(key string, res *Result, cause error, n int64) {
	l.warn.warn("redis limiter: deciding without redis", slog.String("cause", cause.Error()), slog.String("breaker", l.breaker.State().String()))
	denied := false
	var locked []*localRule
	checks := map[int]localCheck{}
	now := l.cfg.Clock.Now()
	for _, i := range l.remote {
		r := l.rules[i]
		rd := &res.Rules[i]
		switch r.Failure {
		case FailOpen:
			rd.Source = SourceFailOpen
			rd.Decision = l7.Decision{Allowed: true, Limit: r.Limit, Window: r.Window, Remaining: r.Limit}
		case FailClosed:
			rd.Source = SourceFailClosed
			rd.Decision = l7.Decision{Limit: r.Limit, Window: r.Window, RetryAfter: l.failClosedRetry()}
			denied = true
		case Degrade:
			lr := l.local[i]
			lr.mu.Lock()
			locked = append(locked, lr)
			c := lr.check(key, now, n)
			checks[i] = c
			rd.Source = SourceLocal
			rd.Decision = c.decision
			denied = denied || !c.decision.Allowed
		}
	}
	if !denied {
		for _, c := range checks {
			c.commit()
			res.charge.local = append(res.charge.local, c)
		}
	}
	for _, lr := range locked {
		lr.mu.Unlock()
	}
	for _, i := range l.remote {
		verdict := "allow"
		if !res.Rules[i].Decision.Allowed {
			verdict = "deny"
		}
		l.metrics.fallback.WithLabelValues(l.rules[i].Name, l.rules[i].Failure.String(), verdict).Inc()
	}
}

// failClosedRetry is a fail-closed refusal's RetryAfter: until the next
// probe, or OpenFor while the breaker has not opened yet.
func (l *Limiter) failClosedRetry() time.Duration {
	if d := l.breaker.retryIn(); d > 0 {
		return d
	}
	return l.cfg.Breaker.OpenFor
}

// call is one script invocation waiting for a round trip.
type call struct {
	script, src string
	keys        []string
	args        []any
	reply       any
	err         error
	done        chan struct{}
	custom      bool // args other than the Limiter's (a cost above 1, a lease sync): never merged
}

// op is the round-trip metric's label of a pipeline of calls.
func op(calls []*call) string {
	for _, c := range calls {
		if c.src != leaseSource {
			return "decide"
		}
	}
	return "lease"
}

// roundTrip runs c, through the batch queue when batching is on. It returns
// an error only if ctx ended or the Limiter closed; Redis errors are in c.err.
func (l *Limiter) roundTrip(ctx context.Context, c *call) error {
	if c.done == nil {
		c.done = make(chan struct{})
	}
	if l.cfg.MaxBatch <= 1 {
		l.runDecide([]*call{c})
		return nil
	}
	select {
	case l.queue <- c:
	case <-ctx.Done():
		return fmt.Errorf("redis limiter: %w", ctx.Err())
	case <-l.ctx.Done():
		return ErrClosed
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("redis limiter: %w", ctx.Err())
	case <-l.ctx.Done():
		return ErrClosed
	}
}

// batchWorker takes whatever is queued (up to MaxBatch) and sends it as
// one pipeline. It never waits for a batch to fill: under light load a
// batch is one call and adds no latency; under load the queue fills while
// the previous round trip is in flight.
func (l *Limiter) batchWorker() {
	defer l.wg.Done()
	batch := make([]*call, 0, l.cfg.MaxBatch)
	for {
		batch = batch[:0]
		select {
		case c := <-l.queue:
			batch = append(batch, c)
		case <-l.ctx.Done():
			return
		}
	fill:
		for len(batch) < l.cfg.MaxBatch {
			select {
			case c := <-l.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		l.runDecide(batch)
	}
}

// runDecide sends a batch of decide calls: as one EVALSHA over all their
// keys on a single node (the script decides them in order, each request
// all-or-nothing), or as one EVALSHA per request in one pipeline.
func (l *Limiter) runDecide(calls []*call) {
	l.metrics.batchSize.Observe(float64(len(calls)))
	if l.merge && len(calls) > 1 {
		plain := calls[:0:0]
		var custom []*call
		for _, c := range calls {
			if c.custom {
				custom = append(custom, c)
			} else {
				plain = append(plain, c)
			}
		}
		if len(custom) > 0 {
			l.runBatch(custom, op(custom))
			if calls = plain; len(calls) == 0 {
				return
			}
		}
	}
	if !l.merge || len(calls) == 1 {
		l.runBatch(calls, op(calls))
		return
	}
	k := len(l.remote)
	keys := make([]string, 0, len(calls)*k)
	for _, c := range calls {
		keys = append(keys, c.keys...)
	}
	merged := &call{script: l.decideSH, src: decideSource, keys: keys, args: l.scriptArgs(l.args)}
	l.runBatch([]*call{merged}, "decide")
	seg := decideReplyLen(k)
	arr, ok := merged.reply.([]any)
	if merged.err == nil && (!ok || len(arr) != seg*len(calls)) {
		merged.err = fmt.Errorf("decode batched script reply: want %d values, got %T of %d", seg*len(calls), merged.reply, len(arr))
	}
	for i, c := range calls {
		if merged.err != nil {
			c.err = merged.err
		} else {
			c.reply = arr[i*seg : (i+1)*seg]
		}
		close(c.done)
	}
}

// runBatch sends calls as one pipeline, reloads the script and resends the
// calls that got NOSCRIPT (Redis restarted or SCRIPT FLUSH), reports the
// round trip to the breaker and metrics, and wakes every caller.
func (l *Limiter) runBatch(calls []*call, op string) {
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.Timeout)
	defer cancel()
	start := time.Now()
	err := l.pipeline(ctx, calls)
	if err == nil {
		var again []*call
		for _, c := range calls {
			if redis.HasErrorPrefix(c.err, "NOSCRIPT") {
				again = append(again, c)
			}
		}
		if len(again) > 0 {
			err = l.reload(ctx, again)
		}
	}
	l.metrics.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil {
		l.failed(op, err)
	} else {
		l.breaker.success()
	}
	for _, c := range calls {
		if c.done != nil {
			close(c.done)
		}
	}
}

// pipeline sends calls and stores each reply; the error is the first one
// that looks like Redis being unreachable (not a script's own error).
func (l *Limiter) pipeline(ctx context.Context, calls []*call) error {
	if len(calls) == 1 {
		c := calls[0]
		c.reply, c.err = l.client.EvalSha(ctx, c.script, c.keys, c.args...).Result()
		if c.err != nil && !redis.HasErrorPrefix(c.err, "NOSCRIPT") {
			return c.err
		}
		return nil
	}
	pipe := l.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = pipe.EvalSha(ctx, c.script, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx)
	var first error
	for i, c := range calls {
		c.reply, c.err = cmds[i].Val(), cmds[i].Err()
		if c.err != nil && !redis.HasErrorPrefix(c.err, "NOSCRIPT") && first == nil {
			first = c.err
		}
	}
	return first
}

func (l *Limiter) reload(ctx context.Context, calls []*call) error {
	loaded := map[string]bool{}
	for _, c := range calls {
		if loaded[c.script] {
			continue
		}
		if err := l.client.ScriptLoad(ctx, c.src).Err(); err != nil {
			for _, c := range calls {
				c.err = fmt.Errorf("reload script after NOSCRIPT: %w", err)
			}
			return calls[0].err
		}
		loaded[c.script] = true
	}
	return l.pipeline(ctx, calls)
}

// failed records a failed round trip: metric, breaker, throttled log.
func (l *Limiter) failed(op string, err error) {
	kind := errorKind(err)
	l.metrics.errors.WithLabelValues(op, kind).Inc()
	l.breaker.failure()
	l.warn.warn("redis limiter: round trip failed", slog.String("op", op), slog.String("kind", kind), slog.String("error", err.Error()))
}

// errorKind names a failed round trip's cause for the errors metric:
// refused (nothing listens: the connect failed at once), timeout, server
// (Redis answered with an error), connection (any other network failure).
func errorKind(err error) string {
	var rerr redis.Error
	var nerr net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &nerr) && nerr.Timeout():
		return "timeout"
	case errors.As(err, &rerr):
		return "server"
	}
	return "connection"
}

// startProbe checks Redis with PING in the background; decisions keep
// falling back (without I/O) until it reports.
func (l *Limiter) startProbe() {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithTimeout(l.ctx, l.cfg.Breaker.ProbeTimeout)
		defer cancel()
		start := time.Now()
		err := l.client.Ping(ctx).Err()
		l.metrics.latency.WithLabelValues("probe").Observe(time.Since(start).Seconds())
		if err != nil {
			l.metrics.errors.WithLabelValues("probe", errorKind(err)).Inc()
			l.warn.warn("redis limiter: probe failed", slog.String("error", err.Error()))
		}
		l.breaker.probeDone(err == nil)
	}()
}

func (l *Limiter) breakerChanged(from, to BreakerState) {
	l.metrics.breakerState.Set(float64(l.breaker.State())) // current, not "to": reports may arrive out of order
	l.metrics.transitions.WithLabelValues(to.String()).Inc()
	l.cfg.Logger.Info("redis limiter: circuit breaker changed", slog.String("from", from.String()), slog.String("to", to.String()))
}
