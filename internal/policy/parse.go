package policy

import (
	"fmt"
	"hash/fnv"
	"math/big"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// Parse validates a policy held in memory. file names it in messages and
// anchors relative list-file paths; readFile reads list files (os.ReadFile
// in production, a map in tests).
func Parse(file string, data []byte, readFile func(string) ([]byte, error)) (*Policy, error) {
	ps := &parser{Checker: yamlcheck.Checker{File: file, ReadFileFunc: readFile}}
	p := ps.parse(data)
	if len(ps.Problems) > 0 {
		sort.SliceStable(ps.Problems, func(i, j int) bool {
			a, b := ps.Problems[i], ps.Problems[j]
			if a.File != b.File {
				return a.File == file // the policy file first, then list files
			}
			if a.Pos.Line != b.Pos.Line {
				return a.Pos.Line < b.Pos.Line
			}
			return a.Pos.Column < b.Pos.Column
		})
		return nil, &ValidationError{File: file, Problems: ps.Problems}
	}
	return p, nil
}

// RuleID is a rule's stable id: a 32-bit FNV-1a hash of its name, so a rule
// keeps its id (and the data plane keeps its bucket state) across reloads as
// long as its name is unchanged. The default rule is 0.
func RuleID(name string) uint32 {
	if name == DefaultRuleName {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return h.Sum32()
}

type parser struct {
	yamlcheck.Checker
	// defaultReserveSet: defaults: writes a reserve, so rules inherit it
	// as if written (and its bound is checked).
	defaultReserveSet bool
	// claimed records which rule (and where) first matched each prefix,
	// ASN, country and L4 key, to report overlaps at the second one.
	claimed map[string]claim
}

type claim struct {
	where string
	pos   Pos
}

// claim reports a problem if key was claimed by an earlier match.
func (ps *parser) claim(n *yaml.Node, key, what, where string) bool {
	if ps.claimed == nil {
		ps.claimed = map[string]claim{}
	}
	if prev, dup := ps.claimed[key]; dup {
		ps.Errorf(n, "%s: %s is already matched by %s (line %d:%d); each one may belong to only one rule", where, what, prev.where, prev.pos.Line, prev.pos.Column)
		return false
	}
	ps.claimed[key] = claim{where: where, pos: yamlcheck.PosOf(n)}
	return true
}

func (ps *parser) parse(data []byte) *Policy {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		for _, se := range yamlcheck.SyntaxErrors(data, err) {
			ps.ErrorAt(ps.File, se.Pos, "yaml syntax: %s", se.Message)
		}
		return nil
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		ps.ErrorAt(ps.File, Pos{}, "empty policy file; it needs at least apiVersion: %s", APIVersion)
		return nil
	}
	root := yamlcheck.Resolve(doc.Content[0])
	p := &Policy{
		File:          ps.File,
		Mode:          ModeEnforce,
		Malformed:     VerdictPass,
		Clock:         ClockPrecise,
		Defaults:      defaultLimits(),
		GlobalReserve: DefaultReserve,
		Standing:      DefaultStanding(),
		Tables:        DefaultTables(),
		Metrics:       Metrics{Listen: DefaultMetricsListen},
		Sampling:      DefaultSampling(),
	}
	f := ps.rootTable().ParseTop(&ps.Checker, root, p)
	if f == nil {
		return nil
	}
	tableAt := map[string]*yaml.Node{}
	for _, key := range tablesTable.Keys() {
		if v := yamlcheck.Lookup(f["tables"], key); v != nil {
			tableAt[key] = v
		}
	}
	ps.crossCheck(p, root, f["lists"], f["rules"], tableAt)
	ps.checkFleet(p)
	ps.checkBGP(p)
	return p
}

// rootTable is the policy file's top level. Sections with a table of their
// own are walked as nested tables; the others (rules, limits, lists, the
// raw l7: section) keep their parse functions, which need the parser's
// state (claimed prefixes, the defaults' reserve).
func (ps *parser) rootTable() *yamlcheck.Table[Policy] {
	section := func(key string, parse func(n *yaml.Node, p *Policy)) yamlcheck.Field[Policy] {
		return yamlcheck.Func(key, "", "", func(_ *yamlcheck.Checker, n *yaml.Node, _ string, p *Policy) { parse(n, p) },
			func(*Policy) string { return "" })
	}
	return yamlcheck.NewTable("the policy",
		section("apiVersion", func(n *yaml.Node, p *Policy) {
			if v, ok := ps.Scalar(n, "apiVersion"); ok {
				if v != APIVersion {
					ps.Errorf(n, "unsupported apiVersion %q; allowed: %s", v, APIVersion)
				}
				p.APIVersion = v
			}
		}).Required("missing apiVersion; allowed: "+APIVersion),
		section("interfaces", func(n *yaml.Node, p *Policy) { p.Interfaces = ps.interfaces(n) }),
		yamlcheck.Val("mode", yamlcheck.Enum[Mode]{Values: []Mode{ModeEnforce, ModeDryRun}}, func(p *Policy) *Mode { return &p.Mode }, ""),
		yamlcheck.Val("malformed", yamlcheck.Enum[Verdict]{Values: []Verdict{VerdictPass, VerdictDrop}},
			func(p *Policy) *Verdict { return &p.Malformed }, ""),
		yamlcheck.Val("clock", yamlcheck.Enum[Clock]{Values: []Clock{ClockPrecise, ClockCoarse}}, func(p *Policy) *Clock { return &p.Clock }, ""),
		section("defaults", func(n *yaml.Node, p *Policy) { p.Defaults = ps.limits(n, p.Defaults) }),
		section("global", func(n *yaml.Node, p *Policy) {
			gf := globalTable.Parse(&ps.Checker, n, p)
			if r, ok := gf["reserve"]; ok {
				ps.checkReserve(r, "global", p.Global, p.GlobalReserve)
			} else if gf != nil {
				p.GlobalReserve = implicitReserve(DefaultReserve, p.Global)
			}
		}),
		yamlcheck.Nested("lists", "", listsTable, func(p *Policy) *Policy { return p }),
		section("rules", func(n *yaml.Node, p *Policy) { p.Rules = ps.rules(n, p.Defaults) }),
		yamlcheck.Nested("tables", "", tablesTable, func(p *Policy) *Tables { return &p.Tables }),
		yamlcheck.Nested("metrics", "", metricsTable, func(p *Policy) *Metrics { return &p.Metrics }),
		section("asn_data", func(n *yaml.Node, p *Policy) { p.ASNData = ps.asnData(n) }),
		section("l7", func(n *yaml.Node, p *Policy) { p.L7 = n }),
		yamlcheck.Nested("standing", "", standingTable, func(p *Policy) *Standing { return &p.Standing }),
		section("syn", func(n *yaml.Node, p *Policy) { p.SYN = ps.syn(n) }),
		section("shield", func(n *yaml.Node, p *Policy) { p.Shield = ps.shield(n) }),
		yamlcheck.Nested("sampling", "", samplingTable, func(p *Policy) *Sampling { return &p.Sampling }),
		section("fleet", func(n *yaml.Node, p *Policy) { p.Fleet = ps.fleet(n) }),
		section("bgp", func(n *yaml.Node, p *Policy) { p.BGP = ps.bgp(n) }),
	)
}

var ifaceNameRE = regexp.MustCompile(`^[A-Za-z0-9_.\-@]{1,15}$`)

// interfaceTable is one interfaces: entry written as a mapping (a bare
// name is {name: NAME}).
var interfaceTable = yamlcheck.NewTable("an interface",
	yamlcheck.Func("name", "text", "a Linux interface name: 1-15 characters of A-Za-z0-9_.-@, each once",
		func(c *yamlcheck.Checker, n *yaml.Node, _ string, i *Interface) {
			i.Name, _ = c.Scalar(n, "interface name")
		},
		func(i *Interface) string { return i.Name }).Required("interface needs a name"),
	yamlcheck.Val("xdp_mode", yamlcheck.Enum[XDPMode]{Values: []XDPMode{XDPNative, XDPGeneric, XDPAuto}},
		func(i *Interface) *XDPMode { return &i.XDPMode }, "how the XDP program is attached"),
)

func (ps *parser) interfaces(n *yaml.Node) []Interface {
	var out []Interface
	seen := map[string]Pos{}
	for _, item := range ps.Seq(n, "interfaces") {
		itf := Interface{XDPMode: XDPAuto, Pos: yamlcheck.PosOf(item)}
		nameNode := item
		if item.Kind == yaml.MappingNode {
			f := interfaceTable.ParseTop(&ps.Checker, item, &itf)
			if nameNode = f["name"]; nameNode == nil {
				continue
			}
		} else {
			itf.Name, _ = ps.Scalar(item, "interface name")
		}
		if nameNode.Kind != yaml.ScalarNode || yamlcheck.IsNull(nameNode) {
			continue // reported
		}
		name := itf.Name
		if !ifaceNameRE.MatchString(name) || name == "." || name == ".." {
			ps.Errorf(nameNode, "interface name %q is not a Linux interface name (1-15 characters, no spaces, / or :)", name)
			continue
		}
		if prev, dup := seen[name]; dup {
			ps.Errorf(nameNode, "interface %q is already listed at line %d", name, prev.Line)
			continue
		}
		seen[name] = yamlcheck.PosOf(nameNode)
		out = append(out, itf)
	}
	return out
}

// defaultBurst is one second's worth of the rate, rounded up, at least 1:
// 100/s -> 100, 60M/min -> 1M, 3/min -> 1.
func defaultBurst(r Rate) uint64 {
	n := new(big.Int).Mul(new(big.Int).SetUint64(r.Count), big.NewInt(int64(time.Second)))
	q, m := new(big.Int).QuoRem(n, big.NewInt(int64(r.Per)), new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	if q.Sign() == 0 || !q.IsUint64() {
		return max(1, r.Count)
	}
	return q.Uint64()
}

// parseLimit parses "100/s" or {rate: 100/s, burst: 200}. Without a burst
// the bucket holds one second's worth (see defaultBurst).
func parseLimit(ps *yamlcheck.Checker, n *yaml.Node, where string, unit Unit) Limit {
	rateNode, burstNode := n, (*yaml.Node)(nil)
	if n.Kind == yaml.MappingNode {
		f := ps.Fields(n, where, "rate", "burst")
		var ok bool
		if rateNode, ok = f["rate"]; !ok {
			if f != nil {
				ps.Errorf(n, "%s needs a rate, e.g. rate: 100/s", where)
			}
			return Limit{}
		}
		burstNode = f["burst"]
	}
	// The rate and the burst are checked independently, so a policy with
	// both wrong gets both problems at once.
	burst, burstOK := uint64(0), true
	if burstNode != nil {
		burstOK = false
		if bs, ok := ps.Scalar(burstNode, where+" burst"); ok {
			b, err := ParseBurst(bs, unit)
			if err != nil {
				ps.Errorf(burstNode, "%s: %v", where, err)
			} else {
				burst, burstOK = b, true
			}
		}
	}
	s, ok := ps.Scalar(rateNode, where+" rate")
	if !ok {
		return Limit{}
	}
	r, u, err := ParseRate(s)
	if err != nil {
		ps.Errorf(rateNode, "%s: %v", where, err)
		return Limit{}
	}
	if u != unit {
		ps.Errorf(rateNode, "%s: %q is a %s rate; %s takes a %s rate", where, s, u, where, unit)
		return Limit{}
	}
	if !burstOK {
		return Limit{}
	}
	l := Limit{Rate: r, Burst: defaultBurst(r)}
	if burstNode != nil {
		l.Burst = burst
	}
	return l
}

// ParsePrefix parses a CIDR or a bare address (a host prefix). It rejects
// host bits below the mask, zones and IPv4-mapped IPv6 (write IPv4 as IPv4).
func ParsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			cause := err.Error()
			if i := strings.LastIndex(cause, "): "); i >= 0 {
				cause = cause[i+3:]
			}
			return netip.Prefix{}, fmt.Errorf("bad CIDR %q (%s): want an address/length like 192.0.2.0/24 or 2001:db8::/32", s, cause)
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("bad CIDR %q: want an address/length like 192.0.2.0/24 or 2001:db8::/32", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("bad CIDR %q: IPv4-mapped IPv6 is not allowed; write the IPv4 form", s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fmt.Errorf("bad CIDR %q: host bits are set below the /%d mask; did you mean %s?", s, p.Bits(), m)
	}
	return p, nil
}

// listsTable is the lists: section.
var listsTable = yamlcheck.NewTable("lists",
	yamlcheck.Val[Policy, []ListEntry]("deny", listEntries{}, func(p *Policy) *[]ListEntry { return &p.Deny },
		"dropped before any rule"),
	yamlcheck.Val[Policy, []ListEntry]("allow", listEntries{}, func(p *Policy) *[]ListEntry { return &p.Allow },
		"passed without limits (docs: Lists, for how deny and allow entries nest)"),
	yamlcheck.Val[Policy, []ListEntry]("protected", listEntries{}, func(p *Policy) *[]ListEntry { return &p.Protected },
		"prefixes run-time deny entries may not cover or fall inside (edgectl deny add refuses them without --force; L7 escalation never denies them)"),
)

// listEntries is a list: CIDRs, {cidr, expires} entries and {file: PATH}
// list files (one CIDR per line, relative to the policy file); each entry
// remembers where it was written.
type listEntries struct{}

func (listEntries) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]ListEntry, bool) {
	var out []ListEntry
	for _, item := range c.Seq(n, where) {
		src := fmt.Sprintf("%s:%d:%d", c.File, item.Line, item.Column)
		if item.Kind == yaml.ScalarNode {
			if p, err := ParsePrefix(item.Value); err != nil {
				c.Errorf(item, "%s: %v", where, err)
			} else {
				out = append(out, ListEntry{Prefix: p, Source: src})
			}
			continue
		}
		f := c.Fields(item, where+" entry", "cidr", "expires", "file")
		if f == nil {
			continue
		}
		cidr, hasCIDR := f["cidr"]
		file, hasFile := f["file"]
		switch {
		case hasCIDR && hasFile:
			c.Errorf(item, "%s entry has both cidr and file; use one", where)
		case hasFile:
			if e, ok := f["expires"]; ok {
				c.Errorf(e, "%s: expires applies to a cidr entry, not to a file", where)
			}
			out = append(out, readListFile(c, file, where)...)
		case hasCIDR:
			p, ok := prefixAt(c, cidr, where, where+" cidr")
			if !ok {
				continue
			}
			e := ListEntry{Prefix: p, Source: src}
			if x, ok := f["expires"]; ok {
				e.Expires, _ = timestamp.Parse(c, x, where+" expires")
			}
			out = append(out, e)
		default:
			c.Errorf(item, "%s entry needs cidr or file", where)
		}
	}
	return out, true
}

func (k listEntries) Format(es []ListEntry) string {
	if len(es) == 0 {
		return "none"
	}
	return "[" + strings.Join(k.Items(es), ", ") + "]"
}

func (listEntries) Items(es []ListEntry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Prefix.String()
		if !e.Expires.IsZero() {
			out[i] += " until " + e.Expires.Format(time.RFC3339)
		}
	}
	return out
}

func (listEntries) Describe() string {
	return "list of CIDRs, {cidr: CIDR, expires: TIME} and {file: PATH} (one CIDR per line)"
}

// timestamp is an RFC 3339 time or a date (UTC midnight).
type timestampKind struct{}

var timestamp timestampKind

func (timestampKind) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (time.Time, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return time.Time{}, false
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), true
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t.UTC(), true
	}
	c.Errorf(n, "%s %q: want an RFC 3339 time like 2026-12-31T23:59:00Z or a date like 2026-12-31 (UTC midnight)", where, s)
	return time.Time{}, false
}

// globalTable is the global: section: one bucket for all traffic, and its
// reserve.
var globalTable = yamlcheck.NewTable("global",
	yamlcheck.Val[Policy, Limit]("packets", limitKind{Unit: Packets}, func(p *Policy) *Limit { return &p.Global.Packets },
		"the packet limit of all traffic that reaches the limiter"),
	yamlcheck.Val[Policy, Limit]("bytes", limitKind{Unit: Bytes}, func(p *Policy) *Limit { return &p.Global.Bytes },
		"its byte limit"),
	yamlcheck.Val[Policy, uint32]("reserve", reserve, func(p *Policy) *uint32 { return &p.GlobalReserve },
		"the share of the burst only established and validated sources may use; by default 50% where it leaves new sources a packet"),
)

// limitKind is a limit of Unit: a rate ("100/s") or {rate, burst}; without
// a burst, one second's worth.
type limitKind struct{ Unit Unit }

func (k limitKind) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (Limit, bool) {
	return parseLimit(c, n, where, k.Unit), true
}

func (k limitKind) Format(l Limit) string { return l.format(k.Unit) }

func (k limitKind) Describe() string {
	if k.Unit == Bytes {
		return "bits or bytes per time (like 100Mbit/s), or {rate, burst}"
	}
	return "packets per time (like 100/s), or {rate, burst}"
}

var ruleNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// protocolNumbers are the protocols an L4 rule may match: the ones the data
// plane parses (bpf/headers/edgeguard_parse.h).
func protocolNumbers() map[string]uint8 {
	return map[string]uint8{"icmp": 1, "tcp": 6, "udp": 17, "icmpv6": 58}
}

// ProtocolName returns the name of an IP protocol number a rule may match.
func ProtocolName(n uint8) string {
	for name, v := range protocolNumbers() {
		if v == n {
			return name
		}
	}
	return strconv.Itoa(int(n))
}

func hasPorts(proto uint8) bool { return proto == 6 || proto == 17 }

func isICMP(proto uint8) bool { return proto == 1 || proto == 58 }

var asnRE = regexp.MustCompile(`^(?i:as)?([0-9]+)$`)

// ParseASN parses "64500" or "AS64500" (any case). 0 is reserved and refused.
func ParseASN(s string) (uint32, error) {
	s = strings.TrimSpace(s)
	m := asnRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("bad ASN %q: write 64500 or AS64500 (asdot like 1.10 is not accepted)", s)
	}
	v, err := strconv.ParseUint(m[1], 10, 32)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("bad ASN %q: must be from 1 to 4294967295", s)
	}
	return uint32(v), nil
}

// ParseCountry parses an ISO 3166-1 alpha-2 code ("DE", "de").
func ParseCountry(s string) (Country, error) {
	u := strings.ToUpper(strings.TrimSpace(s))
	if len(u) != 2 || u[0] < 'A' || u[0] > 'Z' || u[1] < 'A' || u[1] > 'Z' {
		return Country{}, fmt.Errorf("bad country code %q: want two letters (ISO 3166-1 alpha-2), e.g. DE", s)
	}
	return Country{u[0], u[1]}, nil
}

// tablesTable is the tables: section: the data plane's capacities.
var tablesTable = yamlcheck.NewTable("tables",
	tableSize("per_source_entries", func(t *Tables) *uint32 { return &t.PerSourceEntries }, "capacity of the per-source buckets (an LRU: the least recently used make room at run time)"),
	tableSize("aggregate_entries", func(t *Tables) *uint32 { return &t.AggregateEntries }, "capacity of the per-prefix and per-ASN buckets (at run time)"),
	tableSize("prefix_entries", func(t *Tables) *uint32 { return &t.PrefixEntries }, "capacity of the prefix-facts trie: distinct rule prefixes checked at load, compiled prefix facts at compile"),
	tableSize("list_entries", func(t *Tables) *uint32 { return &t.ListEntries }, "capacity of the deny and allow lists: distinct list prefixes checked at load, compiled list records at compile"),
	tableSize("max_rules", func(t *Tables) *uint32 { return &t.MaxRules }, "the most rules, the default rule included (rules + 1)"),
	tableSize("ipv4_direct_chunks", func(t *Tables) *uint32 { return &t.IPv4DirectChunks },
		"the IPv4 direct table's budget of 16-entry chunks per generation, checked at apply: over it, IPv4 sources use the trie (below)"),
	tableSize("standing_entries", func(t *Tables) *uint32 { return &t.StandingEntries }, "capacity of the standing table (one entry per source address, /32 or /64, ~100 bytes each)"),
)

func tableSize(key string, at func(*Tables) *uint32, doc string) yamlcheck.Field[Tables] {
	return yamlcheck.Val(key, yamlcheck.Uint[uint32]{Min: 1, Max: 1 << 26}, at, doc)
}

// metricsTable is the metrics: section.
var metricsTable = yamlcheck.NewTable("metrics",
	yamlcheck.Val("listen", yamlcheck.HostPort{Like: `127.0.0.1:9469 or [::1]:9469, or "" to disable`, Empty: true},
		func(m *Metrics) *string { return &m.Listen }, "where Prometheus metrics are served; \"\": not at all"),
)

// asnDataTable is the asn_data: section.
var asnDataTable = yamlcheck.NewTable("asn_data",
	yamlcheck.Val("path", yamlcheck.Path{}, func(a *ASNData) *string { return &a.Path },
		"an iptoasn TSV (ip2asn-combined.tsv) or a .mmdb file; required"),
	yamlcheck.Val("format", yamlcheck.Enum[ASNFormat]{Values: []ASNFormat{ASNFormatIPToASN, ASNFormatMMDB}},
		func(a *ASNData) *ASNFormat { return &a.Format }, "the file's format; by default mmdb for a .mmdb path, else iptoasn"),
)

func (ps *parser) asnData(n *yaml.Node) ASNData {
	var out ASNData
	f := asnDataTable.Parse(&ps.Checker, n, &out)
	if f == nil {
		return out
	}
	if _, ok := f["path"]; !ok {
		ps.Errorf(n, "asn_data needs a path (an iptoasn TSV such as ip2asn-combined.tsv, or a .mmdb file)")
	}
	if _, ok := f["format"]; !ok || out.Format == "" {
		out.Format = ASNFormatIPToASN
		if strings.HasSuffix(strings.ToLower(out.Path), ".mmdb") {
			out.Format = ASNFormatMMDB
		}
	}
	return out
}
