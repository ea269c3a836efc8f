package main

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/packet"
)

// sources says which IPv4 source addresses the generator writes into the
// frames. The address is built as the 32-bit little-endian view of the four
// header bytes: base | (random & mask) << shift, or base alone when mask is
// zero. Only the frames carry these addresses; nothing routes them.
type sources struct {
	name  string
	base  uint32
	mask  uint32
	shift uint8
	count uint64 // distinct addresses the frames carry
}

// le is the little-endian view of an IPv4 address, as an 8-byte-aligned
// 32-bit load of the header bytes sees it on x86 and arm64.
func le(a netip.Addr) uint32 { b := a.As4(); return binary.LittleEndian.Uint32(b[:]) }

var (
	oneSource = sources{name: "1", base: le(netip.MustParseAddr("198.19.0.1")), count: 1}
	// 1,024 sources in 198.19.0.0/16: byte 3 takes 8 random bits, byte 4
	// two (198.19.x.0-3).
	kSources = sources{name: "1k", base: le(netip.MustParseAddr("198.19.0.0")), mask: 0x3ff, shift: 16, count: 1024}
	// the /16: 198.19.0.0/16, every packet a random one of 65,536.
	slash16 = sources{name: "/16", base: le(netip.MustParseAddr("198.19.0.0")), mask: 0xffff, shift: 16, count: 65536}
	// 2^20 sources in 100.0.0.0/8 (bytes 2, 3 and the low 4 bits of 4).
	mSources = sources{name: "1M", base: le(netip.MustParseAddr("100.0.0.0")), mask: 0xfffff, shift: 8, count: 1 << 20}
	// the whole IPv4 space, a random 32-bit source per packet.
	wholeSpace = sources{name: "whole", mask: 0xffffffff, count: 1 << 32}
)

const (
	ipOff    = 14
	csumOff  = ipOff + 10
	saddrOff = ipOff + 12
	xdpTX    = 3
	xdpDrop  = 1
)

// generatorProgram returns an XDP program that writes a source address into
// the frame, fixes the IPv4 header checksum (the receiving stack checks it;
// the UDP checksum is zero, i.e. absent) and returns XDP_TX. hdrSum is the
// one's-complement sum of the header's 16-bit little-endian words with
// source and checksum zero: the sum is byte-order independent (RFC 1071),
// so it is done on the little-endian view throughout.
func generatorProgram(src sources, hdrSum uint32) asm.Instructions {
	in := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
	}
	if src.mask == 0 {
		in = append(in, asm.Mov.Imm32(asm.R0, int32(src.base)))
	} else {
		in = append(in, asm.FnGetPrandomU32.Call())
		if src.mask != 0xffffffff {
			in = append(in, asm.And.Imm32(asm.R0, int32(src.mask)))
		}
		if src.shift != 0 {
			in = append(in, asm.LSh.Imm32(asm.R0, int32(src.shift)))
		}
		if src.base != 0 {
			in = append(in, asm.Or.Imm32(asm.R0, int32(src.base)))
		}
	}
	in = append(in,
		// r2 = data, r3 = data_end; bounds check the IPv4 header.
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, 4, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, ipOff+20),
		asm.JGT.Reg(asm.R4, asm.R3, "short"),
		asm.StoreMem(asm.R2, saddrOff, asm.R0, asm.Word),
		// sum = hdrSum + low16 + high16, folded twice, complemented.
		asm.Mov.Reg32(asm.R1, asm.R0),
		asm.And.Imm32(asm.R1, 0xffff),
		asm.RSh.Imm32(asm.R0, 16),
		asm.Add.Reg(asm.R1, asm.R0),
		asm.Add.Imm(asm.R1, int32(hdrSum)),
		asm.Mov.Reg(asm.R0, asm.R1),
		asm.RSh.Imm(asm.R0, 16),
		asm.And.Imm(asm.R1, 0xffff),
		asm.Add.Reg(asm.R1, asm.R0),
		asm.Mov.Reg(asm.R0, asm.R1),
		asm.RSh.Imm(asm.R0, 16),
		asm.And.Imm(asm.R1, 0xffff),
		asm.Add.Reg(asm.R1, asm.R0),
		asm.Xor.Imm(asm.R1, 0xffff),
		asm.StoreMem(asm.R2, csumOff, asm.R1, asm.Half),
		asm.Mov.Imm(asm.R0, xdpTX),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("short"),
		asm.Return(),
	)
	return in
}

// constProgram is an XDP program that returns verdict: XDP_DROP is the
// floor, XDP_PASS turns veth NAPI on without filtering.
func constProgram(name string, verdict int32) (*ebpf.Program, error) {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: name, Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, verdict), asm.Return()},
	})
	if err != nil {
		return nil, fmt.Errorf("load %s program: %w", name, err)
	}
	return p, nil
}

// floodFrame is the 64-byte UDP/IPv4 frame the generator repeats, and the
// header sum the program needs.
func floodFrame(srcMAC, dstMAC [6]byte, dst netip.Addr, dport uint16) ([]byte, uint32) {
	f := packet.Frame{
		SrcMAC: srcMAC, DstMAC: dstMAC,
		Src: netip.MustParseAddr("198.19.0.1"), Dst: dst,
		Proto: packet.ProtoUDP, SrcPort: 40000, DstPort: dport, Payload: 18,
	}
	b := f.Build()
	binary.BigEndian.PutUint16(b[ipOff+20+6:], 0) // UDP checksum: absent
	var h [20]byte
	copy(h[:], b[ipOff:ipOff+20])
	clear(h[10:16]) // checksum and source
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.LittleEndian.Uint16(h[i:]))
	}
	return b, sum
}

// xdpMD mirrors struct xdp_md, the context BPF_PROG_RUN takes.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// generator runs the program on live frames from the attacker's veth end.
type generator struct {
	prog    *ebpf.Program
	frame   []byte
	ifindex int
}

func newGenerator(src sources, frame []byte, hdrSum uint32, ifindex int) (*generator, error) {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "flood_gen", Type: ebpf.XDP, License: "GPL",
		Instructions: generatorProgram(src, hdrSum),
	})
	if err != nil {
		return nil, fmt.Errorf("load generator program: %w", err)
	}
	return &generator{prog: p, frame: frame, ifindex: ifindex}, nil
}

func (g *generator) close() { g.prog.Close() }

// run sends n frames in one BPF_PROG_RUN call. The calling thread must be
// in the attacker's namespace (the ifindex is looked up there).
func (g *generator) run(n uint32) error {
	_, err := g.prog.Run(&ebpf.RunOptions{
		Data:    g.frame,
		Repeat:  n,
		Flags:   unix.BPF_F_TEST_XDP_LIVE_FRAMES,
		Context: xdpMD{DataEnd: uint32(len(g.frame)), IngressIfindex: uint32(g.ifindex)},
	})
	if err != nil {
		return fmt.Errorf("live-frame run of %d frames: %w", n, err)
	}
	return nil
}

// paced sends total frames at rate per second (0: as fast as it can) in
// chunks, and returns how many it sent and how long it took. It stops at
// total or at limit, whichever comes first.
func (g *generator) paced(total uint64, rate uint64, limit time.Duration) (uint64, time.Duration, error) {
	// BPF_PROG_RUN in live-frame mode sets up a page pool per call
	// (about a millisecond here), so calls must carry many frames. Paced
	// runs send 5 ms worth per call, so frames arrive in bursts.
	chunk := uint64(1 << 16)
	if rate != 0 {
		chunk = max(rate/200, 1024)
	}
	start := time.Now()
	var sent uint64
	for sent < total {
		el := time.Since(start)
		if el > limit {
			break
		}
		if rate != 0 {
			due := uint64(el.Nanoseconds()) * rate / 1e9
			if sent >= due {
				time.Sleep(50 * time.Microsecond)
				continue
			}
		}
		n := min(chunk, total-sent)
		if err := g.run(uint32(n)); err != nil {
			return sent, time.Since(start), err
		}
		sent += n
	}
	return sent, time.Since(start), nil
}
