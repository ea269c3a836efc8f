package proxy

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/redislimit"
)

// newAlgorithm builds a local limit's algorithm.
func newAlgorithm(l Limit) (l7.Algorithm, error) {
	switch l.Algorithm {
	case AlgGCRA:
		return l7.NewGCRA(l.Count, l.Per, l.Burst)
	case AlgTokenBucket:
		return l7.NewTokenBucket(l.Count, l.Per, l.Burst)
	case AlgSlidingWindow:
		return l7.NewSlidingWindow(l.Count, l.Per)
	case AlgFixedWindow:
		return l7.NewFixedWindow(l.Count, l.Per)
	case AlgSlidingLog:
		return l7.NewSlidingLog(l.Count, l.Per)
	case AlgLeakyBucket:
		// burst is the bucket's size: the requests admitted at once from an
		// empty bucket (policing), or admitted and queued (shaping): the one
		// released now and burst-1 waiting.
		burst := l.Burst
		if burst == 0 {
			burst = l.Count
		}
		return l7.NewLeakyBucket(l.Count, l.Per, burst-1, 0)
	}
	return nil, fmt.Errorf("unknown algorithm %q", l.Algorithm)
}

// redisRule builds a redis or hybrid limit's rule (validated by
// redislimit.New; the checks here mirror the ones a policy author can fix).
// rc gives the hosts sharing it and the hybrid sync interval.
func redisRule(l Limit, rc *Redis) (redislimit.Rule, error) {
	r := redislimit.Rule{Name: l.Name, Limit: l.Count, Window: l.Per, Burst: l.Burst, Failure: redislimit.FailOpen}
	hosts, sync := int64(1), DefaultSyncInterval
	if rc != nil {
		hosts, sync = max(rc.Hosts, 1), cmp.Or(rc.SyncInterval, DefaultSyncInterval)
	}
	switch l.Algorithm {
	case AlgGCRA, AlgLeakyBucket:
		// The leaky bucket as a policer is the same meter as GCRA with its
		// burst (l7.LeakyBucket): Redis decides it with the GCRA script.
		if l.Shape {
			return r, fmt.Errorf("shape: true needs backend local (the release slot is decided from local state)")
		}
		r.Algorithm = redislimit.GCRA
		if int64(l.Per)/l.Count < 1 {
			return r, fmt.Errorf("rate %d per %s: interval below 1ns", l.Count, l.Per)
		}
	case AlgSlidingWindow:
		r.Algorithm = redislimit.SlidingWindow
		if l.Per%1000 != 0 {
			return r, fmt.Errorf("sliding-window in redis needs a whole number of microseconds, not %s", l.Per)
		}
	default:
		return r, fmt.Errorf("backend redis supports gcra, sliding-window and leaky_bucket, not %s", l.Algorithm)
	}
	switch l.Failure {
	case FailureClosed:
		r.Failure = redislimit.FailClosed
	case FailureLocal:
		r.Failure, r.DegradeShards = redislimit.Degrade, hosts
	}
	if l.Backend == BackendHybrid {
		if r.Algorithm != redislimit.SlidingWindow {
			return r, fmt.Errorf("backend hybrid needs algorithm sliding-window (its leases share a sliding window counter), not %s", l.Algorithm)
		}
		r.Hybrid = &redislimit.Hybrid{SyncInterval: sync, MaxLease: HybridLease(l, hosts), Share: hosts,
			Capacity: cmp.Or(l.Capacity, DefaultLocalCapacity)}
	}
	return r, nil
}

// HybridLease is a hybrid limit's largest grant: its lease, or by default
// ⌈Count ÷ (10 × hosts)⌉, so that hosts together exceed the limit by at
// most a tenth of it in a window ((hosts − 1) × lease). A single host
// decides from the window itself (redislimit's hybridRule), so its lease
// costs only round trips: its default is ⌈Count ÷ 4⌉
// (redislimit.SingleLease), which bounds what hosts all left at hosts: 1
// admit before each has seen the others' counts (Count + (N − 1) × lease
// in that window) and what a crash loses.
func HybridLease(l Limit, hosts int64) int64 {
	if l.Lease > 0 {
		return l.Lease
	}
	if hosts <= 1 {
		return redislimit.SingleLease(l.Count)
	}
	return redislimit.FleetLease(l.Count, hosts)
}

// keyMaker turns Key expressions into l7.KeyFuncs (local limits: 64-bit
// hashes with a per-process seed, no allocation) and into stable strings
// (redis limits: the same on every instance).
type keyMaker struct {
	keys     *l7.Keys
	asn      *asn.Table // the policy's asn_data (asn keys), or nil
	seed     maphash.Seed
	v4, v6   int
	user     string
	tenant   string
	endpoint func(route string) l7.KeyFunc
}

func newKeyMaker(cfg *Config) (*keyMaker, error) {
	keys, err := l7.NewKeys(l7.KeyConfig{
		TrustedProxies: cfg.TrustedProxies,
		IPv4PrefixLen:  cfg.ClientPrefixV4,
		IPv6PrefixLen:  cfg.ClientPrefixV6,
		UserHeader:     cfg.UserHeader,
		TenantHeader:   cfg.TenantHeader,
	})
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	km := &keyMaker{keys: keys, seed: maphash.MakeSeed(), v4: cfg.ClientPrefixV4, v6: cfg.ClientPrefixV6,
		user: "X-User-Id", tenant: "X-Tenant-Id"}
	if km.v4 == 0 {
		km.v4 = 32
	}
	if km.v6 == 0 {
		km.v6 = 64
	}
	if cfg.UserHeader != "" {
		km.user = http.CanonicalHeaderKey(cfg.UserHeader)
	}
	if cfg.TenantHeader != "" {
		km.tenant = http.CanonicalHeaderKey(cfg.TenantHeader)
	}
	return km, nil
}

// hashFunc is the local KeyFunc of k on route. The endpoint part is the
// method and the route's name (not the URL path: a client cannot mint new
// keys by varying the path).
func (km *keyMaker) hashFunc(k Key, route string) l7.KeyFunc {
	parts := make([]l7.KeyFunc, len(k))
	for i, p := range k {
		switch p.Kind {
		case KeyIP:
			parts[i] = km.keys.IP()
		case KeyHeader:
			parts[i] = km.keys.Header(p.Header)
		case KeyUser:
			parts[i] = km.keys.User()
		case KeyTenant:
			parts[i] = km.keys.Tenant()
		case KeyGlobal:
			parts[i] = km.keys.Global()
		case KeyPrefix:
			seed := km.seed
			parts[i] = func(r *http.Request) (uint64, bool) {
				pfx, ok := km.aggregate(r)
				if !ok {
					return 0, false
				}
				return maphash.Comparable(seed, pfx), true
			}
		case KeyASN:
			seed := km.seed
			parts[i] = func(r *http.Request) (uint64, bool) {
				n, ok := km.asnOf(r)
				if !ok {
					return 0, false
				}
				return maphash.Comparable(seed, n) ^ 0xa5a5a5a5a5a5a5a5, true
			}
		case KeyEndpoint:
			rh := maphash.String(km.seed, route)
			seed := km.seed
			parts[i] = func(r *http.Request) (uint64, bool) {
				return maphash.String(seed, r.Method) ^ (rh * 0x9e3779b97f4a7c15), true
			}
		}
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return l7.Compose(parts...)
}

// aggregate is the client's /24 or /48 (KeyPrefix).
func (km *keyMaker) aggregate(r *http.Request) (netip.Prefix, bool) {
	a, ok := km.keys.ClientIP(r)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	bits := AggregatePrefixV6
	if a.Is4() {
		bits = AggregatePrefixV4
	}
	pfx, err := a.Prefix(bits)
	return pfx, err == nil
}

// asnOf is the client's ASN from the policy's asn_data (KeyASN); false
// without asn_data or for an address in no ASN.
func (km *keyMaker) asnOf(r *http.Request) (uint32, bool) {
	if km.asn == nil {
		return 0, false
	}
	a, ok := km.keys.ClientIP(r)
	if !ok {
		return 0, false
	}
	e, ok := km.asn.Lookup(a)
	if !ok || e.ASN == 0 {
		return 0, false
	}
	return e.ASN, true
}

// maxKeyValue: longer header values are replaced by a hash in Redis keys.
const maxKeyValue = 64

func stableValue(v string) string {
	if len(v) <= maxKeyValue {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// stringFunc is the Redis key of k on route: readable, the same on every
// instance ("ip=203.0.113.7/32|user=alice"). ok is false when a part is
// missing.
func (km *keyMaker) stringFunc(k Key, route string) func(r *http.Request) (string, bool) {
	return func(r *http.Request) (string, bool) {
		var b strings.Builder
		for i, p := range k {
			if i > 0 {
				b.WriteByte('|')
			}
			switch p.Kind {
			case KeyIP:
				a, ok := km.keys.ClientIP(r)
				if !ok {
					return "", false
				}
				bits := km.v6
				if a.Is4() {
					bits = km.v4
				}
				pfx, err := a.Prefix(bits)
				if err != nil {
					return "", false
				}
				b.WriteString("ip=" + pfx.String())
			case KeyHeader, KeyUser, KeyTenant:
				name := p.Header
				switch p.Kind {
				case KeyUser:
					name = km.user
				case KeyTenant:
					name = km.tenant
				}
				v := r.Header[name]
				if len(v) == 0 || v[0] == "" {
					return "", false
				}
				b.WriteString(strings.ToLower(name) + "=" + stableValue(v[0]))
			case KeyEndpoint:
				b.WriteString("endpoint=" + r.Method + " " + route)
			case KeyGlobal:
				b.WriteString("global")
			case KeyPrefix:
				pfx, ok := km.aggregate(r)
				if !ok {
					return "", false
				}
				b.WriteString("prefix=" + pfx.String())
			case KeyASN:
				n, ok := km.asnOf(r)
				if !ok {
					return "", false
				}
				b.WriteString("asn=" + strconv.FormatUint(uint64(n), 10))
			}
		}
		return b.String(), true
	}
}
