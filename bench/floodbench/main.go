// Command floodbench measures, on one veth pair and at one offered load,
// the receiving side's CPU time per packet for plain XDP_DROP, Edgeguard
// (native and generic XDP), nftables per-source meters (netdev ingress and
// prerouting) and iptables hashlimit, under floods from one source, a /16
// and the whole IPv4 space, while legit clients in another namespace
// measure their success rate. bench/flood.sh runs it; docs/benchmarks.md
// explains the method and the results.
//
// Topology, made fresh for every case and removed after it:
//
//	<prefix>-atk  fb-atk 198.18.0.2/30  ==veth==  fb-flood 198.18.0.1/30  <prefix>-edge
//	<prefix>-cli  fb-up  198.18.1.2-11/24 ==veth== fb-legit 198.18.1.1/24
//
// The generator is an XDP program run with BPF_PROG_RUN on live frames
// (BPF_F_TEST_XDP_LIVE_FRAMES) against fb-atk: it writes the source and
// returns XDP_TX, which veth turns into a transmit to fb-flood's NAPI.
// By default fb-flood's NAPI runs as softirq on the generator's CPU: the
// generator thread's and ksoftirqd's schedstat are the total CPU time, and
// the NET_RX softirq's own time (rxtime.go) is the receiving side's;
// -threaded times a threaded-NAPI kthread instead.
// Spoofed sources are only written into frames: the edge namespace has no
// route beyond its two /30 and /24, so nothing answers them, and no
// namespace has a route or interface to the outside.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testbed"
)

type config struct {
	prefix     string
	rate       uint64
	duration   time.Duration
	legitRate  int
	genCPU     int
	napiCPU    int
	suites     string
	threaded   bool
	filterList string
	rounds     int
}

func main() {
	var c config
	flag.StringVar(&c.prefix, "prefix", fmt.Sprintf("eg-flood-%d", os.Getpid()), "namespace name prefix")
	flag.Uint64Var(&c.rate, "rate", 0, "offered flood rate, packets/s (0: as fast as the generator goes)")
	flag.DurationVar(&c.duration, "duration", 3*time.Second, "flood duration per case")
	flag.IntVar(&c.legitRate, "legit-rate", 20, "requests/s per legit client (10 clients)")
	flag.IntVar(&c.genCPU, "gen-cpu", 0, "CPU for the generator thread")
	flag.IntVar(&c.napiCPU, "napi-cpu", 1, "CPU for the receiving NAPI kthread")
	flag.BoolVar(&c.threaded, "threaded", false, "threaded NAPI on the flood interface, timed by its kthread "+
		"(default: NAPI runs as softirq on the generator's CPU, timed with the generator thread, minus the floor)")
	flag.IntVar(&c.rounds, "rounds", 1, "run the case list this many times, interleaved, and print medians")
	flag.StringVar(&c.suites, "suites", "compare,sources,rules", "comma-separated: compare, sources, rules, syn (SYN flood vs the kernel's SYN cookies and SYNPROXY)")
	flag.StringVar(&c.filterList, "filters", "", "only these filters in compare (comma-separated substrings)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c, log); err != nil {
		if errors.Is(err, context.Canceled) {
			log.Warn("interrupted; namespaces of finished cases are removed")
			os.Exit(130)
		}
		log.Error("floodbench failed", "err", err)
		os.Exit(1)
	}
}

type benchCase struct {
	suite string
	f     func() filter
	src   sources
	rules int
}

func filters() []func() filter {
	return []func() filter{
		func() filter { return &xdpConst{} },
		func() filter { return &edgeguard{mode: loader.ModeNative, clock: policy.ClockCoarse} },
		func() filter { return &edgeguard{mode: loader.ModeNative, clock: policy.ClockPrecise} },
		func() filter { return &edgeguard{mode: loader.ModeGeneric, clock: policy.ClockCoarse} },
		func() filter { return nftMeter{netdev: true} },
		func() filter { return nftMeter{netdev: false} },
		func() filter { return hashlimit{} },
		func() filter { return stackOnly{} },
	}
}

func cases(c config) []benchCase {
	var out []benchCase
	want := func(s string) bool { return strings.Contains(","+c.suites+",", ","+s+",") }
	// chosen is every filter -filters names (all when it is empty); the
	// scaling suites leave out the no-filter baseline, which has nothing
	// to scale.
	chosen := func(withBaseline bool) []func() filter {
		var fs []func() filter
		for _, f := range filters() {
			name := f().name()
			if !withBaseline && name == (stackOnly{}).name() {
				continue
			}
			ok := c.filterList == ""
			for _, w := range strings.Split(c.filterList, ",") {
				ok = ok || (w != "" && strings.Contains(name, w))
			}
			if ok {
				fs = append(fs, f)
			}
		}
		return fs
	}
	if want("compare") {
		for _, f := range chosen(true) {
			for _, s := range []sources{oneSource, slash16, wholeSpace} {
				out = append(out, benchCase{"compare", f, s, 0})
			}
		}
	}
	if want("sources") {
		for _, f := range chosen(false) {
			for _, s := range []sources{oneSource, kSources, slash16, mSources} {
				out = append(out, benchCase{"sources", f, s, 0})
			}
		}
	}
	if want("rules") {
		for _, f := range chosen(false) {
			if f().name() == (&xdpConst{}).name() {
				continue // the floor has no rules
			}
			for _, n := range []int{0, 1000, 10000} {
				out = append(out, benchCase{"rules", f, slash16, n})
			}
		}
	}
	return out
}

// result is one case's numbers.
type result struct {
	offered, received, ringDrops uint64        // frames sent, consumed by NAPI, lost at the ring
	passed                       uint64        // flood datagrams that reached UDP
	filterCount                  uint64        // the filter's own drop counter
	cpu                          time.Duration // generator + receive (or the NAPI kthread, threaded)
	rxCPU                        time.Duration // in the NET_RX softirq only (rxClock); 0 when threaded
	elapsed                      time.Duration
	legit                        legitResult
}

func run(ctx context.Context, c config, log *slog.Logger) error {
	fmt.Printf("# floodbench: rate %d pps offered, %s per case, legit 10 clients x %d req/s, generator cpu %d, napi cpu %d\n",
		c.rate, c.duration, c.legitRate, c.genCPU, c.napiCPU)
	fmt.Printf("# policy: per-source %d/s burst %d everywhere; nft set / hashlimit table %d entries; "+
		"edgeguard also /16 budget %d/s (198.18.0.0/15) and %d/s for all other sources together, "+
		"on the coarse clock unless the name says precise\n",
		perSourceRate, perSourceBurst, meterSize, prefixBudget, unknownBudget)
	if c.threaded {
		fmt.Println("# ns CPU/pkt: the flood interface's threaded NAPI kthread (schedstat) per packet it consumed")
	} else {
		fmt.Println("# ns CPU/pkt: generator thread + ksoftirqd on its CPU (schedstat) per packet received; NAPI runs there as softirq. " +
			"'above floor' subtracts the XDP_DROP case with the same sources")
	}
	var rc *rxClock
	if !c.threaded {
		var err error
		if rc, err = newRxClock(); err != nil {
			return fmt.Errorf("receive-side clock: %w", err)
		}
		defer rc.close()
		fmt.Println("# rx ns/pkt: time in the NET_RX softirq (net_rx_action, timed at irq:softirq_entry/exit) per packet " +
			"received: the receiving side alone, without the generator; 'per rx CPU-s' divides by that time")
	}
	if strings.Contains(","+c.suites+",", ",syn,") {
		if err := runSynSuite(ctx, c, rc); err != nil {
			return err
		}
		if len(cases(c)) == 0 {
			return nil
		}
	}
	fmt.Println("| suite | filter | sources | extra rules | received Mpps | ring drops | flood dropped | flood passed pps | filter's count | ns CPU/pkt | above floor | dropped per CPU-s (M) | rx ns/pkt | dropped per rx CPU-s (M) | legit success |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	floor := map[string]float64{} // total ns/pkt of the floor, by sources
	list := cases(c)
	samples := make([][]sample, len(list))
	for round := 0; round < max(c.rounds, 1); round++ {
		for i, bc := range list {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			f := bc.f()
			r, err := runCase(c, rc, fmt.Sprintf("%s-%d-%d", c.prefix, round, i), f, bc.src, bc.rules)
			if err != nil {
				log.Error("case failed", "filter", f.name(), "sources", bc.src.name, "err", err)
				fmt.Printf("| %s | %s | %s | %d | failed: %s |\n", bc.suite, f.name(), bc.src.name, bc.rules, strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			dropped := r.received - min(r.passed, r.received)
			perPkt := float64(r.cpu.Nanoseconds()) / float64(max(r.received, 1))
			dropRate := float64(dropped) / r.cpu.Seconds() / 1e6
			rxPerPkt := float64(r.rxCPU.Nanoseconds()) / float64(max(r.received, 1))
			rxDropRate := float64(dropped) / max(r.rxCPU.Seconds(), 1e-9) / 1e6
			if _, ok := f.(*xdpConst); ok {
				floor[bc.src.name] = perPkt
			}
			above := "-"
			if fl, ok := floor[bc.src.name]; ok {
				above = fmt.Sprintf("%.0f", perPkt-fl)
			}
			rxCols := "- | -" // threaded: NAPI runs outside the softirq
			if rc != nil {
				rxCols = fmt.Sprintf("%.0f | %.2f", rxPerPkt, rxDropRate)
			}
			fmt.Printf("| %s | %s | %s | %d | %.2f | %.1f%% | %.2f%% | %.0f | %d | %.0f | %s | %.2f | %s | %.2f%% (%d/%d) |\n",
				bc.suite, f.name(), bc.src.name, bc.rules,
				float64(r.received)/r.elapsed.Seconds()/1e6,
				100*float64(r.ringDrops)/float64(max(r.offered, 1)),
				100*float64(dropped)/float64(max(r.received, 1)),
				float64(r.passed)/r.elapsed.Seconds(), r.filterCount,
				perPkt, above, dropRate, rxCols,
				100*float64(r.legit.answered)/float64(max(r.legit.sent, 1)), r.legit.answered, r.legit.sent)
			samples[i] = append(samples[i], sample{
				perPkt: perPkt, dropShare: float64(dropped) / float64(max(r.received, 1)),
				passedPPS: float64(r.passed) / r.elapsed.Seconds(), dropRate: dropRate,
				rxPerPkt: rxPerPkt, rxDropRate: rxDropRate,
				legitSent: r.legit.sent, legitOK: r.legit.answered,
			})
		}
	}
	if c.rounds > 1 {
		printMedians(list, samples)
	}
	return nil
}

// sample is one run of one case.
type sample struct {
	perPkt, dropShare, passedPPS, dropRate float64
	rxPerPkt, rxDropRate                   float64
	legitSent, legitOK                     uint64
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// printMedians prints every case's medians over the rounds, the minimum
// CPU per packet in brackets, and the legit clients' total over all rounds.
func printMedians(list []benchCase, samples [][]sample) {
	fmt.Printf("\n# medians over the rounds (minimum in brackets); 'above floor' uses the floor's median\n")
	fmt.Println("| suite | filter | sources | extra rules | rounds | ns CPU/pkt | above floor | flood dropped | flood passed pps | dropped per CPU-s (M) | rx ns/pkt | dropped per rx CPU-s (M) | legit success (all rounds) |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	floor := map[string]float64{}
	for i, bc := range list {
		ss := samples[i]
		if len(ss) == 0 {
			continue
		}
		col := func(get func(sample) float64) []float64 {
			var out []float64
			for _, s := range ss {
				out = append(out, get(s))
			}
			return out
		}
		per := col(func(s sample) float64 { return s.perPkt })
		name := bc.f().name()
		if _, ok := bc.f().(*xdpConst); ok {
			floor[bc.src.name] = median(per)
		}
		above := "-"
		if fl, ok := floor[bc.src.name]; ok {
			above = fmt.Sprintf("%.0f", median(per)-fl)
		}
		var sent, ok uint64
		for _, s := range ss {
			sent += s.legitSent
			ok += s.legitOK
		}
		rx := col(func(s sample) float64 { return s.rxPerPkt })
		rxCols := "- | -" // threaded: no softirq time
		if slices.Max(rx) > 0 {
			rxCols = fmt.Sprintf("%.0f (%.0f) | %.2f", median(rx), slices.Min(rx),
				median(col(func(s sample) float64 { return s.rxDropRate })))
		}
		fmt.Printf("| %s | %s | %s | %d | %d | %.0f (%.0f) | %s | %.2f%% | %.0f | %.2f | %s | %.2f%% (%d/%d) |\n",
			bc.suite, name, bc.src.name, bc.rules, len(ss), median(per), slices.Min(per), above,
			100*median(col(func(s sample) float64 { return s.dropShare })),
			median(col(func(s sample) float64 { return s.passedPPS })),
			median(col(func(s sample) float64 { return s.dropRate })),
			rxCols,
			100*float64(ok)/float64(max(sent, 1)), ok, sent)
	}
}

func runCase(c config, rc *rxClock, prefix string, f filter, src sources, extraRules int) (res result, err error) {
	tb := testbed.New(prefix)
	defer func() {
		f.close()
		err = errors.Join(err, tb.Close())
	}()
	mk := tb.Namespace
	atk, err := mk("atk")
	if err != nil {
		return res, err
	}
	edgeNS, err := mk("edge")
	if err != nil {
		return res, err
	}
	cli, err := mk("cli")
	if err != nil {
		return res, err
	}
	flood, err := tb.Connect(edgeNS, atk, testbed.VethSpec{NameA: "fb-flood", NameB: "fb-atk",
		AddrsA: []netip.Prefix{netip.MustParsePrefix("198.18.0.1/30")}, AddrsB: []netip.Prefix{netip.MustParsePrefix("198.18.0.2/30")}})
	if err != nil {
		return res, err
	}
	floodIf, atkIf := flood.A, flood.B
	var clients []netip.Addr
	var clientPfx []netip.Prefix
	for h := byte(2); h < 12; h++ {
		a := netip.AddrFrom4([4]byte{198, 18, 1, h})
		clients = append(clients, a)
		clientPfx = append(clientPfx, netip.PrefixFrom(a, 24))
	}
	legit, err := tb.Connect(edgeNS, cli, testbed.VethSpec{NameA: "fb-legit", NameB: "fb-up",
		AddrsA: []netip.Prefix{netip.MustParsePrefix("198.18.1.1/24")}, AddrsB: clientPfx})
	if err != nil {
		return res, err
	}
	legitIf := legit.A
	e := &edge{ns: edgeNS, floodIf: floodIf, legitIf: legitIf, floodAddr: netip.MustParseAddr("198.18.0.1")}
	// Strict reverse-path filtering would drop spoofed sources in the
	// routing step; servers facing the internet have a default route
	// instead. Neither namespace has one: replies and ICMP errors to
	// spoofed sources have no route and are never sent.
	if _, err := nsExec(edgeNS, "", "sysctl", "-q", "-w", "net.ipv4.conf.all.rp_filter=0",
		"net.ipv4.conf.default.rp_filter=0", "net.ipv4.conf.fb-flood.rp_filter=0"); err != nil {
		return res, err
	}
	if err := f.setup(e, extraRules); err != nil {
		return res, fmt.Errorf("set up %s: %w", f.name(), err)
	}
	// Who does the receive work: the flood interface's NAPI kthread
	// (threaded), or softirq on the generator's CPU: veth schedules NAPI
	// on the CPU that transmitted, and the softirq runs when the
	// generator's batch re-enables bottom halves, in the generator
	// thread's context (this kernel has no IRQ time accounting, so its
	// schedstat includes it), or in ksoftirqd when the kernel defers it.
	kt := 0
	if c.threaded {
		if _, err := nsExec(edgeNS, "", "sh", "-c", "echo 1 > /sys/class/net/fb-flood/threaded"); err != nil {
			return res, err
		}
		if kt, err = napiThread("fb-flood"); err != nil {
			return res, err
		}
		if err := pin(kt, c.napiCPU); err != nil {
			return res, err
		}
	} else if kt, err = threadByName(fmt.Sprintf("ksoftirqd/%d", c.genCPU)); err != nil {
		return res, err
	}

	// The flood's destination: a UDP socket nobody reads (its full buffer
	// drops what passes, as a busy server would, counted in InErrors).
	var sink, echo *net.UDPConn
	if err := edgeNS.Do(func() (err error) {
		if sink, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(198, 18, 0, 1), Port: 9}); err != nil {
			return err
		}
		sink.SetReadBuffer(4096)
		echo, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(198, 18, 1, 1), Port: 7})
		return err
	}); err != nil {
		return res, fmt.Errorf("open sink and echo sockets: %w", err)
	}
	defer sink.Close()
	defer echo.Close()
	var served atomic.Uint64
	go echoServer(echo, &served)

	frame, sum := floodFrame([6]byte(atkIf.MAC), [6]byte(floodIf.MAC), e.floodAddr, 9)
	gen, err := newGenerator(src, frame, sum, atkIf.Index)
	if err != nil {
		return res, err
	}
	defer gen.close()

	// Warm-up: one second of flood, so that NAPI, caches, the filters'
	// tables (full, for the many-source floods) and Edgeguard's aggregate
	// buckets (empty) are in their flood state; then the measured run.
	if err := atk.Do(func() error {
		if err := pin(0, c.genCPU); err != nil {
			return err
		}
		_, _, err := gen.paced(1<<40, c.rate, time.Second)
		return err
	}); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	time.Sleep(100 * time.Millisecond)

	s0, err := linkStats(e)
	if err != nil {
		return res, err
	}
	u0, err := udpDelivered(e)
	if err != nil {
		return res, err
	}
	fc0, err := f.dropped(e)
	if err != nil {
		return res, err
	}
	cpu0, err := cpuNS(kt)
	if err != nil {
		return res, err
	}
	var rx0 rxTotals
	if rc != nil {
		if rx0, err = rc.read(); err != nil {
			return res, err
		}
	}
	served0 := served.Load()

	legitDone := make(chan struct{})
	var legitErr error
	go func() {
		defer close(legitDone)
		// Legit clients arrive after the flood started (new sources
		// mid-attack) and stop before it ends.
		time.Sleep(c.duration / 4)
		res.legit, legitErr = runLegit(cli, clients, netip.MustParseAddrPort("198.18.1.1:7"), c.legitRate, c.duration/2)
	}()
	total := c.rate * uint64(c.duration.Seconds()+0.5)
	if c.rate == 0 {
		total = 1 << 40
	}
	var genErr error
	var genCPU uint64
	atk.Do(func() error {
		if err := pin(0, c.genCPU); err != nil {
			genErr = err
			return nil
		}
		g0, err := cpuNS(-1)
		if err != nil {
			genErr = err
			return nil
		}
		res.offered, res.elapsed, genErr = gen.paced(total, c.rate, c.duration)
		g1, err := cpuNS(-1)
		if err != nil {
			genErr = err
			return nil
		}
		genCPU = g1 - g0
		return nil
	})
	if genErr != nil {
		return res, genErr
	}
	time.Sleep(50 * time.Millisecond) // let NAPI drain the ring
	cpu1, err := cpuNS(kt)
	if err != nil {
		return res, err
	}
	if rc != nil {
		rx1, err := rc.read()
		if err != nil {
			return res, err
		}
		res.rxCPU = time.Duration(rx1.NS - rx0.NS)
	}
	s1, err := linkStats(e)
	if err != nil {
		return res, err
	}
	<-legitDone
	if legitErr != nil {
		return res, fmt.Errorf("legit clients: %w", legitErr)
	}
	u1, err := udpDelivered(e)
	if err != nil {
		return res, err
	}
	fc1, err := f.dropped(e)
	if err != nil {
		return res, err
	}
	res.received = s1.rxPackets - s0.rxPackets
	res.ringDrops = s1.rxDropped - s0.rxDropped
	legitIn := served.Load() - served0
	res.passed = (u1 - u0) - min(legitIn, u1-u0)
	res.filterCount = fc1 - fc0
	res.cpu = time.Duration(cpu1 - cpu0)
	if !c.threaded {
		res.cpu += time.Duration(genCPU)
	}
	runtime.KeepAlive(sink)
	return res, nil
}
