// Package testbed builds private network-namespace topologies: named
// namespaces, veth pairs between them with fixed addresses from the
// benchmarking ranges 198.18.0.0/15 and fd00::/8 only, permanent neighbour
// entries (no ARP or neighbour discovery in the way), and helpers to run
// code and open sockets inside a namespace. The integration tests
// (test/netns) and `edgectl demo` share it.
//
// A Testbed remembers everything it creates; Close removes it, in reverse
// order. Namespaces are named <prefix>-<seq>-<role>, with the creating
// process's pid in the prefix, so RemoveStale can sweep what a killed
// process left behind without touching anyone else's.
//
// Namespaces are entered on a dedicated, locked OS thread that is thrown
// away afterwards (never returned to the Go scheduler), so no goroutine ever
// runs in the wrong namespace by accident.
package testbed

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Allowed are the only ranges a testbed puts on an interface: RFC 2544
// benchmarking space and IPv6 unique-local addresses. Traffic between them
// never leaves the namespaces, and could not be routed if it did.
var Allowed = [...]netip.Prefix{
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("fd00::/8"),
}

// netnsDir is where iproute2 (and vishvananda/netns) keep named namespaces.
const netnsDir = "/run/netns"

// Testbed owns the namespaces of one topology.
type Testbed struct {
	prefix string

	mu         sync.Mutex
	seq        int
	namespaces []*Namespace
}

// New returns an empty testbed whose namespaces are called
// <prefix>-<seq>-<role>. The prefix should contain the pid (see
// RemoveStale), e.g. "eg-demo-1234".
func New(prefix string) *Testbed {
	return &Testbed{prefix: prefix}
}

// Namespace is a named network namespace (visible in `ip netns list` while
// it exists, which helps debugging).
type Namespace struct {
	Name   string
	handle vnetns.NsHandle
	nl     *netlink.Handle
}

// Namespace creates a namespace with its loopback up. Close removes it.
func (t *Testbed) Namespace(role string) (*Namespace, error) {
	t.mu.Lock()
	t.seq++
	name := fmt.Sprintf("%s-%d-%s", t.prefix, t.seq, role)
	t.mu.Unlock()
	ns, err := newNamespace(name)
	if err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	t.mu.Lock()
	t.namespaces = append(t.namespaces, ns)
	t.mu.Unlock()
	lo, err := ns.nl.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("namespace %s: find lo: %w", name, err)
	}
	if err := ns.nl.LinkSetUp(lo); err != nil {
		return nil, fmt.Errorf("namespace %s: set lo up: %w", name, err)
	}
	return ns, nil
}

// Close removes every namespace the testbed created, newest first, and
// with them their interfaces. It returns every error, joined.
func (t *Testbed) Close() error {
	t.mu.Lock()
	nss := t.namespaces
	t.namespaces = nil
	t.mu.Unlock()
	var errs []error
	for i := len(nss) - 1; i >= 0; i-- {
		if err := nss[i].remove(); err != nil {
			errs = append(errs, fmt.Errorf("remove namespace %s: %w", nss[i].Name, err))
		}
	}
	return errors.Join(errs...)
}

// Names lists the namespaces the testbed currently owns.
func (t *Testbed) Names() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, ns := range t.namespaces {
		out = append(out, ns.Name)
	}
	return out
}

// bpffsDir is where the daemons of testbeds pin their objects.
const bpffsDir = "/sys/fs/bpf"

// RemoveStale deletes what a process killed with SIGKILL (or a test binary
// interrupted before its cleanups ran) left behind: namespaces named
// <base>-<pid>-... and pin directories /sys/fs/bpf/<base>-<pid>[-...] whose
// pid is no longer running. It returns what it removed.
func RemoveStale(base string) ([]string, error) {
	var removed []string
	var errs []error
	for _, dir := range []string{netnsDir, bpffsDir} {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s: %w", dir, err))
			continue
		}
		for _, e := range entries {
			rest, ok := strings.CutPrefix(e.Name(), base+"-")
			if !ok {
				continue
			}
			pidText, _, _ := strings.Cut(rest, "-")
			pid, err := strconv.Atoi(pidText)
			if err != nil || pid <= 0 || processAlive(pid) {
				continue
			}
			path := filepath.Join(dir, e.Name())
			if dir == netnsDir {
				err = vnetns.DeleteNamed(e.Name())
			} else {
				err = os.RemoveAll(path)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove stale %s: %w", path, err))
				continue
			}
			removed = append(removed, path)
		}
	}
	return removed, errors.Join(errs...)
}

// Exists reports whether a namespace of that name is still present.
func Exists(name string) bool {
	_, err := os.Stat(filepath.Join(netnsDir, name))
	return err == nil
}

func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
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

// Path is the namespace's bind mount, for `nsenter --net=PATH`.
func (ns *Namespace) Path() string { return filepath.Join(netnsDir, ns.Name) }

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

// Sysctl writes value to /proc/sys/<key> (key with slashes, e.g.
// "net/ipv4/conf/all/rp_filter") inside the namespace: /proc/sys/net
// belongs to the network namespace of the thread that opens it.
func (ns *Namespace) Sysctl(key, value string) error {
	return ns.Do(func() error {
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s in %s: %w", key, value, ns.Name, err)
		}
		return nil
	})
}

// ListenUDP opens a UDP socket bound to addr inside the namespace.
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

// ListenTCP opens a TCP listener bound to addr inside the namespace.
func (ns *Namespace) ListenTCP(addr netip.AddrPort) (*net.TCPListener, error) {
	var l *net.TCPListener
	err := ns.Do(func() (err error) {
		l, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen tcp %s in %s: %w", addr, ns.Name, err)
	}
	return l, nil
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

// DialTCP connects a TCP socket inside the namespace from laddr (port 0:
// any) to raddr, giving up after timeout.
func (ns *Namespace) DialTCP(laddr, raddr netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(laddr), Timeout: timeout}
		c, err = d.Dial("tcp", raddr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial tcp %s -> %s in %s: %w", laddr, raddr, ns.Name, err)
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
func (t *Testbed) Connect(a, b *Namespace, spec VethSpec) (*Veth, error) {
	v, err := connect(a, b, spec)
	if err != nil {
		return nil, fmt.Errorf("connect %s/%s to %s/%s: %w", a.Name, spec.NameA, b.Name, spec.NameB, err)
	}
	return v, nil
}

func connect(a, b *Namespace, spec VethSpec) (*Veth, error) {
	for _, p := range append(append([]netip.Prefix{}, spec.AddrsA...), spec.AddrsB...) {
		if !InAllowed(p) {
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

// InAllowed reports whether p lies inside one of the Allowed ranges.
func InAllowed(p netip.Prefix) bool {
	for _, a := range Allowed {
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
