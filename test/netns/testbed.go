// Package netns builds private network-namespace topologies for tests: named
// namespaces, veth pairs between them with fixed addresses from the
// benchmarking ranges 198.18.0.0/15 and fd00::/8 only, permanent neighbour
// entries (no ARP or neighbour discovery in the way), and helpers to run
// code and open sockets inside a namespace. Everything a Testbed creates is
// removed in t.Cleanup, also when the test fails.
//
// Namespaces are entered on a dedicated, locked OS thread that is thrown
// away afterwards (never returned to the Go scheduler), so no goroutine of
// the test ever runs in the wrong namespace by accident.
package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// allowed are the only ranges a testbed puts on an interface: RFC 2544
// benchmarking space and IPv6 unique-local addresses. Traffic between them
// never leaves the namespaces, and could not be routed if it did.
var allowed = [...]netip.Prefix{
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("fd00::/8"),
}

// RequireRoot skips tb when not running as root, with the reason. In CI
// (CI set and not "false") a skip would hide a regression, so it fails.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if ci := os.Getenv("CI"); ci != "" && ci != "false" {
		tb.Fatal("network namespace tests need root (CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF), and CI must run them")
	}
	tb.Skip("needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF) to create network namespaces and load BPF programs")
}

// nameSeq makes namespace names unique within this process; the pid makes
// them unique across processes running at once.
var nameSeq atomic.Uint64

// Testbed owns the namespaces and links of one test.
type Testbed struct {
	tb testing.TB
}

// New returns an empty testbed. It skips (or, in CI, fails) the test when
// not root.
func New(tb testing.TB) *Testbed {
	tb.Helper()
	RequireRoot(tb)
	return &Testbed{tb: tb}
}

// Namespace is a named network namespace (visible in `ip netns list` while
// the test runs, which helps debugging).
type Namespace struct {
	Name   string
	handle vnetns.NsHandle
	nl     *netlink.Handle
}

// Namespace creates a namespace called eg-test-<pid>-<seq>-<role>, with its
// loopback up, removed when the test ends.
func (t *Testbed) Namespace(role string) *Namespace {
	t.tb.Helper()
	name := fmt.Sprintf("eg-test-%d-%d-%s", os.Getpid(), nameSeq.Add(1), role)
	ns, err := newNamespace(name)
	if err != nil {
		t.tb.Fatalf("create namespace %s: %v", name, err)
	}
	t.tb.Cleanup(func() {
		if err := ns.remove(); err != nil {
			t.tb.Errorf("remove namespace %s: %v", name, err)
		}
	})
	lo, err := ns.nl.LinkByName("lo")
	if err != nil {
		t.tb.Fatalf("namespace %s: find lo: %v", name, err)
	}
	if err := ns.nl.LinkSetUp(lo); err != nil {
		t.tb.Fatalf("namespace %s: set lo up: %v", name, err)
	}
	return ns
}

func newNamespace(name string) (*Namespace, error) {
	type result struct {
		h   vnetns.NsHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		// NewNamed moves the calling thread into the new namespace. The
		// thread stays locked to this goroutine, so Go discards it when
		// the goroutine returns instead of running other code on it.
		runtime.LockOSThread()
		h, err := vnetns.NewNamed(name)
		done <- result{h, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, r.err
	}
	nl, err := netlink.NewHandleAt(r.h)
	if err != nil {
		r.h.Close()
		return nil, errors.Join(fmt.Errorf("open netlink in namespace: %w", err), vnetns.DeleteNamed(name))
	}
	return &Namespace{Name: name, handle: r.h, nl: nl}, nil
}

// remove deletes the name; the namespace, and every interface in it, goes
// away once no socket or thread refers to it any more.
func (ns *Namespace) remove() error {
	ns.nl.Close()
	err := ns.handle.Close()
	return errors.Join(err, vnetns.DeleteNamed(ns.Name))
}

// Netlink is a netlink handle whose sockets live in the namespace.
func (ns *Namespace) Netlink() *netlink.Handle { return ns.nl }

// Do runs fn on an OS thread inside the namespace. Sockets and BPF links
// created by fn stay in the namespace after Do returns; goroutines started
// by fn do not run in it.
func (ns *Namespace) Do(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread has switched namespaces, so it must
		// die with this goroutine rather than be reused.
		runtime.LockOSThread()
		if err := vnetns.Set(ns.handle); err != nil {
			done <- fmt.Errorf("enter namespace %s: %w", ns.Name, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// ListenUDP opens a UDP socket bound to addr ("ip:port") inside the
// namespace.
func (ns *Namespace) ListenUDP(addr netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := ns.Do(func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen udp %s in %s: %w", addr, ns.Name, err)
	}
	return c, nil
}

// DialUDP opens a UDP socket inside the namespace, bound to laddr (port 0:
// any) and connected to raddr.
func (ns *Namespace) DialUDP(laddr, raddr netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := ns.Do(func() (err error) {
		c, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(laddr), net.UDPAddrFromAddrPort(raddr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial udp %s -> %s in %s: %w", laddr, raddr, ns.Name, err)
	}
	return c, nil
}

// Endpoint is one end of a veth pair.
type Endpoint struct {
	NS    *Namespace
	Name  string // interface name inside NS
	Index int    // ifindex inside NS
	MAC   net.HardwareAddr
	Addrs []netip.Prefix
}

// Veth is a veth pair between two namespaces.
type Veth struct {
	A, B Endpoint
}

// VethSpec describes a veth pair: interface names (at most 15 bytes, unique
// within their namespace) and the addresses of each end.
type VethSpec struct {
	NameA, NameB   string
	AddrsA, AddrsB []netip.Prefix
}

// Connect creates a veth pair from a to b, puts the addresses on, brings
// both ends up and adds permanent neighbour entries for every address of
// the other end, so no ARP or neighbour solicitation ever precedes traffic.
// IPv6 addresses skip duplicate address detection, so they are usable at
// once. The pair disappears with its namespaces.
func (t *Testbed) Connect(a, b *Namespace, spec VethSpec) *Veth {
	t.tb.Helper()
	v, err := connect(a, b, spec)
	if err != nil {
		t.tb.Fatalf("connect %s/%s to %s/%s: %v", a.Name, spec.NameA, b.Name, spec.NameB, err)
	}
	return v
}

func connect(a, b *Namespace, spec VethSpec) (*Veth, error) {
	for _, p := range append(append([]netip.Prefix{}, spec.AddrsA...), spec.AddrsB...) {
		if !inAllowed(p) {
			return nil, fmt.Errorf("address %s is outside 198.18.0.0/15 and fd00::/8: testbeds use only those", p)
		}
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: spec.NameA, MTU: 1500},
		PeerName:      spec.NameB,
		PeerNamespace: netlink.NsFd(b.handle),
	}
	if err := a.nl.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("add veth: %w", err)
	}
	v := &Veth{
		A: Endpoint{NS: a, Name: spec.NameA, Addrs: spec.AddrsA},
		B: Endpoint{NS: b, Name: spec.NameB, Addrs: spec.AddrsB},
	}
	for _, e := range []*Endpoint{&v.A, &v.B} {
		l, err := e.NS.nl.LinkByName(e.Name)
		if err != nil {
			return nil, fmt.Errorf("find %s: %w", e.Name, err)
		}
		e.Index = l.Attrs().Index
		e.MAC = l.Attrs().HardwareAddr
		for _, p := range e.Addrs {
			addr := &netlink.Addr{IPNet: prefixToIPNet(p)}
			if p.Addr().Is6() {
				addr.Flags = unix.IFA_F_NODAD
			}
			if err := e.NS.nl.AddrAdd(l, addr); err != nil {
				return nil, fmt.Errorf("add %s to %s: %w", p, e.Name, err)
			}
		}
		if err := e.NS.nl.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("set %s up: %w", e.Name, err)
		}
	}
	for _, pair := range [][2]*Endpoint{{&v.A, &v.B}, {&v.B, &v.A}} {
		local, peer := pair[0], pair[1]
		for _, p := range peer.Addrs {
			n := &netlink.Neigh{
				LinkIndex:    local.Index,
				Family:       family(p.Addr()),
				State:        netlink.NUD_PERMANENT,
				IP:           p.Addr().AsSlice(),
				HardwareAddr: peer.MAC,
			}
			if err := local.NS.nl.NeighSet(n); err != nil {
				return nil, fmt.Errorf("add permanent neighbour %s on %s: %w", p.Addr(), local.Name, err)
			}
		}
	}
	return v, nil
}

func inAllowed(p netip.Prefix) bool {
	for _, a := range allowed {
		if a.Bits() <= p.Bits() && a.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func family(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}
