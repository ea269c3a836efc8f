package yamlcheck

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// The kinds every configuration section shares. A section with a value of
// its own (a rate, a percentage, a prefix list) writes its kind beside its
// table; these are the ones that need nothing but YAML.

// Duration is a Go duration ("30s", "5m") in [Min, Max].
type Duration struct{ Min, Max time.Duration }

// Parse implements Kind.
func (k Duration) Parse(c *Checker, n *yaml.Node, where string) (time.Duration, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		c.Errorf(n, "%s %q: want a duration like 30s or 5m", where, s)
		return 0, false
	}
	if d < k.Min || d > k.Max {
		c.Errorf(n, "%s %s: must be between %s and %s", where, s, FormatDuration(k.Min), FormatDuration(k.Max))
		return 0, false
	}
	return d, true
}

// Format implements Kind.
func (Duration) Format(d time.Duration) string { return d.String() }

// Describe implements Kind.
func (k Duration) Describe() string {
	return fmt.Sprintf("duration, %s to %s", FormatDuration(k.Min), FormatDuration(k.Max))
}

// FormatDuration writes d without a trailing zero unit: 168h, 5m, 1m30s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Factor is a number ("3", "1.5", "2x") in [Min, Max].
type Factor struct{ Min, Max float64 }

// Parse implements Kind.
func (k Factor) Parse(c *Checker, n *yaml.Node, where string) (float64, bool) {
	return number(c, n, where, "x", 1, k.Min, k.Max, "want a number like 3 or 1.5", "")
}

// number parses a number with an optional suffix (x, %) that divides it
// by scale, in [lo, hi]; unit is appended to the bounds in the message.
func number(c *Checker, n *yaml.Node, where, suffix string, scale, lo, hi float64, want, unit string) (float64, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), suffix), 64)
	if err == nil && strings.HasSuffix(s, suffix) {
		v /= scale
	}
	if err != nil || v != v {
		c.Errorf(n, "%s %q: %s", where, s, want)
		return 0, false
	}
	if v < lo || v > hi {
		c.Errorf(n, "%s %s: must be between %g%s and %g%s", where, s, lo*scale, unit, hi*scale, unit)
		return 0, false
	}
	return v, true
}

// Format implements Kind.
func (Factor) Format(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// Describe implements Kind.
func (k Factor) Describe() string { return fmt.Sprintf("number, %g to %g", k.Min, k.Max) }

// Uint is a whole number in [Min, Max].
type Uint[V ~int | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64] struct{ Min, Max V }

// Parse implements Kind.
func (k Uint[V]) Parse(c *Checker, n *yaml.Node, where string) (V, bool) {
	u, ok := c.UintIn(n, where, uint64(k.Min), uint64(k.Max))
	return V(u), ok
}

// Format implements Kind.
func (Uint[V]) Format(v V) string { return strconv.FormatUint(uint64(v), 10) }

// Describe implements Kind.
func (k Uint[V]) Describe() string { return fmt.Sprintf("whole number, %d to %d", k.Min, k.Max) }

// Percent is a percentage ("95%", or a fraction like 0.95) in [Min, Max]
// (fractions).
type Percent struct{ Min, Max float64 }

// Parse implements Kind.
func (k Percent) Parse(c *Checker, n *yaml.Node, where string) (float64, bool) {
	return number(c, n, where, "%", 100, k.Min, k.Max, "want a percentage like 95%", "%")
}

// Format implements Kind.
func (Percent) Format(v float64) string { return strconv.FormatFloat(v*100, 'g', 6, 64) + "%" }

// Describe implements Kind.
func (k Percent) Describe() string {
	return fmt.Sprintf("percentage, %g%% to %g%%", k.Min*100, k.Max*100)
}

// Parsed is a single value read by Func (its error is reported as
// "where: err"), written by Fmt and described by Desc: a value with a
// parser of its own (a reserve, a BGP community).
type Parsed[V any] struct {
	Func func(string) (V, error)
	Fmt  func(V) string
	Desc string
}

// Parse implements Kind.
func (k Parsed[V]) Parse(c *Checker, n *yaml.Node, where string) (V, bool) {
	var zero V
	s, ok := c.Scalar(n, where)
	if !ok {
		return zero, false
	}
	v, err := k.Func(s)
	if err != nil {
		c.Errorf(n, "%s: %v", where, err)
		return zero, false
	}
	return v, true
}

// Format implements Kind.
func (k Parsed[V]) Format(v V) string { return k.Fmt(v) }

// Describe implements Kind.
func (k Parsed[V]) Describe() string { return k.Desc }

// Bool is true or false.
type Bool struct{}

// Parse implements Kind.
func (Bool) Parse(c *Checker, n *yaml.Node, where string) (bool, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return false, false
	}
	switch s {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	c.Errorf(n, "%s %q: want true or false", where, s)
	return false, false
}

// Format implements Kind.
func (Bool) Format(v bool) string { return strconv.FormatBool(v) }

// Describe implements Kind.
func (Bool) Describe() string { return "true or false" }

// Enum is one of Values. Removed are values the file may no longer write,
// each with the message that says what to write instead.
type Enum[V ~string] struct {
	Values  []V
	Removed map[V]string
}

// Parse implements Kind.
func (k Enum[V]) Parse(c *Checker, n *yaml.Node, where string) (V, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	if slices.Contains(k.Values, V(s)) {
		return V(s), true
	}
	if msg, ok := k.Removed[V(s)]; ok {
		c.Errorf(n, "%s %s was removed: %s", where, s, msg)
		return "", false
	}
	c.Errorf(n, "%s %q is not allowed; allowed: %s", where, s, k.list())
	return "", false
}

func (k Enum[V]) list() string {
	out := make([]string, len(k.Values))
	for i, v := range k.Values {
		out[i] = string(v)
	}
	return strings.Join(out, ", ")
}

// Format implements Kind.
func (Enum[V]) Format(v V) string {
	if v == "" {
		return `""`
	}
	return string(v)
}

// Describe implements Kind.
func (k Enum[V]) Describe() string { return "one of " + k.list() }

// Off is a kind whose zero value means off: the file writes 0 or off for
// it, and the diff and the docs say off.
type Off[V comparable] struct{ Kind Kind[V] }

// Parse implements Kind.
func (k Off[V]) Parse(c *Checker, n *yaml.Node, where string) (V, bool) {
	if r := Resolve(n); r.Kind == yaml.ScalarNode && (r.Value == "0" || r.Value == "off") {
		var zero V
		return zero, true
	}
	return k.Kind.Parse(c, n, where)
}

// Format implements Kind.
func (k Off[V]) Format(v V) string {
	var zero V
	if v == zero {
		return "off"
	}
	return k.Kind.Format(v)
}

// Describe implements Kind.
func (k Off[V]) Describe() string { return k.Kind.Describe() + "; 0 or off: off" }

// HostPort is host:port with a port from 1 to 65535. Like says what an
// example looks like, for the message.
type HostPort struct {
	Like string
	// Empty lets the file write "" (for "none").
	Empty bool
	// Listen is an address to listen on (the l7: section's): the host
	// may be empty (every address) and the port 0 (one the kernel picks).
	Listen bool
}

// Parse implements Kind.
func (k HostPort) Parse(c *Checker, n *yaml.Node, where string) (string, bool) {
	if r := Resolve(n); k.Empty && r.Kind == yaml.ScalarNode && r.Value == "" && !IsNull(r) {
		return "", true
	}
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	host, port, err := net.SplitHostPort(s)
	pn, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil || (!k.Listen && (pn == 0 || host == "")) {
		c.Errorf(n, "%s %q: want host:port like %s", where, s, k.Like)
		return "", false
	}
	return s, true
}

// Format implements Kind.
func (HostPort) Format(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// Describe implements Kind.
func (k HostPort) Describe() string {
	if k.Empty {
		return `host:port, or "" for none`
	}
	return "host:port"
}

// String is any single value.
type String struct{}

// Parse implements Kind.
func (String) Parse(c *Checker, n *yaml.Node, where string) (string, bool) { return c.Scalar(n, where) }

// Format implements Kind.
func (String) Format(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// Describe implements Kind.
func (String) Describe() string { return "text" }

// Path is a file path; a relative one is relative to the file being read
// (Checker.File), not to the working directory.
type Path struct{}

// Parse implements Kind.
func (Path) Parse(c *Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	return c.Path(s), true
}

// Format implements Kind.
func (Path) Format(s string) string { return String{}.Format(s) }

// Describe implements Kind.
func (Path) Describe() string { return "file path (relative: to the policy file)" }

// Path makes a path written in the file absolute: relative to the file's
// directory.
func (c *Checker) Path(s string) string {
	if s == "" || filepath.IsAbs(s) {
		return s
	}
	return filepath.Join(filepath.Dir(c.File), s)
}

// ReadFile reads the file n names (relative to the checked file), with
// Checker.ReadFileFunc; on a problem it reports it at n.
func (c *Checker) ReadFile(n *yaml.Node, where string) (path string, data []byte, ok bool) {
	name, ok := c.Scalar(n, where+" file")
	if !ok {
		return "", nil, false
	}
	path = c.Path(name)
	if c.ReadFileFunc == nil {
		c.Errorf(n, "%s file %q: no way to read list files here", where, name)
		return "", nil, false
	}
	data, err := c.ReadFileFunc(path)
	if err != nil {
		c.Errorf(n, "%s file %q: %v", where, path, err)
		return "", nil, false
	}
	return path, data, true
}

// Pattern is a single value that matches RE; Want says what it may be, for
// the message ("use 1-63 lower-case letters, ...").
type Pattern struct {
	RE   *regexp.Regexp
	Want string
}

// Parse implements Kind.
func (k Pattern) Parse(c *Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	if !k.RE.MatchString(s) {
		c.Errorf(n, "%s %q: %s", where, s, k.Want)
		return "", false
	}
	return s, true
}

// Format implements Kind.
func (Pattern) Format(s string) string { return String{}.Format(s) }

// Describe implements Kind.
func (k Pattern) Describe() string { return "text: " + k.Want }

// List is a list of values of one kind, of Min to Max items (Max 0: no
// bound); a single value is a list of one. The diff reports items one by
// one.
type List[V any] struct {
	Of       Kind[V]
	Min, Max int
}

// Parse implements Kind.
func (k List[V]) Parse(c *Checker, n *yaml.Node, where string) ([]V, bool) {
	items := c.Seq(n, where)
	switch {
	case len(items) < k.Min && len(items) == 0:
		c.Errorf(n, "%s is empty", where)
		return nil, false
	case len(items) < k.Min:
		c.Errorf(n, "%s: %d items, at least %d", where, len(items), k.Min)
		return nil, false
	case k.Max > 0 && len(items) > k.Max:
		c.Errorf(n, "%s: %d items, at most %d", where, len(items), k.Max)
		items = items[:k.Max]
	}
	var out []V
	for _, it := range items {
		if v, ok := k.Of.Parse(c, it, where); ok {
			out = append(out, v)
		}
	}
	return out, true
}

// Format implements Kind.
func (k List[V]) Format(v []V) string { return "[" + strings.Join(k.Items(v), ", ") + "]" }

// Items implements Lister.
func (k List[V]) Items(v []V) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = k.Of.Format(x)
	}
	return out
}

// Describe implements Kind.
func (k List[V]) Describe() string { return "list of " + k.Of.Describe() }
