package proxy

import (
	"fmt"
	"regexp"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// The tables of l7.routes: a route, its match, its tiers and a limit (a
// limit also of the rate-limit service's rules). Their fields' problems
// name the item they belong to ("route \"api\" exempt_paths", "limit
// \"a\": rate ..."), so each item's table is built for it, with the item
// being decoded; the docs build them for an empty item.

// route decodes one route; ok is false when it has no valid name.
func (d *decoder) route(n *yaml.Node, rc *Redis) (Route, bool) {
	var r Route
	got := d.routeTable(&r, rc).ParseAt(&d.Checker, n, "route", &r)
	if got == nil {
		return Route{}, false
	}
	ok := r.Name != ""
	// The local limits of one request are checked together: at most
	// l7.MaxChecks of them (the route's plus its largest tier's).
	most := 0
	if r.Tiers != nil {
		for _, t := range r.Tiers.Tiers {
			most = max(most, countLocal(t.Limits))
		}
	}
	if n0 := countLocal(r.Limits) + most; n0 > l7.MaxChecks {
		d.Errorf(n, "route %q: %d local limits apply to one request (route plus largest tier); at most %d", r.Name, n0, l7.MaxChecks)
	}
	return r, ok
}

// routeTable is the table of route r (rc: the section's redis).
func (d *decoder) routeTable(r *Route, rc *Redis) *yamlcheck.Table[Route] {
	where := func() string { return fmt.Sprintf("route %q", r.Name) }
	return yamlcheck.NewTable("route",
		yamlcheck.Val("name", as("route name", nameKind{}), func(r *Route) *string { return &r.Name },
			"unique").Formatted(required(func(r *Route) string { return r.Name })).Required("route: name is required"),
		yamlcheck.Val("match", at(where, " match", matchSection), func(r *Route) *Match { return &r.Match },
			"which requests (all fields optional, all must match)").
			Formatted(func(r *Route) string { return formatMatch(r.Match) }),
		yamlcheck.Val("exempt_paths", at(where, " exempt_paths", yamlcheck.Kind[[]string](exactPaths{})),
			func(r *Route) *[]string { return &r.ExemptPaths },
			"exact URL paths of the route never shed or limited"),
		yamlcheck.Val("limits", at(where, "", yamlcheck.Kind[[]Limit](limitList{custom("list of limits (below)", func(c *yamlcheck.Checker, n *yaml.Node, where string) ([]Limit, bool) {
			return d.limits(n, where, rc), true
		})})), func(r *Route) *[]Limit { return &r.Limits }, "rate limits; a request passes only if every one admits it"),
		yamlcheck.Val("tiers", at(where, " tiers", yamlcheck.Kind[*Tiers](d.tiersSection(where, rc))),
			func(r *Route) **Tiers { return &r.Tiers }, "more limits by the tier a header names (below)"),
		yamlcheck.Val("concurrency", at(where, " concurrency", yamlcheck.Kind[*Concurrency](concurrencySection)),
			func(r *Route) **Concurrency { return &r.Concurrency }, "the route's own limit on requests in flight (as `l7.concurrency`)"),
	)
}

func countLocal(ls []Limit) int {
	n := 0
	for _, l := range ls {
		if l.Backend == BackendLocal {
			n++
		}
	}
	return n
}

// matchSpec is a match as the file writes it: the pattern is compiled
// once path_case is known.
type matchSpec struct {
	Match
	pattern string
}

var matchTable = yamlcheck.NewTable("match",
	yamlcheck.Val("host", as("match host", hostName{}), func(m *matchSpec) *string { return &m.Host },
		"case-insensitive, port ignored, `*.example.com` for subdomains"),
	yamlcheck.Val("methods", as("match methods", methods{}), func(m *matchSpec) *[]string { return &m.Methods },
		"upper case"),
	yamlcheck.Val("path_prefix", as("match path_prefix", pathPrefix{}), func(m *matchSpec) *string { return &m.PathPrefix },
		"compared with the decoded normal path (see `paths`); written in normal form"),
	yamlcheck.Val("path_pattern", as("match path_pattern", yamlcheck.Kind[string](yamlcheck.String{})),
		func(m *matchSpec) *string { return &m.pattern },
		"RE2, unanchored unless you anchor it, compared with the decoded normal path; not with `path_prefix`"),
	yamlcheck.Val("path_case", as("match path_case", choice{"sensitive", "insensitive"}),
		func(m *matchSpec) *bool { return &m.IgnoreCase },
		"`insensitive` compares `path_prefix`/`path_pattern` without regard to case (for an upstream that serves `/LIMITED` as `/limited`); the path is forwarded in its own case"),
	yamlcheck.Val("header", as("match header", headerValues{}), func(m *matchSpec) *map[string]string { return &m.Header },
		"`{Name: exact value}`").Formatted(func(m *matchSpec) string {
		if len(m.Header) == 0 {
			return "none"
		}
		return headerValues{}.Format(m.Header)
	}),
)

// matchSection is a route's match.
var matchSection = custom("mapping (below)", func(c *yamlcheck.Checker, n *yaml.Node, where string) (Match, bool) {
	var m matchSpec
	t := *matchTable
	got := t.ParseAt(c, n, where, &m)
	_, hasPrefix := got["path_prefix"]
	qv, hasPattern := got["path_pattern"]
	if hasPrefix && hasPattern {
		c.Errorf(qv, "%s: set path_prefix or path_pattern, not both", where)
	}
	if hasPattern && yamlcheck.Resolve(qv).Kind == yaml.ScalarNode && !yamlcheck.IsNull(yamlcheck.Resolve(qv)) {
		s := m.pattern
		if m.IgnoreCase {
			s = "(?i)" + s
		}
		re, err := regexp.Compile(s)
		if err != nil {
			c.Errorf(qv, "match path_pattern %q: %v", s, err)
		}
		m.PathPattern = re
	}
	return m.Match, got != nil
})

// tiersSection is a route's tiers (where: the route, rc: the section's
// redis).
func (d *decoder) tiersSection(where func() string, rc *Redis) optional[Tiers] {
	t := yamlcheck.NewTable("tiers",
		yamlcheck.Val("header", as("tiers header", headerName{}), func(t *Tiers) *string { return &t.Header },
			"the header naming the tier, set by a trusted auth layer").Formatted(required(func(t *Tiers) string { return t.Header })),
		yamlcheck.Val("default", as("tiers default", nameKind{}), func(t *Tiers) *string { return &t.Default },
			"the tier of a request without the header or with an unknown tier (none: no tier limits)"),
		yamlcheck.Val("levels", as("tiers levels", yamlcheck.Kind[[]Tier](tierList{custom("mapping of tier name to limits", func(c *yamlcheck.Checker, n *yaml.Node, _ string) ([]Tier, bool) {
			return d.levels(n, where(), rc), true
		})})), func(t *Tiers) *[]Tier { return &t.Tiers },
			"each tier's limits, added to the route's"),
	)
	return optional[Tiers]{section[Tiers]{Table: t, Def: func() Tiers { return Tiers{} },
		Check: func(c *yamlcheck.Checker, n *yaml.Node, _ string, got map[string]*yaml.Node, t *Tiers) {
			if _, ok := got["header"]; !ok {
				c.Errorf(n, "%s tiers: header is required (the header naming the tier)", where())
			}
			CheckTierDefault(c, got["default"], t.Default, t.Tiers)
		}}}
}

// levels decodes a tiers: levels: mapping.
func (d *decoder) levels(v *yaml.Node, where string, rc *Redis) []Tier {
	var out []Tier
	v = yamlcheck.Resolve(v)
	if v.Kind != yaml.MappingNode {
		d.Errorf(v, "%s tiers levels must be a mapping of tier name to limits, got %s", where, yamlcheck.KindName(v))
		return nil
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		name, ok := nameKind{}.Parse(&d.Checker, yamlcheck.Resolve(v.Content[i]), "tier name")
		ls := d.limits(v.Content[i+1], fmt.Sprintf("%s tier %q", where, name), rc)
		if ok {
			out = append(out, Tier{Name: name, Limits: ls})
		}
	}
	return out
}

func (d *decoder) limits(n *yaml.Node, where string, rc *Redis) []Limit {
	var out []Limit
	for _, c := range d.Seq(n, where+" limits") {
		if l, ok := d.limit(c, where, rc); ok {
			out = append(out, l)
		}
	}
	return out
}

// limit decodes one limit; ok is false when its name, key, rate,
// algorithm, backend or reserve has a problem (it is then left out, and
// not checked across fields).
func (d *decoder) limit(n *yaml.Node, where string, rc *Redis) (Limit, bool) {
	spec := limitSpec{Limit: Limit{Algorithm: AlgGCRA, Backend: BackendLocal, Capacity: DefaultLocalCapacity}}
	bad := false
	got := d.limitTable(&spec, &bad).ParseAt(&d.Checker, n, where+" limit", &spec)
	if got == nil {
		return Limit{}, false
	}
	l := spec.Limit
	l.Count, l.Per = spec.rate.Count, spec.rate.Per
	ok := !bad
	if v, has := got["name"]; has && l.Name != "" {
		if prev := d.limitNames[l.Name]; prev != nil {
			d.Errorf(v, "limit name %q is already used at line %d (names are unique in l7:)", l.Name, prev.Line)
			ok = false
		}
		d.limitNames[l.Name] = v
	} else if !has {
		d.Errorf(n, "%s limit: name is required", where)
		ok = false
	}
	if v, has := got["key"]; has && d.keyless {
		d.Errorf(v, "limit %q: a rate-limit service limit takes no key: it counts per value of its descriptor", l.Name)
		ok = false
	} else if !has && !d.keyless {
		d.Errorf(n, "limit %q: key is required (ip, header:NAME, user, tenant, endpoint, global, prefix, asn, or parts joined by +)", l.Name)
		ok = false
	}
	rateNode, has := got["rate"]
	if !has {
		d.Errorf(n, "limit %q: rate is required, e.g. 100/min", l.Name)
		ok = false
	}
	if v, has := got["backend"]; has && l.Shared() && !d.redis {
		d.Errorf(v, "limit %q: backend %s needs an l7 redis: section", l.Name, l.Backend)
		ok = false
	}
	switch v, has := got["failure"]; {
	case has && !l.Shared():
		d.Errorf(v, "limit %q: failure applies only to backend redis and hybrid", l.Name)
	case has:
	case l.Backend == BackendHybrid:
		l.Failure = FailureLocal
	case rc != nil:
		l.Failure = rc.Failure
	}
	if v, has := got["lease"]; has && l.Backend != BackendHybrid {
		d.Errorf(v, "limit %q: lease applies only to backend hybrid", l.Name)
		ok = false
	}
	switch v, has := got["reserve"]; {
	case has && l.Shared():
		d.Errorf(v, "limit %q: reserve applies to backend local (the class ranking is local)", l.Name)
		ok = false
	case has:
	case l.Backend == BackendLocal && (l.Key.Aggregate() || d.keyless && d.aggregate):
		l.Reserve = DefaultAggregateReserve
	}
	f := got
	if (l.Algorithm == AlgSlidingWindow || l.Algorithm == AlgFixedWindow || l.Algorithm == AlgSlidingLog) && l.Burst != 0 {
		d.Errorf(f["burst"], "limit %q: burst applies to gcra, token-bucket and leaky_bucket, not %s", l.Name, l.Algorithm)
		ok = false
	}
	if l.Shape {
		switch {
		case l.Algorithm != AlgLeakyBucket:
			d.Errorf(f["shape"], "limit %q: shape: true applies to algorithm leaky_bucket, not %s", l.Name, l.Algorithm)
			ok = false
		case l.Shadow:
			d.Errorf(f["shape"], "limit %q: shape: true with shadow: true is not supported (a shadow limit never holds a request)", l.Name)
			ok = false
		case l.Shared():
			d.Errorf(f["shape"], "limit %q: shape: true with backend %s is not supported (the release slot is decided from local state)", l.Name, l.Backend)
			ok = false
		}
	}
	if ok && l.Algorithm == AlgSlidingLog {
		capacity := int64(l.Capacity)
		switch {
		case l.Shared():
			d.Errorf(f["backend"], "limit %q: algorithm sliding_log with backend %s is not supported "+
				"(its log would be a sorted set of up to rate entries per key in Redis); use sliding-window or gcra with redis", l.Name, l.Backend)
			ok = false
		case l.Count > l7.MaxSlidingLogLimit:
			d.Errorf(rateNode, "limit %q: sliding_log keeps one timestamp per admitted request: rate count %d is above %d",
				l.Name, l.Count, l7.MaxSlidingLogLimit)
			ok = false
		case l.Count*capacity*8 > MaxSlidingLogBytes:
			d.Errorf(rateNode, "limit %q: sliding_log keeps one 8-byte timestamp per admitted request and key: "+
				"rate count %d times capacity %d keys is %d MiB, above %d MiB; lower capacity or the rate's count "+
				"(e.g. 100/min instead of 6000/h), or use sliding-window",
				l.Name, l.Count, capacity, l.Count*capacity*8>>20, MaxSlidingLogBytes>>20)
			ok = false
		}
	}
	if ok && l.Backend == BackendHybrid && l.Algorithm != AlgSlidingWindow {
		at := f["algorithm"]
		if at == nil {
			at = f["backend"]
		}
		d.Errorf(at, "limit %q: backend hybrid needs algorithm: sliding-window (its leases share a sliding window counter), not %s", l.Name, l.Algorithm)
		ok = false
	}
	if ok && l.Shared() {
		if l.Algorithm != AlgGCRA && l.Algorithm != AlgSlidingWindow && l.Algorithm != AlgLeakyBucket {
			d.Errorf(f["algorithm"], "limit %q: backend redis supports gcra, sliding-window and leaky_bucket, not %s", l.Name, l.Algorithm)
			ok = false
		} else if _, err := redisRule(l, rc); err != nil {
			d.Errorf(rateNode, "limit %q: %v", l.Name, err)
			ok = false
		}
	} else if ok {
		if _, err := newAlgorithm(l); err != nil {
			d.Errorf(rateNode, "limit %q: %v", l.Name, err)
			ok = false
		}
	}
	return l, ok
}

// limitSpec is a limit as the file writes it.
type limitSpec struct {
	Limit
	rate requestRate
}

// limitTable is the table of limit l; a problem in a field that decides
// whether l is usable sets *bad.
func (d *decoder) limitTable(l *limitSpec, bad *bool) *yamlcheck.Table[limitSpec] {
	named := func(field string) func() string {
		return func() string { return fmt.Sprintf("limit %q: %s", l.Name, field) }
	}
	return yamlcheck.NewTable("limit",
		yamlcheck.Val("name", marking(bad, as("limit name", yamlcheck.Kind[string](nameKind{}))), func(l *limitSpec) *string { return &l.Name },
			"unique in the whole `l7:` section; in RateLimit headers, 429 bodies and metrics").
			Formatted(required(func(l *limitSpec) string { return l.Name })),
		yamlcheck.Val("key", marking(bad, as("limit key", custom("key", func(c *yamlcheck.Checker, n *yaml.Node, where string) (Key, bool) {
			if d.keyless {
				return nil, true // refused below, with the reason
			}
			return parseKey(c, n, where)
		}))), func(l *limitSpec) *Key { return &l.Key },
			"what the limit counts per (refused on an `rls:` rule): `ip`, `header:NAME`, `user`, `tenant`, `endpoint` (method + route name), `global`, `prefix` (the client's /24 or /48), `asn` (the client's ASN from `asn_data`; a client in no ASN skips the limit), or parts joined by `+` (`endpoint+user`, `tenant+ip`)").
			Formatted(required(func(l *limitSpec) string { return l.Key.String() })),
		yamlcheck.Val("rate", marking(bad, at(func() string { return fmt.Sprintf("limit %q", l.Name) }, "", yamlcheck.Kind[requestRate](rateKind{}))),
			func(l *limitSpec) *requestRate { return &l.rate },
			"a request rate in the policy's rate syntax (`100/min`, `1.5/s`, `10k/h`; bit and byte rates are refused)"),
		yamlcheck.Val("burst", as("limit burst", yamlcheck.Kind[int64](yamlcheck.Uint[int64]{Min: 1, Max: 1 << 40})), func(l *limitSpec) *int64 { return &l.Burst },
			"gcra, token-bucket, leaky_bucket; unset: the rate's count").
			Formatted(unsetSays("the rate's count", func(l *limitSpec) string { return yamlcheck.Uint[int64]{}.Format(l.Burst) })),
		yamlcheck.Val("algorithm", marking(bad, as("limit algorithm", yamlcheck.Kind[string](algorithm{}))), func(l *limitSpec) *string { return &l.Algorithm },
			"underscores and hyphens are both accepted (`sliding_window`, `leaky-bucket`, `sliding-log`); redis: `gcra`, `sliding-window`, `leaky_bucket`; hybrid: `sliding-window` (docs/l7.md)"),
		yamlcheck.Val("shape", as("limit shape", yamlcheck.Kind[bool](yamlcheck.Bool{})), func(l *limitSpec) *bool { return &l.Shape },
			"leaky_bucket, local, not shadow: delays each admitted request until its release slot (at most `(burst-1)/rate`)"),
		yamlcheck.Val("shadow", as("limit shadow", yamlcheck.Kind[bool](yamlcheck.Bool{})), func(l *limitSpec) *bool { return &l.Shadow },
			"counts would-be rejections and never rejects"),
		yamlcheck.Val("backend", marking(bad, as("limit backend", yamlcheck.Kind[string](enumOf{[]string{BackendLocal, BackendRedis, BackendHybrid}}))),
			func(l *limitSpec) *string { return &l.Backend },
			"`redis` and `hybrid` need `l7.redis`; `hybrid` (algorithm `sliding-window` only) decides from a local lease of a limit shared through Redis (below; docs/l7-redis.md, \"Hybrid\")"),
		yamlcheck.Val("failure", as("limit failure", yamlcheck.Kind[string](enumOf{[]string{FailureOpen, FailureClosed, FailureLocal}})),
			func(l *limitSpec) *string { return &l.Failure },
			"redis and hybrid only; `local`: the limit ÷ `l7.redis.hosts` per host, in memory, while Redis is unreachable").
			Formatted(unsetSays("l7.redis.failure; hybrid: local", func(l *limitSpec) string { return l.Failure })),
		yamlcheck.Val("lease", as("limit lease", yamlcheck.Kind[int64](yamlcheck.Uint[int64]{Min: 1, Max: 1 << 40})),
			func(l *limitSpec) *int64 { return &l.Lease },
			"hybrid only: the largest grant, the requests one host admits between two syncs; with several hosts the default keeps their overshoot under a tenth of the rate; a single host decides from the shared window itself, and the lease bounds what a crash loses and what hosts all left at hosts: 1 admit before they see each other (docs/l7-redis.md)").
			Formatted(unsetSays("⌈count ÷ (10 × hosts)⌉; hosts 1: ⌈count ÷ 4⌉", func(l *limitSpec) string { return yamlcheck.Uint[int64]{}.Format(l.Lease) })),
		yamlcheck.Val("capacity", as("limit capacity", yamlcheck.Kind[int](yamlcheck.Uint[int]{Min: 1, Max: maxCapacity})),
			func(l *limitSpec) *int { return &l.Capacity }, "keys per limit: a local limit's store (24 bytes each, allocated up front); a hybrid limit's leases on each host (about 150 bytes each, as keys arrive; a new key at capacity evicts the least recently used lease after reporting its counts to Redis: docs/l7-redis.md, \"Memory\"); not backend redis; `failure: local` (redis and hybrid, while Redis is unreachable) keeps up to 100,000 keys per limit whatever `capacity` says"),
		yamlcheck.Val("reserve", marking(bad, at(named("reserve"), "", yamlcheck.Kind[int](percent{Single: "limit reserve"}))), func(l *limitSpec) *int { return &l.Reserve },
			"local only: the share of the limit (of its burst, else of the rate's count; rounded down, at most all but one request) only the first class of the L7 ranking may use; unset: 50% for a key of only `global`, `endpoint`, `prefix` and `asn` (an aggregate), else 0%").
			Formatted(func(l *limitSpec) string {
				if l.Name == "" { // the docs' default: decoding sets it
					return "50% aggregate, else 0%"
				}
				return percent{}.Format(l.Reserve)
			}),
	)
}
