package proxy

import (
	"fmt"
	"net/textproto"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// Defaults of Decode.
const (
	DefaultLocalCapacity       = 1 << 16
	DefaultEscalationSources   = 1 << 16
	DefaultEscalationRejection = 100
	DefaultEscalationWindow    = time.Minute
	DefaultEscalationTTL       = 10 * time.Minute
	maxCapacity                = 1 << 24
	// MaxSlidingLogBytes bounds a sliding_log limit's logs: rate count
	// times capacity times 8 bytes (at the default capacity, a rate count
	// of at most 128).
	MaxSlidingLogBytes = 64 << 20
)

// Decode decodes and validates the l7: section node (policy.Policy.L7) of
// file. It reports every problem at once, each with its position, in file
// order; the Config is nil whenever there is a problem.
func Decode(node *yaml.Node, file string) (*Config, []policy.Problem) {
	d := &decoder{Checker: yamlcheck.Checker{File: file}, limitNames: map[string]*yaml.Node{}}
	cfg := d.config(node)
	if len(d.Problems) > 0 {
		sort.SliceStable(d.Problems, func(i, j int) bool {
			a, b := d.Problems[i].Pos, d.Problems[j].Pos
			if a.Line != b.Line {
				return a.Line < b.Line
			}
			return a.Column < b.Column
		})
		return nil, d.Problems
	}
	return cfg, nil
}

type decoder struct {
	yamlcheck.Checker
	limitNames map[string]*yaml.Node
	// cfg is the section being decoded (its routes see what the table
	// decoded before them).
	cfg   *Config
	redis bool
	// keyless: limits take no key (the rate-limit service's, keyed by
	// their descriptor: LimitDecoder).
	keyless bool
	// aggregate: the keyless limits being decoded count an aggregate of
	// clients (their default reserve is DefaultAggregateReserve).
	aggregate bool
}

func (d *decoder) name(n *yaml.Node, where string) (string, bool) {
	s, ok := d.Scalar(n, where)
	if ok && !l7.ValidName(s) {
		d.Errorf(n, "%s %q: want 1-64 of [A-Za-z0-9_.-]", where, s)
		return "", false
	}
	return s, ok
}

// httpToken reports whether s is an RFC 9110 token (a method or header name).
func httpToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func (d *decoder) config(node *yaml.Node) *Config {
	if node == nil {
		d.Errorf(nil, "l7: section missing")
		return nil
	}
	cfg := DefaultConfig()
	d.cfg = &cfg
	// A redis: key, even one with problems, lets limits name backend
	// redis (its own problems are reported once, there).
	if m := yamlcheck.Resolve(node); m.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(m.Content); i += 2 {
			d.redis = d.redis || yamlcheck.Resolve(m.Content[i]).Value == "redis"
		}
	}
	got := d.l7Table().Parse(&d.Checker, node, &cfg)
	if got == nil {
		return nil
	}
	// With an rls: section (the rate-limit service, internal/l7/rls) the
	// reverse proxy is optional: no listen and no upstream serve no proxy.
	_, hasListen := got["listen"]
	_, hasUpstream := got["upstream"]
	proxyOff := cfg.RLS != nil && !hasListen && !hasUpstream
	if !hasListen && !proxyOff {
		d.Errorf(node, "l7: listen is required (host:port)")
	}
	if !hasUpstream && !proxyOff {
		d.Errorf(node, "l7: upstream is required (http://host:port)")
	}
	if n, ok := got["engine"]; ok && cfg.Engine == EngineEventLoop && cfg.Upstream != nil && cfg.Upstream.Scheme == "https" {
		d.Errorf(n, "l7 engine event-loop: the upstream is https and the event loop speaks plain http; use auto or net-http")
	}
	return &cfg
}

func (d *decoder) route(n *yaml.Node, rc *Redis) (Route, bool) {
	f := d.Fields(n, "route", "name", "match", "exempt_paths", "limits", "tiers", "concurrency")
	if f == nil {
		return Route{}, false
	}
	var r Route
	ok := true
	if v, has := f["name"]; has {
		r.Name, ok = d.name(v, "route name")
	} else {
		d.Errorf(n, "route: name is required")
		ok = false
	}
	where := fmt.Sprintf("route %q", r.Name)
	if v, has := f["match"]; has {
		r.Match = d.match(v, where)
	}
	if v, has := f["exempt_paths"]; has {
		r.ExemptPaths, _ = exactPaths{}.Parse(&d.Checker, v, where+" exempt_paths")
	}
	if v, has := f["limits"]; has {
		r.Limits = d.limits(v, where, rc)
	}
	if v, has := f["tiers"]; has {
		r.Tiers = d.tiers(v, where, rc)
	}
	if v, has := f["concurrency"]; has {
		r.Concurrency, _ = concurrencySection.Parse(&d.Checker, v, where+" concurrency")
	}
	// The local limits of one request are checked together: at most
	// l7.MaxChecks of them (the route's plus its largest tier's).
	most := 0
	if r.Tiers != nil {
		for _, t := range r.Tiers.Tiers {
			most = max(most, countLocal(t.Limits))
		}
	}
	if n0 := countLocal(r.Limits) + most; n0 > l7.MaxChecks {
		d.Errorf(n, "%s: %d local limits apply to one request (route plus largest tier); at most %d", where, n0, l7.MaxChecks)
	}
	return r, ok
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

func (d *decoder) match(n *yaml.Node, where string) Match {
	f := d.Fields(n, where+" match", "host", "methods", "path_prefix", "path_pattern", "path_case", "header")
	var m Match
	if v, ok := f["host"]; ok {
		if s, ok := d.Scalar(v, "match host"); ok {
			h := strings.TrimPrefix(s, "*.")
			if h == "" || strings.ContainsAny(h, "/:*@ ") {
				d.Errorf(v, "match host %q: want a host name without port, e.g. api.example.com or *.example.com", s)
			}
			m.Host = strings.ToLower(s)
		}
	}
	if v, ok := f["methods"]; ok {
		for _, c := range d.Seq(v, "match methods") {
			s, ok := d.Scalar(c, "method")
			if !ok {
				continue
			}
			if !httpToken(s) || strings.ToUpper(s) != s {
				d.Errorf(c, "match method %q: want an upper-case HTTP method such as GET", s)
				continue
			}
			m.Methods = append(m.Methods, s)
		}
	}
	pv, hasPrefix := f["path_prefix"]
	qv, hasPattern := f["path_pattern"]
	if hasPrefix && hasPattern {
		d.Errorf(qv, "%s match: set path_prefix or path_pattern, not both", where)
	}
	if v, ok := f["path_case"]; ok {
		s, _ := enumOf{[]string{"sensitive", "insensitive"}}.Parse(&d.Checker, v, "match path_case")
		m.IgnoreCase = s == "insensitive"
	}
	if hasPrefix {
		if s, ok := d.Scalar(pv, "match path_prefix"); ok {
			if !strings.HasPrefix(s, "/") {
				d.Errorf(pv, "match path_prefix %q must start with /", s)
			} else {
				normalPath(&d.Checker, pv, "match path_prefix", s)
			}
			m.PathPrefix = s
		}
	}
	if hasPattern {
		if s, ok := d.Scalar(qv, "match path_pattern"); ok {
			if m.IgnoreCase {
				s = "(?i)" + s
			}
			re, err := regexp.Compile(s)
			if err != nil {
				d.Errorf(qv, "match path_pattern %q: %v", s, err)
			}
			m.PathPattern = re
		}
	}
	if v, ok := f["header"]; ok {
		v = yamlcheck.Resolve(v)
		if v.Kind != yaml.MappingNode {
			d.Errorf(v, "match header must be a mapping of header name to value, got %s", yamlcheck.KindName(v))
		} else {
			m.Header = map[string]string{}
			for i := 0; i+1 < len(v.Content); i += 2 {
				name, _ := headerName{}.Parse(&d.Checker, yamlcheck.Resolve(v.Content[i]), "match header")
				val, ok := d.Scalar(yamlcheck.Resolve(v.Content[i+1]), "match header value")
				if name != "" && ok {
					m.Header[name] = val
				}
			}
		}
	}
	return m
}

func (d *decoder) tiers(n *yaml.Node, where string, rc *Redis) *Tiers {
	f := d.Fields(n, where+" tiers", "header", "default", "levels")
	if f == nil {
		return nil
	}
	t := &Tiers{}
	if v, ok := f["header"]; ok {
		t.Header, _ = headerName{}.Parse(&d.Checker, v, "tiers header")
	} else {
		d.Errorf(n, "%s tiers: header is required (the header naming the tier)", where)
	}
	var defNode *yaml.Node
	if v, ok := f["default"]; ok {
		t.Default, _ = d.name(v, "tiers default")
		defNode = v
	}
	if v, ok := f["levels"]; ok {
		v = yamlcheck.Resolve(v)
		if v.Kind != yaml.MappingNode {
			d.Errorf(v, "%s tiers levels must be a mapping of tier name to limits, got %s", where, yamlcheck.KindName(v))
		} else {
			for i := 0; i+1 < len(v.Content); i += 2 {
				name, ok := d.name(yamlcheck.Resolve(v.Content[i]), "tier name")
				ls := d.limits(v.Content[i+1], fmt.Sprintf("%s tier %q", where, name), rc)
				if ok {
					t.Tiers = append(t.Tiers, Tier{Name: name, Limits: ls})
				}
			}
		}
	}
	if t.Default != "" {
		found := false
		for _, x := range t.Tiers {
			found = found || x.Name == t.Default
		}
		if !found {
			d.Errorf(defNode, "tiers default %q is not one of the levels", t.Default)
		}
	}
	return t
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

func (d *decoder) limit(n *yaml.Node, where string, rc *Redis) (Limit, bool) {
	f := d.Fields(n, where+" limit", "name", "key", "rate", "burst", "algorithm", "shape", "shadow", "backend",
		"failure", "capacity", "reserve")
	if f == nil {
		return Limit{}, false
	}
	l := Limit{Algorithm: AlgGCRA, Backend: BackendLocal, Capacity: DefaultLocalCapacity}
	ok := true
	if v, has := f["name"]; has {
		var nok bool
		if l.Name, nok = d.name(v, "limit name"); nok {
			if prev := d.limitNames[l.Name]; prev != nil {
				d.Errorf(v, "limit name %q is already used at line %d (names are unique in l7:)", l.Name, prev.Line)
				ok = false
			}
			d.limitNames[l.Name] = v
		}
		ok = ok && nok
	} else {
		d.Errorf(n, "%s limit: name is required", where)
		ok = false
	}
	if v, has := f["key"]; has && d.keyless {
		d.Errorf(v, "limit %q: a rate-limit service limit takes no key: it counts per value of its descriptor", l.Name)
		ok = false
	} else if has {
		k, kok := d.key(v)
		l.Key, ok = k, ok && kok
	} else if !d.keyless {
		d.Errorf(n, "limit %q: key is required (ip, header:NAME, user, tenant, endpoint, global, prefix, asn, or parts joined by +)", l.Name)
		ok = false
	}
	var rateNode *yaml.Node
	if v, has := f["rate"]; has {
		rateNode = v
		if s, sok := d.Scalar(v, "limit rate"); sok {
			r, unit, err := policy.ParseRate(s)
			switch {
			case err != nil:
				d.Errorf(v, "limit %q: %v", l.Name, err)
				ok = false
			case unit != policy.Packets:
				d.Errorf(v, "limit %q: rate %q counts %s; an L7 rate counts requests, e.g. 100/min", l.Name, s, unit)
				ok = false
			case r.Count > 1<<40:
				d.Errorf(v, "limit %q: rate %q is too large", l.Name, s)
				ok = false
			default:
				l.Count, l.Per = int64(r.Count), r.Per
			}
		} else {
			ok = false
		}
	} else {
		d.Errorf(n, "limit %q: rate is required, e.g. 100/min", l.Name)
		ok = false
	}
	if v, has := f["burst"]; has {
		l.Burst, _ = yamlcheck.Uint[int64]{Min: 1, Max: 1 << 40}.Parse(&d.Checker, v, "limit burst")
	}
	if v, has := f["algorithm"]; has {
		if s, sok := d.Scalar(v, "limit algorithm"); sok {
			if alias, isAlias := algorithmAlias(s); isAlias {
				v = &yaml.Node{Kind: yaml.ScalarNode, Value: alias, Line: v.Line, Column: v.Column}
			}
			s, aok := enumOf{[]string{AlgGCRA, AlgSlidingWindow, AlgTokenBucket, AlgFixedWindow, AlgLeakyBucket, AlgSlidingLog}}.Parse(&d.Checker, v, "limit algorithm")
			l.Algorithm, ok = s, ok && aok
		} else {
			ok = false
		}
	}
	if v, has := f["shape"]; has {
		l.Shape, _ = yamlcheck.Bool{}.Parse(&d.Checker, v, "limit shape")
	}
	if v, has := f["shadow"]; has {
		l.Shadow, _ = yamlcheck.Bool{}.Parse(&d.Checker, v, "limit shadow")
	}
	if v, has := f["backend"]; has {
		s, bok := enumOf{[]string{BackendLocal, BackendRedis}}.Parse(&d.Checker, v, "limit backend")
		l.Backend, ok = s, ok && bok
		if s == BackendRedis && !d.redis {
			d.Errorf(v, "limit %q: backend redis needs an l7 redis: section", l.Name)
			ok = false
		}
	}
	if v, has := f["failure"]; has {
		l.Failure, _ = enumOf{[]string{FailureOpen, FailureClosed}}.Parse(&d.Checker, v, "limit failure")
		if l.Backend != BackendRedis {
			d.Errorf(v, "limit %q: failure applies only to backend redis", l.Name)
		}
	} else if rc != nil {
		l.Failure = rc.Failure
	}
	if v, has := f["capacity"]; has {
		x, _ := yamlcheck.Uint[int64]{Min: 1, Max: maxCapacity}.Parse(&d.Checker, v, "limit capacity")
		l.Capacity = int(x)
	}
	switch v, has := f["reserve"]; {
	case has && l.Backend == BackendRedis:
		d.Errorf(v, "limit %q: reserve applies to backend local (the class ranking is local)", l.Name)
		ok = false
	case has:
		if s, sok := d.Scalar(v, "limit reserve"); sok {
			pct, err := strconv.Atoi(strings.TrimSuffix(s, "%"))
			if err != nil || !strings.HasSuffix(s, "%") || pct < 0 || pct > 99 {
				d.Errorf(v, "limit %q: reserve %q: want a percentage from 0%% to 99%%", l.Name, s)
				ok = false
			}
			l.Reserve = pct
		}
	case l.Backend == BackendLocal && (l.Key.Aggregate() || d.keyless && d.aggregate):
		l.Reserve = DefaultAggregateReserve
	}
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
		case l.Backend == BackendRedis:
			d.Errorf(f["shape"], "limit %q: shape: true with backend redis is not supported (the release slot is decided from local state)", l.Name)
			ok = false
		}
	}
	if ok && l.Algorithm == AlgSlidingLog {
		capacity := int64(l.Capacity)
		switch {
		case l.Backend == BackendRedis:
			d.Errorf(f["backend"], "limit %q: algorithm sliding_log with backend redis is not supported "+
				"(its log would be a sorted set of up to rate entries per key in Redis); use sliding-window or gcra with redis", l.Name)
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
	if ok && l.Backend == BackendRedis {
		if l.Algorithm != AlgGCRA && l.Algorithm != AlgSlidingWindow && l.Algorithm != AlgLeakyBucket {
			d.Errorf(f["algorithm"], "limit %q: backend redis supports gcra, sliding-window and leaky_bucket, not %s", l.Name, l.Algorithm)
			ok = false
		} else if _, err := redisRule(l); err != nil {
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

// algorithmAlias is the canonical name of another spelling of an
// algorithm (hyphens and underscores both accepted), and whether s is one.
func algorithmAlias(s string) (string, bool) {
	switch s {
	case "sliding_window":
		return AlgSlidingWindow, true
	case "token_bucket":
		return AlgTokenBucket, true
	case "fixed_window":
		return AlgFixedWindow, true
	case "leaky-bucket":
		return AlgLeakyBucket, true
	case "sliding-log":
		return AlgSlidingLog, true
	}
	return "", false
}

func (d *decoder) key(n *yaml.Node) (Key, bool) {
	s, ok := d.Scalar(n, "limit key")
	if !ok {
		return nil, false
	}
	k, err := ParseKey(s)
	if err != nil {
		d.Errorf(n, "%v", err)
		return nil, false
	}
	return k, true
}

// ParseKey parses a key expression: ip, header:NAME, user, tenant,
// endpoint, global, prefix, asn, or several joined by "+" (endpoint+user,
// tenant+ip, asn+endpoint).
func ParseKey(s string) (Key, error) {
	var k Key
	seen := map[string]bool{}
	for _, part := range strings.Split(s, "+") {
		part = strings.TrimSpace(part)
		var p KeyPart
		switch {
		case part == "ip":
			p.Kind = KeyIP
		case part == "user":
			p.Kind = KeyUser
		case part == "tenant":
			p.Kind = KeyTenant
		case part == "endpoint":
			p.Kind = KeyEndpoint
		case part == "global":
			p.Kind = KeyGlobal
		case part == "prefix":
			p.Kind = KeyPrefix
		case part == "asn":
			p.Kind = KeyASN
		case strings.HasPrefix(part, "header:"):
			h := strings.TrimSpace(strings.TrimPrefix(part, "header:"))
			if !httpToken(h) {
				return nil, fmt.Errorf("limit key %q: header name %q is not valid", s, h)
			}
			p = KeyPart{Kind: KeyHeader, Header: textproto.CanonicalMIMEHeaderKey(h)}
		default:
			return nil, fmt.Errorf("limit key %q: unknown part %q; want ip, header:NAME, user, tenant, endpoint, global, prefix, asn, joined by +", s, part)
		}
		id := Key{p}.String()
		if seen[id] {
			return nil, fmt.Errorf("limit key %q: part %q repeated", s, part)
		}
		seen[id] = true
		k = append(k, p)
	}
	if len(k) > 1 && seen["global"] {
		return nil, fmt.Errorf("limit key %q: global cannot be combined", s)
	}
	return k, nil
}
