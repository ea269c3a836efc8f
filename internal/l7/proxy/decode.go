package proxy

import (
	"fmt"
	"github.com/edgeguard/edgeguard/internal/l7/class"
	"net"
	"net/netip"
	"net/textproto"
	"net/url"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/shed"
	"github.com/edgeguard/edgeguard/internal/l7/target"
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
	redis      bool
	// keyless: limits take no key (the rate-limit service's, keyed by
	// their descriptor: LimitDecoder).
	keyless bool
	// aggregate: the keyless limits being decoded count an aggregate of
	// clients (their default reserve is DefaultAggregateReserve).
	aggregate bool
}

// integer is yamlcheck's UintIn for the non-negative ranges used here.
func (d *decoder) integer(n *yaml.Node, where string, lo, hi int64) (int64, bool) {
	u, ok := d.UintIn(n, where, uint64(lo), uint64(hi))
	return int64(u), ok
}

func (d *decoder) boolean(n *yaml.Node, where string) bool {
	s, ok := d.Scalar(n, where)
	if !ok {
		return false
	}
	switch s {
	case "true":
		return true
	case "false":
		return false
	}
	d.Errorf(n, "%s %q: want true or false", where, s)
	return false
}

func (d *decoder) duration(n *yaml.Node, where string) (time.Duration, bool) {
	s, ok := d.Scalar(n, where)
	if !ok {
		return 0, false
	}
	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		d.Errorf(n, "%s %q: want a positive duration such as 500ms, 10s, 1m", where, s)
		return 0, false
	}
	return v, true
}

func (d *decoder) enum(n *yaml.Node, where string, allowed ...string) (string, bool) {
	s, ok := d.Scalar(n, where)
	if !ok {
		return "", false
	}
	for _, a := range allowed {
		if s == a {
			return s, true
		}
	}
	d.Errorf(n, "%s %q: want one of %s", where, s, strings.Join(allowed, ", "))
	return "", false
}

func (d *decoder) name(n *yaml.Node, where string) (string, bool) {
	s, ok := d.Scalar(n, where)
	if ok && !l7.ValidName(s) {
		d.Errorf(n, "%s %q: want 1-64 of [A-Za-z0-9_.-]", where, s)
		return "", false
	}
	return s, ok
}

func (d *decoder) hostPort(n *yaml.Node, where string) (string, bool) {
	s, ok := d.Scalar(n, where)
	if !ok {
		return "", false
	}
	_, port, err := net.SplitHostPort(s)
	if err == nil {
		var p int
		if p, err = strconv.Atoi(port); err == nil && (p < 0 || p > 65535) {
			err = fmt.Errorf("port out of range")
		}
	}
	if err != nil {
		d.Errorf(n, "%s %q: want host:port, e.g. 127.0.0.1:8080 or [::1]:8080", where, s)
		return "", false
	}
	return s, true
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
	cfg := &Config{ClientPrefixV4: 32, ClientPrefixV6: 64, Headers: Headers{Draft: 10}}
	if node == nil {
		d.Errorf(nil, "l7: section missing")
		return nil
	}
	f := d.Fields(node, "l7", "listen", "upstream", "trusted_proxies", "client_prefix", "user_header",
		"tenant_header", "exempt_paths", "headers", "concurrency", "redis", "escalation", "routes", "engine", "loops",
		"access_log", "rls", "paths", "identity_fields", "timeouts", "classes")
	if f == nil {
		return nil
	}
	// With an rls: section (the rate-limit service, internal/l7/rls) the
	// reverse proxy is optional: no listen and no upstream serve no proxy.
	cfg.RLS = f["rls"]
	_, hasListen := f["listen"]
	_, hasUpstream := f["upstream"]
	proxyOff := cfg.RLS != nil && !hasListen && !hasUpstream
	if n, ok := f["listen"]; ok {
		cfg.Listen, _ = d.hostPort(n, "l7 listen")
	} else if !proxyOff {
		d.Errorf(node, "l7: listen is required (host:port)")
	}
	if n, ok := f["upstream"]; ok {
		cfg.Upstream = d.upstream(n)
	} else if !proxyOff {
		d.Errorf(node, "l7: upstream is required (http://host:port)")
	}
	if n, ok := f["engine"]; ok {
		if s, ok := d.Scalar(n, "l7 engine"); ok {
			switch Engine(s) {
			case "auto":
			case EngineEventLoop, EngineNetHTTP:
				cfg.Engine = Engine(s)
			default:
				d.Errorf(n, "l7 engine %q: want auto, event-loop or net-http", s)
			}
		}
		if cfg.Engine == EngineEventLoop && cfg.Upstream != nil && cfg.Upstream.Scheme == "https" {
			d.Errorf(n, "l7 engine event-loop: the upstream is https and the event loop speaks plain http; use auto or net-http")
		}
	}
	if n, ok := f["access_log"]; ok {
		if s, ok := d.Scalar(n, "l7 access_log"); ok {
			switch {
			case s == "stderr":
				cfg.AccessLog = s
			case !strings.HasPrefix(s, "/") || strings.ContainsRune(s, 0) || strings.HasSuffix(s, "/"):
				d.Errorf(n, "l7 access_log %q: want stderr or an absolute file path", s)
			default:
				cfg.AccessLog = filepath.Clean(s)
			}
		}
	}
	if n, ok := f["loops"]; ok {
		x, _ := d.integer(n, "l7 loops", 1, 1024)
		cfg.Loops = int(max(x, 0))
	}
	if n, ok := f["trusted_proxies"]; ok {
		for _, c := range d.Seq(n, "l7 trusted_proxies") {
			s, ok := d.Scalar(c, "trusted proxy")
			if !ok {
				continue
			}
			p, err := netip.ParsePrefix(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil {
					d.Errorf(c, "trusted proxy %q: want an address or CIDR prefix, e.g. 10.0.0.0/8", s)
					continue
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			if p != p.Masked() {
				d.Errorf(c, "trusted proxy %q has host bits set; did you mean %s?", s, p.Masked())
				continue
			}
			cfg.TrustedProxies = append(cfg.TrustedProxies, p)
		}
	}
	if n, ok := f["client_prefix"]; ok {
		cf := d.Fields(n, "l7 client_prefix", "v4", "v6")
		if v, ok := cf["v4"]; ok {
			x, _ := d.integer(v, "client_prefix v4", 1, 32)
			cfg.ClientPrefixV4 = int(max(x, 1))
		}
		if v, ok := cf["v6"]; ok {
			x, _ := d.integer(v, "client_prefix v6", 1, 128)
			cfg.ClientPrefixV6 = int(max(x, 1))
		}
	}
	for _, h := range []struct {
		key string
		dst *string
	}{{"user_header", &cfg.UserHeader}, {"tenant_header", &cfg.TenantHeader}} {
		if n, ok := f[h.key]; ok {
			*h.dst = d.headerName(n, "l7 "+h.key)
		}
	}
	if n, ok := f["exempt_paths"]; ok {
		cfg.ExemptPaths = d.paths(n, "l7 exempt_paths")
	}
	if n, ok := f["paths"]; ok {
		pf := d.Fields(n, "l7 paths", "normalize", "forward")
		if v, ok := pf["normalize"]; ok {
			s, _ := d.enum(v, "l7 paths normalize", "standard", "strict")
			cfg.Paths.Strict = s == "strict"
		}
		if v, ok := pf["forward"]; ok {
			s, _ := d.enum(v, "l7 paths forward", "normalized", "as-sent")
			cfg.Paths.AsSent = s == "as-sent"
		}
	}
	cfg.IdentityFields = DefaultIdentityFields()
	if n, ok := f["identity_fields"]; ok {
		cfg.IdentityFields = []string{}
		for _, c := range d.Seq(n, "l7 identity_fields") {
			if name := d.headerName(c, "l7 identity_fields"); len(name) > 63 {
				d.Errorf(c, "l7 identity_fields: %q is longer than 63 bytes", name)
			} else if name != "" {
				switch name {
				case "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded":
					d.Errorf(c, "l7 identity_fields: %s is always rewritten by the proxy; do not list it", name)
				case "Host", "Content-Length", "Transfer-Encoding", "Connection":
					d.Errorf(c, "l7 identity_fields: %s cannot be removed", name)
				default:
					cfg.IdentityFields = append(cfg.IdentityFields, name)
				}
			}
		}
	}
	cfg.Timeouts = Timeouts{Body: DefaultBodyTimeout, Response: DefaultResponseTimeout, MinRate: DefaultMinRate,
		TunnelIdle: DefaultTunnelIdleTimeout}
	if n, ok := f["timeouts"]; ok {
		tf := d.Fields(n, "l7 timeouts", "body", "response", "min_rate", "tunnel_idle")
		for key, dst := range map[string]*time.Duration{"body": &cfg.Timeouts.Body, "response": &cfg.Timeouts.Response,
			"tunnel_idle": &cfg.Timeouts.TunnelIdle} {
			if v, ok := tf[key]; ok {
				if x, ok := d.duration(v, "l7 timeouts "+key); ok {
					*dst = x
				}
			}
		}
		if v, ok := tf["min_rate"]; ok {
			cfg.Timeouts.MinRate, _ = d.integer(v, "l7 timeouts min_rate (bytes per second)", 0, 1<<30)
		}
	}
	if n, ok := f["headers"]; ok {
		hf := d.Fields(n, "l7 headers", "draft", "legacy")
		if v, ok := hf["draft"]; ok {
			s, _ := d.enum(v, "headers draft", "10", "none")
			cfg.Headers.Draft = 0
			if s == "10" {
				cfg.Headers.Draft = 10
			}
		}
		if v, ok := hf["legacy"]; ok {
			cfg.Headers.Legacy = d.boolean(v, "headers legacy")
		}
	}
	if n, ok := f["concurrency"]; ok {
		cfg.Concurrency = d.concurrency(n, "l7 concurrency")
	}
	if n, ok := f["redis"]; ok {
		cfg.Redis = d.redisConfig(n)
		d.redis = true
	}
	cfg.Escalation = Escalation{Rejections: DefaultEscalationRejection, Window: DefaultEscalationWindow,
		TTL: DefaultEscalationTTL, PrefixV4: 32, PrefixV6: 64, MaxSources: DefaultEscalationSources}
	if n, ok := f["escalation"]; ok {
		d.escalation(n, &cfg.Escalation)
	}
	cfg.Classes = Classes{Enabled: true, Window: class.DefaultWindow, Headroom: class.DefaultHeadroom,
		DefaultUsualRate: class.DefaultUsualRate, CacheTTL: class.DefaultCacheTTL}
	if n, ok := f["classes"]; ok {
		d.classes(n, &cfg.Classes)
	}
	if n, ok := f["routes"]; ok {
		seen := map[string]*yaml.Node{}
		for _, rn := range d.Seq(n, "l7 routes") {
			r, ok := d.route(rn, cfg.Redis)
			if !ok {
				continue
			}
			if prev := seen[r.Name]; prev != nil {
				d.Errorf(rn, "route %q is already defined at line %d", r.Name, prev.Line)
				continue
			}
			seen[r.Name] = rn
			cfg.Routes = append(cfg.Routes, r)
		}
	}
	return cfg
}

func (d *decoder) upstream(n *yaml.Node) *url.URL {
	s, ok := d.Scalar(n, "l7 upstream")
	if !ok {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.Fragment != "" {
		d.Errorf(n, "l7 upstream %q: want http://host:port or https://host:port (an optional path, no query)", s)
		return nil
	}
	if _, port, err := net.SplitHostPort(u.Host); err == nil {
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			d.Errorf(n, "l7 upstream %q: bad port %q", s, port)
			return nil
		}
	}
	return u
}

func (d *decoder) headerName(n *yaml.Node, where string) string {
	s, ok := d.Scalar(n, where)
	if !ok {
		return ""
	}
	if !httpToken(s) {
		d.Errorf(n, "%s %q is not a valid header name", where, s)
		return ""
	}
	return textproto.CanonicalMIMEHeaderKey(s)
}

func (d *decoder) paths(n *yaml.Node, where string) []string {
	var out []string
	for _, c := range d.Seq(n, where) {
		s, ok := d.Scalar(c, "path")
		if !ok {
			continue
		}
		if !strings.HasPrefix(s, "/") {
			d.Errorf(c, "%s: path %q must start with /", where, s)
			continue
		}
		d.normalPath(c, where, s)
		out = append(out, s)
	}
	return out
}

// normalPath holds a configured path (a prefix, an exempt path) to the
// decoded normal form requests are matched in: "/a//b" or "/a/./b" could
// never match.
func (d *decoder) normalPath(n *yaml.Node, where, s string) {
	norm, err := target.Normalize(s, false)
	if err != nil {
		d.Errorf(n, "%s %q: %v", where, s, err)
		return
	}
	if dec := target.Decode(norm); dec != s {
		d.Errorf(n, "%s %q: requests are matched by their normal path; write it as %q", where, s, dec)
	}
}

func (d *decoder) concurrency(n *yaml.Node, where string) *Concurrency {
	f := d.Fields(n, where, "max_in_flight", "queue", "queue_timeout", "adaptive", "adaptive_max",
		"priority_header", "retry_after", "critical_reserve")
	if f == nil {
		return nil
	}
	c := &Concurrency{QueueTimeout: time.Second, RetryAfter: time.Second, CriticalReserve: shed.DefaultCriticalReservePercent}
	if v, ok := f["max_in_flight"]; ok {
		x, _ := d.integer(v, "max_in_flight", 1, 1<<20)
		c.MaxInFlight = int(x)
	} else {
		d.Errorf(n, "%s: max_in_flight is required", where)
	}
	if v, ok := f["queue"]; ok {
		x, _ := d.integer(v, "queue", 0, 1<<20)
		c.Queue = int(x)
	}
	if v, ok := f["queue_timeout"]; ok {
		c.QueueTimeout, _ = d.duration(v, "queue_timeout")
	}
	if v, ok := f["adaptive"]; ok {
		c.Adaptive = d.boolean(v, "adaptive")
	}
	c.AdaptiveMax = max(c.MaxInFlight, 1000)
	if v, ok := f["adaptive_max"]; ok {
		x, ok := d.integer(v, "adaptive_max", 1, 1<<20)
		if ok && x < int64(c.MaxInFlight) {
			d.Errorf(v, "adaptive_max %d is below max_in_flight %d", x, c.MaxInFlight)
		}
		c.AdaptiveMax = int(x)
	}
	if v, ok := f["priority_header"]; ok {
		c.PriorityHeader = d.headerName(v, "priority_header")
	}
	if v, ok := f["retry_after"]; ok {
		c.RetryAfter, _ = d.duration(v, "retry_after")
	}
	if v, ok := f["critical_reserve"]; ok {
		if s, sok := d.Scalar(v, "critical_reserve"); sok {
			pct, err := strconv.Atoi(strings.TrimSuffix(s, "%"))
			if err != nil || !strings.HasSuffix(s, "%") || pct < 0 || pct >= 100 {
				d.Errorf(v, "critical_reserve %q: want a percentage from 0%% to 99%% (0%%: no reserve)", s)
			} else {
				c.CriticalReserve = pct
			}
		}
	}
	return c
}

func (d *decoder) redisConfig(n *yaml.Node) *Redis {
	f := d.Fields(n, "l7 redis", "addr", "timeout", "prefix", "failure", "hosts", "sync_interval")
	if f == nil {
		return nil
	}
	r := &Redis{Timeout: 100 * time.Millisecond, Prefix: "eg:l7:", Failure: FailureOpen, Hosts: 1, SyncInterval: DefaultSyncInterval}
	if v, ok := f["addr"]; ok {
		r.Addr, _ = d.hostPort(v, "redis addr")
	} else {
		d.Errorf(n, "l7 redis: addr is required (host:port)")
	}
	if v, ok := f["timeout"]; ok {
		r.Timeout, _ = d.duration(v, "redis timeout")
	}
	if v, ok := f["prefix"]; ok {
		s, ok := d.Scalar(v, "redis prefix")
		if ok && (s == "" || strings.ContainsAny(s, "{}")) {
			d.Errorf(v, "redis prefix %q must be non-empty and contain no braces", s)
		}
		r.Prefix = s
	}
	if v, ok := f["failure"]; ok {
		r.Failure, _ = d.enum(v, "redis failure", FailureOpen, FailureClosed, FailureLocal)
	}
	if v, ok := f["hosts"]; ok {
		r.Hosts, _ = d.integer(v, "redis hosts", 1, 1<<16)
	}
	if v, ok := f["sync_interval"]; ok {
		if iv, ok := d.duration(v, "redis sync_interval"); ok && (iv < time.Millisecond || iv > time.Hour) {
			d.Errorf(v, "redis sync_interval %s: want 1ms to 1h", iv)
		} else if ok {
			r.SyncInterval = iv
		}
	}
	return r
}

func (d *decoder) escalation(n *yaml.Node, e *Escalation) {
	f := d.Fields(n, "l7 escalation", "enabled", "rejections", "window", "ttl", "prefix_v4", "prefix_v6", "max_sources")
	if v, ok := f["enabled"]; ok {
		e.Enabled = d.boolean(v, "escalation enabled")
	}
	if v, ok := f["rejections"]; ok {
		e.Rejections, _ = d.integer(v, "escalation rejections", 1, 1<<30)
	}
	if v, ok := f["window"]; ok {
		e.Window, _ = d.duration(v, "escalation window")
	}
	if v, ok := f["ttl"]; ok {
		e.TTL, _ = d.duration(v, "escalation ttl")
	}
	if v, ok := f["prefix_v4"]; ok {
		x, _ := d.integer(v, "escalation prefix_v4", 8, 32)
		e.PrefixV4 = int(x)
	}
	if v, ok := f["prefix_v6"]; ok {
		x, _ := d.integer(v, "escalation prefix_v6", 16, 128)
		e.PrefixV6 = int(x)
	}
	if v, ok := f["max_sources"]; ok {
		x, _ := d.integer(v, "escalation max_sources", 1, maxCapacity)
		e.MaxSources = int(x)
	}
}

func (d *decoder) classes(n *yaml.Node, c *Classes) {
	f := d.Fields(n, "l7 classes", "enabled", "window", "headroom", "default_usual_rate", "cache_ttl")
	if v, ok := f["enabled"]; ok {
		c.Enabled = d.boolean(v, "classes enabled")
	}
	if v, ok := f["window"]; ok {
		if w, ok := d.duration(v, "classes window"); ok && (w < time.Second || w > time.Hour) {
			d.Errorf(v, "classes window %s: want 1s to 1h", w)
		} else if ok {
			c.Window = w
		}
	}
	if v, ok := f["headroom"]; ok {
		c.Headroom, _ = d.integer(v, "classes headroom", 1, 100)
	}
	if v, ok := f["default_usual_rate"]; ok {
		c.DefaultUsualRate, _ = d.integer(v, "classes default_usual_rate", 1, 1_000_000)
	}
	if v, ok := f["cache_ttl"]; ok {
		if ttl, ok := d.duration(v, "classes cache_ttl"); ok && ttl > time.Minute {
			d.Errorf(v, "classes cache_ttl %s: want at most 1m (a penalty must show soon)", ttl)
		} else if ok {
			c.CacheTTL = ttl
		}
	}
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
		r.ExemptPaths = d.paths(v, where+" exempt_paths")
	}
	if v, has := f["limits"]; has {
		r.Limits = d.limits(v, where, rc)
	}
	if v, has := f["tiers"]; has {
		r.Tiers = d.tiers(v, where, rc)
	}
	if v, has := f["concurrency"]; has {
		r.Concurrency = d.concurrency(v, where+" concurrency")
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
		s, _ := d.enum(v, "match path_case", "sensitive", "insensitive")
		m.IgnoreCase = s == "insensitive"
	}
	if hasPrefix {
		if s, ok := d.Scalar(pv, "match path_prefix"); ok {
			if !strings.HasPrefix(s, "/") {
				d.Errorf(pv, "match path_prefix %q must start with /", s)
			} else {
				d.normalPath(pv, "match path_prefix", s)
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
				name := d.headerName(yamlcheck.Resolve(v.Content[i]), "match header")
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
		t.Header = d.headerName(v, "tiers header")
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
		"failure", "capacity", "reserve", "lease")
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
		l.Burst, _ = d.integer(v, "limit burst", 1, 1<<40)
	}
	if v, has := f["algorithm"]; has {
		if s, sok := d.Scalar(v, "limit algorithm"); sok {
			if alias, isAlias := algorithmAlias(s); isAlias {
				v = &yaml.Node{Kind: yaml.ScalarNode, Value: alias, Line: v.Line, Column: v.Column}
			}
			s, aok := d.enum(v, "limit algorithm", AlgGCRA, AlgSlidingWindow, AlgTokenBucket, AlgFixedWindow, AlgLeakyBucket, AlgSlidingLog)
			l.Algorithm, ok = s, ok && aok
		} else {
			ok = false
		}
	}
	if v, has := f["shape"]; has {
		l.Shape = d.boolean(v, "limit shape")
	}
	if v, has := f["shadow"]; has {
		l.Shadow = d.boolean(v, "limit shadow")
	}
	if v, has := f["backend"]; has {
		s, bok := d.enum(v, "limit backend", BackendLocal, BackendRedis, BackendHybrid)
		l.Backend, ok = s, ok && bok
		if (s == BackendRedis || s == BackendHybrid) && !d.redis {
			d.Errorf(v, "limit %q: backend %s needs an l7 redis: section", l.Name, s)
			ok = false
		}
	}
	switch v, has := f["failure"]; {
	case has:
		l.Failure, _ = d.enum(v, "limit failure", FailureOpen, FailureClosed, FailureLocal)
		if !l.Shared() {
			d.Errorf(v, "limit %q: failure applies only to backend redis and hybrid", l.Name)
		}
	case l.Backend == BackendHybrid:
		l.Failure = FailureLocal
	case rc != nil:
		l.Failure = rc.Failure
	}
	if v, has := f["lease"]; has {
		l.Lease, _ = d.integer(v, "limit lease", 1, 1<<40)
		if l.Backend != BackendHybrid {
			d.Errorf(v, "limit %q: lease applies only to backend hybrid", l.Name)
			ok = false
		}
	}
	if v, has := f["capacity"]; has {
		x, _ := d.integer(v, "limit capacity", 1, maxCapacity)
		l.Capacity = int(x)
	}
	switch v, has := f["reserve"]; {
	case has && l.Shared():
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
