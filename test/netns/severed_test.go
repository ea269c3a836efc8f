package netns_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/maps/mapstest"
	"github.com/edgeguard/edgeguard/test/netns"
)

// TestSeveredPinnedLinkIsReplaced: Attach finds a pinned link by interface
// name and swaps its program with link.Update. When the interface was
// deleted and created again under the same name (a container's veth, a
// re-created VLAN or bond) while the daemon was down, the pinned link is
// severed and Update fails with ENOLINK. Attach must then remove the stale
// pin and attach afresh, keeping the maps (and bucket state), instead of
// failing every time and leaving the interface unprotected.
func TestSeveredPinnedLinkIsReplaced(t *testing.T) {
	tb := netns.New(t)
	s := tb.Star(1)
	c := s.Clients[0]
	pinDir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("eg-test-%d-%d", os.Getpid(), pinSeq.Add(1)))
	t.Cleanup(func() {
		if err := loader.Unpin(pinDir); err != nil {
			t.Error(err)
		}
	})

	d1, err := loader.Load(loader.Options{Sizes: sizes, TestClock: true, PinDir: pinDir})
	if err != nil {
		t.Fatalf("load with pins: %v", err)
	}
	m1 := maps.New(d1)
	a1 := startFrozen(t, s.Edge, c, d1, m1)
	v4 := openFlows(t, s)[0]
	if got := burst(t, v4, burstCount); got != burstSize {
		t.Fatalf("first daemon: received %d, want %d", got, burstSize)
	}
	if err := a1.Release(); err != nil {
		t.Fatal(err)
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}

	// While no daemon runs, the interface goes away and comes back under
	// the same name, towards a new client namespace with the same
	// addresses.
	l, err := s.Edge.Netlink().LinkByName(c.EdgeIf)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Edge.Netlink().LinkDel(l); err != nil {
		t.Fatalf("delete %s: %v", c.EdgeIf, err)
	}
	againNS := tb.Namespace("c0-again")
	tb.Connect(s.Edge, againNS, netns.VethSpec{
		NameA: c.EdgeIf, NameB: "eg-up",
		AddrsA: c.Link.A.Addrs, AddrsB: c.Link.B.Addrs,
	})
	// The edge's socket stays bound to its address across the re-creation.
	dst := netip.AddrPortFrom(c.EdgeAddr4, udpPort)
	from, err := againNS.DialUDP(netip.AddrPortFrom(c.Src4, 0), dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { from.Close() })
	sentinel, err := againNS.DialUDP(netip.AddrPortFrom(c.Alt4, 0), dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sentinel.Close() })
	v4again := flows{name: "ipv4", from: from, sentinel: sentinel, to: v4.to}

	d2, m2 := mapstest.Load(t, loader.Options{Sizes: sizes, TestClock: true, PinDir: pinDir})
	if err := m2.SetTestClock(uint64(time.Hour)); err != nil {
		t.Fatal(err)
	}
	a2, err := attach(t, s.Edge, d2, c.EdgeIf)
	if err != nil {
		t.Fatalf("attach to re-created %s with a severed pinned link: %v", c.EdgeIf, err)
	}
	t.Cleanup(func() { a2.Detach() })
	if got, want := attachedProgID(t, s.Edge, c.EdgeIf), progID(t, d2.Objects.XdpLimiter); got != want {
		t.Fatalf("program on re-created %s is id %d, want %d", c.EdgeIf, got, want)
	}
	// Enforcing again, with the kept (empty) bucket: nothing passes.
	if got := burst(t, v4again, 50); got != 0 {
		t.Errorf("received %d of 50 on the re-created interface, want 0 (bucket state kept, still empty)", got)
	}
}
