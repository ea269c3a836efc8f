package policy

import (
	"regexp"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// Scope says whether a rule's aggregate budgets are this host's alone or
// shared by the fleet (docs/fleet.md).
type Scope string

// Rule scopes.
const (
	// ScopeHost, the default: every host enforces the whole budget.
	ScopeHost Scope = "host"
	// ScopeFleet: the hosts of the fleet share the per_prefix and per_asn
	// budgets, each taking a share in proportion to its demand.
	ScopeFleet Scope = "fleet"
)

// Fleet is the fleet: section: the hosts that share lists and fleet-wide
// budgets through Redis (docs/fleet.md). Nil without one.
type Fleet struct {
	// Name is the fleet's name; it is part of every Redis key, so two
	// fleets can share one Redis.
	Name string
	// HostID is this host's id in the fleet; empty: the hostname (the
	// daemon fills it).
	HostID string
	// Interval is the sync interval of shares and heartbeats.
	Interval time.Duration
	// Lists shares run-time deny/allow entries (default true).
	Lists bool
	// Floor is the share of a fleet budget every active host gets at
	// least, in parts per million of budget ÷ hosts (default 10%).
	Floor uint32
	Redis FleetRedis
	Pos   Pos
}

// FleetRedis is the fleet's Redis connection.
type FleetRedis struct {
	// FromL7 is set when the file says redis: l7: Addrs and Timeout are
	// the decoded l7.redis's (FleetRedisFromL7).
	FromL7 bool
	// Addrs is one address (a single server), or several cluster seeds.
	Addrs []string
	// Cluster uses the Redis Cluster protocol (implied by two or more
	// addresses).
	Cluster bool
	// Username and PasswordFile are the AUTH credentials; the file holds
	// the password (trailing newline ignored) and is read when the daemon
	// connects, never logged.
	Username     string
	PasswordFile string
	// TLS, when set, connects with TLS.
	TLS *FleetTLS
	// Timeout bounds one round trip (default 200ms).
	Timeout time.Duration
	// DB is the database number (single server only).
	DB int
}

// FleetTLS is fleet.redis.tls.
type FleetTLS struct {
	// CAFile verifies the server (default: the system roots).
	CAFile string
	// CertFile and KeyFile are a client certificate (both or neither).
	CertFile, KeyFile string
	// ServerName overrides the name checked in the server's certificate.
	ServerName string
}

// Fleet defaults and bounds.
const (
	DefaultFleetInterval = time.Second
	minFleetInterval     = 100 * time.Millisecond
	maxFleetInterval     = time.Minute
	DefaultFleetTimeout  = 200 * time.Millisecond
	DefaultFleetFloor    = 100_000 // 10% of budget ÷ hosts
	maxFleetSeeds        = 64
)

var fleetNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// hostIDRE bounds host ids: they are Redis key parts and metric label
// values (one per host of the fleet, never per source).
var hostIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// ValidHostID reports whether s may name a host of a fleet (the hostname
// the daemon takes by default is checked against it too).
func ValidHostID(s string) bool { return hostIDRE.MatchString(s) }

// fleetTable is the fleet: section.
var fleetTable = yamlcheck.NewTable("fleet",
	yamlcheck.Val("name", yamlcheck.Pattern{RE: fleetNameRE, Want: "use 1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit"},
		func(f *Fleet) *string { return &f.Name }, "the fleet's name, part of every Redis key; the same on all its hosts").
		Required("fleet needs a name (all hosts of one fleet use the same name)"),
	yamlcheck.Val("host_id", yamlcheck.Pattern{RE: hostIDRE, Want: "use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"},
		func(f *Fleet) *string { return &f.HostID }, "this host's id in the fleet; by default the hostname"),
	yamlcheck.Val("interval", yamlcheck.Duration{Min: minFleetInterval, Max: maxFleetInterval},
		func(f *Fleet) *time.Duration { return &f.Interval }, "the sync interval of shares and heartbeats"),
	yamlcheck.Val("lists", yamlcheck.Bool{}, func(f *Fleet) *bool { return &f.Lists }, "share run-time deny and allow entries"),
	yamlcheck.Val[Fleet, uint32]("floor", reserve, func(f *Fleet) *uint32 { return &f.Floor },
		"the share of a fleet budget every active host gets at least, of budget ÷ hosts"),
	yamlcheck.Val[Fleet, FleetRedis]("redis", fleetRedisKind{}, func(f *Fleet) *FleetRedis { return &f.Redis },
		"the Redis the fleet shares: {addrs: [host:port, ...], ...} (below), or l7 to use l7.redis").
		Required("fleet needs redis: {addrs: [host:port]} (or redis: l7 to use l7.redis)"),
)

// fleetRedisTable is fleet.redis.
var fleetRedisTable = yamlcheck.NewTable("fleet.redis",
	yamlcheck.Val("addrs", yamlcheck.List[string]{Of: yamlcheck.HostPort{Like: "198.18.0.1:6379 or [fd00::1]:6379"}, Min: 1, Max: maxFleetSeeds},
		func(r *FleetRedis) *[]string { return &r.Addrs }, "one server's address, or Redis Cluster seeds").
		Required("fleet.redis needs addrs: [host:port, ...] (one server, or Redis Cluster seeds)"),
	yamlcheck.Val("cluster", yamlcheck.Bool{}, func(r *FleetRedis) *bool { return &r.Cluster },
		"use the Redis Cluster protocol; by default with two or more addrs"),
	yamlcheck.Val("username", yamlcheck.String{}, func(r *FleetRedis) *string { return &r.Username }, "the AUTH user"),
	yamlcheck.Val("password_file", yamlcheck.Path{}, func(r *FleetRedis) *string { return &r.PasswordFile },
		"a file holding the AUTH password (read when the daemon connects, never logged)"),
	yamlcheck.Val[FleetRedis, *FleetTLS]("tls", fleetTLSKind{}, func(r *FleetRedis) **FleetTLS { return &r.TLS },
		"connect with TLS: {ca_file, cert_file, key_file, server_name}"),
	yamlcheck.Val("timeout", yamlcheck.Duration{Min: 10 * time.Millisecond, Max: 10 * time.Second},
		func(r *FleetRedis) *time.Duration { return &r.Timeout }, "bound of one round trip"),
	yamlcheck.Val("db", yamlcheck.Uint[int]{Min: 0, Max: 15}, func(r *FleetRedis) *int { return &r.DB },
		"the database number (a single server only)"),
)

// fleetTLSTable is fleet.redis.tls.
var fleetTLSTable = yamlcheck.NewTable("fleet.redis.tls",
	yamlcheck.Val("ca_file", yamlcheck.Path{}, func(t *FleetTLS) *string { return &t.CAFile }, "verifies the server; by default the system roots"),
	yamlcheck.Val("cert_file", yamlcheck.Path{}, func(t *FleetTLS) *string { return &t.CertFile }, "a client certificate (with key_file)"),
	yamlcheck.Val("key_file", yamlcheck.Path{}, func(t *FleetTLS) *string { return &t.KeyFile }, "the client certificate's key"),
	yamlcheck.Val("server_name", yamlcheck.String{}, func(t *FleetTLS) *string { return &t.ServerName }, "the name checked in the server's certificate"),
)

func (ps *parser) fleet(n *yaml.Node) *Fleet {
	fl := defaultFleet()
	fl.Pos = yamlcheck.PosOf(n)
	if fleetTable.Parse(&ps.Checker, n, fl) == nil {
		return nil
	}
	return fl
}

// defaultFleet is what each field of a fleet: section defaults to.
func defaultFleet() *Fleet {
	return &Fleet{Interval: DefaultFleetInterval, Lists: true, Floor: DefaultFleetFloor, Redis: FleetRedis{Timeout: DefaultFleetTimeout}}
}

// fleetRedisKind is fleet.redis: l7, or a mapping (fleetRedisTable).
type fleetRedisKind struct{}

func (fleetRedisKind) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (FleetRedis, bool) {
	r := FleetRedis{Timeout: DefaultFleetTimeout}
	if n.Kind == yaml.ScalarNode && n.Value == "l7" {
		r.FromL7 = true
		return r, true
	}
	f := fleetRedisTable.ParseAt(c, n, where, &r)
	if f == nil {
		return r, true
	}
	if v, ok := f["cluster"]; ok {
		if !r.Cluster && len(r.Addrs) > 1 {
			c.Errorf(v, "fleet.redis.cluster: false with %d addrs; a single server takes one address", len(r.Addrs))
		}
	} else {
		r.Cluster = len(r.Addrs) > 1
	}
	if v, ok := f["db"]; ok && r.Cluster && r.DB != 0 {
		c.Errorf(v, "fleet.redis.db: Redis Cluster has only database 0")
	}
	return r, true
}

func (fleetRedisKind) Format(r FleetRedis) string {
	if r.FromL7 {
		return "l7"
	}
	return fleetRedisTable.String(&r)
}

func (fleetRedisKind) Describe() string { return "l7, or a mapping (fleet.redis below)" }

// fleetTLSKind is fleet.redis.tls (fleetTLSTable); nil: no TLS.
type fleetTLSKind struct{}

func (fleetTLSKind) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (*FleetTLS, bool) {
	t := &FleetTLS{}
	if fleetTLSTable.ParseAt(c, n, where, t) == nil {
		return nil, false
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		c.Errorf(n, "fleet.redis.tls needs both cert_file and key_file, or neither")
	}
	return t, true
}

func (fleetTLSKind) Format(t *FleetTLS) string {
	if t == nil {
		return "off"
	}
	return fleetTLSTable.String(t)
}

func (fleetTLSKind) Describe() string { return "a mapping (fleet.redis.tls below)" }

// checkFleet checks what the fleet: section and the rules' scopes need of
// each other: a scope: fleet rule needs a fleet: section and an aggregate
// budget to share. (What redis: l7 needs of the l7: section is checked
// where l7: is decoded: FleetRedisFromL7.)
func (ps *parser) checkFleet(p *Policy) {
	for _, r := range p.Rules {
		if r.Scope != ScopeFleet {
			continue
		}
		n := &yaml.Node{Line: r.Pos.Line, Column: r.Pos.Column}
		if p.Fleet == nil {
			ps.Errorf(n, "rule %s has scope: fleet, which needs a fleet: section (name, redis)", r.Name)
		}
		if r.Action != ActionLimit || (!r.Limits.PerASN.IsSet() && !r.Limits.PerPrefix.IsSet()) {
			ps.Errorf(n, "rule %s has scope: fleet but no per_prefix or per_asn budget to share (per_source limits stay per host)", r.Name)
		}
	}
}

// FleetRedisFromL7 gives a fleet with redis: l7 the address and timeout of
// the decoded l7.redis (addr "": the l7: section has no redis:, or none).
// internal/policy keeps l7: as written and cannot decode it (internal/l7
// imports it): whoever decodes it calls this, and reports the problem it
// returns with the l7: section's.
func (p *Policy) FleetRedisFromL7(addr string, timeout time.Duration) []Problem {
	if p.Fleet == nil || !p.Fleet.Redis.FromL7 {
		return nil
	}
	if addr == "" {
		return []Problem{{File: p.File, Pos: p.Fleet.Pos, Msg: "fleet.redis: l7 needs an l7: redis: addr: section"}}
	}
	p.Fleet.Redis.Addrs = []string{addr}
	p.Fleet.Redis.Timeout = timeout
	return nil
}

// fleet reports changes of the fleet: section and of the rules' scopes
// (neither reaches the compiled policy).
func (d *differ) fleet(a, b *Policy) {
	fa, fb := a.Fleet, b.Fleet
	switch {
	case fa == nil && fb != nil:
		d.add('+', "fleet section: %s", fleetTable.String(fb))
	case fa != nil && fb == nil:
		d.add('-', "fleet section")
	case fa != nil && fb != nil:
		fleetTable.DiffWith("fleet ", fa, fb, d.emit)
	}
	scopes := map[string]Scope{}
	for _, r := range a.Rules {
		scopes[r.Name] = r.Scope
	}
	for _, r := range b.Rules {
		if old, ok := scopes[r.Name]; ok && old != r.Scope {
			d.field("rule "+r.Name+" scope", string(old), string(r.Scope))
		}
	}
}
