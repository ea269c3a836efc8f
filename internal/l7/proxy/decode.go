package proxy

import (
	"fmt"
	"net/textproto"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// Defaults of Decode.
const (
	DefaultLocalCapacity       = 1 << 16
	DefaultEscalationSources   = 1 << 16
	DefaultEscalationRejection = 100
	DefaultEscalationWindow    = time.Minute
	DefaultEscalationTTL       = 10 * time.Minute
	maxCapacity                = 1 << 24
	// MaxSlidingLogBytes bounds a sliding_log limit's logs: rate count
	// times capacity times 8 bytes (at the default capacity, a rate count
	// of at most 128).
	MaxSlidingLogBytes = 64 << 20
)

// Decode decodes and validates the l7: section node (policy.Policy.L7) of
// file. It reports every problem at once, each with its position, in file
// order; the Config is nil whenever there is a problem.
func Decode(node *yaml.Node, file string) (*Config, []policy.Problem) {
	d := &decoder{Checker: yamlcheck.Checker{File: file}, limitNames: map[string]*yaml.Node{}}
	cfg := d.config(node)
	if len(d.Problems) > 0 {
		sort.SliceStable(d.Problems, func(i, j int) bool {
			a, b := d.Problems[i].Pos, d.Problems[j].Pos
			if a.Line != b.Line {
				return a.Line < b.Line
			}
			return a.Column < b.Column
		})
		return nil, d.Problems
	}
	return cfg, nil
}

type decoder struct {
	yamlcheck.Checker
	limitNames map[string]*yaml.Node
	// cfg is the section being decoded (its routes see what the table
	// decoded before them).
	cfg   *Config
	redis bool
	// keyless: limits take no key (the rate-limit service's, keyed by
	// their descriptor: LimitDecoder).
	keyless bool
	// aggregate: the keyless limits being decoded count an aggregate of
	// clients (their default reserve is DefaultAggregateReserve).
	aggregate bool
}

// httpToken reports whether s is an RFC 9110 token (a method or header name).
func httpToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func (d *decoder) config(node *yaml.Node) *Config {
	if node == nil {
		d.Errorf(nil, "l7: section missing")
		return nil
	}
	cfg := DefaultConfig()
	d.cfg = &cfg
	// A redis: key, even one with problems, lets limits name backend
	// redis (its own problems are reported once, there).
	if m := yamlcheck.Resolve(node); m.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(m.Content); i += 2 {
			d.redis = d.redis || yamlcheck.Resolve(m.Content[i]).Value == "redis"
		}
	}
	got := d.l7Table().ParseItem(&d.Checker, node, "l7", &cfg)
	if got == nil {
		return nil
	}
	// With an rls: section (the rate-limit service, internal/l7/rls) the
	// reverse proxy is optional: no listen and no upstream serve no proxy.
	_, hasListen := got["listen"]
	_, hasUpstream := got["upstream"]
	proxyOff := cfg.RLS != nil && !hasListen && !hasUpstream
	if !hasListen && !proxyOff {
		d.Errorf(node, "l7: listen is required (host:port)")
	}
	if !hasUpstream && !proxyOff {
		d.Errorf(node, "l7: upstream is required (http://host:port)")
	}
	if n, ok := got["engine"]; ok && cfg.Engine == EngineEventLoop && cfg.Upstream != nil && cfg.Upstream.Scheme == "https" {
		d.Errorf(n, "l7 engine event-loop: the upstream is https and the event loop speaks plain http; use auto or net-http")
	}
	return &cfg
}

// algorithmAlias is the canonical name of another spelling of an
// algorithm (hyphens and underscores both accepted), and whether s is one.
func algorithmAlias(s string) (string, bool) {
	switch s {
	case "sliding_window":
		return AlgSlidingWindow, true
	case "token_bucket":
		return AlgTokenBucket, true
	case "fixed_window":
		return AlgFixedWindow, true
	case "leaky-bucket":
		return AlgLeakyBucket, true
	case "sliding-log":
		return AlgSlidingLog, true
	}
	return "", false
}

// ParseKey parses a key expression: ip, header:NAME, user, tenant,
// endpoint, global, prefix, asn, or several joined by "+" (endpoint+user,
// tenant+ip, asn+endpoint).
func ParseKey(s string) (Key, error) {
	var k Key
	seen := map[string]bool{}
	for _, part := range strings.Split(s, "+") {
		part = strings.TrimSpace(part)
		var p KeyPart
		switch {
		case part == "ip":
			p.Kind = KeyIP
		case part == "user":
			p.Kind = KeyUser
		case part == "tenant":
			p.Kind = KeyTenant
		case part == "endpoint":
			p.Kind = KeyEndpoint
		case part == "global":
			p.Kind = KeyGlobal
		case part == "prefix":
			p.Kind = KeyPrefix
		case part == "asn":
			p.Kind = KeyASN
		case strings.HasPrefix(part, "header:"):
			h := strings.TrimSpace(strings.TrimPrefix(part, "header:"))
			if !httpToken(h) {
				return nil, fmt.Errorf("limit key %q: header name %q is not valid", s, h)
			}
			p = KeyPart{Kind: KeyHeader, Header: textproto.CanonicalMIMEHeaderKey(h)}
		default:
			return nil, fmt.Errorf("limit key %q: unknown part %q; want ip, header:NAME, user, tenant, endpoint, global, prefix, asn, joined by +", s, part)
		}
		id := Key{p}.String()
		if seen[id] {
			return nil, fmt.Errorf("limit key %q: part %q repeated", s, part)
		}
		seen[id] = true
		k = append(k, p)
	}
	if len(k) > 1 && seen["global"] {
		return nil, fmt.Errorf("limit key %q: global cannot be combined", s)
	}
	return k, nil
}
