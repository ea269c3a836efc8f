package loader_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Source feeder: an XDP program that gives the frame the next source of a
// full-period linear congruential sequence (x*1664525 + 1013904223 mod
// 2^32: every 32-bit value once per 2^32 steps) and tail-calls the program
// under test. BPF_PROG_TEST_RUN without live frames runs all Repeat runs
// on one copy of the frame, so each run sees the previous run's source
// advanced by one step: Repeat packets, all from new sources, in one
// syscall and without the runner's per-call cost.
type sourceFeeder struct {
	prog  *ebpf.Program
	calls *ebpf.Map
}

const (
	lcgMul = 1664525
	lcgAdd = 1013904223
)

// lcgNext is one step of the feeder's sequence.
func lcgNext(x uint32) uint32 { return x*lcgMul + lcgAdd }

// advanceSource moves frame's source the runs steps the feeder made in the
// kernel's copy of it, so the next syscall continues the sequence.
func advanceSource(frame []byte, runs int) {
	x := binary.NativeEndian.Uint32(frame[ipv4SrcOffset:])
	for range runs {
		x = lcgNext(x)
	}
	binary.NativeEndian.PutUint32(frame[ipv4SrcOffset:], x)
}

func newSourceFeeder(tb testing.TB, target *ebpf.Program, at ebpf.AttachType) *sourceFeeder {
	tb.Helper()
	return newFeeder(tb, target, at, asm.Instructions{
		asm.Mul.Imm32(asm.R5, lcgMul),
		asm.Add.Imm32(asm.R5, lcgAdd),
	})
}

// newSourceFeederIn is newSourceFeeder for sources inside an IPv4 prefix:
// the host bits of the source (in network order) step through the same
// sequence modulo 2^(32-bits), which is also full-period, so no source
// repeats within 2^(32-bits) packets. The feeder converts the address to
// host order and back (two byte swaps more than newSourceFeeder).
func newSourceFeederIn(tb testing.TB, target *ebpf.Program, at ebpf.AttachType, in netip.Prefix) *sourceFeeder {
	tb.Helper()
	if !in.Addr().Is4() || in.Bits() < 1 {
		tb.Fatalf("source feeder range %s: want an IPv4 prefix of at least /1", in)
	}
	mask, base := prefixMaskBase(in)
	return newFeeder(tb, target, at, asm.Instructions{
		asm.HostTo(asm.BE, asm.R5, asm.Word), // network order to a number
		asm.Mul.Imm32(asm.R5, lcgMul),
		asm.Add.Imm32(asm.R5, lcgAdd),
		asm.And.Imm32(asm.R5, int32(mask)),
		asm.Or.Imm32(asm.R5, int32(base)),
		asm.HostTo(asm.BE, asm.R5, asm.Word),
	})
}

// newFeeder loads a feeder whose step turns the frame's source, in R5,
// into the next one, and puts target in its program array.
func newFeeder(tb testing.TB, target *ebpf.Program, at ebpf.AttachType, step asm.Instructions) *sourceFeeder {
	tb.Helper()
	calls, err := ebpf.NewMap(&ebpf.MapSpec{Name: "feeder_calls", Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		tb.Fatalf("create feeder program array: %v", err)
	}
	if err := calls.Put(uint32(0), target); err != nil {
		calls.Close()
		tb.Fatalf("put program under test into the feeder's program array: %v", err)
	}
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, ipv4SrcOffset+4),
		asm.JGT.Reg(asm.R4, asm.R3, "out"),
		asm.LoadMem(asm.R5, asm.R2, ipv4SrcOffset, asm.Word),
	}
	insns = append(insns, step...)
	insns = append(insns,
		asm.StoreMem(asm.R2, ipv4SrcOffset, asm.R5, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, calls.FD()),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnTailCall.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"), // XDP_ABORTED: the tail call failed
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "source_feeder", Type: ebpf.XDP, AttachType: at, License: "MIT", Instructions: insns,
	})
	if err != nil {
		calls.Close()
		tb.Fatalf("load source feeder: %v", err)
	}
	return &sourceFeeder{prog: prog, calls: calls}
}

// prefixMaskBase returns an IPv4 prefix's host-bit mask and its first
// address, as numbers.
func prefixMaskBase(in netip.Prefix) (mask, base uint32) {
	mask = uint32(1)<<(32-in.Bits()) - 1
	a := in.Masked().Addr().As4()
	return mask, binary.BigEndian.Uint32(a[:])
}

// advanceSourceIn is advanceSource for newSourceFeederIn(in).
func advanceSourceIn(in netip.Prefix) func(frame []byte, runs int) {
	mask, base := prefixMaskBase(in)
	return func(frame []byte, runs int) {
		x := binary.BigEndian.Uint32(frame[ipv4SrcOffset:])
		for range runs {
			x = lcgNext(x)&mask | base
		}
		binary.BigEndian.PutUint32(frame[ipv4SrcOffset:], x)
	}
}

func (f *sourceFeeder) Close() {
	f.prog.Close()
	f.calls.Close()
}

func TestSourceFeederAdvancesEveryRun(t *testing.T) {
	requireRoot(t)
	bare := bareDrop(t)
	defer bare.Close()
	f := newSourceFeeder(t, bare, ebpf.AttachNone)
	defer f.Close()
	frame := benchFrame(src4(1))
	start := binary.NativeEndian.Uint32(frame[ipv4SrcOffset:])
	const runs = 1000
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)), Repeat: runs}
	r, err := f.prog.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	if r != xdpDrop {
		t.Fatalf("verdict %d, want XDP_DROP from the tail-called program", r)
	}
	advanceSource(frame, runs)
	if got, want := binary.NativeEndian.Uint32(opts.DataOut[ipv4SrcOffset:]), binary.NativeEndian.Uint32(frame[ipv4SrcOffset:]); got != want {
		t.Fatalf("source after %d runs = %#x, want %#x (from %#x)", runs, got, want, start)
	}
}

// TestSourceFeederInStaysInPrefix: the ranged feeder's sources stay inside
// its prefix, the Go mirror follows it, and none repeats over many runs.
func TestSourceFeederInStaysInPrefix(t *testing.T) {
	requireRoot(t)
	bare := bareDrop(t)
	defer bare.Close()
	in := netip.MustParsePrefix("4.0.0.0/6")
	f := newSourceFeederIn(t, bare, ebpf.AttachNone, in)
	defer f.Close()
	advance := advanceSourceIn(in)
	frame := benchFrame(netip.MustParseAddr("4.0.0.1"))
	seen := map[netip.Addr]bool{}
	for i := range 5000 {
		opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)), Repeat: 1}
		if r, err := f.prog.Run(opts); err != nil || r != xdpDrop {
			t.Fatalf("run %d: verdict %d, err %v", i, r, err)
		}
		advance(frame, 1)
		src := netip.AddrFrom4([4]byte(opts.DataOut[ipv4SrcOffset : ipv4SrcOffset+4]))
		if got := netip.AddrFrom4([4]byte(frame[ipv4SrcOffset : ipv4SrcOffset+4])); got != src {
			t.Fatalf("run %d: kernel wrote %s, the Go mirror says %s", i, src, got)
		}
		if !in.Contains(src) {
			t.Fatalf("run %d: source %s outside %s", i, src, in)
		}
		if seen[src] {
			t.Fatalf("run %d: source %s repeats", i, src)
		}
		seen[src] = true
	}
}
