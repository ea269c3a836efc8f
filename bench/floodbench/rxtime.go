package main

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// netRxSoftirq is NET_RX_SOFTIRQ, the vector of net_rx_action.
const netRxSoftirq = 3

// rxClock times the kernel's receive work itself: two programs on the
// irq:softirq_entry and irq:softirq_exit tracepoints, around
// net_rx_action, the NET_RX softirq handler that runs every NAPI poll
// (veth's included: the XDP program, the skb path up to the socket,
// netfilter hooks, GRO flushes). Each CPU keeps the entry time and a
// running sum of (exit - entry) and a count of softirqs.
//
// This is the receiving side's CPU time, without the generator's: the
// flood's only receive work happens in NET_RX on the generator's CPU
// (veth schedules its NAPI where it transmitted), and nothing else on
// that CPU receives more than the legit clients' few hundred packets.
// The probe's own cost (two tracepoint calls and two clock reads per
// softirq, one softirq per batch of frames) is inside the sums; it is the
// same for every filter.
type rxClock struct {
	start, total *ebpf.Map
	progs        []*ebpf.Program
	links        []link.Link
}

// rxTotals is one CPU's rx_total value, or their sum.
type rxTotals struct{ NS, Calls uint64 }

func newRxClock() (_ *rxClock, err error) {
	rc := &rxClock{}
	defer func() {
		if err != nil {
			rc.close()
		}
	}()
	if rc.start, err = ebpf.NewMap(&ebpf.MapSpec{Name: "rx_start", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1}); err != nil {
		return nil, fmt.Errorf("create rx_start map: %w", err)
	}
	if rc.total, err = ebpf.NewMap(&ebpf.MapSpec{Name: "rx_total", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: 1}); err != nil {
		return nil, fmt.Errorf("create rx_total map: %w", err)
	}

	// Both programs get the softirq vector as the tracepoint's first
	// argument; anything but NET_RX returns at once.
	netRxOnly := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.DWord),
		asm.JNE.Imm(asm.R2, netRxSoftirq, "out"),
	}
	// lookup puts &map[0] in R0, or jumps to "out" when it is missing.
	lookup := func(m *ebpf.Map) asm.Instructions {
		return asm.Instructions{
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
		}
	}
	entry := append(slices.Clone(netRxOnly), asm.FnKtimeGetNs.Call(), asm.Mov.Reg(asm.R6, asm.R0))
	entry = append(entry, lookup(rc.start)...)
	entry = append(entry,
		asm.StoreMem(asm.R0, 0, asm.R6, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)

	exit := append(slices.Clone(netRxOnly), lookup(rc.start)...)
	exit = append(exit,
		asm.LoadMem(asm.R6, asm.R0, 0, asm.DWord), // entry time
		asm.Mov.Imm(asm.R1, 0),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.JEq.Imm(asm.R6, 0, "out"), // attached mid-softirq: no entry seen
		asm.FnKtimeGetNs.Call(),
		asm.Sub.Reg(asm.R0, asm.R6),
		asm.Mov.Reg(asm.R7, asm.R0),
	)
	exit = append(exit, lookup(rc.total)...)
	exit = append(exit,
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Reg(asm.R1, asm.R7),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.LoadMem(asm.R1, asm.R0, 8, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 8, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)

	attach := func(name, tracepoint string, insns asm.Instructions) error {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: name, Type: ebpf.RawTracepoint, Instructions: insns, License: "GPL",
		})
		if err != nil {
			return fmt.Errorf("load %s: %w", name, err)
		}
		rc.progs = append(rc.progs, p)
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tracepoint, Program: p})
		if err != nil {
			return fmt.Errorf("attach %s to %s: %w", name, tracepoint, err)
		}
		rc.links = append(rc.links, l)
		return nil
	}
	if err := attach("rx_entry", "softirq_entry", entry); err != nil {
		return nil, err
	}
	if err := attach("rx_exit", "softirq_exit", exit); err != nil {
		return nil, err
	}
	return rc, nil
}

// read sums the per-CPU totals.
func (rc *rxClock) read() (rxTotals, error) {
	var per []rxTotals
	if err := rc.total.Lookup(uint32(0), &per); err != nil {
		return rxTotals{}, fmt.Errorf("read rx_total: %w", err)
	}
	var t rxTotals
	for _, v := range per {
		t.NS += v.NS
		t.Calls += v.Calls
	}
	return t, nil
}

func (rc *rxClock) close() error {
	var errs []error
	for _, l := range rc.links {
		errs = append(errs, l.Close())
	}
	for _, p := range rc.progs {
		errs = append(errs, p.Close())
	}
	for _, m := range []*ebpf.Map{rc.start, rc.total} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}
