// Package shield is Edgeguard's adaptive shield: it learns a baseline rate
// per traffic aggregate from the data plane's 1-in-N samples, decides when
// an aggregate surges above it, finds the header fingerprint that covers a
// surge, and plans the actions (tighten an aggregate for new sources, or a
// fingerprint rule with its own budget) the daemon writes to the data
// plane. Everything here is pure: time comes in as arguments, nothing
// touches a map, a file or the network (docs/shield.md).
package shield

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Kind is what an aggregate groups traffic by.
type Kind uint8

// Aggregate kinds, narrowest first: a surge is attributed to the narrowest
// hot aggregate a packet belongs to.
const (
	KindPrefix  Kind = iota // a rule's source prefix group (the data plane's prefix aggregate)
	KindASN                 // a rule's traffic from one origin ASN
	KindCountry             // traffic from one country
	KindPort                // traffic to one protocol and destination port
	KindRule                // one rule's traffic
	KindGlobal              // everything
	numKinds
)

var kindNames = [numKinds]string{"prefix", "asn", "country", "port", "rule", "global"}

func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return "kind" + strconv.Itoa(int(k))
}

// Key names one aggregate. Only the fields of its Kind are set, so keys
// compare with ==.
type Key struct {
	Kind    Kind
	Rule    uint32       // prefix, asn, rule
	Prefix  netip.Prefix // prefix: masked
	ASN     uint32       // asn
	Country [2]byte      // country
	Proto   uint8        // port
	Port    uint16       // port
}

// String is the key as edgectl shows it and accepts it back ("rule 3 asn
// 64500", "rule 0 prefix 198.18.4.0/24", "country DE", "port udp/53",
// "rule 7", "global").
func (k Key) String() string {
	switch k.Kind {
	case KindPrefix:
		return fmt.Sprintf("rule %d prefix %s", k.Rule, k.Prefix)
	case KindASN:
		return fmt.Sprintf("rule %d asn %d", k.Rule, k.ASN)
	case KindCountry:
		return "country " + string(k.Country[:])
	case KindPort:
		return "port " + ProtoName(k.Proto) + "/" + strconv.Itoa(int(k.Port))
	case KindRule:
		return fmt.Sprintf("rule %d", k.Rule)
	case KindGlobal:
		return "global"
	}
	return k.Kind.String()
}

// ParseKey reads a key in the form Key.String writes.
func ParseKey(s string) (Key, error) {
	f := strings.Fields(s)
	bad := fmt.Errorf("aggregate %q: use 'rule N prefix CIDR', 'rule N asn N', 'country CC', 'port PROTO/N', 'rule N' or 'global'", s)
	switch {
	case len(f) == 1 && f[0] == "global":
		return Key{Kind: KindGlobal}, nil
	case len(f) == 2 && f[0] == "country" && len(f[1]) == 2:
		c := strings.ToUpper(f[1])
		return Key{Kind: KindCountry, Country: [2]byte{c[0], c[1]}}, nil
	case len(f) == 2 && f[0] == "port":
		proto, port, ok := strings.Cut(f[1], "/")
		p, perr := strconv.ParseUint(port, 10, 16)
		pr, prok := ParseProto(proto)
		if !ok || perr != nil || !prok {
			return Key{}, bad
		}
		return Key{Kind: KindPort, Proto: pr, Port: uint16(p)}, nil
	case (len(f) == 2 || len(f) == 4) && f[0] == "rule":
		r, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			return Key{}, bad
		}
		if len(f) == 2 {
			return Key{Kind: KindRule, Rule: uint32(r)}, nil
		}
		switch f[2] {
		case "prefix":
			p, err := netip.ParsePrefix(f[3])
			if err != nil {
				return Key{}, bad
			}
			return Key{Kind: KindPrefix, Rule: uint32(r), Prefix: p.Masked()}, nil
		case "asn":
			a, err := strconv.ParseUint(strings.TrimPrefix(strings.ToUpper(f[3]), "AS"), 10, 32)
			if err != nil {
				return Key{}, bad
			}
			return Key{Kind: KindASN, Rule: uint32(r), ASN: uint32(a)}, nil
		}
	}
	return Key{}, bad
}

// ProtoName names the IP protocols the data plane parses.
func ProtoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 1:
		return "icmp"
	case 58:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}

// ParseProto is the inverse of ProtoName.
func ParseProto(s string) (uint8, bool) {
	switch s {
	case "tcp":
		return 6, true
	case "udp":
		return 17, true
	case "icmp":
		return 1, true
	case "icmpv6":
		return 58, true
	}
	n, err := strconv.ParseUint(s, 10, 8)
	return uint8(n), err == nil
}

// Sample is one sampled packet as the shield sees it: the data plane's
// 1-in-N sample of a passed or dropped packet, resolved by the daemon
// (rule id, not table slot; country from the ASN data).
type Sample struct {
	Src      netip.Addr
	ASN      uint32
	Country  [2]byte // zero: unknown
	Rule     uint32
	Proto    uint8
	SPort    uint16
	DPort    uint16
	Len      uint16 // IP total length
	TTL      uint8
	TCPFlags uint8
	Passed   bool
	// Weight is how many packets the sample stands for (N of 1-in-N,
	// scaled up when the data plane's cap skipped some).
	Weight float64
}

// RuleShape is what the data plane can tighten for a rule's traffic: the
// prefix length of its prefix aggregate (0: none), whether it aggregates
// the whole rule in one bucket, whether it has an ASN aggregate.
type RuleShape struct {
	PrefixLen4, PrefixLen6 uint8
	Whole                  bool
	ASN                    bool
	// Counted: the data plane counts these aggregates' instances exactly
	// (maps.WatchAggregates); their rates come from Count, not samples.
	Counted bool
}

// GlobalShape is the same for the global bucket.
type GlobalShape struct {
	Limited, Counted bool
}

// keys appends the aggregates a sample belongs to.
func keys(dst []Key, s Sample, shape RuleShape) []Key {
	bits := shape.PrefixLen4
	if s.Src.Is6() && !s.Src.Is4In6() {
		bits = shape.PrefixLen6
	}
	if bits == 0 { // no prefix aggregate: learn the /24 or /48 anyway
		bits = 24
		if s.Src.Is6() && !s.Src.Is4In6() {
			bits = 48
		}
	}
	if p, err := s.Src.Unmap().Prefix(int(bits)); err == nil {
		dst = append(dst, Key{Kind: KindPrefix, Rule: s.Rule, Prefix: p})
	}
	if s.ASN != 0 {
		dst = append(dst, Key{Kind: KindASN, Rule: s.Rule, ASN: s.ASN})
	}
	if s.Country != [2]byte{} {
		dst = append(dst, Key{Kind: KindCountry, Country: s.Country})
	}
	if s.Proto == 6 || s.Proto == 17 {
		dst = append(dst, Key{Kind: KindPort, Proto: s.Proto, Port: s.DPort})
	}
	dst = append(dst, Key{Kind: KindRule, Rule: s.Rule}, Key{Kind: KindGlobal})
	return dst
}

// tightenable reports whether the data plane has a bucket for the
// aggregate that an override can tighten.
func tightenable(k Key, shape RuleShape, global GlobalShape) bool {
	switch k.Kind {
	case KindPrefix:
		bits := shape.PrefixLen4
		if k.Prefix.Addr().Is6() {
			bits = shape.PrefixLen6
		}
		return bits != 0 && int(bits) == k.Prefix.Bits()
	case KindASN:
		return shape.ASN
	case KindRule:
		return shape.Whole
	case KindGlobal:
		return global.Limited
	}
	return false
}

// counted reports whether k's rate comes from exact counters.
func counted(k Key, shape RuleShape, global GlobalShape) bool {
	if k.Kind == KindGlobal {
		return global.Counted
	}
	return shape.Counted && tightenable(k, shape, global)
}
