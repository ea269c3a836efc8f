package rls

import (
	"errors"
	"strings"
	"testing"
)

// TestDescriptorKey: a descriptor's counting key (also its Redis key, so
// a contract across versions) is the rule and every entry, remote_address
// grouped by l7.client_prefix, a value over 64 bytes replaced by its
// FNV-1a hash and length (as the proxy's keys).
func TestDescriptorKey(t *testing.T) {
	s, _ := startServer(t, `
l7:
  client_prefix: {v4: 24, v6: 48}
  rls:
    listen: 127.0.0.1:0
    rules:
      - {name: by-ip, domain: edge, descriptor: [remote_address, generic_key], limits: [{name: l, rate: 1000/s}]}
`, nil, nil)
	svc := s.Service()
	long := strings.Repeat("x", 70)
	for _, c := range []struct {
		addr, value, want string
	}{
		{"198.18.7.9", "api", "by-ip|remote_address=198.18.7.0/24|generic_key=api"},
		{"::ffff:198.18.7.9", "api", "by-ip|remote_address=198.18.7.0/24|generic_key=api"},
		{"fd00:1:2:3::9", "api", "by-ip|remote_address=fd00:1:2::/48|generic_key=api"},
		{"198.18.7.9", long, "by-ip|remote_address=198.18.7.0/24|generic_key=h:513a36f59147a8dd:70"},
		{"198.18.7.9", strings.Repeat("y", 64), "by-ip|remote_address=198.18.7.0/24|generic_key=" + strings.Repeat("y", 64)},
	} {
		v, err := svc.Explain(&Request{Domain: "edge", Descriptors: []Descriptor{{Entries: []Entry{{"remote_address", c.addr}, {"generic_key", c.value}}}}})
		if err != nil {
			t.Fatalf("%s %.10s: %v", c.addr, c.value, err)
		}
		if got := v.Statuses[0].Key; got != c.want {
			t.Errorf("%s %.10s: key %q, want %q", c.addr, c.value, got, c.want)
		}
	}
	if _, err := svc.Explain(&Request{Domain: "edge", Descriptors: []Descriptor{{Entries: []Entry{{"remote_address", "not-an-ip"}, {"generic_key", "x"}}}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("remote_address not-an-ip: err %v, want ErrInvalid", err)
	}
}
