package policy

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// The kinds of value the policy's sections share beyond yamlcheck's: packet
// rates and prefix lists. Each section's table (yamlcheck.Table) uses them.

// rateKind is a rate of Unit per time, from Min to Max per second (Max 0:
// no bound); NonZero refuses a rate of 0. What names what is counted in
// messages ("packets" unless set; "bits or bytes" for Bytes), Range the
// bounds in them when they are not plain numbers per second.
type rateKind struct {
	Unit     Unit
	What     string
	Min, Max float64
	NonZero  bool
	Range    string
}

// packetRate is a rateKind of packets.
type packetRate = rateKind

func (k rateKind) unit() Unit { return cmp.Or(k.Unit, Packets) }

func (k rateKind) what() string {
	if k.unit() == Bytes {
		return cmp.Or(k.What, "bits or bytes")
	}
	return cmp.Or(k.What, "packets")
}

func (k rateKind) like() string {
	if k.unit() == Bytes {
		return "10Gbit/s or 1MB/s"
	}
	return "100/s"
}

func (k rateKind) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (Rate, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return Rate{}, false
	}
	r, u, err := ParseRate(s)
	switch {
	case err != nil:
		c.Errorf(n, "%s: %v", where, err)
		return Rate{}, false
	case u != k.unit():
		c.Errorf(n, "%s %q: want %s per time, like %s", where, s, k.what(), k.like())
		return Rate{}, false
	}
	switch ps := r.PerSecond(); {
	case k.NonZero && r.IsZero():
		c.Errorf(n, "%s must be above 0", where)
		return Rate{}, false
	case k.Max == 0:
	case k.Range != "" && (ps < k.Min || ps > k.Max):
		c.Errorf(n, "%s %q: want %s", where, s, k.Range)
		return Rate{}, false
	case k.Min > 0 && (ps < k.Min || ps > k.Max):
		c.Errorf(n, "%s %v/s: want %g/s to %g/s", where, ps, k.Min, k.Max)
		return Rate{}, false
	case ps > k.Max:
		c.Errorf(n, "%s %v/s: must be at most %g/s", where, ps, k.Max)
		return Rate{}, false
	}
	return r, true
}

func (k rateKind) Format(r Rate) string {
	if k.unit() == Bytes && r.IsZero() {
		return "off"
	}
	return FormatRate(r, k.unit())
}

func (k rateKind) Describe() string {
	switch {
	case k.Range != "":
		return fmt.Sprintf("%s per time (like %s), %s", k.what(), k.like(), k.Range)
	case k.Max == 0:
		return k.what() + " per time (like 100/s)"
	case k.Min > 0:
		return fmt.Sprintf("%s per time (like 100/s), %s/s to %s/s", k.what(), num(k.Min), num(k.Max))
	}
	return fmt.Sprintf("%s per time (like 100/s), at most %s/s", k.what(), num(k.Max))
}

// num writes a bound without an exponent: 1000000, 0.5.
func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// prefixList is a list of CIDRs and {file: PATH} entries naming list files
// (one CIDR per line, # comments), sorted and deduplicated, of at most Max
// prefixes.
type prefixList struct {
	Max int
	// TooMany ends the message about more than Max prefixes.
	TooMany string
}

func (k prefixList) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]netip.Prefix, bool) {
	var out []netip.Prefix
	for _, item := range c.Seq(n, where) {
		if item.Kind == yaml.MappingNode {
			f := c.Fields(item, where+" entry", "file")
			file, ok := f["file"]
			if !ok {
				if f != nil {
					c.Errorf(item, "%s entry needs file: PATH (or write a CIDR)", where)
				}
				continue
			}
			for _, e := range readListFile(c, file, where) {
				out = append(out, e.Prefix)
			}
			continue
		}
		if p, ok := prefixAt(c, item, where, where+" entry"); ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, compareOutput)
	out = slices.Compact(out)
	if len(out) > k.Max {
		c.Errorf(n, "%s has %d prefixes; %s", where, len(out), fmt.Sprintf(k.TooMany, k.Max))
	}
	return out, true
}

func (prefixList) Format(ps []netip.Prefix) string {
	if len(ps) == 0 {
		return "none"
	}
	return fmt.Sprint(ps)
}

func (prefixList) Items(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

func (k prefixList) Describe() string {
	return fmt.Sprintf("list of CIDRs and {file: PATH} list files, at most %d prefixes", k.Max)
}

// prefixAt is the CIDR (or bare address) n holds; a problem is reported as
// "where: err" (what names n when it is not a single value).
func prefixAt(c *yamlcheck.Checker, n *yaml.Node, where, what string) (netip.Prefix, bool) {
	s, ok := c.Scalar(n, what)
	if !ok {
		return netip.Prefix{}, false
	}
	p, err := ParsePrefix(s)
	if err != nil {
		c.Errorf(n, "%s: %v", where, err)
		return netip.Prefix{}, false
	}
	return p, true
}

// readListFile reads the list file n names (relative to the policy file):
// one CIDR per line. Its problems are reported at their lines in it.
func readListFile(c *yamlcheck.Checker, n *yaml.Node, where string) []ListEntry {
	path, data, ok := c.ReadFile(n, where)
	if !ok {
		return nil
	}
	entries, err := ParseCIDRList(path, bytes.NewReader(data))
	var verr *ValidationError
	if errors.As(err, &verr) {
		c.Problems = append(c.Problems, verr.Problems...)
	} else if err != nil {
		c.Errorf(n, "%s file %q: %v", where, path, err)
	}
	return entries
}

// reserve is a share of a burst or budget: "50%", "12.5%" or 0, below
// 100% (ParseReserve), in parts per million.
var reserve = yamlcheck.Parsed[uint32]{Func: ParseReserve, Fmt: FormatReserve,
	Desc: "percentage below 100% (like 10% or 12.5%), or 0"}
