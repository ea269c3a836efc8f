// Package proxy is Edgeguard's L7 reverse proxy: the daemon runs it from the
// policy's l7: section. A request is matched to a route (host, methods, path
// prefix or pattern, header), exempt paths go straight through, then the
// concurrency limits shed (503), then the route's rate limits reject (429),
// and what is left is proxied to the upstream. Sources that keep being
// rejected can be escalated to the XDP deny list. See docs/l7-proxy.md.
package proxy

import (
	"github.com/edgeguard/edgeguard/internal/l7/class"

	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// Config is a decoded, validated l7: section. Decode fills every default, so
// a Config from Decode needs nothing more; a Config built by hand must follow
// the same rules (New validates what it relies on).
type Config struct {
	// Listen is the proxy's host:port.
	Listen string
	// Upstream is the one backend every route proxies to (http or https).
	Upstream *url.URL
	// TrustedProxies are the peers whose X-Forwarded-For / Forwarded headers
	// name the client.
	TrustedProxies []netip.Prefix
	// ClientPrefixV4 and ClientPrefixV6 group client addresses for ip keys
	// (default 32 and 64).
	ClientPrefixV4, ClientPrefixV6 int
	// UserHeader and TenantHeader name the headers of the user and tenant
	// keys (defaults X-User-Id, X-Tenant-Id).
	UserHeader, TenantHeader string
	// ExemptPaths are URL paths never limited or shed (health checks).
	ExemptPaths []string
	// Headers selects the RateLimit response fields.
	Headers Headers
	// Concurrency, when set, bounds the requests in flight across all routes.
	Concurrency *Concurrency
	// Redis, when set, is the backend of the limits with backend: redis.
	Redis *Redis
	// Escalation sends persistently rejected sources to the XDP deny list.
	Escalation Escalation
	// Routes are tried in order; the first match decides. A request no
	// route matches is proxied with only the global concurrency limit.
	Routes []Route
	// Engine serves the proxy; "" (auto) is the event loop for an http
	// upstream and net/http for an https one (ServingEngine).
	Engine Engine
	// Loops is the event loop engine's number of loops (0: GOMAXPROCS,
	// one per core; see eventloop.Config.Loops).
	Loops int
	// Paths is how request paths are normalised for routing and
	// forwarding (internal/l7/target).
	Paths Paths
	// IdentityFields are the request fields that claim who the client is
	// or where the request came from, set by a client: removed before the
	// request goes upstream (canonical names; Decode fills
	// DefaultIdentityFields). X-Forwarded-For, -Host, -Proto and Forwarded
	// are always rewritten and are not listed here.
	IdentityFields []string
	// Timeouts bound transfers: bodies, responses and tunnels.
	Timeouts Timeouts
	// Classes ranks clients (l7.classes, internal/l7/class): on unless
	// disabled.
	Classes Classes
	// AccessLog is where the stage writes one JSON line per request:
	// "stderr", an absolute file path (reopened on SIGUSR1), or "" for
	// none (internal/l7/accesslog).
	AccessLog string
	// RLS is the rls: section (the rate-limit service for Envoy and nginx,
	// decoded by internal/l7/rls), nil when absent. With it, Listen and
	// Upstream may both be empty: then no proxy is served.
	RLS *yaml.Node
}

// ServesProxy reports whether the configuration runs the reverse proxy
// (false for an l7: section with only the rate-limit service).
func (c *Config) ServesProxy() bool { return c.Listen != "" }

// Paths is the request path rule (docs/l7-proxy.md, "Request targets").
type Paths struct {
	// Strict refuses (400) a path with a spelling some upstream could read
	// differently from its normal form (target.Normalize with strict).
	Strict bool
	// AsSent forwards the request target as the client sent it; routing
	// still uses the normal form. Default (false): the normal form is
	// forwarded, so the upstream serves what was routed.
	AsSent bool
}

// Timeouts bound the transfers of a request (docs/l7-proxy.md, "Engines").
type Timeouts struct {
	// Body and Response are periods: while the proxy waits for the
	// client's request body, each Body must bring at least MinRate × Body
	// bytes (and some); while it has a response to write to the client,
	// each Response must take at least MinRate × Response bytes (and
	// some). So a body or response of N bytes is done within one period
	// plus N / MinRate, or the connection is closed (and its upstream).
	Body, Response time.Duration
	// MinRate is in bytes per second (0: only "some" progress per period).
	MinRate int64
	// TunnelIdle closes an upgraded connection (a WebSocket) that carried
	// no byte either way for that long.
	TunnelIdle time.Duration
}

// Defaults of Timeouts.
const (
	DefaultBodyTimeout       = 60 * time.Second
	DefaultResponseTimeout   = 60 * time.Second
	DefaultMinRate           = 512
	DefaultTunnelIdleTimeout = 5 * time.Minute
)

// DefaultIdentityFields are the client-set fields removed from requests
// unless the policy lists its own (l7.identity_fields): each claims a
// client address, a forwarding hop or the original URL, and some upstream
// framework believes it.
func DefaultIdentityFields() []string {
	return []string{
		"X-Real-Ip", "True-Client-Ip", "Cf-Connecting-Ip", "X-Client-Ip", "X-Cluster-Client-Ip",
		"Forwarded-For", "X-Forwarded", "X-Forwarded-Port", "X-Forwarded-Prefix", "X-Forwarded-Server",
		"X-Forwarded-Ssl", "X-Forwarded-Scheme", "X-Original-Url", "X-Rewrite-Url", "X-Original-Forwarded-For",
		"Fastly-Client-Ip", "X-Proxyuser-Ip", "Client-Ip",
	}
}

// Engine is what serves the proxy's connections.
type Engine string

const (
	// EngineEventLoop is internal/l7/eventloop: one epoll loop per core,
	// plain-http upstreams only.
	EngineEventLoop Engine = "event-loop"
	// EngineNetHTTP is net/http's server with httputil.ReverseProxy.
	EngineNetHTTP Engine = "net-http"
)

// ServingEngine resolves Engine: an unset one is the event loop unless the
// upstream is https.
func (c *Config) ServingEngine() Engine {
	if c.Engine != "" {
		return c.Engine
	}
	if c.Upstream != nil && c.Upstream.Scheme == "https" {
		return EngineNetHTTP
	}
	return EngineEventLoop
}

// Classes is the l7.classes section: how the L7 stage ranks clients
// (docs/operations.md, "Class ranking at L7"). Decode fills the defaults
// of internal/l7/class.
type Classes struct {
	Enabled bool
	// Window is the usual rate's measuring period.
	Window time.Duration
	// Headroom multiplies a client's usual requests per Window: beyond it
	// its requests are charged as over_usual.
	Headroom int64
	// DefaultUsualRate (requests/s) is the usual of a client with history
	// whose own is not measured yet.
	DefaultUsualRate int64
	// CacheTTL is how long a data plane standing read is used.
	CacheTTL time.Duration
}

// Ranking is the class table's configuration for these settings and the
// policy's standing.established_after: the one the L7 stage and the
// rate-limit service install in the table they share.
func (c Classes) Ranking(establishedAfter time.Duration) class.Config {
	return class.Config{EstablishedAfter: establishedAfter, Window: c.Window, Headroom: c.Headroom,
		DefaultUsualRate: c.DefaultUsualRate, CacheTTL: c.CacheTTL}
}

// Headers selects the RateLimit header fields of responses.
type Headers struct {
	// Draft is the ratelimit-headers draft version written: 10, or 0 for
	// no RateLimit/RateLimit-Policy fields.
	Draft int
	// Legacy adds X-RateLimit-Limit/Remaining/Reset.
	Legacy bool
}

// Concurrency is a concurrency limit with its queue (see internal/l7/shed).
type Concurrency struct {
	MaxInFlight  int
	Queue        int
	QueueTimeout time.Duration
	// Adaptive lets the limit follow latency (AIMD), starting at MaxInFlight
	// and never above AdaptiveMax.
	Adaptive    bool
	AdaptiveMax int
	// PriorityHeader names the header whose value (critical, default,
	// sheddable) sets a request's priority. Empty: every request is default.
	PriorityHeader string
	// RetryAfter is advertised on 503 (default 1s).
	RetryAfter time.Duration
	// CriticalReserve is the percentage of MaxInFlight (rounded up, at
	// most all but one slot) only critical requests may use (default 10;
	// 0: none). Decode fills it; 0 in a Config built by hand means none.
	CriticalReserve int
}

// Redis configures the Redis backend.
type Redis struct {
	Addr    string
	Timeout time.Duration // one round trip (default 100ms)
	Prefix  string        // key prefix (default "eg:l7:")
	// Failure is the default failure policy of redis limits:
	// FailureOpen (default), FailureClosed or FailureLocal.
	Failure string
	// Hosts is the number of daemons sharing these limits (default 1):
	// a hybrid limit's grants divide what is left among them, and
	// FailureLocal gives each host the limit ÷ Hosts.
	Hosts int64
	// SyncInterval is how long a hybrid limit's host decides from its
	// lease before it reports its count and asks again (default 1s).
	SyncInterval time.Duration
}

// DefaultSyncInterval is a hybrid limit's default lease lifetime.
const DefaultSyncInterval = time.Second

// Failure policies of redis and hybrid limits.
const (
	FailureOpen   = "fail-open"
	FailureClosed = "fail-closed"
	// FailureLocal limits each host locally to the limit ÷ Redis.Hosts
	// while Redis is unreachable (redislimit.Degrade); the default of
	// hybrid limits.
	FailureLocal = "local"
)

// Escalation configures escalation of rejected sources to the XDP deny list.
type Escalation struct {
	Enabled bool
	// Rejections is the threshold: a source rejected (429) more than this
	// many times within Window is escalated.
	Rejections int64
	Window     time.Duration
	// TTL is the deny entry's lifetime; a source is escalated at most once
	// per TTL.
	TTL time.Duration
	// PrefixV4 and PrefixV6 are the sizes of the denied prefixes (and of the
	// groups rejections are counted over).
	PrefixV4, PrefixV6 int
	// MaxSources bounds the sources tracked (default 65536): memory is
	// 48 bytes per source slot, allocated up front.
	MaxSources int
}

// Route is one set of limits for the requests its Match selects.
type Route struct {
	Name        string
	Match       Match
	ExemptPaths []string
	Limits      []Limit
	Tiers       *Tiers
	Concurrency *Concurrency
}

// Match selects requests. Every set field must match; an empty Match
// matches everything.
type Match struct {
	// Host is compared case-insensitively with the request's host, port
	// removed. A leading "*." matches any subdomain (not the bare domain).
	Host string
	// Methods, when not empty, lists the accepted methods (upper case).
	Methods []string
	// PathPrefix matches URL paths that start with it.
	PathPrefix string
	// PathPattern matches URL paths it matches (RE2, anchor it yourself).
	PathPattern *regexp.Regexp
	// IgnoreCase compares the path with PathPrefix and PathPattern without
	// regard to case (path_case: insensitive), for upstreams that serve
	// /LIMITED as /limited.
	IgnoreCase bool
	// Header maps canonical header names to the exact value required.
	Header map[string]string
}

// Limit is one rate limit of a route or tier.
type Limit struct {
	// Name appears in RateLimit headers, 429 bodies and metrics; unique in
	// the whole l7: section.
	Name string
	Key  Key
	// Count requests per Per.
	Count int64
	Per   time.Duration
	// Burst for gcra and token-bucket (0: Count).
	Burst int64
	// Algorithm: AlgGCRA (default), AlgSlidingWindow, AlgTokenBucket,
	// AlgFixedWindow, AlgLeakyBucket, AlgSlidingLog. Redis limits: gcra, sliding-window or
	// leaky_bucket without Shape.
	Algorithm string
	// Shape (leaky_bucket, local backend, not shadow): an admitted request
	// is held until its release slot, at most (Burst-1) intervals.
	Shape bool
	// Shadow counts would-be rejections and never rejects.
	Shadow bool
	// Backend is BackendLocal (default), BackendRedis or BackendHybrid.
	Backend string
	// Failure is a redis or hybrid limit's failure policy (default
	// Redis.Failure for redis, FailureLocal for hybrid).
	Failure string
	// Lease caps a hybrid limit's grant: the requests one host admits
	// between two syncs (default ⌈Count ÷ (10 × Redis.Hosts)⌉).
	Lease int64
	// Capacity bounds the keys of a local limit and the leases a hybrid
	// limit keeps on a host (default 1<<16).
	Capacity int
	// Reserve is the percentage of the limit (rounded down, at most all
	// but one request) that only the first class of the L7 ranking may
	// use (internal/l7/class): established and authenticated clients
	// within their usual rate. Decode fills it: DefaultAggregateReserve
	// for a local limit whose key names no client (global, endpoint,
	// prefix, asn), 0 otherwise and for redis limits.
	Reserve int
}

// DefaultAggregateReserve is the reserve of a local limit whose key is an
// aggregate of clients (docs/policy.md, l7 limits): the share the data
// plane's aggregates keep for their first class by default, too.
const DefaultAggregateReserve = 50

// Algorithms and backends of a Limit.
const (
	AlgGCRA          = "gcra"
	AlgSlidingWindow = "sliding-window"
	AlgTokenBucket   = "token-bucket"
	AlgFixedWindow   = "fixed-window"
	// AlgLeakyBucket is spelled with an underscore, as the issue and the
	// policy reference name it; "leaky-bucket" is accepted too.
	AlgLeakyBucket = "leaky_bucket"
	// AlgSlidingLog, the exact sliding log (local backend only), is
	// spelled like AlgLeakyBucket; "sliding-log" is accepted too.
	AlgSlidingLog = "sliding_log"
	BackendLocal  = "local"
	BackendRedis  = "redis"
	// BackendHybrid decides from a local lease of a limit shared through
	// Redis (sliding-window only): docs/l7-redis.md, "Hybrid".
	BackendHybrid = "hybrid"
)

// Shared reports whether l is kept in Redis (backend redis or hybrid).
func (l Limit) Shared() bool { return l.Backend == BackendRedis || l.Backend == BackendHybrid }

// Tiers adds limits per tier; the tier is named by a header a trusted auth
// layer sets.
type Tiers struct {
	Header  string
	Default string
	Tiers   []Tier
}

// Tier is one named set of extra limits.
type Tier struct {
	Name   string
	Limits []Limit
}

// KeyKind is one part of a composed key.
type KeyKind int

// Key parts.
const (
	KeyIP KeyKind = iota + 1
	KeyHeader
	KeyUser
	KeyTenant
	KeyEndpoint
	KeyGlobal
	// KeyPrefix is the client's /24 (IPv4) or /48 (IPv6).
	KeyPrefix
	// KeyASN is the client's ASN (the policy's asn_data); a client in no
	// ASN skips the limit.
	KeyASN
)

// Aggregate prefix lengths of KeyPrefix.
const (
	AggregatePrefixV4 = 24
	AggregatePrefixV6 = 48
)

// LimitsKeyedOn names the limits (of routes and tiers) whose key has a
// part of kind k.
func (c *Config) LimitsKeyedOn(k KeyKind) []string {
	var out []string
	add := func(ls []Limit) {
		for _, l := range ls {
			for _, p := range l.Key {
				if p.Kind == k {
					out = append(out, l.Name)
					break
				}
			}
		}
	}
	for _, r := range c.Routes {
		add(r.Limits)
		if r.Tiers != nil {
			for _, t := range r.Tiers.Tiers {
				add(t.Limits)
			}
		}
	}
	return out
}

// Aggregate reports whether k names no client: every part is global,
// endpoint, prefix or asn.
func (k Key) Aggregate() bool {
	for _, p := range k {
		switch p.Kind {
		case KeyGlobal, KeyEndpoint, KeyPrefix, KeyASN:
		default:
			return false
		}
	}
	return len(k) > 0
}

// KeyPart is one part of a Key: a kind, and the header name for KeyHeader.
type KeyPart struct {
	Kind   KeyKind
	Header string
}

// Key is what a limit counts per: one or more parts, all required (a request
// lacking a part skips the limit).
type Key []KeyPart

// String returns the key as written in the policy: "ip", "header:X-API-Key",
// "endpoint+user".
func (k Key) String() string {
	var b strings.Builder
	for i, p := range k {
		if i > 0 {
			b.WriteByte('+')
		}
		switch p.Kind {
		case KeyIP:
			b.WriteString("ip")
		case KeyHeader:
			b.WriteString("header:" + p.Header)
		case KeyUser:
			b.WriteString("user")
		case KeyTenant:
			b.WriteString("tenant")
		case KeyEndpoint:
			b.WriteString("endpoint")
		case KeyGlobal:
			b.WriteString("global")
		case KeyPrefix:
			b.WriteString("prefix")
		case KeyASN:
			b.WriteString("asn")
		}
	}
	return b.String()
}

// problems collects policy problems in one file.
type problems struct {
	file string
	list []policy.Problem
}
