package main

// The SYN suite (-suites syn): a spoofed SYN flood against a real TCP
// listener on the edge, answered by (1) the kernel's own SYN cookies
// (tcp_syncookies=2: every SYN answered with a cookie, no request state),
// (2) iptables SYNPROXY (netfilter's anchor), (3) Edgeguard's SYN path
// (XDP SYN cookies, tcx hand-off). For each: SYNs answered per CPU-second
// of the receive side (the NET_RX softirq, rxtime.go, as the other
// suites), and real clients' connect success during the flood. Same run,
// ratio to the kernel printed. docs/tcp.md and docs/benchmarks.md.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/maps/mapstest"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testbed"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

const synBenchPort = 80

// synFilter answers the SYN flood on the edge.
type synFilter interface {
	name() string
	setup(e *edge) error
	// answered is how many SYNs it answered so far.
	answered(e *edge) (uint64, error)
	close()
}

// netstatIn reads a TcpExt counter of ns.
func netstatIn(ns *testbed.Namespace, name string) (uint64, error) {
	var v []uint64
	err := ns.Do(func() (err error) {
		v, err = testenv.NetCounters("netstat", "TcpExt", name)
		return err
	})
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// passNAPI gives an interface NAPI with an XDP_PASS program: frames sent to
// it with XDP_TX (the generator's, Edgeguard's SYN-ACKs) are then received.
type passNAPI struct {
	prog  *ebpf.Program
	links []link.Link
}

func (p *passNAPI) attach(ns *testbed.Namespace, ifindex int) error {
	if p.prog == nil {
		var err error
		if p.prog, err = constProgram("syn_napi", 2); err != nil {
			return err
		}
	}
	return ns.Do(func() error {
		l, err := link.AttachXDP(link.XDPOptions{Program: p.prog, Interface: ifindex, Flags: link.XDPDriverMode})
		if err != nil {
			return err
		}
		p.links = append(p.links, l)
		return nil
	})
}

func (p *passNAPI) close() {
	for _, l := range p.links {
		l.Close()
	}
	if p.prog != nil {
		p.prog.Close()
	}
}

// kernelCookies: the kernel answers every SYN with its own cookie.
type kernelCookies struct{ napi passNAPI }

func (k *kernelCookies) name() string { return "kernel syncookies" }
func (k *kernelCookies) setup(e *edge) error {
	if _, err := nsExec(e.ns, "", "sysctl", "-q", "-w", "net.ipv4.tcp_syncookies=2"); err != nil {
		return err
	}
	return k.napi.attach(e.ns, e.floodIf.Index)
}
func (k *kernelCookies) answered(e *edge) (uint64, error) { return netstatIn(e.ns, "SyncookiesSent") }
func (k *kernelCookies) close()                           { k.napi.close() }

// synproxy: iptables SYNPROXY answers SYNs untracked, then opens the
// connection to the listener itself.
type synproxy struct{ napi passNAPI }

func (s *synproxy) name() string { return "iptables SYNPROXY" }
func (s *synproxy) setup(e *edge) error {
	rules := fmt.Sprintf(`*raw
-A PREROUTING -p tcp -m tcp --syn --dport %[1]d -j CT --notrack
COMMIT
*filter
-A INPUT -p tcp -m tcp --dport %[1]d -m conntrack --ctstate INVALID,UNTRACKED -j SYNPROXY --sack-perm --timestamp --wscale 7 --mss 1460
-A INPUT -m conntrack --ctstate INVALID -j DROP
COMMIT
`, synBenchPort)
	// The rules load conntrack; its sysctl exists only after them.
	if _, err := nsExec(e.ns, rules, "iptables-restore"); err != nil {
		return err
	}
	if _, err := nsExec(e.ns, "", "sysctl", "-q", "-w", "net.netfilter.nf_conntrack_tcp_loose=0"); err != nil {
		return err
	}
	return s.napi.attach(e.ns, e.floodIf.Index)
}

// answered is the SYNPROXY rule's packet count: under a SYN flood those are
// the SYNs it answered (plus the few legit clients' ACKs).
func (s *synproxy) answered(e *edge) (uint64, error) {
	out, err := nsExec(e.ns, "", "iptables", "-L", "INPUT", "-v", "-x", "-n")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "SYNPROXY") {
			f := strings.Fields(line)
			if len(f) > 0 {
				return strconv.ParseUint(f[0], 10, 64)
			}
		}
	}
	return 0, errors.New("no SYNPROXY rule counter")
}
func (s *synproxy) close() { s.napi.close() }

// edgeguardSyn: the limiter (no limits) with the SYN path in front,
// protection always on.
type edgeguardSyn struct {
	dp   *loader.Datapath
	sp   *loader.SynPath
	syn  *maps.Syn
	atts []*loader.Attachment
}

func (g *edgeguardSyn) name() string { return "edgeguard syn" }
func (g *edgeguardSyn) setup(e *edge) error {
	var err error
	if g.dp, err = loader.Load(loader.Options{Sizes: loader.Sizes{SrcEntries: 1 << 16, AggEntries: 1 << 14,
		PrefixEntries: 1 << 12, ListEntries: 1 << 10, V4Chunks: 1 << 10}}); err != nil {
		return err
	}
	gen := policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictPass,
		Rules:     []policy.CompiledRule{{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}}},
	}
	if err := mapstest.StageCommit(maps.New(g.dp), &gen); err != nil {
		return err
	}
	if g.sp, err = loader.LoadSyn(g.dp, loader.SynOptions{}); err != nil {
		return err
	}
	g.syn = maps.NewSyn(g.sp)
	if err := g.syn.ApplySyn([]maps.SynService{{
		Mode: maps.SynAlways, MSS4: 1460, MSS6: 1440, WScale: 7,
		Endpoints: []netip.AddrPort{netip.AddrPortFrom(netip.IPv4Unspecified(), synBenchPort)},
	}}); err != nil {
		return err
	}
	return e.ns.Do(func() error {
		for _, ifc := range []string{e.floodIf.Name, e.legitIf.Name} {
			a, err := g.dp.Attach(ifc, loader.ModeNative)
			if err != nil {
				return err
			}
			g.atts = append(g.atts, a)
			if err := g.sp.AttachTC(ifc); err != nil {
				return err
			}
		}
		return nil
	})
}
func (g *edgeguardSyn) answered(e *edge) (uint64, error) {
	c, err := g.syn.SynCounters(1)
	if err != nil {
		return 0, err
	}
	return c[0].Answered, nil
}
func (g *edgeguardSyn) close() {
	for _, a := range g.atts {
		a.Detach()
	}
	if g.sp != nil {
		g.sp.Close()
	}
	if g.dp != nil {
		g.dp.Close()
	}
}

// synFrame is a SYN from 198.19.0.1 with Linux's options, and the sums the
// generator completes with each frame's source: the IP header's and the
// TCP pseudo-header + segment's, both without the source address.
func synFrame(srcMAC, dstMAC [6]byte, dst netip.Addr, dport uint16) ([]byte, uint32, uint32) {
	f := packet.Frame{SrcMAC: srcMAC, DstMAC: dstMAC, Src: netip.MustParseAddr("198.19.0.1"), Dst: dst,
		Proto: packet.ProtoTCP, SrcPort: 40000, DstPort: dport, TCPFlags: 0x02}
	b := f.Build()
	var ipSum uint32
	var h [20]byte
	copy(h[:], b[ipOff:ipOff+20])
	clear(h[10:16])
	for i := 0; i < 20; i += 2 {
		ipSum += uint32(binary.LittleEndian.Uint16(h[i:]))
	}
	tcp := append([]byte(nil), b[ipOff+20:]...)
	clear(tcp[16:18])
	var tcpSum uint32
	for i := 0; i+1 < len(tcp); i += 2 {
		tcpSum += uint32(binary.LittleEndian.Uint16(tcp[i:]))
	}
	d := dst.As4()
	tcpSum += uint32(binary.LittleEndian.Uint16(d[0:])) + uint32(binary.LittleEndian.Uint16(d[2:]))
	// Protocol and TCP length, in network order as little-endian halves.
	tcpSum += uint32(6) << 8
	l := uint16(len(tcp))
	tcpSum += uint32(l>>8 | l<<8)
	return b, ipSum, tcpSum
}

// synGeneratorProgram is generatorProgram for SYNs: it also completes the
// TCP checksum, which covers the source address (the kernel checks it).
//
// It also rewrites the whole frame first: live-frame pages are recycled
// with their content, and a frame the SYN path turned into a SYN-ACK
// (XDP_TX back to the generator's side) would otherwise be sent again as
// one.
func synGeneratorProgram(frame []byte, src sources, ipSum, tcpSum uint32) asm.Instructions {
	tmpl := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word),
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, int32(len(frame))),
		asm.JGT.Reg(asm.R4, asm.R3, "short"),
	}
	for i := 0; i+4 <= len(frame); i += 4 {
		tmpl = append(tmpl, asm.StoreImm(asm.R2, int16(i), int64(int32(binary.LittleEndian.Uint32(frame[i:]))), asm.Word))
	}
	if r := len(frame) % 4; r >= 2 {
		i := len(frame) - r
		tmpl = append(tmpl, asm.StoreImm(asm.R2, int16(i), int64(binary.LittleEndian.Uint16(frame[i:])), asm.Half))
	}
	in := append(tmpl, generatorProgram(src, ipSum)...)
	// Cut the trailing "r0 = XDP_TX; exit; short: r0 = XDP_DROP; exit"
	// and put it back after the TCP checksum; the source is in the frame
	// at saddrOff by then.
	in = in[:len(in)-4]
	fold := func(dst asm.Register) asm.Instructions {
		return asm.Instructions{
			asm.Mov.Reg(asm.R0, dst), asm.RSh.Imm(asm.R0, 16), asm.And.Imm(dst, 0xffff), asm.Add.Reg(dst, asm.R0),
			asm.Mov.Reg(asm.R0, dst), asm.RSh.Imm(asm.R0, 16), asm.And.Imm(dst, 0xffff), asm.Add.Reg(dst, asm.R0),
		}
	}
	in = append(in,
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, 4, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, ipOff+40),
		asm.JGT.Reg(asm.R4, asm.R3, "short"),
		asm.LoadMem(asm.R5, asm.R2, saddrOff, asm.Word),
		asm.Mov.Reg32(asm.R1, asm.R5),
		asm.And.Imm32(asm.R1, 0xffff),
		asm.RSh.Imm32(asm.R5, 16),
		asm.Add.Reg(asm.R1, asm.R5),
		asm.Add.Imm(asm.R1, int32(tcpSum)),
	)
	in = append(in, fold(asm.R1)...)
	in = append(in,
		asm.Xor.Imm(asm.R1, 0xffff),
		asm.StoreMem(asm.R2, ipOff+20+16, asm.R1, asm.Half),
		asm.Mov.Imm(asm.R0, xdpTX),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("short"),
		asm.Return(),
	)
	return in
}

type synResult struct {
	sent, answered uint64
	rx             time.Duration
	ok, tried      int
	p99            time.Duration
}

// runSynSuite runs every SYN filter (rounds times, interleaved) and prints
// a table with the ratio to the kernel's own SYN cookies.
func runSynSuite(ctx context.Context, c config, rc *rxClock) error {
	if rc == nil {
		return errors.New("the syn suite measures softirq time: run it without -threaded")
	}
	if err := loader.ProbeSyn(); err != nil {
		return fmt.Errorf("syn suite: %w", err)
	}
	mk := []func() synFilter{
		func() synFilter { return &kernelCookies{} },
		func() synFilter { return &synproxy{} },
		func() synFilter { return &edgeguardSyn{} },
	}
	per := make([][]synResult, len(mk))
	for round := 0; round < max(c.rounds, 1); round++ {
		for i, f := range mk {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r, err := runSynCase(c, rc, fmt.Sprintf("%s-s%d%d", c.prefix, round, i), f())
			if err != nil {
				fmt.Printf("| syn | %s | failed: %s |\n", f().name(), strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			per[i] = append(per[i], r)
		}
	}
	fmt.Println()
	fmt.Println("| suite | answerer | rounds | SYNs sent | answered | rx CPU-s | answered per rx CPU-s (k) | vs kernel | clients connected | p99 connect |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	rate := func(r synResult) float64 {
		if r.rx <= 0 {
			return 0
		}
		return float64(r.answered) / r.rx.Seconds()
	}
	med := func(rs []synResult) synResult {
		s := slices.Clone(rs)
		slices.SortFunc(s, func(a, b synResult) int {
			switch {
			case rate(a) < rate(b):
				return -1
			case rate(a) > rate(b):
				return 1
			}
			return 0
		})
		return s[len(s)/2]
	}
	var kernel float64
	if len(per[0]) > 0 {
		kernel = rate(med(per[0]))
	}
	for i, f := range mk {
		if len(per[i]) == 0 {
			continue
		}
		m := med(per[i])
		ratio := "-"
		if kernel > 0 {
			ratio = fmt.Sprintf("%.2fx", rate(m)/kernel)
		}
		ok, tried := 0, 0
		for _, r := range per[i] {
			ok += r.ok
			tried += r.tried
		}
		fmt.Printf("| syn | %s | %d | %d | %d | %.3f | %.0f | %s | %d/%d | %v |\n", f().name(), len(per[i]), m.sent, m.answered,
			m.rx.Seconds(), rate(m)/1e3, ratio, ok, tried, m.p99.Round(10*time.Microsecond))
	}
	return nil
}

func runSynCase(c config, rc *rxClock, prefix string, f synFilter) (res synResult, err error) {
	tb := testbed.New(prefix)
	defer func() {
		f.close()
		err = errors.Join(err, tb.Close())
	}()
	atk, err := tb.Namespace("atk")
	if err != nil {
		return res, err
	}
	edgeNS, err := tb.Namespace("edge")
	if err != nil {
		return res, err
	}
	cli, err := tb.Namespace("cli")
	if err != nil {
		return res, err
	}
	flood, err := tb.Connect(edgeNS, atk, testbed.VethSpec{NameA: "fb-flood", NameB: "fb-atk",
		AddrsA: []netip.Prefix{netip.MustParsePrefix("198.18.0.1/30")}, AddrsB: []netip.Prefix{netip.MustParsePrefix("198.18.0.2/30")}})
	if err != nil {
		return res, err
	}
	legit, err := tb.Connect(edgeNS, cli, testbed.VethSpec{NameA: "fb-legit", NameB: "fb-up",
		AddrsA: []netip.Prefix{netip.MustParsePrefix("198.18.1.1/24")}, AddrsB: []netip.Prefix{netip.MustParsePrefix("198.18.1.2/24")}})
	if err != nil {
		return res, err
	}
	e := &edge{ns: edgeNS, floodIf: flood.A, legitIf: legit.A, floodAddr: netip.MustParseAddr("198.18.0.1")}
	if _, err := nsExec(edgeNS, "", "sysctl", "-q", "-w", "net.ipv4.conf.all.rp_filter=0",
		"net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.fb-flood.rp_filter=0"); err != nil {
		return res, err
	}
	// The kernel and SYNPROXY answer only what they can route: the spoofed
	// /16 is routed to the attacker's end (a permanent neighbour), whose
	// XDP program drops everything, so replies never leave the pair.
	if _, err := nsExec(edgeNS, "", "ip", "neigh", "replace", "198.18.0.2", "lladdr", flood.B.MAC.String(),
		"dev", "fb-flood", "nud", "permanent"); err != nil {
		return res, err
	}
	if _, err := nsExec(edgeNS, "", "ip", "route", "add", "198.19.0.0/16", "via", "198.18.0.2", "dev", "fb-flood"); err != nil {
		return res, err
	}
	// SYN-ACKs to the spoofed sources come back to the attacker's end and
	// to the clients' end: both get NAPI and an XDP program, the same for
	// every answerer (the attacker's drops them: nothing routes them).
	var peers passNAPI
	defer peers.close()
	if err := peers.attach(cli, legit.B.Index); err != nil {
		return res, err
	}
	drop, err := constProgram("syn_sink", xdpDrop)
	if err != nil {
		return res, err
	}
	defer drop.Close()
	if err := atk.Do(func() error {
		l, err := link.AttachXDP(link.XDPOptions{Program: drop, Interface: flood.B.Index, Flags: link.XDPDriverMode})
		if err == nil {
			peers.links = append(peers.links, l)
		}
		return err
	}); err != nil {
		return res, err
	}
	// The listener, without MPTCP (docs/tcp.md), accepting and closing.
	var ln net.Listener
	if err := edgeNS.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		ln, err = lc.Listen(context.Background(), "tcp4", fmt.Sprintf("0.0.0.0:%d", synBenchPort))
		return err
	}); err != nil {
		return res, err
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	if err := f.setup(e); err != nil {
		return res, fmt.Errorf("set up %s: %w", f.name(), err)
	}

	frame, ipSum, tcpSum := synFrame([6]byte(flood.B.MAC), [6]byte(flood.A.MAC), e.floodAddr, synBenchPort)
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "syn_gen", Type: ebpf.XDP, License: "GPL",
		Instructions: synGeneratorProgram(frame, slash16, ipSum, tcpSum)})
	if err != nil {
		return res, fmt.Errorf("load syn generator: %w", err)
	}
	gen := &generator{prog: p, frame: frame, ifindex: flood.B.Index}
	defer gen.close()

	a0, err := f.answered(e)
	if err != nil {
		return res, err
	}
	rx0, err := rc.read()
	if err != nil {
		return res, err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var times []time.Duration
	var ok, tried atomic.Int64
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(c.duration / 4)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			tried.Add(1)
			start := time.Now()
			var conn net.Conn
			err := cli.Do(func() (err error) {
				conn, err = net.DialTimeout("tcp4", fmt.Sprintf("198.18.1.1:%d", synBenchPort), 3*time.Second)
				return err
			})
			if err == nil {
				conn.Close()
				ok.Add(1)
				mu.Lock()
				times = append(times, time.Since(start))
				mu.Unlock()
			}
		}
	}()
	total := c.rate * uint64(c.duration.Seconds()+0.5)
	if c.rate == 0 {
		total = 1 << 40
	}
	var sent uint64
	err = atk.Do(func() error {
		if err := pin(0, c.genCPU); err != nil {
			return err
		}
		var err error
		sent, _, err = gen.paced(total, c.rate, c.duration)
		return err
	})
	close(stop)
	wg.Wait()
	if err != nil {
		return res, err
	}
	time.Sleep(100 * time.Millisecond)
	a1, err := f.answered(e)
	if err != nil {
		return res, err
	}
	rx1, err := rc.read()
	if err != nil {
		return res, err
	}
	res = synResult{sent: sent, answered: a1 - a0, rx: time.Duration(rx1.NS - rx0.NS), ok: int(ok.Load()), tried: int(tried.Load())}
	if len(times) > 0 {
		slices.Sort(times)
		res.p99 = times[(len(times)*99+99)/100-1]
	}
	return res, nil
}
