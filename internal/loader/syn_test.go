package loader_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

const xdpTX = 3

// inNewNetns runs f on a locked thread in a fresh network namespace, so
// the SYN path's socket lookups see only the listeners f opens.
func inNewNetns(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		// The thread is left locked and dies with its namespace.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare netns: %v", err)
			return
		}
		f()
	}()
	<-done
}

// synModel is the cookie's MAC as the SYN path's reference model computes
// it (refmodel.SynCookieMAC).
func synModel(k0, k1 uint64, src, dst netip.Addr, sport, dport uint16, isn uint32, window uint64) uint32 {
	return refmodel.SynCookieMAC(loader.SyncookieEgSynSecret{K0: k0, K1: k1}, maps.Addr16(src), maps.Addr16(dst), sport, dport, isn, window)
}

type tcpSeg struct {
	src, dst     netip.Addr
	sport, dport uint16
	seq, ack     uint32
	flags        uint8
	opts         []byte
	payload      int
}

func csum(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func fold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func pseudo(src, dst netip.Addr, l4len int) uint32 {
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		return csum(csum(0, s[:]), d[:]) + 6 + uint32(l4len)
	}
	s, d := src.As16(), dst.As16()
	return csum(csum(0, s[:]), d[:]) + 6 + uint32(l4len)
}

func (s tcpSeg) frame() []byte {
	opts := append([]byte(nil), s.opts...)
	for len(opts)%4 != 0 {
		opts = append(opts, 1)
	}
	tcp := make([]byte, 20+len(opts)+s.payload)
	binary.BigEndian.PutUint16(tcp[0:], s.sport)
	binary.BigEndian.PutUint16(tcp[2:], s.dport)
	binary.BigEndian.PutUint32(tcp[4:], s.seq)
	binary.BigEndian.PutUint32(tcp[8:], s.ack)
	tcp[12] = byte((20 + len(opts)) / 4 << 4)
	tcp[13] = s.flags
	binary.BigEndian.PutUint16(tcp[14:], 64240)
	copy(tcp[20:], opts)
	binary.BigEndian.PutUint16(tcp[16:], fold(csum(pseudo(s.src, s.dst, len(tcp)), tcp)))
	b := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1}
	if s.src.Is4() {
		b = append(b, 0x08, 0x00)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
		ip[8], ip[9] = 64, 6
		sa, da := s.src.As4(), s.dst.As4()
		copy(ip[12:], sa[:])
		copy(ip[16:], da[:])
		binary.BigEndian.PutUint16(ip[10:], fold(csum(0, ip)))
		b = append(b, ip...)
	} else {
		b = append(b, 0x86, 0xdd)
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(tcp)))
		ip[6], ip[7] = 6, 64
		sa, da := s.src.As16(), s.dst.As16()
		copy(ip[8:], sa[:])
		copy(ip[24:], da[:])
		b = append(b, ip...)
	}
	return append(b, tcp...)
}

// linuxSYNOpts are the options Linux sends: MSS, SACK-permitted,
// timestamps, NOP, window scale.
func linuxSYNOpts(mss uint16, tsval uint32, ws uint8) []byte {
	o := []byte{2, 4, byte(mss >> 8), byte(mss), 4, 2, 8, 10}
	o = binary.BigEndian.AppendUint32(o, tsval)
	o = binary.BigEndian.AppendUint32(o, 0)
	return append(o, 1, 3, 3, ws)
}

type synTestPath struct {
	*testDatapath
	sp  *loader.SynPath
	syn *maps.Syn
	k0  uint64
	k1  uint64
}

func newSynTestPath(t *testing.T, svc maps.SynService) *synTestPath {
	return newSynTestPathSizes(t, svc, smallSizes)
}

func newSynTestPathSizes(t *testing.T, svc maps.SynService, sizes loader.Sizes) *synTestPath {
	td := newTestDatapath(t, sizes)
	sp := loadSynPath(t, td)
	td.apply(defaultGen(policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}}))
	s := maps.NewSyn(sp)
	if err := s.ApplySyn([]maps.SynService{svc}); err != nil {
		t.Fatal(err)
	}
	var k loader.SyncookieEgSynSecret
	if err := sp.Objects.SynSecret.Lookup(uint32(0), &k); err != nil {
		t.Fatal(err)
	}
	if k.K0 == 0 && k.K1 == 0 {
		t.Fatal("cookie key not set at load")
	}
	return &synTestPath{testDatapath: td, sp: sp, syn: s, k0: k.K0, k1: k.K1}
}

func (p *synTestPath) at(t *testing.T, d time.Duration) {
	t.Helper()
	p.setClock(d)
	if err := p.syn.SetSynTestClock(uint64(d)); err != nil {
		t.Fatal(err)
	}
}

func (p *synTestPath) run(t *testing.T, frame []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(frame)+64)
	ret, err := p.sp.Objects.EgSynXdp.Run(&ebpf.RunOptions{Data: frame, DataOut: out})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	return ret, out
}

func (p *synTestPath) counters(t *testing.T) maps.SynCounters {
	t.Helper()
	c, err := p.syn.SynCounters(1)
	if err != nil {
		t.Fatal(err)
	}
	return c[0]
}

// parsedSynAck is what an independent decoder reads from the answer.
type parsedSynAck struct {
	src, dst       netip.Addr
	sport, dport   uint16
	seq, ack       uint32
	flags          uint8
	mss            uint16
	ws             int // -1: none
	sack           bool
	tsval, tsecr   uint32
	ts             bool
	ipOK, tcpOK    bool
	ttl            uint8
	srcMAC, dstMAC []byte
}

func decodeSynAck(t *testing.T, f []byte) parsedSynAck {
	t.Helper()
	var p parsedSynAck
	p.dstMAC, p.srcMAC = f[0:6], f[6:12]
	var tcp []byte
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0800:
		ip := f[14:34]
		p.ipOK = fold(csum(0, ip)) == 0
		p.ttl = ip[8]
		p.src, p.dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		tcp = f[34 : 14+int(binary.BigEndian.Uint16(ip[2:]))]
	case 0x86dd:
		ip := f[14:54]
		p.ipOK = true
		p.ttl = ip[7]
		p.src, p.dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		tcp = f[54 : 54+int(binary.BigEndian.Uint16(ip[4:]))]
	default:
		t.Fatalf("answer is not IP: %x", f[:14])
	}
	p.tcpOK = fold(csum(pseudo(p.src, p.dst, len(tcp)), tcp)) == 0
	p.sport, p.dport = binary.BigEndian.Uint16(tcp[0:]), binary.BigEndian.Uint16(tcp[2:])
	p.seq, p.ack = binary.BigEndian.Uint32(tcp[4:]), binary.BigEndian.Uint32(tcp[8:])
	p.flags = tcp[13]
	p.ws = -1
	opts := tcp[20 : int(tcp[12]>>4)*4]
	for i := 0; i < len(opts); {
		switch opts[i] {
		case 0:
			i = len(opts)
			continue
		case 1:
			i++
			continue
		}
		l := int(opts[i+1])
		switch opts[i] {
		case 2:
			p.mss = binary.BigEndian.Uint16(opts[i+2:])
		case 3:
			p.ws = int(opts[i+2])
		case 4:
			p.sack = true
		case 8:
			p.ts = true
			p.tsval, p.tsecr = binary.BigEndian.Uint32(opts[i+2:]), binary.BigEndian.Uint32(opts[i+6:])
		}
		i += l
	}
	return p
}

var testService = maps.SynService{
	Mode: maps.SynAlways, MSS4: 1400, MSS6: 1380, WScale: 9,
	Endpoints:    []netip.AddrPort{netip.MustParseAddrPort("198.18.0.1:8080"), netip.MustParseAddrPort("[fd00::1]:8080")},
	ValidatedFor: time.Minute,
}

// TestSynCookieAnswer: the SYN-ACK the program builds, read back by an
// independent decoder: addresses and ports swapped, checksums, options
// (ours, the client's timestamp echoed), and a cookie equal to the Go
// reference's; then the handshake's ACK validates, a wrong one does not,
// and an old cookie expires.
func TestSynCookieAnswer(t *testing.T) {
	for _, fam := range []struct {
		name     string
		src, dst string
		mssIdx   uint32
		wantMSS  uint16
	}{
		{"ipv4", "198.18.7.9", "198.18.0.1", 3, 1400},
		{"ipv6", "fd00::7:9", "fd00::1", 2, 1380}, // client 1460 rounds down to 1440, index 2
	} {
		t.Run(fam.name, func(t *testing.T) {
			p := newSynTestPath(t, testService)
			inNewNetns(t, func() {
				network := "tcp4"
				if fam.name == "ipv6" {
					network = "tcp6"
				}
				ln, err := net.Listen(network, ":8080")
				if err != nil {
					t.Errorf("listen: %v", err)
					return
				}
				defer ln.Close()
				src, dst := netip.MustParseAddr(fam.src), netip.MustParseAddr(fam.dst)
				now := 5 * time.Minute
				p.at(t, now)
				const isn = 0x1234_5678
				syn := tcpSeg{src: src, dst: dst, sport: 40000, dport: 8080, seq: isn, flags: 0x02,
					opts: linuxSYNOpts(1460, 777, 7)}
				ret, out := p.run(t, syn.frame())
				if ret != xdpTX {
					t.Errorf("SYN: action %d, want XDP_TX (%d)", ret, xdpTX)
					return
				}
				a := decodeSynAck(t, out)
				if !a.ipOK || !a.tcpOK {
					t.Errorf("checksums: ip ok %v, tcp ok %v", a.ipOK, a.tcpOK)
				}
				if a.src != dst || a.dst != src || a.sport != 8080 || a.dport != 40000 {
					t.Errorf("addresses %v:%d -> %v:%d, want swapped", a.src, a.sport, a.dst, a.dport)
				}
				if string(a.srcMAC) != string([]byte{2, 0, 0, 0, 0, 2}) || string(a.dstMAC) != string([]byte{2, 0, 0, 0, 0, 1}) {
					t.Errorf("MACs not swapped: src %x dst %x", a.srcMAC, a.dstMAC)
				}
				if a.flags != 0x12 || a.ack != isn+1 || a.ttl != 64 {
					t.Errorf("flags %#x ack %#x ttl %d, want SYN|ACK, %#x, 64", a.flags, a.ack, a.ttl, isn+1)
				}
				if a.mss != fam.wantMSS || a.ws != 9 || !a.sack || !a.ts || a.tsecr != 777 {
					t.Errorf("options: mss %d ws %d sack %v ts %v echo %d; want %d, 9, true, true, 777",
						a.mss, a.ws, a.sack, a.ts, a.tsecr, fam.wantMSS)
				}
				window := uint64(now) >> 36
				want := synModel(p.k0, p.k1, src, dst, 40000, 8080, isn, window) | fam.mssIdx<<6 | 1<<4 | 7
				if a.seq != want {
					t.Errorf("cookie %#08x, reference model %#08x", a.seq, want)
				}

				ackOpts := []byte{1, 1, 8, 10}
				ackOpts = binary.BigEndian.AppendUint32(ackOpts, 778)
				ackOpts = binary.BigEndian.AppendUint32(ackOpts, a.tsval)
				ack := tcpSeg{src: src, dst: dst, sport: 40000, dport: 8080, seq: isn + 1, ack: a.seq + 1, flags: 0x10, opts: ackOpts}
				bad := ack
				bad.ack ^= 0x0100_0000
				if ret, _ := p.run(t, bad.frame()); ret != xdpDrop {
					t.Errorf("ACK with a wrong cookie: action %d, want drop", ret)
				}
				p.at(t, now+30*time.Second)
				if ret, _ := p.run(t, ack.frame()); ret != xdpPass {
					t.Errorf("ACK with our cookie: action %d, want pass", ret)
				}
				// The source is validated in the limiter's own standing
				// table (shared with the SYN path).
				if e, err := p.m.Standing.Lookup(src); err != nil || !e.Tracked || e.Standing != maps.StandingValidated ||
					e.Why != maps.WhyTCP || e.SinceNS != uint64(now+30*time.Second) {
					t.Errorf("standing after a valid cookie: %+v, %v; want validated (tcp) since %v", e, err, now+30*time.Second)
				}
				// Two windows later the same cookie is stale.
				p.at(t, now+3*(1<<36))
				if ret, _ := p.run(t, ack.frame()); ret != xdpDrop {
					t.Errorf("ACK with a stale cookie: action %d, want drop", ret)
				}
				c := p.counters(t)
				if c.SYNs != 1 || c.Answered != 1 || c.CookieValid != 1 || c.CookieInvalid != 2 {
					t.Errorf("counters %+v: want 1 SYN answered, 1 valid cookie, 2 invalid", c)
				}
			})
		})
	}
}

// TestSynOutOfState: with no connection, RST and FIN are dropped; a
// segment of an established connection (a real one, on loopback) goes on
// to the limiter.
func TestSynOutOfState(t *testing.T) {
	p := newSynTestPath(t, maps.SynService{Mode: maps.SynAlways, MSS4: 1460, MSS6: 1440,
		Endpoints: []netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:8080")}})
	inNewNetns(t, func() {
		// Through netlink, not ip(8): the kernel matrix's initramfs has
		// no /sbin/ip.
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			t.Errorf("lo up: %v", err)
			return
		}
		ln, err := net.Listen("tcp4", "127.0.0.1:8080")
		if err != nil {
			t.Errorf("listen: %v", err)
			return
		}
		defer ln.Close()
		conn, err := net.Dial("tcp4", "127.0.0.1:8080")
		if err != nil {
			t.Errorf("dial: %v", err)
			return
		}
		defer conn.Close()
		local := conn.LocalAddr().(*net.TCPAddr)
		p.at(t, time.Minute)
		src, dst := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.1")
		est := tcpSeg{src: src, dst: dst, sport: uint16(local.Port), dport: 8080, seq: 1, ack: 1, flags: 0x10}
		if ret, _ := p.run(t, est.frame()); ret != xdpPass {
			t.Errorf("segment of an established connection: action %d, want pass", ret)
		}
		for _, fl := range []uint8{0x04, 0x11, 0x14} {
			seg := tcpSeg{src: src, dst: dst, sport: 50000, dport: 8080, seq: 9, ack: 9, flags: fl}
			if ret, _ := p.run(t, seg.frame()); ret != xdpDrop {
				t.Errorf("flags %#x without a connection: action %d, want drop", fl, ret)
			}
		}
		c := p.counters(t)
		if c.Established != 1 || c.OutOfStateDrop != 3 {
			t.Errorf("counters %+v: want 1 established, 3 out-of-state drops", c)
		}
	})
}

// TestSynAutoHysteresis: auto turns on within the window in which SYNs
// reach the on rate, stays on while windows stay at or above the off rate,
// and turns off only after a window under it and hold since the last busy
// one; while off, SYNs go on to the limiter (counted as would-answer).
func TestSynAutoHysteresis(t *testing.T) {
	const window = time.Duration(1 << 30)
	svc := testService
	svc.Mode = maps.SynAuto
	svc.OnRate, svc.OffRate, svc.Hold = 100, 20, 3*window
	svc.ValidatedFor = 0
	p := newSynTestPath(t, svc)
	inNewNetns(t, func() {
		src, dst := netip.MustParseAddr("198.18.9.9"), netip.MustParseAddr("198.18.0.1")
		seq := uint32(0)
		syn := func() uint32 {
			seq++
			s := tcpSeg{src: src, dst: dst, sport: uint16(1024 + seq%60000), dport: 8080, seq: seq, flags: 0x02,
				opts: linuxSYNOpts(1460, 1, 7)}
			ret, _ := p.run(t, s.frame())
			return ret
		}
		// 100/s is 107 SYNs per 2^30 ns window.
		at := 10 * window
		p.at(t, at)
		for i := range 106 {
			if ret := syn(); ret != xdpPass {
				t.Fatalf("SYN %d below the on rate: action %d, want pass (to the kernel)", i, ret)
			}
		}
		if ret := syn(); ret != xdpTX {
			t.Fatalf("SYN reaching the on rate: action %d, want XDP_TX", ret)
		}
		if c := p.counters(t); !c.Active || c.Activations != 1 || c.WouldAnswer != 106 {
			t.Fatalf("after the on rate: %+v", c)
		}
		// Windows at or above the off rate (20/s is 21 SYNs per
		// window): busy, so protection stays on.
		for w := 1; w <= 3; w++ {
			p.at(t, at+time.Duration(w)*window)
			for range 25 {
				if ret := syn(); ret != xdpTX {
					t.Fatalf("window %d at the off rate: action %d, want XDP_TX", w, ret)
				}
			}
		}
		// Quiet windows: the first SYN after them sees a window under
		// off; hold (3 windows) since the last busy one has passed.
		p.at(t, at+5*window)
		if ret := syn(); ret != xdpTX {
			t.Fatalf("one quiet window, hold not over: action %d, want XDP_TX", ret)
		}
		p.at(t, at+8*window)
		if ret := syn(); ret != xdpPass {
			t.Fatalf("after hold under the off rate: action %d, want pass", ret)
		}
		if c := p.counters(t); c.Active {
			t.Fatalf("still active: %+v", c)
		}
	})
}

// TestSynAnswerBudget: SYN-ACKs to one source prefix stop at its burst
// (the host is no reflector), refill at the rate, and another prefix has
// its own budget; monitor mode answers nothing.
func TestSynAnswerBudget(t *testing.T) {
	svc := testService
	svc.Answers = maps.Rate{Count: 10, Per: time.Second, Burst: 5}
	svc.AnswerLen4, svc.AnswerLen6 = 24, 48
	svc.ValidatedFor = 0
	p := newSynTestPath(t, svc)
	inNewNetns(t, func() {
		dst := netip.MustParseAddr("198.18.0.1")
		send := func(src string, n int) (tx, drop int) {
			for i := range n {
				s := tcpSeg{src: netip.MustParseAddr(src), dst: dst, sport: uint16(2000 + i), dport: 8080, seq: uint32(i), flags: 0x02}
				switch ret, _ := p.run(t, s.frame()); ret {
				case xdpTX:
					tx++
				case xdpDrop:
					drop++
				}
			}
			return
		}
		p.at(t, time.Hour)
		if tx, drop := send("198.18.5.1", 8); tx != 5 || drop != 3 {
			t.Errorf("8 SYNs from one /24: %d answered, %d dropped; want 5, 3", tx, drop)
		}
		if tx, _ := send("198.18.5.200", 1); tx != 0 {
			t.Errorf("same /24, other address: answered %d, want 0 (the budget is the prefix's)", tx)
		}
		if tx, _ := send("198.18.6.1", 1); tx != 1 {
			t.Errorf("another /24: answered %d, want 1", tx)
		}
		p.at(t, time.Hour+200*time.Millisecond) // 2 more at 10/s
		if tx, drop := send("198.18.5.1", 3); tx != 2 || drop != 1 {
			t.Errorf("after 200 ms: %d answered, %d dropped; want 2, 1", tx, drop)
		}
		if c := p.counters(t); c.AnswerLimited != 5 || c.Answered != 8 {
			t.Errorf("counters %+v: want 8 answered, 5 limited", c)
		}
		mon := svc
		mon.Mode = maps.SynMonitor
		if err := p.syn.ApplySyn([]maps.SynService{mon}); err != nil {
			t.Fatal(err)
		}
		if tx, drop := send("198.18.7.1", 3); tx != 0 || drop != 0 {
			t.Errorf("monitor: %d answered, %d dropped; want none (the kernel answers)", tx, drop)
		}
	})
}

// handshake sends a SYN from src:sport, which must be answered, and the
// ACK that completes it with the answer's cookie; it returns the ACK's
// action.
func (p *synTestPath) handshake(t *testing.T, src, dst netip.Addr, sport uint16, isn uint32) uint32 {
	t.Helper()
	syn := tcpSeg{src: src, dst: dst, sport: sport, dport: 8080, seq: isn, flags: 0x02, opts: linuxSYNOpts(1460, 5, 7)}
	ret, out := p.run(t, syn.frame())
	if ret != xdpTX {
		t.Fatalf("SYN from %v: action %d, want XDP_TX", src, ret)
	}
	a := decodeSynAck(t, out)
	ack := tcpSeg{src: src, dst: dst, sport: sport, dport: 8080, seq: isn + 1, ack: a.seq + 1, flags: 0x10}
	ret, _ = p.run(t, ack.frame())
	return ret
}

// TestSynValidatedStanding: the SYN path and the limiter share one standing
// table. A valid cookie makes a new source validated there (created and
// validated are counted with the limiter's events); its next SYNs bypass
// the SYN path for validated_for, then get cookies again, and a completed
// one renews it. A source validated by other means (the L7 stage) bypasses
// too; a penalised one stays penalised and gets no bypass; with the table
// full the source is not entered, nobody is evicted, and its handshakes
// keep working through cookies.
func TestSynValidatedStanding(t *testing.T) {
	dst := netip.MustParseAddr("198.18.0.1")
	synFrom := func(src netip.Addr, sport uint16) []byte {
		return tcpSeg{src: src, dst: dst, sport: sport, dport: 8080, seq: 77, flags: 0x02, opts: linuxSYNOpts(1460, 5, 7)}.frame()
	}
	t.Run("bypass", func(t *testing.T) {
		p := newSynTestPath(t, testService) // validated_for 1 min
		inNewNetns(t, func() {
			ln, err := net.Listen("tcp4", ":8080")
			if err != nil {
				t.Errorf("listen: %v", err)
				return
			}
			defer ln.Close()
			user := netip.MustParseAddr("198.18.20.1")
			now := time.Hour
			p.at(t, now)
			if e, _ := p.m.Standing.Lookup(user); e.Tracked {
				t.Fatalf("standing before any handshake: %+v", e)
			}
			if ret := p.handshake(t, user, dst, 40001, 1000); ret != xdpPass {
				t.Fatalf("ACK with our cookie: action %d, want pass", ret)
			}
			e, err := p.m.Standing.Lookup(user)
			if err != nil || e.Standing != maps.StandingValidated || e.Why != maps.WhyTCP || e.SinceNS != uint64(now) {
				t.Fatalf("standing: %+v %v; want validated (tcp) since %v", e, err, now)
			}
			if ev, err := p.m.Standing.Counts(); err != nil || ev.Created != 1 || ev.Validated != 1 {
				t.Errorf("standing events %+v %v: want 1 created, 1 validated", ev, err)
			}
			// Within validated_for: the SYN goes on to the limiter (and
			// the kernel), unanswered.
			p.at(t, now+59*time.Second)
			if ret, _ := p.run(t, synFrom(user, 40002)); ret != xdpPass {
				t.Errorf("SYN of a validated source: action %d, want pass (bypass)", ret)
			}
			// After it: cookies again; a completed handshake renews.
			p.at(t, now+61*time.Second)
			if ret := p.handshake(t, user, dst, 40003, 2000); ret != xdpPass {
				t.Errorf("renewing handshake: ACK action %d, want pass", ret)
			}
			if e, _ := p.m.Standing.Lookup(user); e.Standing != maps.StandingValidated || e.SinceNS != uint64(now+61*time.Second) {
				t.Errorf("standing after renewal: %+v, want since %v", e, now+61*time.Second)
			}
			if ev, _ := p.m.Standing.Counts(); ev.Created != 1 || ev.Validated != 1 {
				t.Errorf("standing events %+v: a renewal is not a new validation", ev)
			}
			// Validated by the L7 stage (or a connection the limiter
			// saw): the same bypass.
			l7 := netip.MustParseAddr("198.18.21.1")
			if err := p.m.Standing.Set(l7, maps.StandingValidated); err != nil {
				t.Fatal(err)
			}
			if ret, _ := p.run(t, synFrom(l7, 40004)); ret != xdpPass {
				t.Errorf("SYN of an L7-validated source: action %d, want pass (bypass)", ret)
			}
			// Penalised: a handshake does not lift the penalty, and
			// gives no bypass.
			bad := netip.MustParseAddr("198.18.22.1")
			if err := p.m.Standing.Set(bad, maps.StandingPenalised); err != nil {
				t.Fatal(err)
			}
			if ret := p.handshake(t, bad, dst, 40005, 3000); ret != xdpPass {
				t.Errorf("penalised source's ACK: action %d, want pass (the limiter decides)", ret)
			}
			if e, _ := p.m.Standing.Lookup(bad); e.Standing != maps.StandingPenalised {
				t.Errorf("penalised source after a handshake: %+v, want still penalised", e)
			}
			if ret, _ := p.run(t, synFrom(bad, 40006)); ret != xdpTX {
				t.Errorf("penalised source's SYN: action %d, want XDP_TX (no bypass)", ret)
			}
			c := p.counters(t)
			if c.ValidatedPass != 2 || c.CookieValid != 3 || c.Answered != 4 {
				t.Errorf("counters %+v: want 2 validated passes, 3 valid cookies, 4 answered", c)
			}
		})
	})
	t.Run("ipv6 /64", func(t *testing.T) {
		p := newSynTestPath(t, testService)
		inNewNetns(t, func() {
			ln, err := net.Listen("tcp6", ":8080")
			if err != nil {
				t.Errorf("listen: %v", err)
				return
			}
			defer ln.Close()
			d6 := netip.MustParseAddr("fd00::1")
			p.at(t, time.Hour)
			syn := func(src netip.Addr, sport uint16) (uint32, []byte) {
				return p.run(t, tcpSeg{src: src, dst: d6, sport: sport, dport: 8080, seq: 9, flags: 0x02,
					opts: linuxSYNOpts(1460, 5, 7)}.frame())
			}
			user := netip.MustParseAddr("fd00:0:0:7::1")
			ret, out := syn(user, 40010)
			if ret != xdpTX {
				t.Fatalf("SYN: action %d", ret)
			}
			a := decodeSynAck(t, out)
			ack := tcpSeg{src: user, dst: d6, sport: 40010, dport: 8080, seq: 10, ack: a.seq + 1, flags: 0x10}
			if ret, _ := p.run(t, ack.frame()); ret != xdpPass {
				t.Fatalf("ACK: action %d", ret)
			}
			// Standing is per /64: another address of it bypasses, one
			// of another /64 does not.
			if e, _ := p.m.Standing.Lookup(netip.MustParseAddr("fd00:0:0:7::99")); e.Standing != maps.StandingValidated {
				t.Errorf("standing of the /64: %+v", e)
			}
			if ret, _ := syn(netip.MustParseAddr("fd00:0:0:7::99"), 40011); ret != xdpPass {
				t.Errorf("same /64: action %d, want pass (bypass)", ret)
			}
			if ret, _ := syn(netip.MustParseAddr("fd00:0:0:8::1"), 40012); ret != xdpTX {
				t.Errorf("another /64: action %d, want XDP_TX", ret)
			}
		})
	})
	t.Run("table full", func(t *testing.T) {
		sizes := smallSizes
		sizes.StandingEntries = 2
		p := newSynTestPathSizes(t, testService, sizes)
		inNewNetns(t, func() {
			ln, err := net.Listen("tcp4", ":8080")
			if err != nil {
				t.Errorf("listen: %v", err)
				return
			}
			defer ln.Close()
			p.at(t, time.Hour)
			kept := []netip.Addr{netip.MustParseAddr("198.18.30.1"), netip.MustParseAddr("198.18.30.2")}
			for _, a := range kept {
				if err := p.m.Standing.Set(a, maps.StandingEstablished); err != nil {
					t.Fatal(err)
				}
			}
			late := netip.MustParseAddr("198.18.31.1")
			if ret := p.handshake(t, late, dst, 40020, 1); ret != xdpPass {
				t.Errorf("ACK with the table full: action %d, want pass (the cookie still works)", ret)
			}
			if e, _ := p.m.Standing.Lookup(late); e.Tracked {
				t.Errorf("entered although the table is full: %+v", e)
			}
			for _, a := range kept {
				if e, _ := p.m.Standing.Lookup(a); e.Standing != maps.StandingEstablished {
					t.Errorf("%v evicted or changed: %+v", a, e)
				}
			}
			if ev, _ := p.m.Standing.Counts(); ev.Full != 1 || ev.Validated != 0 {
				t.Errorf("standing events %+v: want 1 full, 0 validated", ev)
			}
			if ret, _ := p.run(t, synFrom(late, 40021)); ret != xdpTX {
				t.Errorf("next SYN of the unrecorded source: action %d, want XDP_TX (cookies again)", ret)
			}
		})
	})
}
