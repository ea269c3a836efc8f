package netns_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/trafficgen"
	"github.com/edgeguard/edgeguard/test/netns"
)

// TestGenerators checks the generators without any XDP program: a flood
// stops at its count and at its duration, its spoofed IPv4 and IPv6
// datagrams all reach a socket (so their checksums are right), and
// legitimate UDP and TCP requests all get their replies.
func TestGenerators(t *testing.T) {
	tb := netns.New(t)
	s := tb.Star(1)
	c := s.Clients[0]
	if err := s.AcceptSpoofed(c, attackerNet); err != nil {
		t.Fatal(err)
	}
	sinkConn, err := s.Edge.ListenUDP(netip.AddrPortFrom(netip.IPv6Unspecified(), 9009))
	if err != nil {
		t.Fatal(err)
	}
	sinkConn.SetReadBuffer(4 << 20)
	echoUDP, err := s.Edge.ListenUDP(netip.AddrPortFrom(netip.IPv6Unspecified(), 7007))
	if err != nil {
		t.Fatal(err)
	}
	echoTCP, err := s.Edge.ListenTCP(netip.AddrPortFrom(netip.IPv6Unspecified(), 7007))
	if err != nil {
		t.Fatal(err)
	}
	sink := trafficgen.NewEcho([]*net.UDPConn{sinkConn}, nil)
	echo := trafficgen.NewEcho([]*net.UDPConn{echoUDP}, []*net.TCPListener{echoTCP})
	t.Cleanup(func() { sink.Close(); echo.Close() })

	var pc *trafficgen.PacketConn
	if err := c.NS.Do(func() (err error) { pc, err = trafficgen.OpenPacketConn(c.Link.B.Index); return err }); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ctx := context.Background()
	base := trafficgen.Flood{SrcMAC: c.Link.B.MAC, DstMAC: c.Link.A.MAC, DstPort: 9009, Proto: trafficgen.UDP, Payload: 20}

	waitSink := func(want uint64) uint64 {
		deadline := time.Now().Add(5 * time.Second)
		for sink.Other() < want && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		return sink.Other()
	}
	// Bounded by count: 500 frames at 5,000/s, from 1,000 possible sources.
	f := base
	f.Dst, f.Sources, f.Distinct, f.Rate, f.Count, f.Duration = c.EdgeAddr4, []netip.Prefix{attackerNet}, 0, 5000, 500, 10*time.Second
	r, err := f.Run(ctx, pc)
	if err != nil || r.Sent != 500 || r.Errors != 0 {
		t.Fatalf("ipv4 flood of 500: %+v, %v", r, err)
	}
	if got := waitSink(500); got != 500 {
		t.Errorf("ipv4: %d of 500 spoofed datagrams reached the socket", got)
	}
	// IPv6, rotating inside the client's /64.
	f.Dst, f.Sources = c.EdgeAddr6, []netip.Prefix{netip.PrefixFrom(c.Src6, 64).Masked()}
	r, err = f.Run(ctx, pc)
	if err != nil || r.Sent != 500 {
		t.Fatalf("ipv6 flood of 500: %+v, %v", r, err)
	}
	if got := waitSink(1000); got != 1000 {
		t.Errorf("ipv6: %d of 500 spoofed datagrams reached the socket", got-500)
	}
	// Bounded by time: a count it cannot reach in 300ms at 1,000/s.
	f.Rate, f.Count, f.Duration = 1000, 1_000_000, 300*time.Millisecond
	r, err = f.Run(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	if r.Elapsed > time.Second || r.Sent < 200 || r.Sent > 400 {
		t.Errorf("300ms flood at 1000/s: sent %d in %v, want about 300 in 300ms", r.Sent, r.Elapsed)
	}

	u, err := c.NS.DialUDP(netip.AddrPortFrom(c.Src4, 0), netip.AddrPortFrom(c.EdgeAddr4, 7007))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	lr, err := trafficgen.LegitUDP{Conns: []*net.UDPConn{u}, Rate: 100, Count: 50, Duration: 5 * time.Second}.Run(ctx)
	if err != nil || lr.Sent != 50 || lr.Replied != 50 {
		t.Errorf("legit udp: %v, %v", lr, err)
	}
	dial := func(timeout time.Duration) (net.Conn, error) {
		return c.NS.DialTCP(netip.AddrPortFrom(c.Src4, 0), netip.AddrPortFrom(c.EdgeAddr4, 7007), timeout)
	}
	tr, err := trafficgen.LegitTCP{Dial: []func(time.Duration) (net.Conn, error){dial}, Rate: 50, Count: 20, Duration: 5 * time.Second}.Run(ctx)
	if err != nil || tr.Sent != 20 || tr.Replied != 20 {
		t.Errorf("legit tcp: %v, %v", tr, err)
	}
	t.Logf("legit udp %v; legit tcp %v", lr, tr)
}
