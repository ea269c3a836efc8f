package proxy

import (
	"net/http"
	"regexp"
	"strings"
)

// matcher is a compiled Match. matches allocates nothing: host and header
// comparisons work on the request's strings in place, and
// regexp.MatchString does not allocate for a compiled pattern.
type matcher struct {
	host       string // lower case, without "*."
	wildcard   bool   // host was "*.example.com": match subdomains
	methods    []string
	pathPrefix string
	ignoreCase bool // pathPrefix compared case-insensitively (pattern has (?i))
	pattern    *regexp.Regexp
	headers    []headerMatch
}

type headerMatch struct{ name, value string }

func newMatcher(m Match) matcher {
	mt := matcher{methods: m.Methods, pathPrefix: m.PathPrefix, pattern: m.PathPattern, ignoreCase: m.IgnoreCase}
	mt.host = strings.ToLower(m.Host)
	if strings.HasPrefix(mt.host, "*.") {
		mt.wildcard = true
		mt.host = mt.host[1:] // keep the dot: ".example.com"
	}
	for name, v := range m.Header {
		mt.headers = append(mt.headers, headerMatch{name: http.CanonicalHeaderKey(name), value: v})
	}
	return mt
}

// hostOnly strips the port from a Host header value ("[::1]:80" -> "[::1]").
func hostOnly(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[i:], "]") {
		return h[:i]
	}
	return h
}

func (m *matcher) matches(r *http.Request) bool {
	if m.host != "" {
		h := hostOnly(r.Host)
		if m.wildcard {
			if len(h) <= len(m.host) || !strings.EqualFold(h[len(h)-len(m.host):], m.host) {
				return false
			}
		} else if !strings.EqualFold(h, m.host) {
			return false
		}
	}
	if len(m.methods) > 0 {
		ok := false
		for _, x := range m.methods {
			if x == r.Method {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if m.pathPrefix != "" {
		p := r.URL.Path
		if len(p) < len(m.pathPrefix) {
			return false
		}
		if m.ignoreCase && !strings.EqualFold(p[:len(m.pathPrefix)], m.pathPrefix) ||
			!m.ignoreCase && p[:len(m.pathPrefix)] != m.pathPrefix {
			return false
		}
	}
	if m.pattern != nil && !m.pattern.MatchString(r.URL.Path) {
		return false
	}
	for _, hm := range m.headers {
		v := r.Header[hm.name]
		if len(v) == 0 || v[0] != hm.value {
			return false
		}
	}
	return true
}
