package netns

import (
	"fmt"
	"net/netip"
)

// MaxClients is how many clients a star holds: client i uses 198.18.i.0/29
// and fd00:0:0:i::/64.
const MaxClients = 256

// Star is an edge namespace with one veth per client namespace: the shape of
// an edge host (the program attaches to the edge's interfaces) facing
// independent traffic sources. Later flood testbeds add clients, not new
// topologies.
type Star struct {
	Edge    *Namespace
	Clients []*Client
}

// Client is one client namespace and its link to the edge.
type Client struct {
	NS *Namespace
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
//	edge  eg-c<i>  198.18.i.1/29  fd00:0:0:i::1/64
//	client eg-up   198.18.i.2/29  fd00:0:0:i::2/64  (Src)
//	               198.18.i.3/29  fd00:0:0:i::3/64  (Alt)
//
// with permanent neighbour entries both ways.
func (t *Testbed) Star(n int) *Star {
	t.tb.Helper()
	if n < 1 || n > MaxClients {
		t.tb.Fatalf("star with %d clients: want 1 to %d", n, MaxClients)
	}
	s := &Star{Edge: t.Namespace("edge")}
	for i := 0; i < n; i++ {
		s.Clients = append(s.Clients, t.addClient(s.Edge, i))
	}
	return s
}

func (t *Testbed) addClient(edge *Namespace, i int) *Client {
	t.tb.Helper()
	v4 := func(host byte) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(i), host}) }
	v6 := func(host byte) netip.Addr {
		var a [16]byte
		a[0] = 0xfd
		a[6], a[7] = byte(i>>8), byte(i)
		a[15] = host
		return netip.AddrFrom16(a)
	}
	c := &Client{
		NS:        t.Namespace(fmt.Sprintf("c%d", i)),
		EdgeIf:    fmt.Sprintf("eg-c%d", i),
		EdgeAddr4: v4(1), EdgeAddr6: v6(1),
		Src4: v4(2), Src6: v6(2),
		Alt4: v4(3), Alt6: v6(3),
	}
	c.Link = t.Connect(edge, c.NS, VethSpec{
		NameA:  c.EdgeIf,
		NameB:  "eg-up",
		AddrsA: []netip.Prefix{netip.PrefixFrom(c.EdgeAddr4, 29), netip.PrefixFrom(c.EdgeAddr6, 64)},
		AddrsB: []netip.Prefix{
			netip.PrefixFrom(c.Src4, 29), netip.PrefixFrom(c.Alt4, 29),
			netip.PrefixFrom(c.Src6, 64), netip.PrefixFrom(c.Alt6, 64),
		},
	})
	return c
}
