package asn

import (
	"net/netip"
	"testing"
)

var addrSeeds = []string{
	"1.2.3.4", "0.0.0.0", "255.255.255.255", "256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1..2.3", "",
	"::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9",
	"1::2::3", ":::", ":1", "1:", "12345::", "abcd:EF01::", "2001:db8::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
	"::ffff:1.2.3.4", "fe80::1%eth0", "1:2:3:4:5:6:7:8::", "g::", "1:2:3:4:5:6:7", "::0:0:0:0:0:0:0", "0:0:0:0:0:0:0::",
}

func checkParseAddr(t *testing.T, s string) {
	got, ok := parseAddr([]byte(s))
	want, err := netip.ParseAddr(s)
	wantOK := err == nil && want.Zone() == ""
	if ok != wantOK || (ok && got != want) {
		t.Fatalf("parseAddr(%q) = %v, %v; netip says %v, %v", s, got, ok, want, err)
	}
}

func TestParseAddrMatchesNetip(t *testing.T) {
	for _, s := range addrSeeds {
		checkParseAddr(t, s)
	}
}

func FuzzParseAddr(f *testing.F) {
	for _, s := range addrSeeds {
		f.Add(s)
	}
	f.Fuzz(checkParseAddr)
}

func TestParseAddrDoesNotAllocate(t *testing.T) {
	v4, v6 := []byte("203.0.113.250"), []byte("2001:db8:1234::ff00")
	if n := testing.AllocsPerRun(100, func() {
		parseAddr(v4)
		parseAddr(v6)
	}); n != 0 {
		t.Fatalf("%v allocations per parse", n)
	}
}
