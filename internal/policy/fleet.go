package policy

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
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
	// copied from l7.redis.
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

func (ps *parser) fleet(n *yaml.Node) *Fleet {
	f := ps.Fields(n, "fleet", "name", "host_id", "interval", "lists", "floor", "redis")
	if f == nil {
		return nil
	}
	fl := &Fleet{Interval: DefaultFleetInterval, Lists: true, Floor: DefaultFleetFloor, Pos: yamlcheck.PosOf(n)}
	if v, ok := f["name"]; !ok {
		ps.Errorf(n, "fleet needs a name (all hosts of one fleet use the same name)")
	} else if s, ok := ps.Scalar(v, "fleet.name"); ok {
		if !fleetNameRE.MatchString(s) {
			ps.Errorf(v, "fleet.name %q: use 1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", s)
		} else {
			fl.Name = s
		}
	}
	if v, ok := f["host_id"]; ok {
		if s, ok := ps.Scalar(v, "fleet.host_id"); ok {
			if !ValidHostID(s) {
				ps.Errorf(v, "fleet.host_id %q: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", s)
			} else {
				fl.HostID = s
			}
		}
	}
	if v, ok := f["interval"]; ok {
		fl.Interval = ps.duration(v, "fleet.interval", minFleetInterval, maxFleetInterval, fl.Interval)
	}
	if v, ok := f["lists"]; ok {
		fl.Lists = ps.boolean(v, "fleet.lists", fl.Lists)
	}
	if v, ok := f["floor"]; ok {
		if s, ok := ps.Scalar(v, "fleet.floor"); ok {
			ppm, err := ParseReserve(s)
			if err != nil {
				ps.Errorf(v, "fleet.floor: %v", err)
			} else {
				fl.Floor = ppm
			}
		}
	}
	if v, ok := f["redis"]; !ok {
		ps.Errorf(n, "fleet needs redis: {addrs: [host:port]} (or redis: l7 to use l7.redis)")
	} else {
		fl.Redis = ps.fleetRedis(v)
	}
	return fl
}

func (ps *parser) boolean(n *yaml.Node, where string, def bool) bool {
	s, ok := ps.Scalar(n, where)
	if !ok {
		return def
	}
	switch s {
	case "true":
		return true
	case "false":
		return false
	}
	ps.Errorf(n, "%s %q: want true or false", where, s)
	return def
}

func (ps *parser) hostPort(n *yaml.Node, where string) (string, bool) {
	s, ok := ps.Scalar(n, where)
	if !ok {
		return "", false
	}
	host, port, err := net.SplitHostPort(s)
	pn, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil || pn == 0 || host == "" {
		ps.Errorf(n, "%s %q: want host:port like 198.18.0.1:6379 or [fd00::1]:6379", where, s)
		return "", false
	}
	return s, true
}

func (ps *parser) fleetRedis(n *yaml.Node) FleetRedis {
	r := FleetRedis{Timeout: DefaultFleetTimeout}
	if n.Kind == yaml.ScalarNode && n.Value == "l7" {
		r.FromL7 = true
		return r
	}
	f := ps.Fields(n, "fleet.redis", "addrs", "cluster", "username", "password_file", "tls", "timeout", "db")
	if f == nil {
		return r
	}
	if v, ok := f["addrs"]; !ok {
		ps.Errorf(n, "fleet.redis needs addrs: [host:port, ...] (one server, or Redis Cluster seeds)")
	} else {
		items := ps.Seq(v, "fleet.redis.addrs")
		if len(items) == 0 {
			ps.Errorf(v, "fleet.redis.addrs is empty")
		}
		if len(items) > maxFleetSeeds {
			ps.Errorf(v, "fleet.redis.addrs: %d addresses, at most %d", len(items), maxFleetSeeds)
			items = items[:maxFleetSeeds]
		}
		for _, it := range items {
			if s, ok := ps.hostPort(it, "fleet.redis.addrs"); ok {
				r.Addrs = append(r.Addrs, s)
			}
		}
		r.Cluster = len(r.Addrs) > 1
	}
	if v, ok := f["cluster"]; ok {
		c := ps.boolean(v, "fleet.redis.cluster", r.Cluster)
		if !c && len(r.Addrs) > 1 {
			ps.Errorf(v, "fleet.redis.cluster: false with %d addrs; a single server takes one address", len(r.Addrs))
		}
		r.Cluster = c
	}
	if v, ok := f["username"]; ok {
		r.Username, _ = ps.Scalar(v, "fleet.redis.username")
	}
	if v, ok := f["password_file"]; ok {
		r.PasswordFile = ps.path(v, "fleet.redis.password_file")
	}
	if v, ok := f["timeout"]; ok {
		r.Timeout = ps.duration(v, "fleet.redis.timeout", 10*time.Millisecond, 10*time.Second, r.Timeout)
	}
	if v, ok := f["db"]; ok {
		if u, ok := ps.UintIn(v, "fleet.redis.db", 0, 15); ok {
			r.DB = int(u)
			if r.Cluster && u != 0 {
				ps.Errorf(v, "fleet.redis.db: Redis Cluster has only database 0")
			}
		}
	}
	if v, ok := f["tls"]; ok {
		tf := ps.Fields(v, "fleet.redis.tls", "ca_file", "cert_file", "key_file", "server_name")
		if tf != nil {
			t := &FleetTLS{}
			if x, ok := tf["ca_file"]; ok {
				t.CAFile = ps.path(x, "fleet.redis.tls.ca_file")
			}
			if x, ok := tf["cert_file"]; ok {
				t.CertFile = ps.path(x, "fleet.redis.tls.cert_file")
			}
			if x, ok := tf["key_file"]; ok {
				t.KeyFile = ps.path(x, "fleet.redis.tls.key_file")
			}
			if x, ok := tf["server_name"]; ok {
				t.ServerName, _ = ps.Scalar(x, "fleet.redis.tls.server_name")
			}
			if (t.CertFile == "") != (t.KeyFile == "") {
				ps.Errorf(v, "fleet.redis.tls needs both cert_file and key_file, or neither")
			}
			r.TLS = t
		}
	}
	return r
}

// path is a file path; a relative one is relative to the policy file.
func (ps *parser) path(n *yaml.Node, where string) string {
	s, ok := ps.Scalar(n, where)
	if !ok || s == "" {
		return ""
	}
	if !filepath.IsAbs(s) {
		s = filepath.Join(filepath.Dir(ps.File), s)
	}
	return s
}

// scope parses a rule's scope.
func (ps *parser) scope(n *yaml.Node, where string) Scope {
	return Scope(ps.enum(n, where+" scope", string(ScopeHost), string(ScopeHost), string(ScopeFleet)))
}

// checkFleet checks what the fleet: section and the rules' scopes need of
// each other: a scope: fleet rule needs a fleet: section and an aggregate
// budget to share; redis: l7 needs an l7.redis address.
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
	if p.Fleet == nil || !p.Fleet.Redis.FromL7 {
		return
	}
	addr, timeout := l7RedisAddr(p.L7)
	if addr == "" {
		ps.Errorf(&yaml.Node{Line: p.Fleet.Pos.Line, Column: p.Fleet.Pos.Column}, "fleet.redis: l7 needs an l7: redis: addr: section")
		return
	}
	p.Fleet.Redis.Addrs = []string{addr}
	if timeout > 0 {
		p.Fleet.Redis.Timeout = timeout
	}
}

// l7RedisAddr reads l7.redis.addr and l7.redis.timeout from the raw l7:
// section (the L7 stage's decoder validates them).
func l7RedisAddr(l7 *yaml.Node) (string, time.Duration) {
	get := func(n *yaml.Node, key string) *yaml.Node {
		n = yamlcheck.Resolve(n)
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				return yamlcheck.Resolve(n.Content[i+1])
			}
		}
		return nil
	}
	r := get(l7, "redis")
	a := get(r, "addr")
	if a == nil || a.Kind != yaml.ScalarNode {
		return "", 0
	}
	if _, _, err := net.SplitHostPort(a.Value); err != nil {
		return "", 0
	}
	var timeout time.Duration
	if t := get(r, "timeout"); t != nil && t.Kind == yaml.ScalarNode {
		if d, err := time.ParseDuration(t.Value); err == nil && d > 0 {
			timeout = d
		}
	}
	return a.Value, timeout
}

// fleet reports changes of the fleet: section and of the rules' scopes
// (neither reaches the compiled policy).
func (d *differ) fleet(a, b *Policy) {
	fa, fb := a.Fleet, b.Fleet
	switch {
	case fa == nil && fb != nil:
		d.add('+', "fleet section: %s", fleetSummary(fb))
	case fa != nil && fb == nil:
		d.add('-', "fleet section")
	case fa != nil && fb != nil:
		d.field("fleet", fleetSummary(fa), fleetSummary(fb))
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

// fleetSummary is one line of what a fleet: section says (the password
// itself is never in the policy, only its file).
func fleetSummary(f *Fleet) string {
	r := f.Redis
	s := fmt.Sprintf("name %s, host %s, interval %s, floor %s, lists %t, redis %s", f.Name, orNone(f.HostID), f.Interval,
		FormatReserve(f.Floor), f.Lists, strings.Join(r.Addrs, ","))
	if r.Cluster {
		s += " (cluster)"
	}
	if r.Username != "" || r.PasswordFile != "" {
		s += fmt.Sprintf(", auth %s %s", orNone(r.Username), orNone(r.PasswordFile))
	}
	if r.TLS != nil {
		s += fmt.Sprintf(", tls ca %s cert %s server %s", orNone(r.TLS.CAFile), orNone(r.TLS.CertFile), orNone(r.TLS.ServerName))
	}
	return s + fmt.Sprintf(", timeout %s, db %d", r.Timeout, r.DB)
}
