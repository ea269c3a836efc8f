package sockdiag

import (
	"context"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestMPTCPListeners: a listener opened with MPTCP is reported with its
// port, a plain TCP one is not (kernel with MPTCP enabled).
func TestMPTCPListeners(t *testing.T) {
	testenv.RequireRoot(t)
	if b, err := os.ReadFile("/proc/sys/net/mptcp/enabled"); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Skipf("MPTCP is off on this kernel (net.mptcp.enabled: %q %v)", b, err)
	}
	var mp, plain net.ListenConfig
	mp.SetMultipathTCP(true)
	plain.SetMultipathTCP(false)
	lm, err := mp.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	lp, err := plain.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lp.Close()
	got, err := MPTCPListeners()
	if err != nil {
		t.Fatal(err)
	}
	want := netip.MustParseAddrPort(lm.Addr().String())
	if !slices.Contains(got, want) {
		t.Errorf("MPTCP listeners %v lack %v", got, want)
	}
	if p := netip.MustParseAddrPort(lp.Addr().String()); slices.Contains(got, p) {
		t.Errorf("MPTCP listeners %v hold the plain TCP %v", got, p)
	}
}
