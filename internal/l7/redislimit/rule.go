package redislimit

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Algorithm selects the limiter a Rule runs in Redis.
type Algorithm int

const (
	// GCRA is the generic cell rate algorithm (a leaky bucket kept as one
	// timestamp): Limit requests per Window, bursts of up to Burst.
	GCRA Algorithm = iota + 1
	// SlidingWindow is the sliding window counter: two fixed-window counts,
	// the previous one weighted by how much of it still overlaps the window.
	SlidingWindow
)

func (a Algorithm) String() string {
	switch a {
	case GCRA:
		return "gcra"
	case SlidingWindow:
		return "sliding_window"
	}
	return fmt.Sprintf("algorithm(%d)", int(a))
}

// FailurePolicy says what a rule answers when Redis cannot.
type FailurePolicy int

const (
	// FailOpen admits the request (the default: an outage of the limiter's
	// store must not become an outage of the site).
	FailOpen FailurePolicy = iota
	// FailClosed rejects the request.
	FailClosed
	// Degrade applies a local limit of Limit÷DegradeShards per instance.
	Degrade
)

func (p FailurePolicy) String() string {
	switch p {
	case FailOpen:
		return "fail_open"
	case FailClosed:
		return "fail_closed"
	case Degrade:
		return "degrade"
	}
	return fmt.Sprintf("policy(%d)", int(p))
}

// Hybrid makes a SlidingWindow rule decide locally from an allowance leased
// from Redis; see docs/l7-redis.md for the overshoot bound.
type Hybrid struct {
	// SyncInterval is how long a lease may be used before the instance
	// reports its count and asks for a new one.
	SyncInterval time.Duration
	// MaxLease (L) caps one grant; the cluster-wide overshoot is at most
	// (instances − 1) × MaxLease.
	MaxLease int64
	// Share (S) divides the remaining quota: a grant is min(L, ⌈remaining/S⌉).
	// Set it to the expected number of instances. Default 1: a single
	// instance, which decides from the window itself while its syncs find
	// only its own counts there, and with grants of at most
	// min(L, FleetLease(limit, 1)) and Share 2 while they find others'.
	Share int64
	// Capacity caps the keys this instance holds a lease for (0: 65,536).
	// A new key at capacity evicts the least recently used of a sample of
	// leases, after reporting its unsynced counts to Redis.
	Capacity int
}

// FleetLease is the default largest grant of a hybrid rule shared by
// hosts instances: ⌈limit ÷ (10 × hosts)⌉, at least 1, so that together
// they exceed the limit by at most a tenth of it in a window
// ((hosts − 1) × lease).
func FleetLease(limit, hosts int64) int64 {
	hosts = max(hosts, 1)
	return max((limit+10*hosts-1)/(10*hosts), 1)
}

// SingleLease is the default largest grant of a hybrid rule on a single
// instance (Share 1): ⌈limit ÷ 4⌉, at least 1. It decides from the window
// itself, so the lease costs it round trips only (about one per lease of
// admissions), and bounds what it admits before a sync can show it that
// another instance writes its keys: with N instances all at Share 1 a
// key's window admits at most limit + (N − 1) × lease until each has seen
// the others (then FleetLease(limit, 1) takes its place), and a crash
// loses at most the lease.
func SingleLease(limit int64) int64 { return max((limit+3)/4, 1) }

// Rule is one limit applied to every request's key.
type Rule struct {
	// Name is part of the Redis key and a metric label: [A-Za-z0-9_.-]{1,64}.
	Name      string
	Algorithm Algorithm
	// Limit requests per Window.
	Limit  int64
	Window time.Duration
	// Burst is GCRA's bucket depth; 0 means Limit.
	Burst int64
	// Failure is the rule's policy while Redis is unreachable.
	Failure FailurePolicy
	// DegradeShards is N in Limit÷N for the Degrade policy: the number of
	// instances sharing the limit. Required when Failure is Degrade.
	DegradeShards int64
	// Hybrid, when non-nil, enables hybrid mode (SlidingWindow only).
	Hybrid *Hybrid
}

var ruleName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// maxExact is 2^53: Lua numbers are doubles, exact for integers below it.
const maxExact = 1 << 53

// ErrInvalidRule is wrapped by every rule validation error.
var ErrInvalidRule = errors.New("invalid rule")

func (r Rule) validate() error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("rule %q: %w: %s", r.Name, ErrInvalidRule, fmt.Sprintf(format, args...))
	}
	if !ruleName.MatchString(r.Name) {
		return fail("name must match %s", ruleName)
	}
	if r.Limit < 1 {
		return fail("limit %d must be at least 1", r.Limit)
	}
	if r.Window < time.Microsecond {
		return fail("window %s must be at least 1µs", r.Window)
	}
	switch r.Algorithm {
	case GCRA:
		if r.Burst < 0 {
			return fail("burst %d must not be negative", r.Burst)
		}
		t := r.interval()
		if t < 1 {
			return fail("window/limit is under 1ns")
		}
		if (r.burst()+1) > maxExact/t || int64(r.Window) >= maxExact {
			return fail("burst × window/limit must stay below 2^53 ns (104 days)")
		}
		if r.Hybrid != nil {
			return fail("hybrid mode needs the sliding window algorithm")
		}
	case SlidingWindow:
		if r.Window%time.Microsecond != 0 {
			return fail("window %s must be a whole number of microseconds", r.Window)
		}
		if r.Limit > maxExact/r.windowMicros()/2 {
			return fail("limit × window in µs must stay below 2^52")
		}
	default:
		return fail("unknown algorithm %d", int(r.Algorithm))
	}
	switch r.Failure {
	case FailOpen, FailClosed:
	case Degrade:
		if r.DegradeShards < 1 {
			return fail("degrade policy needs DegradeShards ≥ 1")
		}
	default:
		return fail("unknown failure policy %d", int(r.Failure))
	}
	if h := r.Hybrid; h != nil {
		if h.SyncInterval <= 0 || h.MaxLease < 1 || h.Share < 0 || h.Capacity < 0 {
			return fail("hybrid mode needs SyncInterval > 0, MaxLease ≥ 1, Share ≥ 0, Capacity ≥ 0")
		}
	}
	return nil
}

func (r Rule) burst() int64 {
	if r.Burst == 0 {
		return r.Limit
	}
	return r.Burst
}

// interval is GCRA's emission interval, rounded down to a whole nanosecond.
func (r Rule) interval() int64 { return int64(r.Window) / r.Limit }

func (r Rule) windowMicros() int64 { return int64(r.Window / time.Microsecond) }

// redisKey is prefix{clientKey}:rule. The braces are a Redis Cluster hash
// tag: every limit of one client key hashes to the same slot, so one EVALSHA
// can touch them all. '%' and '}' in the client key are escaped so a key
// cannot end the tag early, and an empty key still gives a non-empty tag.
func redisKey(prefix, clientKey, rule string) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(clientKey) + len(rule) + 4)
	b.WriteString(prefix)
	b.WriteByte('{')
	writeTag(&b, clientKey)
	b.WriteString("}:")
	b.WriteString(rule)
	return b.String()
}

func writeTag(b *strings.Builder, clientKey string) {
	if clientKey == "" {
		b.WriteByte('%')
		return
	}
	if !strings.ContainsAny(clientKey, "%}") {
		b.WriteString(clientKey)
		return
	}
	for i := 0; i < len(clientKey); i++ {
		switch c := clientKey[i]; c {
		case '%':
			b.WriteString("%25")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
}
