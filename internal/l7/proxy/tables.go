package proxy

import (
	"cmp"
	"net/netip"
	"net/url"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/shed"
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// The l7: section's sub-sections, each a table of fields on the walker
// (internal/yamlcheck): key, kind (bounds and wording), where the value
// lives, one-line doc. The defaults are the Default* values below, once:
// Decode starts from them and docs/policy.md's tables are written from
// them (TestPolicyDocL7Tables).

// DefaultTimeouts are l7.timeouts when the file sets none.
func DefaultTimeouts() Timeouts {
	return Timeouts{Body: DefaultBodyTimeout, Response: DefaultResponseTimeout, MinRate: DefaultMinRate,
		TunnelIdle: DefaultTunnelIdleTimeout}
}

// DefaultHeaders are l7.headers when the file sets none.
func DefaultHeaders() Headers { return Headers{Draft: 10} }

// DefaultEscalation is l7.escalation when the file sets none (off).
func DefaultEscalation() Escalation {
	return Escalation{Rejections: DefaultEscalationRejection, Window: DefaultEscalationWindow,
		TTL: DefaultEscalationTTL, PrefixV4: 32, PrefixV6: 64, MaxSources: DefaultEscalationSources}
}

// DefaultClasses is l7.classes when the file sets none (on, with
// internal/l7/class's defaults).
func DefaultClasses() Classes {
	return Classes{Enabled: true, Window: class.DefaultWindow, Headroom: class.DefaultHeadroom,
		DefaultUsualRate: class.DefaultUsualRate, CacheTTL: class.DefaultCacheTTL}
}

// DefaultRedis is l7.redis's defaults (addr is required).
func DefaultRedis() Redis {
	return Redis{Timeout: 100 * time.Millisecond, Prefix: "eg:l7:", Failure: FailureOpen, Hosts: 1, SyncInterval: DefaultSyncInterval}
}

// DefaultConcurrency is a concurrency: section's defaults (max_in_flight
// is required; adaptive_max defaults to max(max_in_flight, 1000)).
func DefaultConcurrency() Concurrency {
	return Concurrency{QueueTimeout: time.Second, RetryAfter: time.Second, CriticalReserve: shed.DefaultCriticalReservePercent}
}

var pathsTable = yamlcheck.NewTable("l7 paths",
	val("l7 paths ", "normalize", choice{"standard", "strict"}, func(p *Paths) *bool { return &p.Strict },
		"`strict` answers 400 to a path some upstream could read differently (an encoded slash, a backslash, `..` above the root, `;`, an encoded control character or `%`); `standard` routes its normal form"),
	val("l7 paths ", "forward", choice{"normalized", "as-sent"}, func(p *Paths) *bool { return &p.AsSent },
		"`as-sent` forwards the target as the client sent it (routing still uses the normal form)"),
)

var timeoutsTable = yamlcheck.NewTable("l7 timeouts",
	val("l7 timeouts ", "body", duration{}, func(t *Timeouts) *time.Duration { return &t.Body },
		"while the proxy waits for a request body, each period must bring `min_rate` bytes/s (and a byte), else 408 and close"),
	val("l7 timeouts ", "response", duration{}, func(t *Timeouts) *time.Duration { return &t.Response },
		"while a response waits for the client, each period must see `min_rate` bytes/s go, else the connection and its upstream exchange are closed"),
	yamlcheck.Val("min_rate", as("l7 timeouts min_rate (bytes per second)", yamlcheck.Uint[int64]{Min: 0, Max: 1 << 30}),
		func(t *Timeouts) *int64 { return &t.MinRate },
		"bytes per second (0: some progress per period); N bytes take at most one period plus N/`min_rate`"),
	val("l7 timeouts ", "tunnel_idle", duration{}, func(t *Timeouts) *time.Duration { return &t.TunnelIdle },
		"closes an upgraded connection (WebSocket) silent both ways that long"),
)

var headersTable = yamlcheck.NewTable("l7 headers",
	val("headers ", "draft", draft{}, func(h *Headers) *int { return &h.Draft },
		"RateLimit-Policy/RateLimit fields of that ratelimit-headers draft, or none"),
	val("headers ", "legacy", yamlcheck.Bool{}, func(h *Headers) *bool { return &h.Legacy },
		"adds `X-RateLimit-Limit`/`-Remaining`/`-Reset`"),
)

var escalationTable = yamlcheck.NewTable("l7 escalation",
	val("escalation ", "enabled", yamlcheck.Bool{}, func(e *Escalation) *bool { return &e.Enabled },
		"more than `rejections` 429s from one prefix within `window`: deny it at the NIC for `ttl`"),
	val("escalation ", "rejections", yamlcheck.Uint[int64]{Min: 1, Max: 1 << 30}, func(e *Escalation) *int64 { return &e.Rejections },
		"the threshold, per prefix"),
	val("escalation ", "window", duration{}, func(e *Escalation) *time.Duration { return &e.Window },
		"the period rejections are counted over"),
	val("escalation ", "ttl", duration{}, func(e *Escalation) *time.Duration { return &e.TTL },
		"the deny entry's lifetime; a prefix is escalated at most once per `ttl`"),
	val("escalation ", "prefix_v4", yamlcheck.Uint[int]{Min: 8, Max: 32}, func(e *Escalation) *int { return &e.PrefixV4 },
		"the IPv4 prefix denied (and counted over)"),
	val("escalation ", "prefix_v6", yamlcheck.Uint[int]{Min: 16, Max: 128}, func(e *Escalation) *int { return &e.PrefixV6 },
		"the IPv6 prefix denied (and counted over)"),
	val("escalation ", "max_sources", yamlcheck.Uint[int]{Min: 1, Max: maxCapacity}, func(e *Escalation) *int { return &e.MaxSources },
		"prefixes tracked (48 bytes each, allocated up front)"),
)

var classesTable = yamlcheck.NewTable("l7 classes",
	val("classes ", "enabled", yamlcheck.Bool{}, func(c *Classes) *bool { return &c.Enabled },
		"the L7 class ranking (docs/operations.md, \"Class ranking at L7\"); `false`: no ranking, every request as before (default priority, no reserve)"),
	val("classes ", "window", duration{Min: time.Second, Max: time.Hour}, func(c *Classes) *time.Duration { return &c.Window },
		"the usual rate's period"),
	val("classes ", "headroom", yamlcheck.Uint[int64]{Min: 1, Max: 100}, func(c *Classes) *int64 { return &c.Headroom },
		"a first-rank client keeps its rank up to `headroom × usual + clump` requests per window"),
	val("classes ", "default_usual_rate", yamlcheck.Uint[int64]{Min: 1, Max: 1_000_000}, func(c *Classes) *int64 { return &c.DefaultUsualRate },
		"requests/s: the usual of a client with history and no measured usual yet (known_good, after a restart)"),
	val("classes ", "cache_ttl", duration{Max: time.Minute, Why: " (a penalty must show soon)"},
		func(c *Classes) *time.Duration { return &c.CacheTTL },
		"how long a data plane standing read is used"),
)

// redisSection is l7.redis.
var redisSection = optional[Redis]{section[Redis]{Table: redisTable, Def: DefaultRedis}}

var redisTable = yamlcheck.NewTable("l7 redis",
	val("redis ", "addr", listenAddr, func(r *Redis) *string { return &r.Addr },
		"the server").Formatted(required(func(r *Redis) string { return r.Addr })).Required("l7 redis: addr is required (host:port)"),
	val("redis ", "timeout", duration{}, func(r *Redis) *time.Duration { return &r.Timeout },
		"one dial, read or write (a refused connection fails at once, with one connect attempt)"),
	val("redis ", "prefix", redisPrefix{}, func(r *Redis) *string { return &r.Prefix },
		"starts every key; no braces"),
	val("redis ", "failure", enumOf{[]string{FailureOpen, FailureClosed, FailureLocal}}, func(r *Redis) *string { return &r.Failure },
		"the default of its `redis` limits (hybrid limits default to `local`): `fail-open` admits, `fail-closed` refuses while Redis cannot answer; `local`: each host limits on its own to the limit ÷ `hosts`"),
	val("redis ", "hosts", yamlcheck.Uint[int64]{Min: 1, Max: 1 << 16}, func(r *Redis) *int64 { return &r.Hosts },
		"the number of daemons sharing these limits (set it to the fleet's size): hybrid grants and `failure: local` divide by it"),
	val("redis ", "sync_interval", duration{Min: time.Millisecond, Max: time.Hour}, func(r *Redis) *time.Duration { return &r.SyncInterval },
		"how long a hybrid host decides from one lease before it reports its count to Redis (docs/l7-redis.md, \"Hybrid\")"),
)

var concurrencyTable = yamlcheck.NewTable("concurrency",
	val("", "max_in_flight", yamlcheck.Uint[int]{Min: 1, Max: 1 << 20}, func(c *Concurrency) *int { return &c.MaxInFlight },
		"requests in flight (required); above it requests queue, then 503").
		Formatted(required(func(c *Concurrency) string { return yamlcheck.Uint[int]{}.Format(c.MaxInFlight) })),
	val("", "queue", yamlcheck.Uint[int]{Min: 0, Max: 1 << 20}, func(c *Concurrency) *int { return &c.Queue },
		"requests waiting for a slot"),
	val("", "queue_timeout", duration{}, func(c *Concurrency) *time.Duration { return &c.QueueTimeout },
		"the longest a request waits in the queue"),
	val("", "adaptive", yamlcheck.Bool{}, func(c *Concurrency) *bool { return &c.Adaptive },
		"the limit follows latency (AIMD), starting at `max_in_flight`"),
	val("", "adaptive_max", yamlcheck.Uint[int]{Min: 1, Max: 1 << 20}, func(c *Concurrency) *int { return &c.AdaptiveMax },
		"the adaptive limit's ceiling, at least `max_in_flight`; default max(`max_in_flight`, 1000)").
		Formatted(unsetSays("max(max_in_flight, 1000)", func(c *Concurrency) string { return yamlcheck.Uint[int]{}.Format(c.AdaptiveMax) })),
	val("", "priority_header", headerName{}, func(c *Concurrency) *string { return &c.PriorityHeader },
		"a header whose `critical`, `default` or `sheddable` (set by a trusted layer in front) overrides the class's priority"),
	val("", "retry_after", duration{}, func(c *Concurrency) *time.Duration { return &c.RetryAfter },
		"advertised on 503"),
	val("", "critical_reserve", percent{Note: " (0%: no reserve)"}, func(c *Concurrency) *int { return &c.CriticalReserve },
		"the share of the limit only critical requests may use: `ceil(limit × pct / 100)` slots, at most all but one"),
)

// concurrencySection is a concurrency: section (global or a route's).
var concurrencySection = optional[Concurrency]{section[Concurrency]{Table: concurrencyTable, Def: DefaultConcurrency,
	Check: func(c *yamlcheck.Checker, n *yaml.Node, where string, got map[string]*yaml.Node, s *Concurrency) {
		if _, ok := got["max_in_flight"]; !ok {
			c.Errorf(n, "%s: max_in_flight is required", where)
		}
		if v, ok := got["adaptive_max"]; !ok {
			s.AdaptiveMax = max(s.MaxInFlight, 1000)
		} else if s.AdaptiveMax != 0 && s.AdaptiveMax < s.MaxInFlight {
			c.Errorf(v, "adaptive_max %d is below max_in_flight %d", s.AdaptiveMax, s.MaxInFlight)
		}
	}}}

// DefaultConfig is what Decode starts from: every default of the l7:
// section.
func DefaultConfig() Config {
	return Config{ClientPrefixV4: 32, ClientPrefixV6: 64, Headers: DefaultHeaders(), IdentityFields: DefaultIdentityFields(),
		Timeouts: DefaultTimeouts(), Escalation: DefaultEscalation(), Classes: DefaultClasses()}
}

// The l7: section's sub-sections that are always there (filled with their
// defaults).
var (
	pathsSection      = section[Paths]{Table: pathsTable, Def: func() Paths { return Paths{} }}
	timeoutsSection   = section[Timeouts]{Table: timeoutsTable, Def: DefaultTimeouts}
	headersSection    = section[Headers]{Table: headersTable, Def: DefaultHeaders}
	escalationSection = section[Escalation]{Table: escalationTable, Def: DefaultEscalation}
	classesSection    = section[Classes]{Table: classesTable, Def: DefaultClasses}
)

// l7Table is the l7: section's top level. Its routes are decoded by d with
// what the table decoded before them (redis); d may be nil for the docs.
func (d *decoder) l7Table() *yamlcheck.Table[Config] {
	routes := routeList{decoded[[]Route]{describe: "list of routes (below)", parse: func(_ *yamlcheck.Checker, n *yaml.Node, _ string) []Route {
		return d.routes(n)
	}}}
	return yamlcheck.NewTable("l7",
		val("l7 ", "listen", listenAddr, func(c *Config) *string { return &c.Listen },
			"where the proxy listens (required unless `rls:` serves alone); bound when the policy is applied, before anything else changes: a taken port fails the apply (at start: before the XDP program is loaded or attached) and the running policy stays").
			Formatted(required(func(c *Config) string { return c.Listen })),
		val("l7 ", "upstream", upstreamURL{}, func(c *Config) **url.URL { return &c.Upstream },
			"`http://host:port` or `https://…` (optional path, no query); every route proxies to it (required unless `rls:` serves alone)").
			Formatted(required(func(c *Config) string { return upstreamURL{}.Format(c.Upstream) })),
		yamlcheck.Val("trusted_proxies", as("l7 trusted_proxies", prefixes{Item: "trusted proxy"}),
			func(c *Config) *[]netip.Prefix { return &c.TrustedProxies },
			"peers whose `Forwarded` / `X-Forwarded-For` name the client; host bits must be zero"),
		yamlcheck.Sub("client_prefix", "`ip` keys group clients by these prefix lengths",
			val("client_prefix ", "v4", yamlcheck.Uint[int]{Min: 1, Max: 32}, func(c *Config) *int { return &c.ClientPrefixV4 },
				"IPv4 prefix length of an `ip` key"),
			val("client_prefix ", "v6", yamlcheck.Uint[int]{Min: 1, Max: 128}, func(c *Config) *int { return &c.ClientPrefixV6 },
				"IPv6 prefix length of an `ip` key"),
		),
		val("l7 ", "user_header", headerName{}, func(c *Config) *string { return &c.UserHeader },
			"header of the `user` key (set by the auth layer in front)").
			Formatted(func(c *Config) string { return cmp.Or(c.UserHeader, "X-User-Id") }),
		val("l7 ", "tenant_header", headerName{}, func(c *Config) *string { return &c.TenantHeader },
			"header of the `tenant` key (set by the auth layer in front)").
			Formatted(func(c *Config) string { return cmp.Or(c.TenantHeader, "X-Tenant-Id") }),
		val("l7 ", "exempt_paths", exactPaths{}, func(c *Config) *[]string { return &c.ExemptPaths },
			"exact URL paths never shed or limited (health checks), in normal form"),
		val("l7 ", "headers", headersSection, func(c *Config) *Headers { return &c.Headers },
			"RateLimit-Policy/RateLimit response fields"),
		val("l7 ", "concurrency", concurrencySection, func(c *Config) **Concurrency { return &c.Concurrency },
			"limit on requests in flight across all routes (503 when shed)"),
		val("l7 ", "redis", redisSection, func(c *Config) **Redis { return &c.Redis },
			"backend of `backend: redis` and `backend: hybrid` limits"),
		val("l7 ", "escalation", escalationSection, func(c *Config) *Escalation { return &c.Escalation },
			"sources that keep being refused (429) are denied at the NIC"),
		val("l7 ", "routes", routes, func(c *Config) *[]Route { return &c.Routes },
			"tried in order, first match wins; unmatched requests get only the global concurrency limit"),
		val("l7 ", "engine", engineKind{}, func(c *Config) *Engine { return &c.Engine },
			"what serves connections: `auto` is the event loop for an `http://` upstream, net/http for `https://`; `event-loop` with an https upstream is an error (docs/l7-proxy.md, \"Engines\")"),
		val("l7 ", "loops", yamlcheck.Uint[int]{Min: 1, Max: 1024}, func(c *Config) *int { return &c.Loops },
			"the event loop engine's number of loops (one OS thread each); unset: one per core").
			Formatted(unsetSays("one per core", func(c *Config) string { return yamlcheck.Uint[int]{}.Format(c.Loops) })),
		val("l7 ", "access_log", accessLog{}, func(c *Config) *string { return &c.AccessLog },
			"one JSON line per request; a file is opened for appending (mode 0640) and reopened on SIGUSR1; a file that cannot be opened fails the policy; a full 1 MiB buffer drops lines and counts it (docs/l7-proxy.md, \"Access log\")"),
		yamlcheck.Val("rls", rawNode{}, func(c *Config) **yaml.Node { return &c.RLS },
			"the rate-limit service for Envoy and nginx (internal/l7/rls; its table below)"),
		val("l7 ", "paths", pathsSection, func(c *Config) *Paths { return &c.Paths },
			"request paths are routed in their normal form (docs/l7-proxy.md, \"Request targets\")"),
		val("l7 ", "identity_fields", identityFields{}, func(c *Config) *[]string { return &c.IdentityFields },
			"client-set fields removed before the upstream (any case); the list replaces the default (`[]`: none); fields whose name holds `_` are always removed; `X-Forwarded-For`/`-Host`/`-Proto` and `Forwarded` are always rewritten and may not be listed"),
		val("l7 ", "timeouts", timeoutsSection, func(c *Config) *Timeouts { return &c.Timeouts },
			"transfer periods, both engines"),
		val("l7 ", "classes", classesSection, func(c *Config) *Classes { return &c.Classes },
			"the L7 class ranking (docs/operations.md, \"Class ranking at L7\")"),
	)
}

// routes decodes l7.routes.
func (d *decoder) routes(n *yaml.Node) []Route {
	var out []Route
	seen := map[string]*yaml.Node{}
	for _, rn := range d.Seq(n, "l7 routes") {
		r, ok := d.route(rn, d.cfg.Redis)
		if !ok {
			continue
		}
		if prev := seen[r.Name]; prev != nil {
			d.Errorf(rn, "route %q is already defined at line %d", r.Name, prev.Line)
			continue
		}
		seen[r.Name] = rn
		out = append(out, r)
	}
	return out
}

// required formats a required field: "required" while unset (the docs'
// default column), else its value.
func required[S any](format func(s *S) string) func(s *S) string {
	return unsetSays("required", format)
}

// unsetSays formats a field: text while unset ("", 0 or none), else its
// value.
func unsetSays[S any](text string, format func(s *S) string) func(s *S) string {
	return func(s *S) string {
		if v := format(s); v != "" && v != "0" && v != "none" {
			return v
		}
		return text
	}
}
