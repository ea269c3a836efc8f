package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/internal/trafficgen"
)

// Ports the lab's edge serves on every address.
const (
	// EchoPort answers legitimate requests (UDP and TCP).
	EchoPort = 7007
	// SinkPort counts flood datagrams that got past the limiter.
	SinkPort = 9009
)

// AttackerNet is the /16 the lab's attackers spoof from: one ASN
// (AS64500) in LabASNData.
var AttackerNet = netip.MustParsePrefix("198.19.0.0/16")

// LabASNData is an iptoasn.com TSV for the lab: the legit clients'
// 198.18.0.0/16 is AS64501, the attacker's 198.19.0.0/16 AS64500, and the
// rest of the IPv4 space (for spoofed whole-space floods) AS64510 and
// AS64511.
const LabASNData = "0.0.0.0\t127.255.255.255\t64510\tZZ\tINTERNET-LOW\n" +
	"128.0.0.0\t198.17.255.255\t64511\tZZ\tINTERNET-HIGH\n" +
	"198.18.0.0\t198.18.255.255\t64501\tZZ\tLEGIT-CLIENTS\n" +
	"198.19.0.0\t198.19.255.255\t64500\tZZ\tATTACKER\n" +
	"198.20.0.0\t255.255.255.255\t64511\tZZ\tINTERNET-HIGH\n"

// AttackerBase is the client index of the first attacker: attackers use
// 198.18.200.0/29 and up, legitimate clients 198.18.0.0/29 and up, so every
// legitimate client has a /24 (and /48) of its own.
const AttackerBase = 200

// LabConfig describes a flood lab.
type LabConfig struct {
	// Prefix names the namespaces (with the pid in it, see RemoveStale).
	Prefix string
	// Legit and Attackers are how many client namespaces of each kind.
	Legit, Attackers int
	// Spoofed are the source prefixes attackers may use; the edge routes
	// them back to the first attacker and turns reverse-path filtering
	// off (Star.AcceptSpoofed).
	Spoofed []netip.Prefix
	// Bin is the edgectl binary; Dir holds the policy and the socket;
	// PinDir is the daemon's bpffs directory.
	Bin, Dir, PinDir string
}

// Lab is an edge running the real daemon, legitimate client namespaces and
// attacker namespaces, an echo server and a flood sink on the edge. Close
// tears everything down.
type Lab struct {
	Config    LabConfig
	TB        *Testbed
	Star      *Star
	Legit     []*Client
	Attackers []*Client
	Daemon    *Daemon
	Echo      *trafficgen.Echo // EchoPort
	Sink      *trafficgen.Echo // SinkPort: counts what passed
}

// NewLab builds the topology and starts the echo server and the sink; the
// daemon is configured but not started (write the policy to
// lab.PolicyPath() first).
func NewLab(cfg LabConfig) (lab *Lab, err error) {
	if cfg.Legit < 1 || cfg.Legit > AttackerBase || cfg.Attackers < 1 || cfg.Attackers > MaxClients-AttackerBase {
		return nil, fmt.Errorf("lab with %d legit and %d attacker clients: want 1 to %d and 1 to %d",
			cfg.Legit, cfg.Attackers, AttackerBase, MaxClients-AttackerBase)
	}
	l := &Lab{Config: cfg, TB: New(cfg.Prefix)}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	edge, err := l.TB.Namespace("edge")
	if err != nil {
		return nil, err
	}
	l.Star = &Star{Edge: edge}
	add := func(i int) (*Client, error) {
		c, err := l.TB.AddClient(l.Star, i)
		if err != nil {
			return nil, err
		}
		l.Star.Clients = append(l.Star.Clients, c)
		return c, nil
	}
	for i := 0; i < cfg.Legit; i++ {
		c, err := add(i)
		if err != nil {
			return nil, err
		}
		l.Legit = append(l.Legit, c)
	}
	for i := 0; i < cfg.Attackers; i++ {
		c, err := add(AttackerBase + i)
		if err != nil {
			return nil, err
		}
		l.Attackers = append(l.Attackers, c)
	}
	if err := l.Star.AcceptSpoofed(l.Attackers[0], cfg.Spoofed...); err != nil {
		return nil, err
	}
	l.Echo, err = l.serve(EchoPort, true)
	if err != nil {
		return nil, err
	}
	l.Sink, err = l.serve(SinkPort, false)
	if err != nil {
		return nil, err
	}
	l.Daemon = &Daemon{
		Bin: cfg.Bin, NS: edge, Config: l.PolicyPath(), PinDir: cfg.PinDir,
		Socket: filepath.Join(cfg.Dir, "run", "edgeguard.sock"),
	}
	return l, nil
}

// serve opens dual-stack sockets on port in the edge namespace.
func (l *Lab) serve(port uint16, withTCP bool) (*trafficgen.Echo, error) {
	any := netip.AddrPortFrom(netip.IPv6Unspecified(), port)
	u, err := l.Star.Edge.ListenUDP(any)
	if err != nil {
		return nil, err
	}
	// Floods arrive in bursts; a deep receive queue keeps the socket
	// count a count of what the limiter passed, not of queue overflows.
	u.SetReadBuffer(8 << 20)
	var tcp []*net.TCPListener
	if withTCP {
		t, err := l.Star.Edge.ListenTCP(any)
		if err != nil {
			u.Close()
			return nil, err
		}
		tcp = append(tcp, t)
	}
	return trafficgen.NewEcho([]*net.UDPConn{u}, tcp), nil
}

// PolicyPath is where the daemon reads its policy.
func (l *Lab) PolicyPath() string { return filepath.Join(l.Config.Dir, "edgeguard.yaml") }

// WritePolicy replaces the policy file atomically (the daemon reloads on
// change once running).
func (l *Lab) WritePolicy(yaml string) error {
	tmp := l.PolicyPath() + ".new"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		return fmt.Errorf("write policy: %w", err)
	}
	if err := os.Rename(tmp, l.PolicyPath()); err != nil {
		return fmt.Errorf("write policy: %w", err)
	}
	return nil
}

// InterfacesYAML is the policy's interfaces: section for every edge veth.
func (l *Lab) InterfacesYAML(mode string) string {
	var b strings.Builder
	b.WriteString("interfaces:\n")
	for _, c := range l.Star.Clients {
		fmt.Fprintf(&b, "  - {name: %s, xdp_mode: %s}\n", c.EdgeIf, mode)
	}
	return b.String()
}

// Flood sends f from attacker a: MACs, destination (the edge's address on
// a's link, of the sources' family, unless f.Dst is set) and port (the
// sink, unless f.DstPort is set) are filled in.
func (l *Lab) Flood(ctx context.Context, a *Client, f trafficgen.Flood) (trafficgen.FloodResult, error) {
	f.SrcMAC, f.DstMAC = a.Link.B.MAC, a.Link.A.MAC
	if !f.Dst.IsValid() {
		f.Dst = a.EdgeAddr4
		if len(f.Sources) > 0 && f.Sources[0].Addr().Is6() {
			f.Dst = a.EdgeAddr6
		}
	}
	if f.DstPort == 0 {
		f.DstPort = SinkPort
	}
	var pc *trafficgen.PacketConn
	err := a.NS.Do(func() (err error) {
		pc, err = trafficgen.OpenPacketConn(a.Link.B.Index)
		return err
	})
	if err != nil {
		return trafficgen.FloodResult{}, fmt.Errorf("flood from %s: %w", a.NS.Name, err)
	}
	defer pc.Close()
	return f.Run(ctx, pc)
}

// LegitUDP sends rate requests per second from each legitimate client's
// two addresses (IPv4, or IPv6 with v6) to the echo server, for at most d.
func (l *Lab) LegitUDP(ctx context.Context, rate int, d time.Duration, v6 bool) (trafficgen.LegitResult, error) {
	return l.LegitUDPProgress(ctx, rate, d, v6, nil)
}

// LegitUDPProgress is LegitUDP counting into p as it goes.
func (l *Lab) LegitUDPProgress(ctx context.Context, rate int, d time.Duration, v6 bool, p *trafficgen.LegitProgress) (trafficgen.LegitResult, error) {
	var conns []*net.UDPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, c := range l.Legit {
		dst, srcs := c.EdgeAddr4, []netip.Addr{c.Src4, c.Alt4}
		if v6 {
			dst, srcs = c.EdgeAddr6, []netip.Addr{c.Src6, c.Alt6}
		}
		for _, src := range srcs {
			u, err := c.NS.DialUDP(netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, EchoPort))
			if err != nil {
				return trafficgen.LegitResult{}, err
			}
			conns = append(conns, u)
		}
	}
	g := trafficgen.LegitUDP{Conns: conns, Rate: rate, Count: int(d.Seconds()*float64(rate)) + 1, Duration: d, Progress: p}
	return g.Run(ctx)
}

// LegitTCP makes rate connections per second from each legitimate
// client's main IPv4 address to the echo server, for at most d.
func (l *Lab) LegitTCP(ctx context.Context, rate int, d time.Duration) (trafficgen.LegitResult, error) {
	var dials []func(time.Duration) (net.Conn, error)
	for _, c := range l.Legit {
		src, dst := netip.AddrPortFrom(c.Src4, 0), netip.AddrPortFrom(c.EdgeAddr4, EchoPort)
		dials = append(dials, func(timeout time.Duration) (net.Conn, error) {
			return c.NS.DialTCP(src, dst, timeout)
		})
	}
	g := trafficgen.LegitTCP{Dial: dials, Rate: rate, Count: int(d.Seconds()*float64(rate)) + 1, Duration: d}
	return g.Run(ctx)
}

// Close stops the daemon, removes its pins, stops the servers and removes
// every namespace, returning every error.
func (l *Lab) Close() error {
	var errs []error
	if l.Daemon != nil {
		errs = append(errs, l.Daemon.Close())
	}
	if l.Echo != nil {
		errs = append(errs, l.Echo.Close())
	}
	if l.Sink != nil {
		errs = append(errs, l.Sink.Close())
	}
	errs = append(errs, l.TB.Close())
	return errors.Join(errs...)
}
