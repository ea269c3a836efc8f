package netns_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/maps/mapstest"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/internal/trafficgen"
	"github.com/edgeguard/edgeguard/test/netns"
)

const synPort = 8080

// synLab is an edge running the limiter with the SYN path in front, a real
// TCP server on it, real clients (client 0) and a flooder (client 1).
type synLab struct {
	t      *testing.T
	star   *netns.Star
	dp     *loader.Datapath
	m      *maps.Maps
	sp     *loader.SynPath
	syn    *maps.Syn
	ln     *net.TCPListener
	accept atomic.Uint64
}

// requireSyn skips when the kernel lacks the SYN path's needs.
func requireSyn(t *testing.T) {
	t.Helper()
	if err := loader.ProbeSyn(); err != nil {
		t.Skipf("SYN path not testable here: %v", err)
	}
}

// napiPeer attaches an XDP program that passes everything to iface in ns:
// a veth delivers frames sent back with XDP_TX only to a peer that has
// NAPI (an XDP program, or GRO on).
func napiPeer(t *testing.T, ns *netns.Namespace, iface string) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()},
	})
	if err != nil {
		t.Fatalf("xdp pass program: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	err = ns.Do(func() error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index, Flags: link.XDPDriverMode})
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	if err != nil {
		t.Fatalf("napi peer on %s: %v", iface, err)
	}
}

func newSynLab(t *testing.T, svc maps.SynService, pinDir string) *synLab {
	t.Helper()
	l := newSynStar(t)
	l.load(svc, pinDir)
	return l
}

// newSynStar is a synLab before anything is loaded: a star of two
// clients (their peers with NAPI) and the echo server on synPort in the
// edge namespace.
func newSynStar(t *testing.T) *synLab {
	t.Helper()
	netns.RequireRoot(t)
	requireSyn(t)
	l := &synLab{t: t, star: netns.New(t).Star(2)}
	for _, c := range l.star.Clients {
		napiPeer(t, c.NS, "eg-up")
	}
	var err error
	// One dual-stack listener: IPv4 clients arrive as ::ffff:a.b.c.d.
	l.ln, err = listenTCP(l.star.Edge, fmt.Sprintf("[::]:%d", synPort))
	if err != nil {
		t.Fatal(err)
	}
	go l.serve(l.ln)
	t.Cleanup(func() { l.ln.Close() })
	return l
}

// established opens a connection from the first client to the echo
// server (closed when the test ends) and returns a check that it still
// echoes, failing the test with when.
func (l *synLab) established() (echo func(when string)) {
	t := l.t
	t.Helper()
	c := l.star.Clients[0]
	conn, err := c.NS.DialTCP(netip.AddrPortFrom(c.Src4, 0), netip.AddrPortFrom(c.EdgeAddr4, synPort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return func(when string) {
		t.Helper()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte("hello")); err != nil {
			t.Fatalf("%s: write: %v", when, err)
		}
		buf := make([]byte, 5)
		if _, err := conn.Read(buf); err != nil || string(buf) != "hello" {
			t.Fatalf("%s: read %q, %v", when, buf, err)
		}
	}
}

// listenTCP listens in ns without MPTCP: Go listens with MPTCP by default
// (1.24+), and the kernel hands no cookie request to an MPTCP listener
// (docs/tcp.md).
func listenTCP(ns *netns.Namespace, addr string) (*net.TCPListener, error) {
	return listenTCPProto(ns, addr, false)
}

// listenTCPProto is listenTCP with MPTCP on or off.
func listenTCPProto(ns *netns.Namespace, addr string, mptcp bool) (*net.TCPListener, error) {
	var ln *net.TCPListener
	err := ns.Do(func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(mptcp)
		l, err := lc.Listen(context.Background(), "tcp", addr)
		if err != nil {
			return err
		}
		ln = l.(*net.TCPListener)
		return nil
	})
	return ln, err
}

// serve echoes each connection's bytes back and counts what it accepted.
func (l *synLab) serve(ln *net.TCPListener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		l.accept.Add(1)
		go func() {
			defer c.Close()
			buf := make([]byte, 512)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
		}()
	}
}

// load loads the limiter (unlimited default rule) and the SYN path in
// front of it, attached to every client link of the edge. With pinDir the
// maps and links are pinned there, and a second load takes them over.
func (l *synLab) load(svc maps.SynService, pinDir string) {
	t := l.t
	dp, err := loader.Load(loader.Options{Sizes: sizes, PinDir: pinDir})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { dp.Close() })
	m := maps.New(dp)
	gen := policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictPass,
		Rules:     []policy.CompiledRule{{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 128}}},
	}
	if err := mapstest.StageCommit(m, &gen); err != nil {
		t.Fatal(err)
	}
	sp, err := loader.LoadSyn(dp, loader.SynOptions{})
	if err != nil {
		t.Fatalf("load syn path: %v", err)
	}
	t.Cleanup(func() { sp.Release() })
	syn := maps.NewSyn(sp)
	if err := syn.ApplySyn([]maps.SynService{svc}); err != nil {
		t.Fatal(err)
	}
	for _, c := range l.star.Clients {
		err := l.star.Edge.Do(func() error {
			a, err := dp.Attach(c.EdgeIf, loader.ModeNative)
			if err != nil {
				return err
			}
			if pinDir == "" {
				t.Cleanup(func() { a.Detach() })
			} else {
				t.Cleanup(func() { a.Release() })
			}
			return sp.AttachTC(c.EdgeIf)
		})
		if err != nil {
			t.Fatalf("attach to %s: %v", c.EdgeIf, err)
		}
	}
	l.dp, l.m, l.sp, l.syn = dp, m, sp, syn
}

func (l *synLab) counters() maps.SynCounters {
	l.t.Helper()
	c, err := l.syn.SynCounters(1)
	if err != nil {
		l.t.Fatal(err)
	}
	return c[0]
}

// netstat reads a TcpExt counter of the edge's namespace.
func (l *synLab) netstat(name string) uint64 {
	l.t.Helper()
	var v uint64
	err := l.star.Edge.Do(func() error {
		vs, err := testenv.NetCounters("netstat", "TcpExt", name)
		if err == nil {
			v = vs[0]
		}
		return err
	})
	if err != nil {
		l.t.Fatal(err)
	}
	return v
}

type connectResult struct {
	ok, failed int
	times      []time.Duration
}

func (r connectResult) p99() time.Duration {
	if len(r.times) == 0 {
		return 0
	}
	s := slices.Clone(r.times)
	slices.Sort(s)
	return s[(len(s)*99+99)/100-1]
}

// connect opens n connections from client 0 to the edge (workers at a
// time), each sending a line and reading it back, and times the connects.
func (l *synLab) connect(n, workers int, pace time.Duration, v6 bool) connectResult {
	c := l.star.Clients[0]
	src, dst := c.Src4, c.EdgeAddr4
	if v6 {
		src, dst = c.Src6, c.EdgeAddr6
	}
	var mu sync.Mutex
	var res connectResult
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				time.Sleep(pace)
				start := time.Now()
				conn, err := c.NS.DialTCP(netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, synPort), 5*time.Second)
				took := time.Since(start)
				if err == nil {
					conn.SetDeadline(time.Now().Add(5 * time.Second))
					_, err = conn.Write([]byte("ping\n"))
					if err == nil {
						buf := make([]byte, 5)
						_, err = conn.Read(buf)
					}
					conn.Close()
				}
				mu.Lock()
				if err != nil {
					res.failed++
				} else {
					res.ok++
					res.times = append(res.times, took)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return res
}

// flood runs a bounded spoofed flood from client 1 (random sources of
// 198.19.0.0/16 or fd00:19::/32) to the edge's port, in the background.
func (l *synLab) flood(ctx context.Context, proto trafficgen.Proto, rate, count int, d time.Duration, v6 bool) <-chan trafficgen.FloodResult {
	c := l.star.Clients[1]
	dst, src := c.EdgeAddr4, netip.MustParsePrefix("198.19.0.0/16")
	if v6 {
		dst, src = c.EdgeAddr6, netip.MustParsePrefix("fd00:19::/32")
	}
	out := make(chan trafficgen.FloodResult, 1)
	var pc *trafficgen.PacketConn
	err := c.NS.Do(func() error {
		ifc, err := net.InterfaceByName("eg-up")
		if err != nil {
			return err
		}
		pc, err = trafficgen.OpenPacketConn(ifc.Index)
		return err
	})
	if err != nil {
		l.t.Fatal(err)
	}
	f := trafficgen.Flood{
		SrcMAC: c.Link.B.MAC, DstMAC: c.Link.A.MAC, Dst: dst, Sources: []netip.Prefix{src},
		Proto: proto, DstPort: synPort, Rate: rate, Count: count, Duration: d, Seed: 13,
	}
	go func() {
		defer pc.Close()
		r, err := f.Run(ctx, pc)
		if err != nil {
			l.t.Errorf("flood: %v", err)
		}
		out <- r
	}()
	return out
}

// ackFlood sends count ACKs with random sequence and acknowledgement
// numbers from random spoofed sources, as fast as the pacing allows.
func (l *synLab) ackFlood(count int) int {
	c := l.star.Clients[1]
	var sent int
	err := c.NS.Do(func() error {
		ifc, err := net.InterfaceByName("eg-up")
		if err != nil {
			return err
		}
		pc, err := trafficgen.OpenPacketConn(ifc.Index)
		if err != nil {
			return err
		}
		defer pc.Close()
		rng := rand.New(rand.NewPCG(7, 9))
		dst := c.EdgeAddr4.As4()
		for i := range count {
			f := make([]byte, 54)
			copy(f[0:6], c.Link.A.MAC)
			copy(f[6:12], c.Link.B.MAC)
			binary.BigEndian.PutUint16(f[12:], 0x0800)
			ip := f[14:34]
			ip[0], ip[8], ip[9] = 0x45, 64, 6
			binary.BigEndian.PutUint16(ip[2:], 40)
			ip[12], ip[13], ip[14], ip[15] = 198, 19, byte(rng.IntN(256)), byte(rng.IntN(256))
			copy(ip[16:], dst[:])
			binary.BigEndian.PutUint16(ip[10:], ipsum(ip))
			tcp := f[34:]
			binary.BigEndian.PutUint16(tcp[0:], uint16(1024+rng.IntN(60000)))
			binary.BigEndian.PutUint16(tcp[2:], synPort)
			binary.BigEndian.PutUint32(tcp[4:], rng.Uint32())
			binary.BigEndian.PutUint32(tcp[8:], rng.Uint32())
			tcp[12], tcp[13] = 5<<4, 0x10
			binary.BigEndian.PutUint16(tcp[14:], 1024)
			if pc.Write(f) == nil {
				sent++
			}
			if i%200 == 199 {
				time.Sleep(time.Millisecond) // stay within the veth's queue
			}
		}
		return nil
	})
	if err != nil {
		l.t.Fatal(err)
	}
	return sent
}

// ipsum is the IPv4 header checksum (the TCP checksum is left zero: the
// program drops these before anything checks it).
func ipsum(h []byte) uint16 {
	var s uint32
	for i := 0; i < len(h); i += 2 {
		s += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func synService(mode maps.SynMode) maps.SynService {
	return maps.SynService{
		Mode: mode, MSS4: 1460, MSS6: 1440, WScale: 7,
		Endpoints: []netip.AddrPort{netip.AddrPortFrom(netip.IPv4Unspecified(), synPort), netip.AddrPortFrom(netip.IPv6Unspecified(), synPort)},
		OnRate:    500, OffRate: 100, Hold: 5 * time.Second,
		Answers:    maps.Rate{Count: 2000, Per: time.Second, Burst: 4000},
		AnswerLen4: 24, AnswerLen6: 48,
	}
}

// TestSynFloodAuto: a spoofed SYN flood turns protection on (auto); real
// clients that first appear during it connect, every SYN of the flood is
// answered by XDP (the kernel sends no SYN cookie of its own), and the
// server accepted no more connections than there were valid cookies.
func TestSynFloodAuto(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) {
			l := newSynLab(t, synService(maps.SynAuto), "")
			cookiesBefore := l.netstat("SyncookiesSent")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := l.flood(ctx, trafficgen.TCPSYN, 20000, 200000, 12*time.Second, v6)
			deadline := time.Now().Add(5 * time.Second)
			for !l.counters().Active && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if !l.counters().Active {
				t.Fatalf("protection did not turn on under the flood: %+v", l.counters())
			}
			// Clients paced over ~3 s, while the flood lasts.
			res := l.connect(300, 4, 40*time.Millisecond, v6)
			cancel()
			fr := <-done
			c := l.counters()
			total := res.ok + res.failed
			t.Logf("flood: %d SYNs sent in %v; clients: %d/%d connected, p99 connect %v; counters %+v",
				fr.Sent, fr.Elapsed.Round(time.Millisecond), res.ok, total, res.p99(), c)
			if res.ok*100 < total*99 {
				t.Errorf("clients connected %d of %d, want >= 99%%", res.ok, total)
			}
			if sent := l.netstat("SyncookiesSent") - cookiesBefore; sent != 0 {
				t.Errorf("TcpExtSyncookiesSent rose by %d: the kernel answered SYNs itself", sent)
			}
			if acc := l.accept.Load(); acc > c.CookieValid+c.ValidatedPass {
				t.Errorf("server accepted %d connections, more than %d valid cookies (+%d validated)", acc, c.CookieValid, c.ValidatedPass)
			}
			// The first SYNs arrive before protection is on (counted as
			// would-answer); every SYN after it is answered.
			if c.Answered+c.WouldAnswer < uint64(fr.Sent)*99/100 || c.BadSYN != 0 || c.Requests < uint64(res.ok) {
				t.Errorf("answered %d of %d flood SYNs, %d requests for %d connections", c.Answered, fr.Sent, c.Requests, res.ok)
			}
		})
	}
}

// TestSynACKFlood: ACKs with random numbers from spoofed sources belong to
// no connection and carry no valid cookie: all dropped; clients connect.
func TestSynACKFlood(t *testing.T) {
	l := newSynLab(t, synService(maps.SynAlways), "")
	sent := l.ackFlood(20000)
	res := l.connect(100, 4, 0, false)
	c := l.counters()
	t.Logf("ack flood: %d sent; clients %d/%d; counters %+v", sent, res.ok, res.ok+res.failed, c)
	// The veth may lose a few frames of its own; none of the flood passes.
	if c.CookieInvalid < uint64(sent)*99/100 || c.CookieValid > uint64(res.ok) {
		t.Errorf("invalid cookies %d for %d ACKs sent; valid %d for %d connections", c.CookieInvalid, sent, c.CookieValid, res.ok)
	}
	if res.failed != 0 {
		t.Errorf("%d of %d client connections failed during the ACK flood", res.failed, res.ok+res.failed)
	}
}

// TestSynEstablishedSurvive: a connection made before protection is on
// keeps working after the SYN path is put in front of the limiter, and
// after a second load (a restart) takes the pinned programs over.
func TestSynEstablishedSurvive(t *testing.T) {
	netns.RequireRoot(t)
	requireSyn(t)
	pinDir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("eg-syn-test-%d-%d", os.Getpid(), pinSeq.Add(1)))
	t.Cleanup(func() { loader.Unpin(pinDir) })
	l := newSynStar(t)
	echo := l.established()
	echo("before protection")
	l.load(synService(maps.SynAlways), pinDir)
	echo("protection on")
	l.sp.Release()
	l.dp.Close()
	// Every file descriptor is closed, as when a daemon dies: the pinned
	// program array still sends what the SYN path does not decide to the
	// limiter (the kernel empties an unpinned one with its last fd).
	next, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "syn", "maps", loader.SyncookieMapSynNext), nil)
	if err != nil {
		t.Fatalf("pinned syn_next: %v", err)
	}
	var progID uint32
	err = next.Lookup(uint32(0), &progID)
	next.Close()
	if err != nil {
		t.Fatalf("syn_next[0] after every fd closed: %v (the limiter would be bypassed)", err)
	}
	echo("every fd closed")
	l.load(synService(maps.SynAlways), pinDir)
	echo("after a restart")
	if err := l.syn.ApplySyn([]maps.SynService{synService(maps.SynAuto)}); err != nil {
		t.Fatal(err)
	}
	echo("after a reload")
	if got := l.counters(); got.Established < 3 || got.OutOfStateDrop != 0 {
		t.Errorf("counters %+v: want the connection's segments counted established, nothing out of state", got)
	}
}

// synDaemonHead is the XDP half of the SYN daemon tests' policies; a syn:
// section follows it.
var synDaemonHead = xdpHead(200000, "  - {name: eg-c0, xdp_mode: native}", "  - {name: eg-c1, xdp_mode: native}")

const synDaemonSection = `syn:
  validated_for: 0s
  services:
    - name: api
      listen: ["0.0.0.0:%d", "[::]:%d"]
      protection: %s
`

// TestSynDaemon: the real daemon runs the SYN path from the policy's syn:
// section. A connection made before it starts survives protection turning
// on, a reload and a restart (kill, then take-over from the pins); new
// clients connect through cookies; stats and metrics count them.
func TestSynDaemon(t *testing.T) {
	l := newSynStar(t)
	star, c := l.star, l.star.Clients[0]
	echo := l.established()
	echo("before the daemon")

	h := newDaemonHarness(t, star.Edge)
	write := func(mode string) {
		t.Helper()
		section := ""
		if mode != "" {
			section = fmt.Sprintf(synDaemonSection, synPort, synPort, mode)
		}
		tmp := h.Config + ".new"
		if err := os.WriteFile(tmp, []byte(synDaemonHead+section), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, h.Config); err != nil {
			t.Fatal(err)
		}
	}
	// No syn: section: the limiter alone, as before this feature.
	write("")
	h.start()
	echo("daemon without syn protection")
	if st, err := h.Stats(context.Background()); err != nil || st.SYN == nil || st.SYN.Available {
		t.Fatalf("stats without a syn: section: %+v, %v", st.SYN, err)
	}
	// Applying a policy that protects the port puts the SYN path in front
	// of the running limiter.
	write("always")
	if out, err := h.ctl("policy", "apply", "--yes", h.Config); err != nil {
		t.Fatalf("policy apply: %v\n%s", err, out)
	}
	echo("protection on")
	if res := l.connect(20, 2, 0, false); res.ok != 20 {
		t.Fatalf("new clients through cookies: %d of 20 connected\n%s", res.ok, h.Logs())
	}
	if res := l.connect(10, 2, 0, true); res.ok != 10 {
		t.Fatalf("new IPv6 clients through cookies: %d of 10 connected\n%s", res.ok, h.Logs())
	}
	st, err := h.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.SYN == nil || !st.SYN.Available || len(st.SYN.Services) != 1 || st.SYN.Services[0].CookiesValid < 30 ||
		st.SYN.Services[0].Requests < 30 || !st.SYN.Services[0].Active {
		t.Fatalf("stats syn = %+v\n%s", st.SYN, h.Logs())
	}
	out, err := h.ctl("stats")
	if err != nil || !strings.Contains(out, "SYN SERVICE") || !strings.Contains(out, "api") {
		t.Errorf("edgectl stats: %v\n%s", err, out)
	}
	fams := h.scrape()
	if f := fams["edgeguard_syn_packets_total"]; f == nil || len(f.Metric) == 0 {
		t.Errorf("no edgeguard_syn_packets_total in /metrics")
	}
	// explain: the clients' address completed handshakes through cookies,
	// so it is validated in the limiter's standing (the table the SYN path
	// shares); with validated_for 0 it gets no bypass, and its next SYN is
	// answered with a cookie, within its /24's answer budget.
	out, err = h.ctl("explain", c.Src4.String(), "--proto", "tcp", "--dport", strconv.Itoa(synPort), "-o", "json")
	if err != nil {
		t.Fatalf("edgectl explain: %v\n%s", err, out)
	}
	var ex control.Explanation
	if err := json.Unmarshal([]byte(out), &ex); err != nil {
		t.Fatalf("explain json: %v\n%s", err, out)
	}
	if ex.Standing == nil || ex.Standing.Standing != "validated" || ex.Standing.Why != "tcp_handshake" {
		t.Errorf("explain standing of a client that completed cookie handshakes: %+v, want validated (tcp_handshake)", ex.Standing)
	}
	if x := ex.SYN; x == nil || !x.Available || x.Bypass || len(x.Services) != 1 {
		t.Errorf("explain syn: %+v", x)
	} else if sv := x.Services[0]; sv.Service != "api" || sv.Protection != "always" || !sv.Active || !sv.Probe ||
		!strings.HasPrefix(sv.Next, "answered in XDP") || sv.AnswerPrefix != netip.PrefixFrom(c.Src4, 24).Masked() ||
		sv.AnswersBurst != 2000 || sv.AnswersAvailable > sv.AnswersBurst || sv.Counters.CookiesValid < 30 ||
		len(sv.Steps) < 3 || sv.Steps[len(sv.Steps)-1] != "answer (answered)" {
		t.Errorf("explain syn service: %+v", sv)
	}
	// The probe's own ACK (--flags 16), asked as one of no connection.
	out, err = h.ctl("explain", c.Src4.String(), "--proto", "tcp", "--dport", strconv.Itoa(synPort), "--flags", "16", "-o", "json")
	var exa control.Explanation
	if err == nil {
		err = json.Unmarshal([]byte(out), &exa)
	}
	if err != nil || exa.SYN == nil || len(exa.SYN.Services) != 1 ||
		!(strings.HasSuffix(exa.SYN.Services[0].ProbeSegment, "(cookie_invalid)") || strings.HasSuffix(exa.SYN.Services[0].ProbeSegment, "(out_of_state_pass)")) {
		t.Errorf("explain of an ACK: %v\n%s", err, out)
	} else {
		t.Logf("explain --flags 16: %s", exa.SYN.Services[0].ProbeSegment)
	}
	if out, err := h.ctl("explain", c.Src4.String(), "--proto", "tcp", "--dport", strconv.Itoa(synPort)); err != nil ||
		!strings.Contains(out, "syn api") || !strings.Contains(out, "a SYN from here answered in XDP") {
		t.Errorf("edgectl explain (table): %v\n%s", err, out)
	} else {
		t.Logf("edgectl explain %s --proto tcp --dport %d:\n%s", c.Src4, synPort, out)
	}

	write("auto")
	if out, err := h.ctl("policy", "apply", "--yes", h.Config); err != nil {
		t.Fatalf("policy apply: %v\n%s", err, out)
	}
	echo("after a reload")
	h.Kill()
	echo("daemon killed, pins enforcing")
	h.start()
	echo("after a restart")
	if res := l.connect(10, 2, 0, false); res.ok != 10 {
		t.Fatalf("after the restart: %d of 10 connected\n%s", res.ok, h.Logs())
	}
	h.stop(syscall.SIGTERM)
}
