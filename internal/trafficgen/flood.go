// Package trafficgen generates test traffic for the namespace testbed:
// paced floods of crafted frames written with AF_PACKET (spoofed sources
// drawn from prefixes), and legitimate request/reply traffic over real UDP
// and TCP sockets that measures how much of it got through and how fast.
//
// Every generator is bounded by a packet (or request) count and by a
// duration, and stops by itself at whichever comes first.
package trafficgen

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/packet"
)

// Hard bounds on any flood, whatever the caller asks for.
const (
	MaxFloodPackets  = 20_000_000
	MaxFloodDuration = 10 * time.Minute
	MaxFloodRate     = 2_000_000 // packets per second
)

// Proto is what a flood sends.
type Proto int

// Flood protocols.
const (
	UDP    Proto = iota
	TCPSYN       // TCP with only SYN set
	ICMP         // echo request (ICMPv6 for IPv6 sources)
)

func (p Proto) String() string {
	switch p {
	case UDP:
		return "udp"
	case TCPSYN:
		return "tcp-syn"
	case ICMP:
		return "icmp"
	}
	return fmt.Sprintf("proto(%d)", int(p))
}

// PacketConn is an AF_PACKET socket bound to one interface. Open it inside
// the namespace that holds the interface (testbed.Namespace.Do); it can be
// written from any goroutine afterwards.
type PacketConn struct {
	fd      int
	ifindex int
}

// OpenPacketConn opens a raw AF_PACKET socket for writing frames on
// ifindex. The socket's receive side is left unbound to a protocol, so it
// queues nothing.
func OpenPacketConn(ifindex int) (*PacketConn, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open af_packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind af_packet socket to ifindex %d: %w", ifindex, err)
	}
	return &PacketConn{fd: fd, ifindex: ifindex}, nil
}

// Write sends one frame.
func (c *PacketConn) Write(frame []byte) error {
	return unix.Sendto(c.fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: c.ifindex})
}

// Close closes the socket.
func (c *PacketConn) Close() error { return unix.Close(c.fd) }

// Flood describes a paced flood of crafted frames.
type Flood struct {
	SrcMAC, DstMAC net.HardwareAddr
	// Dst is the destination address (the edge's address on the link).
	Dst netip.Addr
	// Sources are the prefixes source addresses are drawn from, all of
	// Dst's family.
	Sources []netip.Prefix
	// Distinct > 0: that many addresses are drawn once and used in turn,
	// so each sends Rate/Distinct packets per second. 0: a fresh random
	// address per packet (the per-source table churns).
	Distinct int
	Proto    Proto
	// SrcPorts are used in turn; empty: a random port above 1024 per
	// packet.
	SrcPorts []uint16
	DstPort  uint16
	Payload  int // bytes after the L4 header
	// Rate in packets per second; Count and Duration bound the flood, it
	// stops at whichever comes first. All three are required.
	Rate     int
	Count    int
	Duration time.Duration
	Seed     uint64
	// Step is the pacing step: every Step the frames due by then leave
	// back to back. Default 1 ms; at least MinFloodStep. A botnet's
	// packets arrive independently, not in 1 ms clumps: against a full
	// bucket a clump takes every token that refilled since the last one,
	// and a user's packet arriving in between finds the tokens the clump
	// left, so a coarse step flatters the users (scenarios that measure
	// what users get against a flood use 100 µs). Steps under 1 ms sleep
	// with nanosleep(2), which blocks the goroutine's thread: Go's timers
	// wake no finer than about 1 ms.
	Step time.Duration
	// Poisson draws the gaps between frames from an exponential
	// distribution (mean 1/Rate), as the packets of many independent
	// sources arrive, instead of spacing them evenly. Evenly spaced frames
	// take a bucket's every refill within one gap: a user's packet at a
	// random instant then finds a token less often than a flood packet
	// does (about half as often at 7× the budget), which flatters the
	// flood as a coarse Step flatters the users.
	Poisson bool
	// Deadlines: every frame leaves at its own scheduled time (evenly
	// spaced, or Poisson), sent by a SCHED_FIFO thread that sleeps to each
	// frame's time, instead of in steps by a normal goroutine, so the
	// timing is the same on a quiet and on a loaded machine (paced.go;
	// needs root or CAP_SYS_NICE). Step is unused. A frame the sender
	// reaches more than 1 ms after its time is not sent
	// (FloodResult.Late).
	Deadlines bool
	// Progress, if set, counts frames sent as they go (for live displays).
	Progress *atomic.Uint64
}

// MinFloodStep is the finest pacing step a flood takes.
const MinFloodStep = 50 * time.Microsecond

// FloodResult is what a flood did.
type FloodResult struct {
	Sent   uint64 // frames the kernel accepted
	Errors uint64 // frames it refused (ENOBUFS and the like)
	// Late (Deadlines): frames not sent because the sender reached them
	// too late to leave on time.
	Late    uint64
	Elapsed time.Duration
}

// Validate checks the bounds and the addresses.
func (f Flood) Validate() error {
	switch {
	case f.Rate < 1 || f.Rate > MaxFloodRate:
		return fmt.Errorf("flood rate %d/s: want 1 to %d", f.Rate, MaxFloodRate)
	case f.Count < 1 || f.Count > MaxFloodPackets:
		return fmt.Errorf("flood count %d: want 1 to %d", f.Count, MaxFloodPackets)
	case f.Duration <= 0 || f.Duration > MaxFloodDuration:
		return fmt.Errorf("flood duration %v: want more than 0 and at most %v", f.Duration, MaxFloodDuration)
	case len(f.Sources) == 0:
		return errors.New("flood without source prefixes")
	case len(f.SrcMAC) != 6 || len(f.DstMAC) != 6:
		return errors.New("flood needs 6-byte source and destination MACs")
	case f.Distinct < 0:
		return fmt.Errorf("flood distinct sources %d: want 0 (random) or more", f.Distinct)
	case f.Step != 0 && (f.Step < MinFloodStep || f.Step > time.Second):
		return fmt.Errorf("flood step %v: want %v to 1s (0: 1ms)", f.Step, MinFloodStep)
	}
	for _, p := range f.Sources {
		if p.Addr().Is4() != f.Dst.Is4() {
			return fmt.Errorf("source prefix %s and destination %s are of different families", p, f.Dst)
		}
	}
	return nil
}

// maxStep bounds the frames sent back to back: a veth with native XDP
// queues 256 frames for its NAPI poll, and a generator must not overrun it
// by itself (that would look like drops the program never made).
const maxStep = 200

// Run sends the flood on c, paced in steps of Step (the frames due by
// then, at most maxStep back to back), until Count frames went out,
// Duration passed or ctx ended.
func (f Flood) Run(ctx context.Context, c *PacketConn) (FloodResult, error) {
	if err := f.Validate(); err != nil {
		return FloodResult{}, err
	}
	frameOf := f.Sequence()
	if f.Deadlines {
		return f.runDeadlines(ctx, c, frameOf)
	}
	var res FloodResult
	start := time.Now()
	deadline := start.Add(f.Duration)
	var n uint64
	pace := f.pacer()
	for n < uint64(f.Count) {
		now := time.Now()
		if !now.Before(deadline) || ctx.Err() != nil {
			break
		}
		due := pace.due(n, uint64(now.Sub(start).Nanoseconds()))
		for ; n < due; n++ {
			if err := c.Write(frameOf(n)); err != nil {
				res.Errors++
			} else {
				res.Sent++
				if f.Progress != nil {
					f.Progress.Add(1)
				}
			}
		}
		f.sleepStep()
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// Sequence is the flood's frames, byte for byte, as Run sends them: call
// it with n = 0, 1, 2, ... in order (the random draws are sequential), from
// one goroutine. A test compares what the data plane saw with it.
func (f Flood) Sequence() func(n uint64) []byte {
	rng := f.rng()
	fixed := f.drawSources(rng)
	return func(n uint64) []byte {
		var src netip.Addr
		if len(fixed) > 0 {
			src = fixed[n%uint64(len(fixed))]
		} else {
			src = randomIn(rng, f.Sources[n%uint64(len(f.Sources))])
		}
		sport := uint16(1024 + rng.IntN(64511))
		if len(f.SrcPorts) > 0 {
			sport = f.SrcPorts[n%uint64(len(f.SrcPorts))]
		}
		return f.frame(src, sport)
	}
}

// pacer says how many frames are due by a time: evenly spaced at Rate, or
// at exponential gaps (Poisson).
type pacer struct {
	rate, count uint64
	poisson     bool
	gaps        *rand.Rand
	meanGap, at float64 // Poisson: at is when the next frame to schedule is due, ns after start
	scheduled   uint64  // Poisson: frames scheduled so far
}

func (f Flood) pacer() *pacer {
	p := &pacer{rate: uint64(f.Rate), count: uint64(f.Count), poisson: f.Poisson}
	if f.Poisson {
		p.gaps = rand.New(rand.NewPCG(f.Seed^0x5851f42d4c957f2d, f.Seed))
		p.meanGap = float64(time.Second) / float64(f.Rate)
		p.at = p.gaps.ExpFloat64() * p.meanGap
	}
	return p
}

// due is how many frames should have left elapsed ns after the start, of
// which n did: at most maxStep more than n. A generator that fell behind (a
// busy machine) does not catch up in one burst: the achieved rate drops
// instead, and Sent says so.
func (p *pacer) due(n, elapsed uint64) uint64 {
	if !p.poisson {
		return min(elapsed*p.rate/uint64(time.Second)+1, p.count, n+maxStep)
	}
	for p.scheduled < p.count && p.scheduled < n+maxStep && p.at <= float64(elapsed) {
		p.scheduled++
		p.at += p.gaps.ExpFloat64() * p.meanGap
	}
	return p.scheduled
}

func (f Flood) sleepStep() {
	switch {
	case f.Step == 0:
		time.Sleep(time.Millisecond)
	case f.Step >= time.Millisecond:
		time.Sleep(f.Step)
	default:
		ts := unix.NsecToTimespec(int64(f.Step))
		unix.Nanosleep(&ts, nil) // EINTR: a shorter step, harmless
	}
}

func (f Flood) rng() *rand.Rand { return rand.New(rand.NewPCG(f.Seed, f.Seed^0x9e3779b97f4a7c15)) }

// drawSources draws the Distinct fixed addresses, source i from prefix
// i mod len(Sources), so the addresses spread evenly over the prefixes.
func (f Flood) drawSources(rng *rand.Rand) []netip.Addr {
	var fixed []netip.Addr
	for i := 0; i < f.Distinct; i++ {
		fixed = append(fixed, randomIn(rng, f.Sources[i%len(f.Sources)]))
	}
	return fixed
}

func (f Flood) frame(src netip.Addr, sport uint16) []byte {
	fr := packet.Frame{Src: src, Dst: f.Dst, SrcPort: sport, DstPort: f.DstPort, Payload: f.Payload}
	copy(fr.SrcMAC[:], f.SrcMAC)
	copy(fr.DstMAC[:], f.DstMAC)
	switch f.Proto {
	case UDP:
		fr.Proto = packet.ProtoUDP
	case TCPSYN:
		fr.Proto = packet.ProtoTCP
		fr.TCPFlags = 0x02
	case ICMP:
		fr.Proto = packet.ProtoICMP
		fr.DstPort = 8
		if src.Is6() {
			fr.Proto = packet.ProtoICMPv6
			fr.DstPort = 128
		}
	}
	b := fr.Build()
	fillL4Checksum(b)
	return b
}

// randomIn draws a uniform address from p.
func randomIn(rng *rand.Rand, p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As16()
	start := 0
	if p.Addr().Is4() {
		start = 12
	}
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	for i := 15; i >= start; i-- {
		bitLo := i * 8 // first bit of byte i
		if bitLo+8 <= bits {
			break
		}
		r := byte(rng.Uint32())
		if bitLo < bits {
			r &= 0xff >> (bits - bitLo)
		}
		a[i] |= r
	}
	out := netip.AddrFrom16(a)
	if p.Addr().Is4() {
		out = out.Unmap()
	}
	return out
}

// fillL4Checksum computes the UDP, TCP or ICMP checksum of an untagged
// frame built by package packet (which leaves it zero): IPv6 receivers drop
// UDP with a zero checksum, and every receiver drops a wrong one before a
// socket sees it.
func fillL4Checksum(b []byte) {
	if len(b) < 14 {
		return
	}
	var proto byte
	var l4 []byte
	var pseudo uint32
	switch binary.BigEndian.Uint16(b[12:]) {
	case packet.EtherTypeIPv4:
		ip := b[14:]
		ihl := int(ip[0]&0x0f) * 4
		proto = ip[9]
		l4 = ip[ihl:]
		pseudo = sum16(ip[12:20]) + uint32(proto) + uint32(len(l4))
	case packet.EtherTypeIPv6:
		ip := b[14:]
		proto = ip[6]
		l4 = ip[40:]
		pseudo = sum16(ip[8:40]) + uint32(proto) + uint32(len(l4))
	default:
		return
	}
	var off int
	switch proto {
	case packet.ProtoUDP:
		off = 6
	case packet.ProtoTCP:
		off = 16
	case packet.ProtoICMP:
		off, pseudo = 2, 0
	case packet.ProtoICMPv6:
		off = 2
	default:
		return
	}
	binary.BigEndian.PutUint16(l4[off:], 0)
	s := fold(pseudo + sum16(l4))
	if s == 0 && proto == packet.ProtoUDP {
		s = 0xffff
	}
	binary.BigEndian.PutUint16(l4[off:], s)
}

func sum16(b []byte) uint32 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
