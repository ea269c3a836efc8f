package testbed

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// MaxClients is how many clients a star holds: client i uses 198.18.i.0/29
// and fd00:0:0:i::/64.
const MaxClients = 256

// Star is an edge namespace with one veth per client namespace: the shape of
// an edge host (the program attaches to the edge's interfaces) facing
// independent traffic sources, legitimate or not.
type Star struct {
	Edge    *Namespace
	Clients []*Client
}

// Client is one client namespace and its link to the edge.
type Client struct {
	// Index is i in the client's addresses (198.18.i.0/29).
	Index int
	NS    *Namespace
	// EdgeIf is the edge's end of the client's veth (eg-c<i>, in the edge
	// namespace): the interface to attach XDP to.
	EdgeIf string
	// Link is the veth pair: A is the edge end, B the client end (eg-up).
	Link *Veth
	// EdgeAddr4/6 are the edge's addresses on this link.
	EdgeAddr4, EdgeAddr6 netip.Addr
	// Src4/6 are the client's main source addresses; Alt4/6 are second
	// addresses on the same interface, for traffic that must be told apart
	// by source (a control flow next to a flood, a sentinel after a burst).
	Src4, Src6 netip.Addr
	Alt4, Alt6 netip.Addr
}

// Star builds an edge namespace and n client namespaces, each connected to
// the edge by its own veth pair. Client i gets:
//
//	edge   eg-c<i>  198.18.i.1/29  fd00:0:0:i::1/64
//	client eg-up    198.18.i.2/29  fd00:0:0:i::2/64  (Src)
//	                198.18.i.3/29  fd00:0:0:i::3/64  (Alt)
//
// with permanent neighbour entries both ways.
func (t *Testbed) Star(n int) (*Star, error) {
	if n < 1 || n > MaxClients {
		return nil, fmt.Errorf("star with %d clients: want 1 to %d", n, MaxClients)
	}
	edge, err := t.Namespace("edge")
	if err != nil {
		return nil, err
	}
	s := &Star{Edge: edge}
	for i := 0; i < n; i++ {
		c, err := t.AddClient(s, i)
		if err != nil {
			return nil, err
		}
		s.Clients = append(s.Clients, c)
	}
	return s, nil
}

// AddClient connects a new client namespace with index i to the star's edge
// (see Star for its addresses); it does not append it to s.Clients.
func (t *Testbed) AddClient(s *Star, i int) (*Client, error) {
	if i < 0 || i >= MaxClients {
		return nil, fmt.Errorf("client index %d: want 0 to %d", i, MaxClients-1)
	}
	v4 := func(host byte) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(i), host}) }
	v6 := func(host byte) netip.Addr {
		var a [16]byte
		a[0] = 0xfd
		a[6], a[7] = byte(i>>8), byte(i)
		a[15] = host
		return netip.AddrFrom16(a)
	}
	ns, err := t.Namespace(fmt.Sprintf("c%d", i))
	if err != nil {
		return nil, err
	}
	c := &Client{
		Index:     i,
		NS:        ns,
		EdgeIf:    fmt.Sprintf("eg-c%d", i),
		EdgeAddr4: v4(1), EdgeAddr6: v6(1),
		Src4: v4(2), Src6: v6(2),
		Alt4: v4(3), Alt6: v6(3),
	}
	c.Link, err = t.Connect(s.Edge, c.NS, VethSpec{
		NameA:  c.EdgeIf,
		NameB:  "eg-up",
		AddrsA: []netip.Prefix{netip.PrefixFrom(c.EdgeAddr4, 29), netip.PrefixFrom(c.EdgeAddr6, 64)},
		AddrsB: []netip.Prefix{
			netip.PrefixFrom(c.Src4, 29), netip.PrefixFrom(c.Alt4, 29),
			netip.PrefixFrom(c.Src6, 64), netip.PrefixFrom(c.Alt6, 64),
		},
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptSpoofed prepares the edge to take packets from sources it has no
// interface address for, as a client spoofing them sends: reverse-path
// filtering off (so the kernel delivers them to sockets and the socket
// counts mean something), and a route for each prefix back to client c, so
// anything the edge answers (ICMP errors, TCP resets) goes to c's namespace
// and dies there (forwarding is off in every testbed namespace) instead of
// looking for a way out. Prefixes outside the testbed ranges are allowed
// here: they are sources in crafted frames, never interface addresses.
func (s *Star) AcceptSpoofed(c *Client, prefixes ...netip.Prefix) error {
	for _, k := range []string{"all", "default", c.EdgeIf} {
		if err := s.Edge.Sysctl("net/ipv4/conf/"+k+"/rp_filter", "0"); err != nil {
			return err
		}
	}
	for _, p := range prefixes {
		gw := c.Src4
		if p.Addr().Is6() {
			gw = c.Src6
		}
		r := &netlink.Route{
			LinkIndex: c.Link.A.Index,
			Dst:       prefixToIPNet(p.Masked()),
			Gw:        gw.AsSlice(),
		}
		if err := s.Edge.nl.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s via %s in %s: %w", p, gw, s.Edge.Name, err)
		}
	}
	return nil
}
