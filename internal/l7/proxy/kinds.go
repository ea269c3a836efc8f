package proxy

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"net/textproto"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/target"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// The kinds of the l7: section's tables (tables.go): the values only this
// section writes, with the wording its problems have always had. The
// kinds it shares with the policy (true/false, host:port) are
// yamlcheck's.

// named reports its kind's problems under the name the l7: section has
// always given the field ("escalation rejections", "queue_timeout"), not
// the walker's dotted path.
type named[V any] struct {
	yamlcheck.Kind[V]
	where string
}

// Parse implements yamlcheck.Kind.
func (k named[V]) Parse(c *yamlcheck.Checker, n *yaml.Node, _ string) (V, bool) {
	return k.Kind.Parse(c, n, k.where)
}

// Unwrap implements yamlcheck.Wrapper.
func (k named[V]) Unwrap() yamlcheck.Kind[V] { return k.Kind }

// as names k's problems where.
func as[V any](where string, k yamlcheck.Kind[V]) yamlcheck.Kind[V] { return named[V]{k, where} }

// val is a field of a table whose problems name it prefix+key.
func val[S, V any](prefix, key string, k yamlcheck.Kind[V], at func(s *S) *V, doc string) yamlcheck.Field[S] {
	return yamlcheck.Val(key, as(prefix+key, k), at, doc)
}

// duration is a positive duration; Min and Max (when set) bound it, Why
// says why Max.
type duration struct {
	Min, Max time.Duration
	Why      string
}

// Parse implements yamlcheck.Kind.
func (k duration) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (time.Duration, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return 0, false
	}
	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		c.Errorf(n, "%s %q: want a positive duration such as 500ms, 10s, 1m", where, s)
		return 0, false
	}
	switch {
	case k.Min > 0 && k.Max > 0 && (v < k.Min || v > k.Max):
		c.Errorf(n, "%s %s: want %s to %s", where, v, yamlcheck.FormatDuration(k.Min), yamlcheck.FormatDuration(k.Max))
		return 0, false
	case k.Max > 0 && v > k.Max:
		c.Errorf(n, "%s %s: want at most %s%s", where, v, yamlcheck.FormatDuration(k.Max), k.Why)
		return 0, false
	}
	return v, true
}

// Format implements yamlcheck.Kind.
func (duration) Format(v time.Duration) string { return yamlcheck.FormatDuration(v) }

// Describe implements yamlcheck.Kind.
func (k duration) Describe() string {
	switch {
	case k.Min > 0 && k.Max > 0:
		return fmt.Sprintf("duration, %s to %s", yamlcheck.FormatDuration(k.Min), yamlcheck.FormatDuration(k.Max))
	case k.Max > 0:
		return "duration, up to " + yamlcheck.FormatDuration(k.Max)
	}
	return "positive duration"
}

// enumOf is one of Values.
type enumOf struct{ Values []string }

// Parse implements yamlcheck.Kind.
func (k enumOf) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	for _, a := range k.Values {
		if s == a {
			return s, true
		}
	}
	c.Errorf(n, "%s %q: want one of %s", where, s, strings.Join(k.Values, ", "))
	return "", false
}

// Format implements yamlcheck.Kind.
func (enumOf) Format(s string) string { return s }

// Describe implements yamlcheck.Kind.
func (k enumOf) Describe() string { return strings.Join(k.Values, " | ") }

// choice is one of two words, read as false (Off) or true (On).
type choice struct{ Off, On string }

// Parse implements yamlcheck.Kind.
func (k choice) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (bool, bool) {
	s, ok := enumOf{[]string{k.Off, k.On}}.Parse(c, n, where)
	return s == k.On, ok
}

// Format implements yamlcheck.Kind.
func (k choice) Format(v bool) string {
	if v {
		return k.On
	}
	return k.Off
}

// Describe implements yamlcheck.Kind.
func (k choice) Describe() string { return k.Off + " | " + k.On }

// draft is the RateLimit header draft: 10, or none (0).
type draft struct{}

// Parse implements yamlcheck.Kind.
func (draft) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (int, bool) {
	s, ok := enumOf{[]string{"10", "none"}}.Parse(c, n, where)
	if s == "10" {
		return 10, ok
	}
	return 0, ok
}

// Format implements yamlcheck.Kind.
func (draft) Format(v int) string {
	if v == 0 {
		return "none"
	}
	return strconv.Itoa(v)
}

// Describe implements yamlcheck.Kind.
func (draft) Describe() string { return "10 | none" }

// percent is a percentage from 0% to 99% ("10%"); Note follows the
// wording of a problem; Single, when set, names the field when it is not a
// single value.
type percent struct{ Note, Single string }

// Parse implements yamlcheck.Kind.
func (k percent) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (int, bool) {
	s, ok := c.Scalar(n, cmp.Or(k.Single, where))
	if !ok {
		return 0, false
	}
	pct, err := strconv.Atoi(strings.TrimSuffix(s, "%"))
	if err != nil || !strings.HasSuffix(s, "%") || pct < 0 || pct > 99 {
		c.Errorf(n, "%s %q: want a percentage from 0%% to 99%%%s", where, s, k.Note)
		return 0, false
	}
	return pct, true
}

// Format implements yamlcheck.Kind.
func (percent) Format(v int) string { return strconv.Itoa(v) + "%" }

// Describe implements yamlcheck.Kind.
func (percent) Describe() string { return "0% to 99%" }

// headerName is an HTTP field name (an RFC 9110 token), canonicalised.
type headerName struct{}

// Parse implements yamlcheck.Kind.
func (headerName) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	if !httpToken(s) {
		c.Errorf(n, "%s %q is not a valid header name", where, s)
		return "", false
	}
	return textproto.CanonicalMIMEHeaderKey(s), true
}

// Format implements yamlcheck.Kind.
func (headerName) Format(s string) string { return yamlcheck.String{}.Format(s) }

// Describe implements yamlcheck.Kind.
func (headerName) Describe() string { return "header name" }

// section is a sub-section with a table of its own over its own struct S:
// the value starts at Def() and the file's keys replace its fields; Check,
// when set, does what crosses fields (a required key, one bound against
// another). Its problems name it as the field's where.
type section[S any] struct {
	Table *yamlcheck.Table[S]
	Def   func() S
	Check func(c *yamlcheck.Checker, n *yaml.Node, where string, got map[string]*yaml.Node, s *S)
}

// Parse implements yamlcheck.Kind.
func (k section[S]) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (S, bool) {
	s := k.Def()
	t := *k.Table
	t.Name = where
	got := t.Parse(c, n, &s)
	if got == nil {
		return s, false
	}
	if k.Check != nil {
		k.Check(c, n, where, got, &s)
	}
	return s, true
}

// Format implements yamlcheck.Kind.
func (k section[S]) Format(s S) string { return k.Table.String(&s) }

// Describe implements yamlcheck.Kind.
func (k section[S]) Describe() string { return "mapping (below)" }

// Diff implements yamlcheck.Differ: field by field, as label.key.
func (k section[S]) Diff(label string, a, b S, emit func(op byte, text string)) {
	k.Table.DiffWith(label+".", &a, &b, emit)
}

// optional is a sub-section that is absent (nil) unless the file writes
// it.
type optional[S any] struct{ section[S] }

// Parse implements yamlcheck.Kind.
func (k optional[S]) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (*S, bool) {
	s, ok := k.section.Parse(c, n, where)
	if !ok {
		return nil, false
	}
	return &s, true
}

// Format implements yamlcheck.Kind.
func (k optional[S]) Format(s *S) string {
	if s == nil {
		return "none"
	}
	return k.section.Format(*s)
}

// Diff implements yamlcheck.Differ: an added section on one line, a
// changed one field by field.
func (k optional[S]) Diff(label string, a, b *S, emit func(op byte, text string)) {
	switch {
	case a == nil && b != nil:
		emit('+', label+" "+k.Format(b))
	case a != nil && b == nil:
		emit('-', label)
	case a != nil && b != nil:
		k.section.Diff(label, *a, *b, emit)
	}
}

// listenAddr is an address the l7: section listens on or dials (the host
// may be empty, the port 0).
var listenAddr = yamlcheck.HostPort{Like: "127.0.0.1:8080 or [::1]:8080", Listen: true}

// redisPrefix is l7.redis.prefix: not empty, no braces (a key's hash tag
// is the stage's).
type redisPrefix struct{}

// Parse implements yamlcheck.Kind.
func (redisPrefix) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if ok && (s == "" || strings.ContainsAny(s, "{}")) {
		c.Errorf(n, "%s %q must be non-empty and contain no braces", where, s)
		return "", false
	}
	return s, ok
}

// Format implements yamlcheck.Kind.
func (redisPrefix) Format(s string) string { return s }

// Describe implements yamlcheck.Kind.
func (redisPrefix) Describe() string { return "text without braces" }

// upstreamURL is l7.upstream: http or https, a host, an optional path, no
// query.
type upstreamURL struct{}

// Parse implements yamlcheck.Kind.
func (upstreamURL) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (*url.URL, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return nil, false
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.Fragment != "" {
		c.Errorf(n, "%s %q: want http://host:port or https://host:port (an optional path, no query)", where, s)
		return nil, false
	}
	if _, port, err := net.SplitHostPort(u.Host); err == nil {
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			c.Errorf(n, "%s %q: bad port %q", where, s, port)
			return nil, false
		}
	}
	return u, true
}

// Format implements yamlcheck.Kind.
func (upstreamURL) Format(u *url.URL) string {
	if u == nil {
		return "none"
	}
	return u.String()
}

// Describe implements yamlcheck.Kind.
func (upstreamURL) Describe() string { return "URL" }

// engineKind is l7.engine: auto ("") or an engine.
type engineKind struct{}

// Parse implements yamlcheck.Kind.
func (engineKind) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (Engine, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	switch Engine(s) {
	case "auto":
		return "", true
	case EngineEventLoop, EngineNetHTTP:
		return Engine(s), true
	}
	c.Errorf(n, "%s %q: want auto, event-loop or net-http", where, s)
	return "", false
}

// Format implements yamlcheck.Kind.
func (engineKind) Format(e Engine) string {
	if e == "" {
		return "auto"
	}
	return string(e)
}

// Describe implements yamlcheck.Kind.
func (engineKind) Describe() string { return "auto | event-loop | net-http" }

// accessLog is l7.access_log: stderr or an absolute file path.
type accessLog struct{}

// Parse implements yamlcheck.Kind.
func (accessLog) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	switch {
	case !ok:
		return "", false
	case s == "stderr":
		return s, true
	case !strings.HasPrefix(s, "/") || strings.ContainsRune(s, 0) || strings.HasSuffix(s, "/"):
		c.Errorf(n, "%s %q: want stderr or an absolute file path", where, s)
		return "", false
	}
	return filepath.Clean(s), true
}

// Format implements yamlcheck.Kind.
func (accessLog) Format(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// Describe implements yamlcheck.Kind.
func (accessLog) Describe() string { return "stderr | absolute file path" }

// prefixes is a list of addresses or CIDR prefixes without host bits;
// each item's problems name it Item.
type prefixes struct{ Item string }

// Parse implements yamlcheck.Kind.
func (k prefixes) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]netip.Prefix, bool) {
	var out []netip.Prefix
	for _, item := range c.Seq(n, where) {
		s, ok := c.Scalar(item, k.Item)
		if !ok {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				c.Errorf(item, "%s %q: want an address or CIDR prefix, e.g. 10.0.0.0/8", k.Item, s)
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p != p.Masked() {
			c.Errorf(item, "%s %q has host bits set; did you mean %s?", k.Item, s, p.Masked())
			continue
		}
		out = append(out, p)
	}
	return out, true
}

// Format implements yamlcheck.Kind.
func (prefixes) Format(ps []netip.Prefix) string { return fmt.Sprint(ps) }

// Describe implements yamlcheck.Kind.
func (prefixes) Describe() string { return "list of addresses or CIDR prefixes" }

// Items implements yamlcheck.Lister.
func (prefixes) Items(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// exactPaths is a list of URL paths in the normal form requests are
// matched in.
type exactPaths struct{}

// Parse implements yamlcheck.Kind.
func (exactPaths) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]string, bool) {
	var out []string
	for _, item := range c.Seq(n, where) {
		s, ok := c.Scalar(item, "path")
		if !ok {
			continue
		}
		if !strings.HasPrefix(s, "/") {
			c.Errorf(item, "%s: path %q must start with /", where, s)
			continue
		}
		normalPath(c, item, where, s)
		out = append(out, s)
	}
	return out, true
}

// Format implements yamlcheck.Kind.
func (exactPaths) Format(ps []string) string { return "[" + strings.Join(ps, ", ") + "]" }

// Describe implements yamlcheck.Kind.
func (exactPaths) Describe() string { return "list of paths" }

// Items implements yamlcheck.Lister.
func (exactPaths) Items(ps []string) []string { return ps }

// normalPath holds a configured path (a prefix, an exempt path) to the
// decoded normal form requests are matched in: "/a//b" or "/a/./b" could
// never match.
func normalPath(c *yamlcheck.Checker, n *yaml.Node, where, s string) {
	norm, err := target.Normalize(s, false)
	if err != nil {
		c.Errorf(n, "%s %q: %v", where, s, err)
		return
	}
	if dec := target.Decode(norm); dec != s {
		c.Errorf(n, "%s %q: requests are matched by their normal path; write it as %q", where, s, dec)
	}
}

// identityFields is l7.identity_fields: header names the proxy removes,
// replacing the default list.
type identityFields struct{}

// Parse implements yamlcheck.Kind.
func (identityFields) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]string, bool) {
	out := []string{}
	for _, item := range c.Seq(n, where) {
		name, _ := headerName{}.Parse(c, item, where)
		switch {
		case len(name) > 63:
			c.Errorf(item, "%s: %q is longer than 63 bytes", where, name)
		case name == "":
		case name == "X-Forwarded-For" || name == "X-Forwarded-Host" || name == "X-Forwarded-Proto" || name == "Forwarded":
			c.Errorf(item, "%s: %s is always rewritten by the proxy; do not list it", where, name)
		case name == "Host" || name == "Content-Length" || name == "Transfer-Encoding" || name == "Connection":
			c.Errorf(item, "%s: %s cannot be removed", where, name)
		default:
			out = append(out, name)
		}
	}
	return out, true
}

// Format implements yamlcheck.Kind.
func (identityFields) Format(fs []string) string { return "[" + strings.Join(fs, ", ") + "]" }

// Describe implements yamlcheck.Kind.
func (identityFields) Describe() string { return "list of header names" }

// Items implements yamlcheck.Lister.
func (identityFields) Items(fs []string) []string { return fs }

// rawNode is a node decoded elsewhere (l7.rls: internal/l7/rls).
type rawNode struct{}

// Parse implements yamlcheck.Kind.
func (rawNode) Parse(_ *yamlcheck.Checker, n *yaml.Node, _ string) (*yaml.Node, bool) { return n, true }

// Format implements yamlcheck.Kind.
func (rawNode) Format(n *yaml.Node) string {
	if n == nil {
		return "none"
	}
	return "set"
}

// Describe implements yamlcheck.Kind.
func (rawNode) Describe() string { return "mapping (below)" }

// decoded is a kind whose parse is a function (the routes, which need
// what the section decoded before them).
type decoded[V any] struct {
	parse    func(c *yamlcheck.Checker, n *yaml.Node, where string) V
	describe string
}

// Parse implements yamlcheck.Kind.
func (k decoded[V]) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (V, bool) {
	return k.parse(c, n, where), true
}

// Format implements yamlcheck.Kind.
func (decoded[V]) Format(v V) string { return fmt.Sprint(v) }

// Describe implements yamlcheck.Kind.
func (k decoded[V]) Describe() string { return k.describe }

// atNamed names its kind's problems where()+suffix, at parse time: an
// item of a list named by a field parsed before ("route \"api\"
// exempt_paths").
type atNamed[V any] struct {
	yamlcheck.Kind[V]
	where  func() string
	suffix string
}

// Parse implements yamlcheck.Kind.
func (k atNamed[V]) Parse(c *yamlcheck.Checker, n *yaml.Node, _ string) (V, bool) {
	return k.Kind.Parse(c, n, k.where()+k.suffix)
}

// Unwrap implements yamlcheck.Wrapper.
func (k atNamed[V]) Unwrap() yamlcheck.Kind[V] { return k.Kind }

// at names k's problems where()+suffix.
func at[V any](where func() string, suffix string, k yamlcheck.Kind[V]) yamlcheck.Kind[V] {
	return atNamed[V]{k, where, suffix}
}

// marked sets *bad when its kind reports a problem.
type marked[V any] struct {
	yamlcheck.Kind[V]
	bad *bool
}

// Parse implements yamlcheck.Kind.
func (k marked[V]) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (V, bool) {
	v, ok := k.Kind.Parse(c, n, where)
	if !ok {
		*k.bad = true
	}
	return v, ok
}

// Unwrap implements yamlcheck.Wrapper.
func (k marked[V]) Unwrap() yamlcheck.Kind[V] { return k.Kind }

// marking sets *bad when k reports a problem.
func marking[V any](bad *bool, k yamlcheck.Kind[V]) yamlcheck.Kind[V] { return marked[V]{k, bad} }

// customKind is a kind decoded by a function.
type customKind[V any] struct {
	parse    func(c *yamlcheck.Checker, n *yaml.Node, where string) (V, bool)
	describe string
}

// Parse implements yamlcheck.Kind.
func (k customKind[V]) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (V, bool) {
	return k.parse(c, n, where)
}

// Format implements yamlcheck.Kind.
func (customKind[V]) Format(v V) string { return fmt.Sprint(v) }

// Describe implements yamlcheck.Kind.
func (k customKind[V]) Describe() string { return k.describe }

// custom is a kind decoded by parse; describe is its docs' type.
func custom[V any](describe string, parse func(c *yamlcheck.Checker, n *yaml.Node, where string) (V, bool)) yamlcheck.Kind[V] {
	return customKind[V]{parse: parse, describe: describe}
}

// nameKind is a route, tier, limit or rule name.
type nameKind struct{}

// Parse implements yamlcheck.Kind.
func (nameKind) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if ok && !l7.ValidName(s) {
		c.Errorf(n, "%s %q: want 1-64 of [A-Za-z0-9_.-]", where, s)
		return "", false
	}
	return s, ok
}

// Format implements yamlcheck.Kind.
func (nameKind) Format(s string) string { return yamlcheck.String{}.Format(s) }

// Describe implements yamlcheck.Kind.
func (nameKind) Describe() string { return "name, `[A-Za-z0-9_.-]{1,64}`" }

// hostName is a match's host: a name without port, "*." for subdomains.
type hostName struct{}

// Parse implements yamlcheck.Kind.
func (hostName) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	if h := strings.TrimPrefix(s, "*."); h == "" || strings.ContainsAny(h, "/:*@ ") {
		c.Errorf(n, "%s %q: want a host name without port, e.g. api.example.com or *.example.com", where, s)
		return "", false
	}
	return strings.ToLower(s), true
}

// Format implements yamlcheck.Kind.
func (hostName) Format(s string) string { return yamlcheck.String{}.Format(s) }

// Describe implements yamlcheck.Kind.
func (hostName) Describe() string { return "host name" }

// methods is a match's list of upper-case methods.
type methods struct{}

// Parse implements yamlcheck.Kind.
func (methods) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) ([]string, bool) {
	var out []string
	for _, item := range c.Seq(n, where) {
		s, ok := c.Scalar(item, "method")
		if !ok {
			continue
		}
		if !httpToken(s) || strings.ToUpper(s) != s {
			c.Errorf(item, "match method %q: want an upper-case HTTP method such as GET", s)
			continue
		}
		out = append(out, s)
	}
	return out, true
}

// Format implements yamlcheck.Kind.
func (methods) Format(ms []string) string { return "[" + strings.Join(ms, ", ") + "]" }

// Describe implements yamlcheck.Kind.
func (methods) Describe() string { return "list of methods" }

// pathPrefix is a match's path_prefix: it starts with / and is in normal
// form.
type pathPrefix struct{}

// Parse implements yamlcheck.Kind.
func (pathPrefix) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	if !strings.HasPrefix(s, "/") {
		c.Errorf(n, "%s %q must start with /", where, s)
		return s, true
	}
	normalPath(c, n, where, s)
	return s, true
}

// Format implements yamlcheck.Kind.
func (pathPrefix) Format(s string) string { return yamlcheck.String{}.Format(s) }

// Describe implements yamlcheck.Kind.
func (pathPrefix) Describe() string { return "path" }

// headerValues is a match's header: a mapping of header name to exact
// value.
type headerValues struct{}

// Parse implements yamlcheck.Kind.
func (headerValues) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (map[string]string, bool) {
	n = yamlcheck.Resolve(n)
	if n.Kind != yaml.MappingNode {
		c.Errorf(n, "%s must be a mapping of header name to value, got %s", where, yamlcheck.KindName(n))
		return nil, false
	}
	out := map[string]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		name, _ := headerName{}.Parse(c, yamlcheck.Resolve(n.Content[i]), where)
		val, ok := c.Scalar(yamlcheck.Resolve(n.Content[i+1]), where+" value")
		if name != "" && ok {
			out[name] = val
		}
	}
	return out, true
}

// Format implements yamlcheck.Kind.
func (headerValues) Format(m map[string]string) string { return fmt.Sprint(m) }

// Describe implements yamlcheck.Kind.
func (headerValues) Describe() string { return "mapping of header name to value" }

// parseKey reads a limit's key (ParseKey).
func parseKey(c *yamlcheck.Checker, n *yaml.Node, where string) (Key, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return nil, false
	}
	k, err := ParseKey(s)
	if err != nil {
		c.Errorf(n, "%v", err)
		return nil, false
	}
	return k, true
}

// algorithm is a limit's algorithm, in either spelling.
type algorithm struct{}

var algorithms = enumOf{[]string{AlgGCRA, AlgSlidingWindow, AlgTokenBucket, AlgFixedWindow, AlgLeakyBucket, AlgSlidingLog}}

// Parse implements yamlcheck.Kind.
func (algorithm) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (string, bool) {
	s, ok := c.Scalar(n, where)
	if !ok {
		return "", false
	}
	if alias, isAlias := algorithmAlias(s); isAlias {
		r := yamlcheck.Resolve(n)
		n = &yaml.Node{Kind: yaml.ScalarNode, Value: alias, Line: r.Line, Column: r.Column}
	}
	return algorithms.Parse(c, n, where)
}

// Format implements yamlcheck.Kind.
func (algorithm) Format(s string) string { return s }

// Describe implements yamlcheck.Kind.
func (algorithm) Describe() string { return algorithms.Describe() }

// requestRate is a limit's rate: Count requests per Per.
type requestRate struct {
	Count int64
	Per   time.Duration
}

// rateKind is a limit's rate (the policy's rate syntax, requests only);
// where names the limit.
type rateKind struct{}

// Parse implements yamlcheck.Kind.
func (rateKind) Parse(c *yamlcheck.Checker, n *yaml.Node, where string) (requestRate, bool) {
	s, ok := c.Scalar(n, "limit rate")
	if !ok {
		return requestRate{}, false
	}
	r, unit, err := policy.ParseRate(s)
	switch {
	case err != nil:
		c.Errorf(n, "%s: %v", where, err)
	case unit != policy.Packets:
		c.Errorf(n, "%s: rate %q counts %s; an L7 rate counts requests, e.g. 100/min", where, s, unit)
	case r.Count > 1<<40:
		c.Errorf(n, "%s: rate %q is too large", where, s)
	default:
		return requestRate{Count: int64(r.Count), Per: r.Per}, true
	}
	return requestRate{}, false
}

// Format implements yamlcheck.Kind.
func (rateKind) Format(r requestRate) string {
	if r.Count == 0 {
		return "required"
	}
	return policy.FormatRate(policy.Rate{Count: uint64(r.Count), Per: r.Per}, policy.Packets)
}

// Describe implements yamlcheck.Kind.
func (rateKind) Describe() string { return "request rate" }
