package loader_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

// synDiff is the SYN path's differential harness: the limiter behind it
// (default rule, no limits, random lists), the SYN path on the test
// clock, and the sockets of the test's network namespace (listeners on
// 8080, one connection each over 127.0.0.1 and ::1).
type synDiff struct {
	t     *testing.T
	td    *testDatapath
	sp    *loader.SynPath
	syn   *maps.Syn
	nsvc  int
	eps   []netip.AddrPort // the services' endpoints
	conns []netip.AddrPort // client ends of the established connections
	// replies are SYN-ACKs the program sent, to complete handshakes.
	replies [][]byte
	log     []string
}

var (
	synDiffSrc4 = []string{"198.18.1.1", "198.18.1.2", "198.18.1.77", "198.18.2.1", "198.18.2.9", "198.18.3.3", "127.0.0.1"}
	synDiffSrc6 = []string{"fd00::1:1", "fd00::1:2", "fd00:0:0:2::1", "fd00:0:0:2::5", "fd00:0:0:3::1", "::1"}
	synDiffDst4 = []string{"198.18.0.1", "198.18.0.2", "127.0.0.1"}
	synDiffDst6 = []string{"fd00::1", "fd00::2", "::1"}
	synDiffPort = []uint16{8080, 8081, 9000}
)

// conn is what the program's socket lookup finds for a frame's tuple in
// the test's namespace.
func (h *synDiff) conn(f []byte) refmodel.SynConn {
	s, ok := refmodel.ParseSyn(f)
	if !ok {
		return refmodel.SynNoSocket
	}
	src, dst := netip.AddrFrom16(s.Src).Unmap(), netip.AddrFrom16(s.Dst).Unmap()
	for _, c := range h.conns {
		if c.Addr() == src && c.Port() == s.SPort && dst == src && s.DPort == 8080 {
			return 1 // TCP_ESTABLISHED
		}
	}
	if s.DPort == 8080 {
		return refmodel.SynListen
	}
	return refmodel.SynNoSocket
}

func (h *synDiff) counters(id uint32) [loader.SyncookieEgSynCounterEG_SYNC_MAX]uint64 {
	var per []loader.SyncookieEgSynCounters
	var sum [loader.SyncookieEgSynCounterEG_SYNC_MAX]uint64
	if err := h.sp.Objects.SynCounters.Lookup(id, &per); err != nil {
		h.t.Fatalf("read syn counters: %v", err)
	}
	for _, c := range per {
		for j := range sum {
			sum[j] += c.C[j]
		}
	}
	return sum
}

func (h *synDiff) fail(format string, args ...any) {
	h.t.Helper()
	from := max(0, len(h.log)-8)
	h.t.Fatalf(format+"\nlast packets:\n%s", append(args, fmt.Sprint(h.log[from:]))...)
}

// randSynServices writes 1-4 random protected services.
func (h *synDiff) randSynServices(r *rand.Rand) {
	n := 1 + r.IntN(4)
	used := map[netip.AddrPort]bool{}
	var svcs []maps.SynService
	for range n {
		s := maps.SynService{
			Mode: maps.SynMode(r.IntN(4)), MSS4: uint16(536 + r.IntN(1000)), MSS6: uint16(1220 + r.IntN(300)),
			WScale: uint8(r.IntN(15)), OnRate: uint64(1 + r.IntN(pick(r, 4, 20))), Hold: time.Duration(r.IntN(4)) << 30,
			AnswerLen4: pick(r, uint8(0), 16, 24, 32), AnswerLen6: pick(r, uint8(0), 48, 64, 128),
			ValidatedFor: pick(r, time.Duration(0), 10*time.Second, time.Minute),
		}
		s.OffRate = uint64(r.IntN(int(s.OnRate) + 1))
		if r.IntN(2) == 0 {
			s.OutOfState = maps.Rate{Count: uint64(1 + r.IntN(5)), Per: time.Second, Burst: uint64(1 + r.IntN(3))}
		}
		if r.IntN(3) != 0 {
			s.Answers = maps.Rate{Count: uint64(1 + r.IntN(10)), Per: time.Second, Burst: uint64(1 + r.IntN(4))}
		}
		for range 1 + r.IntN(3) {
			port := pick(r, synDiffPort...)
			var a netip.Addr
			switch r.IntN(3) {
			case 0:
				a = netip.IPv4Unspecified()
			case 1:
				a = netip.MustParseAddr(pick(r, synDiffDst4...))
			default:
				a = netip.MustParseAddr(pick(r, synDiffDst6...))
			}
			ap := netip.AddrPortFrom(a, port)
			if used[ap] {
				continue
			}
			used[ap] = true
			s.Endpoints = append(s.Endpoints, ap)
		}
		svcs = append(svcs, s)
	}
	h.eps = nil
	for _, sv := range svcs {
		h.eps = append(h.eps, sv.Endpoints...)
	}
	if err := h.syn.ApplySyn(svcs); err != nil {
		h.t.Fatalf("apply syn: %v", err)
	}
	h.nsvc = len(svcs)
}

// randSynState writes random auto state (on, a window's SYNs, a busy
// time, an out-of-state TAT) into each service.
func (h *synDiff) randSynState(r *rand.Rand, ns uint64) {
	for id := range uint32(h.nsvc) {
		st := loader.SyncookieEgSynState{Win: ns>>30 - uint64(r.IntN(2)), Syns: uint64(r.IntN(25)),
			LastBusy: ns - uint64(r.IntN(4))<<30, Active: uint32(r.IntN(3) / 2)}
		if r.IntN(2) == 0 {
			st.OosTat = ns + uint64(r.IntN(3))*uint64(time.Second)
		}
		if err := h.sp.Objects.SynState.Put(id, st); err != nil {
			h.t.Fatalf("set syn state: %v", err)
		}
	}
}

// randSynStanding writes standing entries for the sources: validated
// (recently or long ago), penalised, established.
func (h *synDiff) randSynStanding(r *rand.Rand, ns uint64) {
	for range 6 {
		a := netip.MustParseAddr(pick(r, append(slices.Clone(synDiffSrc4), synDiffSrc6...)...))
		v := loader.LimiterEgStandingVal{Since: ns - uint64(r.IntN(120))*uint64(time.Second), LastSeen: ns, CleanSince: ns}
		switch r.IntN(3) {
		case 0:
			v.Standing, v.Why = uint8(maps.StandingValidated), uint8(maps.WhySet)
		case 1:
			v.Standing, v.Why = uint8(maps.StandingPenalised), uint8(maps.WhyOwnLimit)
		default:
			v.Standing, v.Why = uint8(maps.StandingEstablished), uint8(maps.WhyClean)
		}
		if err := h.td.d.Objects.Standing.Put(maps.StandingKey(a), v); err != nil {
			h.t.Fatalf("set standing: %v", err)
		}
	}
}

// randSynLists deny- or allow-lists a few sources, some entries expired.
func (h *synDiff) randSynLists(r *rand.Rand, ns uint64) {
	var want []maps.ListEntry
	given := map[netip.Prefix]bool{}
	for range r.IntN(4) {
		a := netip.MustParseAddr(pick(r, append(slices.Clone(synDiffSrc4), synDiffSrc6...)...))
		bits := a.BitLen()
		if r.IntN(2) == 0 {
			bits -= 8
		}
		p, _ := a.Prefix(bits)
		if given[p] {
			continue
		}
		given[p] = true
		until := ns + pick(r, uint64(0), uint64(time.Minute))
		e := maps.ListEntry{Prefix: p, Origin: maps.OriginCLI}
		if r.IntN(4) == 0 {
			e.AllowUntil = until
		} else {
			e.DenyUntil = until
		}
		want = append(want, e)
	}
	if err := h.td.m.Lists.Set(want); err != nil {
		h.t.Fatalf("set lists: %v", err)
	}
}

// randSynFrame is a TCP segment to a protected service or near one: any
// flags, Linux's SYN options or random option bytes, IPv4 options or
// fragments sometimes, ACKs completing the program's own answers or
// carrying computed cookies of this, the last or an older window, and
// segments of the namespace's real connections.
func (h *synDiff) randSynFrame(r *rand.Rand, key loader.SyncookieEgSynSecret, ns uint64) []byte {
	if len(h.replies) > 0 && r.IntN(6) == 0 {
		// Complete one of the program's answers (or try to).
		a := h.replies[r.IntN(len(h.replies))]
		s, _ := refmodel.ParseSyn(a)
		seg := tcpSeg{src: netip.AddrFrom16(s.Dst).Unmap(), dst: netip.AddrFrom16(s.Src).Unmap(), sport: s.DPort, dport: s.SPort,
			seq: s.Ack, ack: s.Seq + 1, flags: pick(r, uint8(0x10), 0x10, 0x18, 0x11, 0x14)}
		if r.IntN(2) == 0 {
			seg.opts = binary.BigEndian.AppendUint32([]byte{1, 1, 8, 10, 0, 0, 0, 9}, uint32(r.Uint32()))
		}
		return seg.frame()
	}
	v6 := r.IntN(3) == 0
	if r.IntN(10) == 0 {
		// The segment explain asks about.
		src, dst := pick(r, synDiffSrc4...), pick(r, synDiffDst4...)
		if v6 {
			src, dst = pick(r, synDiffSrc6...), pick(r, synDiffDst6...)
		}
		return refmodel.SynProbeFrame(netip.AddrPortFrom(netip.MustParseAddr(src), uint16(1024+r.IntN(60000))),
			netip.AddrPortFrom(netip.MustParseAddr(dst), pick(r, synDiffPort...)), pick(r, uint8(0x02), 0x10, 0x04))
	}
	var src, dst netip.Addr
	if v6 {
		src, dst = netip.MustParseAddr(pick(r, synDiffSrc6...)), netip.MustParseAddr(pick(r, synDiffDst6...))
	} else {
		src, dst = netip.MustParseAddr(pick(r, synDiffSrc4...)), netip.MustParseAddr(pick(r, synDiffDst4...))
	}
	seg := tcpSeg{src: src, dst: dst, sport: uint16(1024 + r.IntN(64000)), dport: pick(r, append(synDiffPort, uint16(r.IntN(65536)))...),
		seq: r.Uint32(), ack: r.Uint32()}
	if len(h.eps) > 0 && r.IntN(2) == 0 {
		// To an endpoint of a service (any address: one of the pool).
		ep := h.eps[r.IntN(len(h.eps))]
		seg.dport = ep.Port()
		if a := ep.Addr(); !a.IsUnspecified() {
			seg.dst = a
			if a.Is4() != seg.src.Is4() {
				seg.src = netip.MustParseAddr(pick(r, synDiffSrc4...))
				if a.Is6() {
					seg.src = netip.MustParseAddr(pick(r, synDiffSrc6...))
				}
			}
		}
	}
	v6 = seg.src.Is6()
	if r.IntN(6) == 0 && len(h.conns) > 0 {
		c := h.conns[r.IntN(len(h.conns))]
		seg.src, seg.dst, seg.sport, seg.dport = c.Addr(), c.Addr(), c.Port(), 8080
	}
	seg.flags = pick(r, uint8(0x02), 0x02, 0x02, 0xc2, 0x0a, 0x10, 0x10, 0x18, 0x11, 0x04, 0x14, 0x12, 0x01, 0x00, uint8(r.IntN(256)))
	switch r.IntN(4) {
	case 0:
		seg.opts = linuxSYNOpts(uint16(r.IntN(9000)), r.Uint32(), uint8(r.IntN(16)))
	case 1:
		seg.opts = make([]byte, r.IntN(41))
		for i := range seg.opts {
			seg.opts[i] = pick(r, byte(0), 1, 2, 3, 4, 8, 10, 4, byte(r.IntN(256)))
		}
		if len(seg.opts) > 40-3 {
			seg.opts = seg.opts[:37]
		}
	case 2:
		seg.opts = []byte{2, 4, 5, 0xb4}
	}
	if seg.flags&0x17 == 0x10 && r.IntN(2) == 0 {
		// An ACK with a computed cookie of some window.
		isn := r.Uint32()
		w := ns>>36 - uint64(pick(r, 0, 0, 1, 2))
		s16, d16 := maps.Addr16(seg.src), maps.Addr16(seg.dst)
		c := refmodel.SynCookieMAC(key, s16, d16, seg.sport, seg.dport, isn, w) | uint32(r.IntN(256))&^pick(r, uint32(0), 1<<5)
		seg.seq, seg.ack = isn+1, c+1
	}
	f := seg.frame()
	if !v6 {
		switch r.IntN(12) {
		case 0: // IPv4 options: 4 NOPs
			f = slices.Insert(f, 34, 1, 1, 1, 1)
			f[14] = 0x46
			binary.BigEndian.PutUint16(f[16:], binary.BigEndian.Uint16(f[16:])+4)
		case 1: // more fragments
			f[20] |= 0x20
		case 2: // not the first fragment
			f[21] = 1
		case 3: // DF
			f[20] |= 0x40
		}
	}
	switch r.IntN(25) {
	case 0: // a VLAN tag: the SYN path does not read it (on to the limiter)
		f = slices.Insert(f, 12, 0x81, 0x00, 0x00, 0x07)
	case 1: // IPv6 with a hop-by-hop header: likewise
		if v6 {
			f = slices.Insert(f, 54, f[20], 0, 1, 4, 0, 0, 0, 0)
			f[20] = 0
			binary.BigEndian.PutUint16(f[18:], binary.BigEndian.Uint16(f[18:])+8)
		}
	}
	if r.IntN(20) == 0 {
		f = f[:max(14, len(f)-1-r.IntN(len(f)-14))]
	}
	return f
}

// step decides one frame through the model loaded from the maps (the
// SYN path's model, then the limiter's on a Continue) and through the
// program, and requires the same action, the same counters, the same
// answer frame, and the same service state, answer budget and standing.
func (h *synDiff) step(r *rand.Rand, ns uint64, seen map[string]int) {
	h.t.Helper()
	if err := h.td.m.SetTestClock(ns); err != nil {
		h.t.Fatal(err)
	}
	if err := h.syn.SetSynTestClock(ns); err != nil {
		h.t.Fatal(err)
	}
	st, err := h.td.m.ReadState()
	if err != nil {
		h.t.Fatalf("read state: %v", err)
	}
	model, err := refmodel.FromState(st)
	if err != nil {
		h.t.Fatalf("load the model: %v", err)
	}
	ss, err := h.syn.ReadSynState()
	if err != nil {
		h.t.Fatalf("read syn state: %v", err)
	}
	if ss.NowNS != ns {
		h.t.Fatalf("syn state read at %d, the test clock says %d", ss.NowNS, ns)
	}
	model.LoadSyn(ss)
	frame := h.randSynFrame(r, ss.Secret, ns)
	conn := h.conn(frame)
	v, tr := model.DecideSYN(frame, conn, ns)
	want := uint32(xdpDrop)
	var lim refmodel.Verdict
	switch v.Action {
	case refmodel.SynTX:
		want = xdpTX
	case refmodel.SynContinue:
		lim = model.Run(frame, st.NowNS)
		if lim.Passes() {
			want = xdpPass
		}
	}
	if err := model.LiveErr(); err != nil {
		h.t.Fatalf("model lookups: %v", err)
	}
	var before [loader.SyncookieEgSynCounterEG_SYNC_MAX]uint64
	if v.Protected {
		before = h.counters(v.Service)
	}
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out}
	got, err := h.sp.Objects.EgSynXdp.Run(opts)
	if err != nil {
		h.t.Fatalf("test run: %v", err)
	}
	desc := fmt.Sprintf("t=%d conn=%d model=%s/%s frame=%s", ns, conn, refmodel.SynActionName(v.Action),
		refmodel.SynCounterName(v.Reason), hex.EncodeToString(frame))
	if v.Action == refmodel.SynContinue {
		desc += " limiter=" + lim.String()
	}
	if !v.Protected {
		desc = fmt.Sprintf("t=%d conn=%d model=unprotected limiter=%s frame=%s", ns, conn, lim, hex.EncodeToString(frame))
	}
	h.log = append(h.log, desc+"\n")
	if got != want {
		h.fail("packet %d: program returned %d, model %d (%s)", len(h.log), got, want, desc)
	}
	if v.Protected {
		after := h.counters(v.Service)
		var wantC [loader.SyncookieEgSynCounterEG_SYNC_MAX]uint64
		for _, c := range v.Counted {
			wantC[c]++
		}
		for i := range after {
			if after[i]-before[i] != wantC[i] {
				h.fail("packet %d: counter %s moved by %d, the model says %d", len(h.log),
					refmodel.SynCounterName(refmodel.SynCounter(i)), after[i]-before[i], wantC[i])
			}
		}
		var sst loader.SyncookieEgSynState
		if err := h.sp.Objects.SynState.Lookup(v.Service, &sst); err != nil {
			h.t.Fatal(err)
		}
		if m := tr.StateAfter; sst != m {
			h.fail("packet %d: service state %+v, the model's %+v", len(h.log), sst, m)
		}
		seen[refmodel.SynCounterName(v.Reason)]++
		seen[refmodel.SynActionName(v.Action)]++
	} else {
		seen["unprotected"]++
	}
	if k := tr.AnswerKey; k != nil {
		var tat uint64
		if err := h.sp.Objects.SynAnswers.Lookup(*k, &tat); err != nil {
			h.fail("packet %d: answer budget %+v: %v", len(h.log), *k, err)
		}
		if m, _ := model.SynAnswerTAT(*k); m != tat {
			h.fail("packet %d: answer TAT %d, the model's %d", len(h.log), tat, m)
		}
		seen["answer_budget"]++
	}
	if v.Action == refmodel.SynTX {
		out = opts.DataOut
		if !bytes.Equal(out, v.Reply) {
			h.fail("packet %d: the program's answer\n%x\nthe model's\n%x", len(h.log), out, v.Reply)
		}
		seen["reply_equal"]++
		if len(h.replies) < 64 {
			h.replies = append(h.replies, slices.Clone(out))
		} else {
			h.replies[r.IntN(64)] = slices.Clone(out)
		}
	}
	if v.Meta != nil {
		s, _ := refmodel.ParseSyn(frame)
		k := maps.StandingKey(netip.AddrFrom16(s.Src).Unmap())
		var pv loader.LimiterEgStandingVal
		if err := h.td.d.Objects.Standing.Lookup(k, &pv); err != nil {
			h.fail("packet %d: standing after a valid cookie: %v", len(h.log), err)
		}
		mv, _ := model.StandingEntry(k)
		if pv.Standing != mv.Standing || pv.Why != mv.Why || pv.Since != mv.Since {
			h.fail("packet %d: standing %+v, the model's %+v", len(h.log), pv, mv)
		}
		seen["cookie_window_"+strconv.Itoa(tr.Cookie)]++
	}
	if tr.Bypass {
		seen["bypass"]++
	}
	for _, c := range v.Counted {
		if c == loader.SyncookieEgSynCounterEG_SYNC_ACTIVATIONS {
			seen["activation"]++
		}
	}
}

// runDiffSYN is one random run: services, state, standing and lists,
// renewed a third of the way in and at two thirds.
func (h *synDiff) run(seed uint64, n int) map[string]int {
	r := rand.New(rand.NewPCG(seed, seed^0x5be0cd19137e2179))
	seen := map[string]int{}
	ns := uint64(1)<<40 + uint64(r.IntN(1<<36))
	h.replies = nil
	for i := range n {
		if i%(n/3) == 0 {
			if i == 0 || r.IntN(2) == 0 {
				h.randSynServices(r)
			}
			h.randSynState(r, ns)
			h.randSynStanding(r, ns)
			h.randSynLists(r, ns)
		}
		switch r.IntN(50) {
		case 0:
			ns += uint64(1+r.IntN(4)) << 30 // auto-mode windows
		case 1:
			ns += uint64(1+r.IntN(2)) << 36 // cookie windows
		case 2:
			ns += uint64(r.IntN(20)) * uint64(time.Second)
		default:
			ns += uint64(r.IntN(int(50 * time.Millisecond)))
		}
		h.step(r, ns, seen)
	}
	return seen
}

// TestDifferentialSYN holds the SYN path's model (refmodel.DecideSYN,
// the model explain prints) to the program: 10,000 random segments (10
// runs of 1,000 from a printed seed), each decided by the model loaded
// from the maps as they are at that segment (maps.ReadState and
// maps.Syn.ReadSynState; the limiter's model on a Continue) and by the
// program (BPF_PROG_TEST_RUN on the test clock, in a namespace with real
// listeners and connections): the same XDP action, the same counters
// moved, the same SYN-ACK frame byte for byte, the same service state and
// answer budget, and the same standing after a valid cookie. States are
// random services (every mode, endpoints by address and by port only,
// budgets), auto state, standing, lists; segments are random flags,
// options, IPv4 options and fragments, ACKs completing the program's own
// answers, and ACKs with cookies of this, the last and older windows.
// EDGEGUARD_DIFF_SEED=N reruns seed N.
func TestDifferentialSYN(t *testing.T) {
	td := newTestDatapath(t, explainSizes)
	sp := loadSynPath(t, td)
	td.apply(defaultGen(policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}}))
	h := &synDiff{t: t, td: td, sp: sp, syn: maps.NewSyn(sp)}
	seed := diffSeeds(t, uint64(time.Now().UnixNano()))[0]
	t.Logf("seed %d (EDGEGUARD_DIFF_SEED=%d to rerun)", seed, seed)
	seen := map[string]int{}
	inNewNetns(t, func() {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			t.Errorf("lo up: %v", err)
			return
		}
		for _, network := range []string{"tcp4", "tcp6"} {
			ln, err := net.Listen(network, ":8080")
			if err != nil {
				t.Errorf("listen %s: %v", network, err)
				return
			}
			defer ln.Close()
		}
		for _, to := range []string{"127.0.0.1:8080", "[::1]:8080"} {
			c, err := net.Dial("tcp", to)
			if err != nil {
				t.Errorf("dial %s: %v", to, err)
				return
			}
			defer c.Close()
			ap := c.LocalAddr().(*net.TCPAddr).AddrPort()
			h.conns = append(h.conns, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
		}
		for run := range uint64(10) {
			for k, n := range h.run(seed+run, 1000) {
				seen[k] += n
			}
		}
	})
	t.Logf("seen: %v", seen)
	for _, k := range []string{"continue", "drop", "answer", "unprotected", "deny", "answered", "would_answer", "answer_limited",
		"bad_syn", "validated_pass", "cookie_valid", "cookie_invalid", "out_of_state_drop", "out_of_state_pass", "established",
		"answer_budget", "reply_equal", "cookie_window_1", "cookie_window_2", "bypass", "activation"} {
		if seen[k] == 0 {
			t.Errorf("no packet reached %s", k)
		}
	}
}
