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
	"cmp"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
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
	got := rlsTable(func(n *yaml.Node) []Rule { return decodeRules(ld, n, cfg.Redis) }).Parse(c, cfg.RLS, out)
	if got == nil {
		return nil, ld.Problems()
	}
	_, listen := got["listen"]
	_, unix := got["unix"]
	_, httpListen := got["http_listen"]
	if !listen && !unix && !httpListen {
		c.Errorf(cfg.RLS, "l7 rls: set listen (gRPC on TCP), unix (gRPC on a Unix socket) or http_listen (the subrequest endpoint)")
	}
	if n, ok := got["tls"]; ok && !listen {
		c.Errorf(n, "rls tls: applies to listen (gRPC on TCP), which is not set")
	}
	if p := ld.Problems(); len(p) > 0 {
		slices.SortStableFunc(p, func(a, b policy.Problem) int {
			return cmp.Or(cmp.Compare(a.Pos.Line, b.Pos.Line), cmp.Compare(a.Pos.Column, b.Pos.Column))
		})
		return nil, p
	}
	return out, nil
}

// rlsTable is the rls: section; its rules are decoded by rules (with the
// limit names of the whole l7: section).
func rlsTable(rules func(n *yaml.Node) []Rule) *yamlcheck.Table[Config] {
	return yamlcheck.NewTable("l7 rls",
		yamlcheck.Val("listen", proxy.Named("rls listen", proxy.ListenAddr), func(c *Config) *string { return &c.Listen },
			"Envoy RLS v3 over gRPC on TCP; bound at apply (a taken port fails the apply, nothing changes); kept across reloads that keep it").
			Formatted(func(c *Config) string { return cmp.Or(c.Listen, "none") }),
		yamlcheck.Val("unix", proxy.Named[string]("rls unix", unixSocket{}), func(c *Config) *string { return &c.Unix },
			"the same service on a Unix socket (mode 0660); a stale socket is removed, a live one or a non-socket fails the apply"),
		yamlcheck.Val("tls", proxy.Named("rls tls", tlsSection), func(c *Config) **TLS { return &c.TLS },
			"TLS for `listen` (PEM files read at every apply; `client_ca` requires client certificates); needs `listen`"),
		yamlcheck.Val("http_listen", proxy.Named("rls http_listen", proxy.ListenAddr), func(c *Config) *string { return &c.HTTPListen },
			"the subrequest endpoint `/v1/check/{domain}` for nginx `auth_request` and Traefik `ForwardAuth`").
			Formatted(func(c *Config) string { return cmp.Or(c.HTTPListen, "none") }),
		yamlcheck.Val("rules", yamlcheck.Kind[[]Rule](ruleList{proxy.Decoded("list of rules (below)", func(_ *yamlcheck.Checker, n *yaml.Node, _ string) []Rule {
			return rules(n)
		})}), func(c *Config) *[]Rule { return &c.Rules },
			"descriptor rules, first match per descriptor; at least one of `listen`, `unix`, `http_listen` must be set. With `l7.classes` enabled a request is ranked by its first `remote_address` in the class table the proxy uses (docs/l7-rls.md, \"Client classes\")"),
	)
}

var tlsTable = yamlcheck.NewTable("rls tls",
	yamlcheck.Val("cert", proxy.Named[string]("rls tls cert", absPath{}), func(t *TLS) *string { return &t.Cert },
		"the server certificate, PEM").Formatted(func(t *TLS) string { return cmp.Or(t.Cert, "required") }),
	yamlcheck.Val("key", proxy.Named[string]("rls tls key", absPath{}), func(t *TLS) *string { return &t.Key },
		"its private key, PEM").Formatted(func(t *TLS) string { return cmp.Or(t.Key, "required") }),
	yamlcheck.Val("client_ca", proxy.Named[string]("rls tls client_ca", absPath{}), func(t *TLS) *string { return &t.ClientCA },
		"when set, clients must present a certificate that chains to it (mutual TLS)"),
)

// tlsSection is rls.tls.
var tlsSection = proxy.Section(tlsTable, func() TLS { return TLS{} },
	func(c *yamlcheck.Checker, n *yaml.Node, _ string, _ map[string]*yaml.Node, t *TLS) {
		if t.Cert == "" || t.Key == "" {
			c.Errorf(n, "rls tls: cert and key are required")
		}
	})

// decodeRules decodes rls.rules: names unique, one rule per domain and
// descriptor.
func decodeRules(ld *proxy.LimitDecoder, n *yaml.Node, rc *proxy.Redis) []Rule {
	c := ld.Checker()
	var out []Rule
	names := map[string]*yaml.Node{}
	shapes := map[string]*yaml.Node{}
	for _, rn := range c.Seq(n, "rls rules") {
		r, ok := decodeRule(ld, rn, rc)
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
		out = append(out, r)
	}
	return out
}

// unixSocket is rls.unix: an absolute socket path of at most 100 bytes.
type unixSocket struct{}

// Parse implements yamlcheck.Kind.
func (unixSocket) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	if !filepath.IsAbs(s) || strings.HasSuffix(s, "/") || len(s) > 100 {
		c.Errorf(n, "%s %q: want an absolute socket path of at most 100 bytes", where, s)
		return "", false
	}
	return filepath.Clean(s), true
}

// Format implements yamlcheck.Kind.
func (unixSocket) Format(s string) string { return cmp.Or(s, "none") }

// Describe implements yamlcheck.Kind.
func (unixSocket) Describe() string { return "absolute path, at most 100 bytes" }

// absPath is an absolute file path.
type absPath struct{}

// Parse implements yamlcheck.Kind.
func (absPath) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if ok && !filepath.IsAbs(s) {
		c.Errorf(n, "%s %q: want an absolute file path", where, s)
	}
	return s, ok
}

// Format implements yamlcheck.Kind.
func (absPath) Format(s string) string { return cmp.Or(s, "none") }

// Describe implements yamlcheck.Kind.
func (absPath) Describe() string { return "absolute file path" }

func entriesString(es []EntryMatch) string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.String()
	}
	return strings.Join(s, ", ")
}

func decodeRule(ld *proxy.LimitDecoder, n *yaml.Node, rc *proxy.Redis) (Rule, bool) {
	c := ld.Checker()
	var r Rule
	bad := false
	got := ruleTable(ld, &r, &bad, rc).ParseAt(c, n, "rls rule", &r)
	if got == nil {
		return Rule{}, false
	}
	ok := !bad && r.Name != ""
	where := fmt.Sprintf("rls rule %q", r.Name)
	if _, has := got["domain"]; !has {
		c.Errorf(n, "%s: domain is required (the domain Envoy's rate limit filter sends)", where)
		ok = false
	}
	if _, has := got["descriptor"]; !has {
		c.Errorf(n, "%s: descriptor is required, e.g. [remote_address]", where)
		ok = false
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

// ruleTable is the table of rule r; a problem in its name, domain or
// descriptor sets *bad.
func ruleTable(ld *proxy.LimitDecoder, r *Rule, bad *bool, rc *proxy.Redis) *yamlcheck.Table[Rule] {
	where := func() string { return fmt.Sprintf("rls rule %q", r.Name) }
	return yamlcheck.NewTable("rls rule",
		yamlcheck.Val("name", proxy.Marking(bad, proxy.Named("rls rule name", proxy.NameKind)), func(r *Rule) *string { return &r.Name },
			"unique").Formatted(func(r *Rule) string { return cmp.Or(r.Name, "required") }).Required("rls rule: name is required"),
		yamlcheck.Val("domain", proxy.Marking(bad, proxy.At(where, "", proxy.Custom("text", func(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
			if s, ok := c.Scalar(n, where+" domain"); ok && s != "" && len(s) <= MaxValue {
				return s, true
			}
			c.Errorf(n, "%s domain: want a non-empty string", where)
			return "", false
		}))), func(r *Rule) *string { return &r.Domain }, "the domain Envoy's rate limit filter sends").
			Formatted(func(r *Rule) string { return cmp.Or(r.Domain, "required") }),
		yamlcheck.Val("descriptor", proxy.At(where, "", proxy.Custom("list of KEY or KEY=VALUE",
			func(c *yamlcheck.Checker, n *yaml.Node, where string) ([]EntryMatch, bool) {
				// The entries decoded, even with a problem, still decide
				// the limits' default reserve and the tiers' entry.
				es, ok := decodeDescriptor(c, n, where)
				*bad = *bad || !ok
				return es, true
			})),
			func(r *Rule) *[]EntryMatch { return &r.Entries },
			"1-16 entries, each `KEY` or `KEY=VALUE`, a key once; matches descriptors with exactly these keys in this order and the fixed values").
			Formatted(func(r *Rule) string {
				if len(r.Entries) == 0 {
					return "required"
				}
				return entriesString(r.Entries)
			}),
		yamlcheck.Val("limits", proxy.At(where, "", proxy.LimitList(proxy.Custom("list of limits", func(_ *yamlcheck.Checker, n *yaml.Node, where string) ([]proxy.Limit, bool) {
			return ld.Limits(n, where, rc, r.Aggregate()), true
		}))), func(r *Rule) *[]proxy.Limit { return &r.Limits },
			"route limits without `key`, `shape` refused; `reserve` defaults to 50% for a descriptor that counts an aggregate of clients (every entry a fixed value or one of `generic_key`, `header_match`, `destination_cluster`, `source_cluster`, `masked_remote_address`), 0% otherwise"),
		yamlcheck.Val("tiers", tiersKind{proxy.At(where, "", proxy.Custom("mapping (below)", func(_ *yamlcheck.Checker, n *yaml.Node, where string) (*Tiers, bool) {
			t := decodeTiers(ld, n, where, rc, r.Entries)
			return t, t != nil
		}))}, func(r *Rule) **Tiers { return &r.Tiers },
			"`{entry: KEY, default: NAME, levels: {NAME: [limits]}}`, `entry` one of the descriptor's keys without a fixed value"),
	)
}

// tiersKind is a rule's tiers: "none" or "set" on one line, diffed field
// by field (levels by name, their limits by name).
type tiersKind struct{ yamlcheck.Kind[*Tiers] }

// Format implements yamlcheck.Kind.
func (tiersKind) Format(t *Tiers) string {
	if t == nil {
		return "none"
	}
	return "set"
}

// Diff implements yamlcheck.Differ.
func (k tiersKind) Diff(label string, a, b *Tiers, emit func(op byte, text string)) {
	if a == nil || b == nil {
		if x, y := k.Format(a), k.Format(b); x != y {
			emit('~', label+" "+x+" -> "+y)
		}
		return
	}
	tiersTable(nil, "", nil, nil).DiffWith(label+".", a, b, emit)
}

// decodeDescriptor decodes a rule's descriptor (where: the rule).
func decodeDescriptor(c *yamlcheck.Checker, v *yaml.Node, where string) ([]EntryMatch, bool) {
	var out []EntryMatch
	ok := true
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
		out = append(out, EntryMatch{Key: k, Value: val})
	}
	if len(out) == 0 || len(out) > MaxEntries {
		c.Errorf(v, "%s descriptor: want 1 to %d entries, e.g. [remote_address] or [generic_key=api, remote_address]", where, MaxEntries)
		ok = false
	}
	return out, ok
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

// tiersTable is the table of a rule's tiers (where: the rule, entries:
// its descriptor).
func tiersTable(ld *proxy.LimitDecoder, where string, rc *proxy.Redis, entries []EntryMatch) *yamlcheck.Table[Tiers] {
	aggregate := Rule{Entries: entries}.Aggregate()
	return yamlcheck.NewTable("tiers",
		yamlcheck.Val("entry", proxy.Named(where+" tiers entry", proxy.Custom("descriptor key", func(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
			s, ok := c.Scalar(n, where)
			if !ok {
				return "", false
			}
			found := false
			for _, e := range entries {
				found = found || (e.Key == s && e.Value == "")
			}
			if !found {
				c.Errorf(n, "%s %q: want one of the descriptor's keys without a fixed value", where, s)
			}
			return s, true
		})), func(t *Tiers) *string { return &t.Entry }, "the descriptor key naming the tier").
			Formatted(func(t *Tiers) string { return cmp.Or(t.Entry, "required") }),
		yamlcheck.Val("default", proxy.Named("tiers default", proxy.NameKind), func(t *Tiers) *string { return &t.Default },
			"the tier of a descriptor whose entry names no level (none: no tier limits)"),
		yamlcheck.Val("levels", proxy.TierList(proxy.Custom("mapping of tier name to limits", func(c *yamlcheck.Checker, v *yaml.Node, _ string) ([]proxy.Tier, bool) {
			v = yamlcheck.Resolve(v)
			if v.Kind != yaml.MappingNode {
				c.Errorf(v, "%s tiers levels must be a mapping of tier name to limits, got %s", where, yamlcheck.KindName(v))
				return nil, false
			}
			var out []proxy.Tier
			for i := 0; i+1 < len(v.Content); i += 2 {
				name, ok := ld.Name(yamlcheck.Resolve(v.Content[i]), "tier name")
				ls := ld.Limits(v.Content[i+1], fmt.Sprintf("%s tier %q", where, name), rc, aggregate)
				for _, l := range ls {
					if l.Shape {
						c.Errorf(v.Content[i+1], "%s tier %q limit %q: shape: true is not supported by the rate-limit service", where, name, l.Name)
					}
				}
				if ok {
					out = append(out, proxy.Tier{Name: name, Limits: ls})
				}
			}
			return out, true
		})), func(t *Tiers) *[]proxy.Tier { return &t.Levels }, "each tier's limits, added to the rule's"),
	)
}

func decodeTiers(ld *proxy.LimitDecoder, n *yaml.Node, where string, rc *proxy.Redis, entries []EntryMatch) *Tiers {
	c := ld.Checker()
	t := &Tiers{}
	got := tiersTable(ld, where, rc, entries).ParseAt(c, n, where+" tiers", t)
	if got == nil {
		return nil
	}
	if _, ok := got["entry"]; !ok {
		c.Errorf(n, "%s tiers: entry is required (the descriptor key naming the tier)", where)
	}
	proxy.CheckTierDefault(c, got["default"], t.Default, t.Levels)
	return t
}
