package l7

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/bits"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
)

// KeyFunc extracts a rule's key from a request as a 64-bit hash. ok is false
// when the request has no such key (no API key header, say): the rule then
// does not apply to the request. KeyFuncs made by Keys do not allocate.
type KeyFunc func(r *http.Request) (key uint64, ok bool)

// KeyConfig configures key extraction.
type KeyConfig struct {
	// TrustedProxies are the peers whose X-Forwarded-For and Forwarded
	// headers are believed. A request from any other peer is keyed by its
	// peer address, whatever its headers say. Empty: never believe them.
	TrustedProxies []netip.Prefix
	// IPv4PrefixLen and IPv6PrefixLen group client addresses: clients in
	// the same prefix share a key. Defaults 32 and 64 (one IPv6 /64 is one
	// subscriber; per-address IPv6 keys are free to rotate).
	IPv4PrefixLen int
	IPv6PrefixLen int
	// UserHeader and TenantHeader name the headers the auth layer sets in
	// front of this middleware (it must strip client-sent copies).
	// Defaults "X-User-Id" and "X-Tenant-Id".
	UserHeader   string
	TenantHeader string
	// Route returns the route pattern of a request for endpoint keys
	// (chi: chi.RouteContext(r.Context()).RoutePattern()). Default: the
	// net/http ServeMux pattern (r.Pattern) when the middleware wraps the
	// handler inside the mux, else the URL path.
	Route func(r *http.Request) string
}

// Keys makes KeyFuncs that hash with one random per-process seed.
type Keys struct {
	seed         maphash.Seed
	trusted      []netip.Prefix
	v4bits       int
	v6bits       int
	userHeader   string
	tenantHeader string
	route        func(r *http.Request) string
}

// NewKeys returns a key maker for cfg.
func NewKeys(cfg KeyConfig) (*Keys, error) {
	k := &Keys{
		seed:         maphash.MakeSeed(),
		v4bits:       32,
		v6bits:       64,
		userHeader:   "X-User-Id",
		tenantHeader: "X-Tenant-Id",
		route:        cfg.Route,
	}
	for _, p := range cfg.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("keys: trusted proxy prefix %q is not valid", p)
		}
		k.trusted = append(k.trusted, p.Masked())
	}
	if cfg.IPv4PrefixLen != 0 {
		if cfg.IPv4PrefixLen < 1 || cfg.IPv4PrefixLen > 32 {
			return nil, fmt.Errorf("keys: IPv4 prefix length %d: must be in [1, 32]", cfg.IPv4PrefixLen)
		}
		k.v4bits = cfg.IPv4PrefixLen
	}
	if cfg.IPv6PrefixLen != 0 {
		if cfg.IPv6PrefixLen < 1 || cfg.IPv6PrefixLen > 128 {
			return nil, fmt.Errorf("keys: IPv6 prefix length %d: must be in [1, 128]", cfg.IPv6PrefixLen)
		}
		k.v6bits = cfg.IPv6PrefixLen
	}
	if cfg.UserHeader != "" {
		k.userHeader = cfg.UserHeader
	}
	if cfg.TenantHeader != "" {
		k.tenantHeader = cfg.TenantHeader
	}
	k.userHeader = textproto.CanonicalMIMEHeaderKey(k.userHeader)
	k.tenantHeader = textproto.CanonicalMIMEHeaderKey(k.tenantHeader)
	return k, nil
}

// Kind tags keep "user=x" and "tenant=x" apart in composed keys.
const (
	tagIP uint64 = iota + 0x9e3779b97f4a7c15
	tagHeader
	tagEndpoint
	tagGlobal
)

// mix combines two words into one well-mixed hash (wyhash's multiply-fold).
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a^0xa0761d6478bd642f, b^0xe7037ed1a0b428db)
	return hi ^ lo
}

func (k *Keys) hashString(tag uint64, s string) uint64 {
	return mix(tag, maphash.String(k.seed, s))
}

// HashAddr returns the key of addr after grouping it by the configured
// prefix length.
func (k *Keys) HashAddr(addr netip.Addr) uint64 {
	addr = addr.Unmap()
	nbits := k.v6bits
	if addr.Is4() {
		nbits = k.v4bits
	}
	if p, err := addr.Prefix(nbits); err == nil {
		addr = p.Addr()
	}
	b := addr.As16()
	return mix(mix(tagIP, binary.BigEndian.Uint64(b[:8])), binary.BigEndian.Uint64(b[8:]))
}

// hashIPv4 is HashAddr of the IPv4 address a (big-endian): its 16-byte
// form is ::ffff:a, so the first word is 0.
func (k *Keys) hashIPv4(a uint32) uint64 {
	a &= ^uint32(0) << (32 - k.v4bits)
	return mix(mix(tagIP, 0), 0xffff<<32|uint64(a))
}

// parseIPv4Port parses "a.b.c.d:port", the form net/http gives
// RemoteAddr for an IPv4 peer, into the address (big-endian). It accepts
// what netip.ParseAddrPort accepts in that form and declines (ok false)
// anything else, which the caller then parses in full.
func parseIPv4Port(s string) (uint32, bool) {
	var a uint32
	i := 0
	for part := range 4 {
		start := i
		v := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' && i-start < 3 {
			v = v*10 + int(s[i]-'0')
			i++
		}
		if i == start || v > 255 || (i-start > 1 && s[start] == '0') {
			return 0, false
		}
		a = a<<8 | uint32(v)
		sep := byte('.')
		if part == 3 {
			sep = ':'
		}
		if i >= len(s) || s[i] != sep {
			return 0, false
		}
		i++
	}
	if n := len(s) - i; n < 1 || n > 5 {
		return 0, false
	}
	port := 0
	for ; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		port = port*10 + int(c-'0')
	}
	return a, port <= 65535
}

// IP keys by client address (ClientIP), grouped by prefix.
func (k *Keys) IP() KeyFunc {
	return func(r *http.Request) (uint64, bool) {
		if len(k.trusted) == 0 {
			// The common case, an IPv4 peer and no proxy to believe:
			// HashAddr's result without netip's general parser.
			if a, ok := parseIPv4Port(r.RemoteAddr); ok {
				return k.hashIPv4(a), true
			}
		}
		addr, ok := k.ClientIP(r)
		if !ok {
			return 0, false
		}
		return k.HashAddr(addr), true
	}
}

// Header keys by the first value of the named header (an API key, say).
func (k *Keys) Header(name string) KeyFunc {
	name = textproto.CanonicalMIMEHeaderKey(name)
	tag := mix(tagHeader, maphash.String(k.seed, name))
	return func(r *http.Request) (uint64, bool) {
		v := r.Header[name]
		if len(v) == 0 || v[0] == "" {
			return 0, false
		}
		return k.hashString(tag, v[0]), true
	}
}

// User keys by the auth layer's user header.
func (k *Keys) User() KeyFunc { return k.Header(k.userHeader) }

// Tenant keys by the auth layer's tenant header.
func (k *Keys) Tenant() KeyFunc { return k.Header(k.tenantHeader) }

// Endpoint keys by method and route pattern.
func (k *Keys) Endpoint() KeyFunc {
	return func(r *http.Request) (uint64, bool) {
		return mix(k.hashString(tagEndpoint, r.Method), maphash.String(k.seed, k.Route(r))), true
	}
}

// Global gives every request the same key: a limit on the rule as a whole.
func (k *Keys) Global() KeyFunc {
	return func(*http.Request) (uint64, bool) { return tagGlobal, true }
}

// Route returns the request's route pattern as configured.
func (k *Keys) Route(r *http.Request) string {
	if k.route != nil {
		return k.route(r)
	}
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}

// Compose keys by all parts together (endpoint+user, tenant+ip): the rule
// applies only when every part is present.
func Compose(parts ...KeyFunc) KeyFunc {
	return func(r *http.Request) (uint64, bool) {
		h := uint64(len(parts))
		for _, p := range parts {
			v, ok := p(r)
			if !ok {
				return 0, false
			}
			h = mix(h, v)
		}
		return h, true
	}
}

func (k *Keys) isTrusted(a netip.Addr) bool {
	for _, p := range k.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientIP returns the client address of r. The peer address is the client
// unless the peer is a trusted proxy; then the Forwarded header (or, when
// absent, X-Forwarded-For) is read from the right, skipping trusted proxies,
// and the first untrusted address is the client. A malformed or obfuscated
// entry stops the walk at the last address that was well formed. If every
// hop is trusted, the leftmost is the client.
func (k *Keys) ClientIP(r *http.Request) (netip.Addr, bool) {
	peer, ok := parseHost(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, false
	}
	if len(k.trusted) == 0 || !k.isTrusted(peer) {
		return peer, true
	}
	if fw := r.Header["Forwarded"]; len(fw) > 0 {
		return k.walk(fw, peer, true), true
	}
	if xff := r.Header["X-Forwarded-For"]; len(xff) > 0 {
		return k.walk(xff, peer, false), true
	}
	return peer, true
}

// walk reads header lines from the last one backwards, each from its last
// comma-separated element backwards.
func (k *Keys) walk(lines []string, peer netip.Addr, forwarded bool) netip.Addr {
	client := peer
	for i := len(lines) - 1; i >= 0; i-- {
		rest := lines[i]
		for rest != "" {
			elem := rest
			if j := strings.LastIndexByte(rest, ','); j >= 0 {
				elem, rest = rest[j+1:], rest[:j]
			} else {
				rest = ""
			}
			elem = strings.TrimSpace(elem)
			if elem == "" {
				continue
			}
			if forwarded {
				elem = forwardedFor(elem)
			}
			a, ok := parseHost(elem)
			if !ok {
				return client
			}
			client = a
			if !k.isTrusted(a) {
				return client
			}
		}
	}
	return client
}

// forwardedFor returns the for= node of one RFC 7239 forwarded-element
// (";"-separated pairs), unquoted, or "" if there is none.
func forwardedFor(elem string) string {
	for elem != "" {
		pair := elem
		if j := strings.IndexByte(elem, ';'); j >= 0 {
			pair, elem = elem[:j], elem[j+1:]
		} else {
			elem = ""
		}
		pair = strings.TrimSpace(pair)
		if len(pair) > 4 && strings.EqualFold(pair[:4], "for=") {
			v := pair[4:]
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			return v
		}
	}
	return ""
}

// parseHost parses "addr", "addr:port", "[v6]" or "[v6]:port", choosing the
// parser by shape so that well-formed input never allocates an error.
func parseHost(s string) (netip.Addr, bool) {
	var a netip.Addr
	var err error
	switch {
	case s == "":
		return netip.Addr{}, false
	case s[0] == '[' && s[len(s)-1] == ']':
		a, err = netip.ParseAddr(s[1 : len(s)-1])
	case s[0] == '[' || strings.Count(s, ":") == 1:
		var ap netip.AddrPort
		ap, err = netip.ParseAddrPort(s)
		a = ap.Addr()
	default:
		a, err = netip.ParseAddr(s)
	}
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}
