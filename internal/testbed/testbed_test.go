package testbed

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

func TestInAllowed(t *testing.T) {
	for p, want := range map[string]bool{
		"198.18.0.0/15": true, "198.19.200.1/32": true, "198.18.3.0/29": true, "fd00:0:0:1::/64": true,
		"198.16.0.0/14": false, "198.20.0.1/32": false, "192.0.2.0/24": false, "0.0.0.0/0": false,
		"fc00::/7": false, "2001:db8::/32": false,
	} {
		if got := InAllowed(netip.MustParsePrefix(p)); got != want {
			t.Errorf("InAllowed(%s) = %v, want %v", p, got, want)
		}
	}
}

func requireRoot(t *testing.T) { testenv.RequireRoot(t) }

// TestTeardown checks Close removes every namespace, that addresses
// outside the testbed ranges are refused, and that RemoveStale removes
// only what dead processes left.
func TestTeardown(t *testing.T) {
	requireRoot(t)
	tb := New(fmt.Sprintf("eg-tbtest-%d", os.Getpid()))
	t.Cleanup(func() { tb.Close() })
	s, err := tb.Star(2)
	if err != nil {
		t.Fatal(err)
	}
	a, err := tb.Namespace("x")
	if err != nil {
		t.Fatal(err)
	}
	_, err = tb.Connect(s.Edge, a, VethSpec{NameA: "eg-bad", NameB: "eg-bad", AddrsA: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}})
	if err == nil || !strings.Contains(err.Error(), "outside 198.18.0.0/15") {
		t.Errorf("connect with 192.0.2.1/24: %v, want a refusal", err)
	}
	names := tb.Names()
	if len(names) != 4 {
		t.Fatalf("namespaces %v, want edge, c0, c1, x", names)
	}
	// Ours are alive: RemoveStale must not touch them.
	if removed, err := RemoveStale("eg-tbtest"); err != nil || len(removed) != 0 {
		t.Errorf("RemoveStale removed %v (%v) while their process runs", removed, err)
	}
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if Exists(n) {
			t.Errorf("namespace %s still exists after Close", n)
		}
	}
	// A dead process's namespace goes.
	dead := New("eg-tbtest-999998")
	if _, err := dead.Namespace("left"); err != nil {
		t.Fatal(err)
	}
	removed, err := RemoveStale("eg-tbtest")
	if err != nil || len(removed) != 1 || !strings.HasSuffix(removed[0], "eg-tbtest-999998-1-left") {
		t.Errorf("RemoveStale = %v, %v; want the dead pid's namespace", removed, err)
	}
	dead.Close()
}
