package l7

import (
	"encoding/binary"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

func newKeys(t *testing.T, cfg KeyConfig) *Keys {
	t.Helper()
	k, err := NewKeys(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func request(remote string, hdr map[string][]string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/v1/items/42", nil)
	r.RemoteAddr = remote
	for k, v := range hdr {
		r.Header[http.CanonicalHeaderKey(k)] = v
	}
	return r
}

func TestClientIPTrustedProxies(t *testing.T) {
	k := newKeys(t, KeyConfig{TrustedProxies: []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("fd00::/8"),
	}})
	cases := []struct {
		name   string
		remote string
		hdr    map[string][]string
		want   string
	}{
		{"untrusted peer ignores XFF", "198.51.100.7:5555",
			map[string][]string{"X-Forwarded-For": {"203.0.113.9"}}, "198.51.100.7"},
		{"trusted peer, no header", "10.1.2.3:80", nil, "10.1.2.3"},
		{"trusted peer believes XFF", "10.1.2.3:80",
			map[string][]string{"X-Forwarded-For": {"203.0.113.9"}}, "203.0.113.9"},
		{"rightmost untrusted wins over spoofed left", "10.1.2.3:80",
			map[string][]string{"X-Forwarded-For": {"1.1.1.1, 203.0.113.9, 10.9.9.9"}}, "203.0.113.9"},
		{"several header lines read last first", "10.1.2.3:80",
			map[string][]string{"X-Forwarded-For": {"1.1.1.1", "203.0.113.9, 10.0.0.5"}}, "203.0.113.9"},
		{"garbage stops at last good hop", "10.1.2.3:80",
			map[string][]string{"X-Forwarded-For": {"nonsense, 10.0.0.5"}}, "10.0.0.5"},
		{"all trusted: leftmost", "10.1.2.3:80",
			map[string][]string{"X-Forwarded-For": {"10.0.0.1, 10.0.0.2"}}, "10.0.0.1"},
		{"Forwarded preferred, quoted v6 with port", "[fd00::1]:443",
			map[string][]string{
				"Forwarded":       {`for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711";by=10.0.0.1`},
				"X-Forwarded-For": {"1.1.1.1"},
			}, "2001:db8:cafe::17"},
		{"Forwarded obfuscated stops", "10.1.2.3:80",
			map[string][]string{"Forwarded": {"for=_hidden, for=10.0.0.7"}}, "10.0.0.7"},
		{"v4-mapped peer unmapped", "[::ffff:198.51.100.7]:80", nil, "198.51.100.7"},
	}
	for _, c := range cases {
		got, ok := k.ClientIP(request(c.remote, c.hdr))
		if !ok || got != netip.MustParseAddr(c.want) {
			t.Errorf("%s: got %v (ok %v), want %s", c.name, got, ok, c.want)
		}
	}
	if _, ok := k.ClientIP(request("@", nil)); ok {
		t.Error("unparseable RemoteAddr gave a client address")
	}
}

func TestIPKeyGrouping(t *testing.T) {
	def := newKeys(t, KeyConfig{})
	ip := def.IP()
	key := func(k KeyFunc, remote string) uint64 {
		h, ok := k(request(remote, nil))
		if !ok {
			t.Fatalf("no key for %s", remote)
		}
		return h
	}
	if key(ip, "[2001:db8:1:2::1]:1") != key(ip, "[2001:db8:1:2:ffff::9]:2") {
		t.Error("same /64 gave different keys")
	}
	if key(ip, "[2001:db8:1:2::1]:1") == key(ip, "[2001:db8:1:3::1]:1") {
		t.Error("different /64 gave the same key")
	}
	if key(ip, "192.0.2.1:1") == key(ip, "192.0.2.2:1") {
		t.Error("IPv4 addresses grouped by default")
	}
	k48 := newKeys(t, KeyConfig{IPv6PrefixLen: 48, IPv4PrefixLen: 24}).IP()
	if key(k48, "[2001:db8:1:2::1]:1") != key(k48, "[2001:db8:1:3::1]:1") {
		t.Error("/48 grouping not applied")
	}
	if key(k48, "192.0.2.1:1") != key(k48, "192.0.2.200:1") {
		t.Error("/24 grouping not applied")
	}
	if _, err := NewKeys(KeyConfig{IPv6PrefixLen: 129}); err == nil {
		t.Error("prefix length 129 accepted")
	}
}

func TestComposedKeys(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	r := request("192.0.2.1:1", map[string][]string{"X-User-Id": {"alice"}, "X-Tenant-Id": {"alice"}, "X-Api-Key": {"k1"}})
	user, _ := k.User()(r)
	tenant, _ := k.Tenant()(r)
	if user == tenant {
		t.Error("user and tenant with the same value share a key")
	}
	eu, ok := Compose(k.Endpoint(), k.User())(r)
	if !ok || eu == user {
		t.Error("endpoint+user missing or equal to user")
	}
	r2 := request("192.0.2.1:1", map[string][]string{"X-User-Id": {"bob"}})
	eu2, _ := Compose(k.Endpoint(), k.User())(r2)
	if eu == eu2 {
		t.Error("endpoint+user equal for different users")
	}
	r3 := httptest.NewRequest(http.MethodPost, "/v1/items/42", nil)
	r3.Header.Set("X-User-Id", "alice")
	eu3, _ := Compose(k.Endpoint(), k.User())(r3)
	if eu == eu3 {
		t.Error("endpoint+user equal for different methods")
	}
	if _, ok := Compose(k.Tenant(), k.IP())(r2); ok {
		t.Error("tenant+ip applied without a tenant")
	}
	if _, ok := k.Header("X-Api-Key")(r2); ok {
		t.Error("absent API key produced a key")
	}
}

func TestKeyExtractionDoesNotAllocate(t *testing.T) {
	k := newKeys(t, KeyConfig{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	r := request("10.1.2.3:4444", map[string][]string{
		"X-Forwarded-For": {"203.0.113.9, 10.0.0.5"},
		"X-User-Id":       {"alice"},
		"X-Tenant-Id":     {"acme"},
	})
	r6 := request("[2001:db8::1]:4444", nil)
	fns := map[string]KeyFunc{
		"ip":          k.IP(),
		"user":        k.User(),
		"endpoint":    k.Endpoint(),
		"tenant+ip":   Compose(k.Tenant(), k.IP()),
		"endpoint+ua": Compose(k.Endpoint(), k.User()),
	}
	for name, fn := range fns {
		if a := testing.AllocsPerRun(100, func() { fn(r); fn(r6) }); a != 0 {
			t.Errorf("%s: %.1f allocs per extraction, want 0", name, a)
		}
	}
}

// TestIPv4FastPathMatchesParser: the RemoteAddr fast path gives HashAddr's
// key for every address and prefix length, and declines what it does not
// parse exactly as netip does.
func TestIPv4FastPathMatchesParser(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, bits := range []int{32, 24, 17, 1} {
		k := newKeys(t, KeyConfig{IPv4PrefixLen: bits})
		for range 2000 {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], r.Uint32())
			addr := netip.AddrFrom4(b)
			s := netip.AddrPortFrom(addr, uint16(r.IntN(65536))).String()
			a, ok := parseIPv4Port(s)
			if !ok {
				t.Fatalf("%q declined", s)
			}
			if got, want := k.hashIPv4(a), k.HashAddr(addr); got != want {
				t.Fatalf("/%d %q: fast key %x, HashAddr %x", bits, s, got, want)
			}
		}
	}
	for _, s := range []string{"", "1.2.3.4", "1.2.3.4:", "1.2.3:80", "01.2.3.4:80", "1.2.3.256:80", "1.2.3.4:65536",
		"1.2.3.4:8x", "1.2.3.4:123456", "1.2.3.4.5:80", "[::1]:80", "1.2.3.4:80:1", "1234.2.3.4:80", " 1.2.3.4:80"} {
		if _, ok := parseIPv4Port(s); ok {
			ap, err := netip.ParseAddrPort(s)
			t.Fatalf("%q accepted by the fast path (netip: %v %v)", s, ap, err)
		}
	}
	if a, ok := parseIPv4Port("0.0.0.0:0"); !ok || a != 0 {
		t.Fatalf("0.0.0.0:0: %x %v", a, ok)
	}
}
