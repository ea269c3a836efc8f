package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// namespace is a named network namespace ("ip netns" sees it, so the
// nft, iptables and sysfs steps run through "ip netns exec").
type namespace struct {
	name   string
	handle vnetns.NsHandle
	nl     *netlink.Handle
}

func newNamespace(name string) (*namespace, error) {
	type result struct {
		h   vnetns.NsHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		// NewNamed moves this thread into the new namespace; it stays
		// locked and dies with the goroutine.
		runtime.LockOSThread()
		h, err := vnetns.NewNamed(name)
		done <- result{h, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, r.err)
	}
	nl, err := netlink.NewHandleAt(r.h)
	if err != nil {
		r.h.Close()
		return nil, errors.Join(fmt.Errorf("open netlink in %s: %w", name, err), vnetns.DeleteNamed(name))
	}
	ns := &namespace{name: name, handle: r.h, nl: nl}
	lo, err := nl.LinkByName("lo")
	if err == nil {
		err = nl.LinkSetUp(lo)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("set lo up in %s: %w", name, err), ns.remove())
	}
	return ns, nil
}

// remove deletes the namespace; its interfaces, nft tables and iptables
// rules go with it once nothing refers to it.
func (ns *namespace) remove() error {
	ns.nl.Close()
	return errors.Join(ns.handle.Close(), vnetns.DeleteNamed(ns.name))
}

// do runs fn on a locked OS thread inside the namespace; the thread is
// discarded afterwards. Sockets and BPF links made by fn stay in the
// namespace.
func (ns *namespace) do(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := vnetns.Set(ns.handle); err != nil {
			done <- fmt.Errorf("enter namespace %s: %w", ns.name, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// exec runs a command inside the namespace with "ip netns exec" (which
// also mounts the namespace's own /sys), bounded by timeout(1).
func (ns *namespace) exec(stdin string, args ...string) (string, error) {
	full := append([]string{"10", "ip", "netns", "exec", ns.name}, args...)
	cmd := exec.Command("timeout", full...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s in %s: %w: %s", strings.Join(args, " "), ns.name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// endpoint is one end of a veth pair.
type endpoint struct {
	ns    *namespace
	name  string
	index int
	mac   net.HardwareAddr
}

var benchRange = netip.MustParsePrefix("198.18.0.0/15")

// connectVeth makes a veth pair a<->b with the given addresses (only from
// 198.18.0.0/15), brings both ends up and adds permanent neighbour entries
// both ways, so no ARP precedes traffic.
func connectVeth(a *namespace, nameA string, addrA netip.Prefix, b *namespace, nameB string, addrsB []netip.Prefix) (endpoint, endpoint, error) {
	for _, p := range append([]netip.Prefix{addrA}, addrsB...) {
		if !benchRange.Contains(p.Addr()) {
			return endpoint{}, endpoint{}, fmt.Errorf("address %s is outside 198.18.0.0/15", p)
		}
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: nameA, MTU: 1500},
		PeerName:      nameB,
		PeerNamespace: netlink.NsFd(b.handle),
	}
	if err := a.nl.LinkAdd(veth); err != nil {
		return endpoint{}, endpoint{}, fmt.Errorf("add veth %s: %w", nameA, err)
	}
	ea, eb := endpoint{ns: a, name: nameA}, endpoint{ns: b, name: nameB}
	addrs := map[*endpoint][]netip.Prefix{&ea: {addrA}, &eb: addrsB}
	for _, e := range []*endpoint{&ea, &eb} {
		l, err := e.ns.nl.LinkByName(e.name)
		if err != nil {
			return ea, eb, fmt.Errorf("find %s: %w", e.name, err)
		}
		e.index, e.mac = l.Attrs().Index, l.Attrs().HardwareAddr
		for _, p := range addrs[e] {
			ipn := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
			if err := e.ns.nl.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
				return ea, eb, fmt.Errorf("add %s to %s: %w", p, e.name, err)
			}
		}
		if err := e.ns.nl.LinkSetUp(l); err != nil {
			return ea, eb, fmt.Errorf("set %s up: %w", e.name, err)
		}
	}
	neigh := func(on endpoint, peer endpoint, ps []netip.Prefix) error {
		for _, p := range ps {
			n := &netlink.Neigh{LinkIndex: on.index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
				IP: p.Addr().AsSlice(), HardwareAddr: peer.mac}
			if err := on.ns.nl.NeighSet(n); err != nil {
				return fmt.Errorf("neighbour %s on %s: %w", p.Addr(), on.name, err)
			}
		}
		return nil
	}
	if err := neigh(ea, eb, addrsB); err != nil {
		return ea, eb, err
	}
	if err := neigh(eb, ea, []netip.Prefix{addrA}); err != nil {
		return ea, eb, err
	}
	return ea, eb, nil
}
