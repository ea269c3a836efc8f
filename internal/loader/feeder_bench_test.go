package loader_test

import (
	"encoding/binary"
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
	calls, err := ebpf.NewMap(&ebpf.MapSpec{Name: "feeder_calls", Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		tb.Fatalf("create feeder program array: %v", err)
	}
	if err := calls.Put(uint32(0), target); err != nil {
		calls.Close()
		tb.Fatalf("put program under test into the feeder's program array: %v", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "source_feeder", Type: ebpf.XDP, AttachType: at, License: "MIT",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
			asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, ipv4SrcOffset+4),
			asm.JGT.Reg(asm.R4, asm.R3, "out"),
			asm.LoadMem(asm.R5, asm.R2, ipv4SrcOffset, asm.Word),
			asm.Mul.Imm32(asm.R5, lcgMul),
			asm.Add.Imm32(asm.R5, lcgAdd),
			asm.StoreMem(asm.R2, ipv4SrcOffset, asm.R5, asm.Word),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.LoadMapPtr(asm.R2, calls.FD()),
			asm.Mov.Imm(asm.R3, 0),
			asm.FnTailCall.Call(),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"), // XDP_ABORTED: the tail call failed
			asm.Return(),
		},
	})
	if err != nil {
		calls.Close()
		tb.Fatalf("load source feeder: %v", err)
	}
	return &sourceFeeder{prog: prog, calls: calls}
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
