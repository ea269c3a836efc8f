// Package rls is Edgeguard's rate-limit service for proxies that stay in
// front: Envoy's RLS v3 over gRPC (envoy.service.ratelimit.v3, Envoy's own
// generated types), and an HTTP subrequest endpoint for nginx auth_request
// and Traefik ForwardAuth. It decides with the L7 stage's engine: the
// policy's l7: limits (internal/l7/proxy's decoder, algorithms and Redis
// rules), l7.Store for the local backend, redislimit for Redis, the same
// draft-10 RateLimit headers and the same escalation to the XDP deny list.
// See docs/l7-rls.md.
package rls

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/accesslog"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// Bounds of a request and of the configuration.
const (
	// MaxDescriptors is the most descriptors one request may carry.
	MaxDescriptors = 64
	// MaxEntries is the most entries one descriptor may carry.
	MaxEntries = 16
	// MaxValue bounds an entry's key and value, in bytes.
	MaxValue = 1024
	// MaxHitsAddend bounds hits_addend.
	MaxHitsAddend = 1 << 32
)

// Config is a decoded rls: section, with what it takes from the rest of
// the l7: section.
type Config struct {
	// Listen is the gRPC service's host:port ("" for none).
	Listen string
	// Unix is the gRPC service's Unix socket path ("" for none).
	Unix string
	// TLS, when set, serves gRPC over TLS on Listen.
	TLS *TLS
	// HTTPListen is the subrequest endpoint's host:port ("" for none).
	HTTPListen string
	// Rules are matched against each descriptor in order; the first match
	// decides it.
	Rules []Rule

	// From the l7: section.
	ClientPrefixV4, ClientPrefixV6 int
	// Classes is l7.classes: when enabled, a request that names its client
	// (remote_address) is charged as the client's class in the class
	// table the L7 stage uses (docs/l7-rls.md, "Client classes").
	Classes        proxy.Classes
	Redis          *proxy.Redis
	Escalation     proxy.Escalation
	Headers        proxy.Headers
	TrustedProxies []netip.Prefix // for the subrequest endpoint's ?forwarded=1

	// From the policy's standing: section (the daemon sets it):
	// standing.established_after, the L7 history a client needs to rank
	// as established.
	EstablishedAfter time.Duration
	// AccessLog is the l7: section's access log (l7.access_log), owned by
	// the L7 stage (stage.Change.AccessLog: it opens, reopens on SIGUSR1
	// and closes it); the service writes one line per decision through it.
	// The daemon sets it; nil writes none.
	AccessLog *accesslog.Log
}

// TLS is the gRPC listener's certificate, and the CA that client
// certificates must chain to (mutual TLS) when ClientCA is set.
type TLS struct {
	Cert, Key, ClientCA string
}

// Rule is a descriptor's limits: it matches descriptors of Domain whose
// entries have exactly Entries' keys, in order, and the fixed values.
type Rule struct {
	Name    string
	Domain  string
	Entries []EntryMatch
	Limits  []proxy.Limit
	Tiers   *Tiers
}

// aggregateKeys are the descriptor entries of Envoy's rate limit actions
// whose values name no client: a fixed string (generic_key,
// header_value_match's header_match), a cluster, or a prefix of
// addresses (masked_remote_address).
var aggregateKeys = map[string]bool{"generic_key": true, "header_match": true, "destination_cluster": true,
	"source_cluster": true, "masked_remote_address": true}

// Aggregate reports whether r counts an aggregate of clients: each of its
// entries has a fixed value or is one of Envoy's aggregate actions
// (aggregateKeys). A rule with remote_address, or with an entry whose
// value could name a client (a request header, metadata), is personal.
// An aggregate rule's local limits take the reserve of a route limit keyed
// on global or prefix by default (DefaultAggregateReserve).
func (r Rule) Aggregate() bool {
	for _, e := range r.Entries {
		if e.Value == "" && !aggregateKeys[e.Key] {
			return false
		}
	}
	return len(r.Entries) > 0
}

// EntryMatch is one entry of a rule's descriptor: a key, and a value it
// must have ("" matches any value).
type EntryMatch struct {
	Key, Value string
}

// String is the entry as written in the policy.
func (e EntryMatch) String() string {
	if e.Value == "" {
		return e.Key
	}
	return e.Key + "=" + e.Value
}

// Tiers adds limits by the value of one of the descriptor's entries.
type Tiers struct {
	Entry   string
	Default string
	Levels  []proxy.Tier
}

// Decode decodes cfg.RLS (nil: no rate-limit service) with the rest of
// cfg. Problems are reported with positions in file.
func Decode(cfg *proxy.Config, file string) (*Config, []policy.Problem) {
	if cfg == nil || cfg.RLS == nil {
		return nil, nil
	}
	ld := proxy.NewLimitDecoder(file, cfg)
	c := ld.Checker()
	out := &Config{ClientPrefixV4: cfg.ClientPrefixV4, ClientPrefixV6: cfg.ClientPrefixV6, Classes: cfg.Classes, Redis: cfg.Redis,
		Escalation: cfg.Escalation, Headers: cfg.Headers, TrustedProxies: cfg.TrustedProxies}
	f := c.Fields(cfg.RLS, "l7 rls", "listen", "unix", "tls", "http_listen", "rules")
	if f == nil {
		return nil, ld.Problems()
	}
	hostPort := func(key string) string {
		n, ok := f[key]
		if !ok {
			return ""
		}
		s, ok := c.Scalar(n, "rls "+key)
		if !ok {
			return ""
		}
		_, port, err := net.SplitHostPort(s)
		if err == nil {
			var p int
			if p, err = strconv.Atoi(port); err == nil && (p < 0 || p > 65535) {
				err = fmt.Errorf("port out of range")
			}
		}
		if err != nil {
			c.Errorf(n, "rls %s %q: want host:port, e.g. 127.0.0.1:8081", key, s)
			return ""
		}
		return s
	}
	out.Listen = hostPort("listen")
	out.HTTPListen = hostPort("http_listen")
	if n, ok := f["unix"]; ok {
		if s, ok := c.Scalar(n, "rls unix"); ok {
			if !filepath.IsAbs(s) || strings.HasSuffix(s, "/") || len(s) > 100 {
				c.Errorf(n, "rls unix %q: want an absolute socket path of at most 100 bytes", s)
			} else {
				out.Unix = filepath.Clean(s)
			}
		}
	}
	if _, ok := f["listen"]; !ok {
		if _, ok := f["unix"]; !ok {
			if _, ok := f["http_listen"]; !ok {
				c.Errorf(cfg.RLS, "l7 rls: set listen (gRPC on TCP), unix (gRPC on a Unix socket) or http_listen (the subrequest endpoint)")
			}
		}
	}
	if n, ok := f["tls"]; ok {
		tf := c.Fields(n, "rls tls", "cert", "key", "client_ca")
		t := &TLS{}
		for _, x := range []struct {
			key string
			dst *string
		}{{"cert", &t.Cert}, {"key", &t.Key}, {"client_ca", &t.ClientCA}} {
			if v, ok := tf[x.key]; ok {
				if s, ok := c.Scalar(v, "rls tls "+x.key); ok {
					if !filepath.IsAbs(s) {
						c.Errorf(v, "rls tls %s %q: want an absolute file path", x.key, s)
					}
					*x.dst = s
				}
			}
		}
		if t.Cert == "" || t.Key == "" {
			c.Errorf(n, "rls tls: cert and key are required")
		}
		if _, ok := f["listen"]; !ok {
			c.Errorf(n, "rls tls: applies to listen (gRPC on TCP), which is not set")
		}
		out.TLS = t
	}
	if n, ok := f["rules"]; ok {
		names := map[string]*yaml.Node{}
		shapes := map[string]*yaml.Node{}
		for _, rn := range c.Seq(n, "rls rules") {
			r, ok := decodeRule(ld, rn, cfg.Redis)
			if !ok {
				continue
			}
			if prev := names[r.Name]; prev != nil {
				c.Errorf(rn, "rls rule %q is already defined at line %d", r.Name, prev.Line)
				continue
			}
			names[r.Name] = rn
			shape := r.Domain + "\x00" + entriesString(r.Entries)
			if prev := shapes[shape]; prev != nil {
				c.Errorf(rn, "rls rule %q: domain %q and descriptor [%s] are already matched by the rule at line %d",
					r.Name, r.Domain, entriesString(r.Entries), prev.Line)
				continue
			}
			shapes[shape] = rn
			out.Rules = append(out.Rules, r)
		}
	}
	if p := ld.Problems(); len(p) > 0 {
		return nil, p
	}
	return out, nil
}

func entriesString(es []EntryMatch) string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.String()
	}
	return strings.Join(s, ", ")
}

func decodeRule(ld *proxy.LimitDecoder, n *yaml.Node, rc *proxy.Redis) (Rule, bool) {
	c := ld.Checker()
	f := c.Fields(n, "rls rule", "name", "domain", "descriptor", "limits", "tiers")
	if f == nil {
		return Rule{}, false
	}
	var r Rule
	ok := true
	if v, has := f["name"]; has {
		r.Name, ok = ld.Name(v, "rls rule name")
	} else {
		c.Errorf(n, "rls rule: name is required")
		ok = false
	}
	where := fmt.Sprintf("rls rule %q", r.Name)
	if v, has := f["domain"]; has {
		if s, sok := c.Scalar(v, where+" domain"); sok && s != "" && len(s) <= MaxValue {
			r.Domain = s
		} else {
			c.Errorf(v, "%s domain: want a non-empty string", where)
			ok = false
		}
	} else {
		c.Errorf(n, "%s: domain is required (the domain Envoy's rate limit filter sends)", where)
		ok = false
	}
	if v, has := f["descriptor"]; has {
		keys := map[string]bool{}
		for _, e := range c.Seq(v, where+" descriptor") {
			s, sok := c.Scalar(e, where+" descriptor entry")
			if !sok {
				ok = false
				continue
			}
			k, val, _ := strings.Cut(s, "=")
			if k == "" || len(k) > MaxValue || len(val) > MaxValue || keys[k] {
				c.Errorf(e, "%s descriptor entry %q: want KEY or KEY=VALUE, each key once", where, s)
				ok = false
				continue
			}
			keys[k] = true
			r.Entries = append(r.Entries, EntryMatch{Key: k, Value: val})
		}
		if len(r.Entries) == 0 || len(r.Entries) > MaxEntries {
			c.Errorf(v, "%s descriptor: want 1 to %d entries, e.g. [remote_address] or [generic_key=api, remote_address]", where, MaxEntries)
			ok = false
		}
	} else {
		c.Errorf(n, "%s: descriptor is required, e.g. [remote_address]", where)
		ok = false
	}
	if v, has := f["limits"]; has {
		r.Limits = ld.Limits(v, where, rc, r.Aggregate())
	}
	if v, has := f["tiers"]; has {
		r.Tiers = decodeTiers(ld, v, where, rc, r.Entries)
	}
	if len(r.Limits) == 0 && r.Tiers == nil {
		c.Errorf(n, "%s: limits or tiers are required", where)
		ok = false
	}
	most := 0
	if r.Tiers != nil {
		for _, t := range r.Tiers.Levels {
			most = max(most, countLocal(t.Limits))
		}
	}
	if n0 := countLocal(r.Limits) + most; n0 > l7.MaxChecks {
		c.Errorf(n, "%s: %d local limits apply to one descriptor (rule plus largest tier); at most %d", where, n0, l7.MaxChecks)
		ok = false
	}
	for _, l := range r.Limits {
		if l.Shape {
			c.Errorf(n, "%s limit %q: shape: true is not supported by the rate-limit service (it answers, it does not hold requests)", where, l.Name)
			ok = false
		}
	}
	return r, ok
}

func countLocal(ls []proxy.Limit) int {
	n := 0
	for _, l := range ls {
		if !l.Shared() {
			n++
		}
	}
	return n
}

func decodeTiers(ld *proxy.LimitDecoder, n *yaml.Node, where string, rc *proxy.Redis, entries []EntryMatch) *Tiers {
	aggregate := Rule{Entries: entries}.Aggregate()
	c := ld.Checker()
	f := c.Fields(n, where+" tiers", "entry", "default", "levels")
	if f == nil {
		return nil
	}
	t := &Tiers{}
	if v, ok := f["entry"]; ok {
		if s, ok := c.Scalar(v, where+" tiers entry"); ok {
			found := false
			for _, e := range entries {
				found = found || (e.Key == s && e.Value == "")
			}
			if !found {
				c.Errorf(v, "%s tiers entry %q: want one of the descriptor's keys without a fixed value", where, s)
			}
			t.Entry = s
		}
	} else {
		c.Errorf(n, "%s tiers: entry is required (the descriptor key naming the tier)", where)
	}
	if v, ok := f["default"]; ok {
		t.Default, _ = ld.Name(v, "tiers default")
	}
	if v, ok := f["levels"]; ok {
		v = yamlcheck.Resolve(v)
		if v.Kind != yaml.MappingNode {
			c.Errorf(v, "%s tiers levels must be a mapping of tier name to limits, got %s", where, yamlcheck.KindName(v))
		} else {
			for i := 0; i+1 < len(v.Content); i += 2 {
				name, ok := ld.Name(yamlcheck.Resolve(v.Content[i]), "tier name")
				ls := ld.Limits(v.Content[i+1], fmt.Sprintf("%s tier %q", where, name), rc, aggregate)
				for _, l := range ls {
					if l.Shape {
						c.Errorf(v.Content[i+1], "%s tier %q limit %q: shape: true is not supported by the rate-limit service", where, name, l.Name)
					}
				}
				if ok {
					t.Levels = append(t.Levels, proxy.Tier{Name: name, Limits: ls})
				}
			}
		}
	}
	if t.Default != "" {
		found := false
		for _, x := range t.Levels {
			found = found || x.Name == t.Default
		}
		if !found {
			c.Errorf(f["default"], "tiers default %q is not one of the levels", t.Default)
		}
	}
	return t
}
