package refmodel

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net/netip"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// The SYN path's model (bpf/syncookie.c, decide() and answer()): which
// TCP segments it decides, the SYN-ACK it answers with (cookie included:
// the model computes the cookie with the key read from syn_secret), what
// an ACK with a valid or invalid cookie gets, and its counters. Written
// from the C, statement by statement, like the limiter's model.
//
// What it takes as an input instead of reading it: the socket lookup
// (bpf_skc_lookup_tcp: no socket, a listener, or a connection in another
// state), which no map holds. What it leaves out: the tcx program (it
// only hands the kernel what the XDP part decided), a full standing table
// (the model always enters a validated source; the program counts
// EG_SE_FULL and does not), LRU eviction of answer budgets, and racing
// CPUs (auto-mode windows and GCRA updates are one packet at a time).

// SynAction is what the SYN path does with a segment.
type SynAction uint8

// SYN path actions: continue to the limiter (tail call), drop, or send
// the answer back (XDP_TX).
const (
	SynContinue SynAction = iota
	SynDrop
	SynTX
)

// SynActionName names an action as explain prints it.
func SynActionName(a SynAction) string {
	switch a {
	case SynDrop:
		return "drop"
	case SynTX:
		return "answer"
	}
	return "continue"
}

// SynCounter is one of the SYN path's per-service counters.
type SynCounter = loader.SyncookieEgSynCounter

// SynConn is what the program's socket lookup found for a segment's
// tuple: SynNoSocket, SynListen, or another TCP state (a connection).
type SynConn int

// Socket lookup results.
const (
	SynNoSocket SynConn = -1
	SynListen   SynConn = 10 // TCP_LISTEN
)

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// SynSegment is what the SYN path reads from a frame (the C struct seg).
type SynSegment struct {
	SMAC, DMAC   [6]byte
	Src, Dst     [16]byte // IPv4 as IPv4-mapped IPv6
	SPort, DPort uint16   // host order
	Seq, Ack     uint32
	V4           bool
	Flags        uint8
	// IPOpts: IPv4 options or the more-fragments bit.
	IPOpts bool
	// Opts are the TCP option bytes the program can load (nil when the
	// frame is shorter than the header says).
	Opts []byte
}

// ParseSyn reads a frame as the SYN path's parse() does; false: not a
// segment it reads (it continues to the limiter without a counter).
func ParseSyn(b []byte) (SynSegment, bool) {
	var s SynSegment
	if len(b) < 14 {
		return s, false
	}
	copy(s.DMAC[:], b[0:6])
	copy(s.SMAC[:], b[6:12])
	var l4 int
	switch binary.BigEndian.Uint16(b[12:]) {
	case etherIPv4:
		if len(b) < 34 || b[14]>>4 != 4 || b[23] != protoTCP || b[14]&0x0f < 5 {
			return s, false
		}
		frag := binary.BigEndian.Uint16(b[20:])
		if frag&0x1fff != 0 {
			return s, false
		}
		s.V4 = true
		s.IPOpts = b[14]&0x0f != 5 || frag&0x2000 != 0
		s.Src = [16]byte{10: 0xff, 11: 0xff}
		s.Dst = s.Src
		copy(s.Src[12:], b[26:30])
		copy(s.Dst[12:], b[30:34])
		l4 = 14 + int(b[14]&0x0f)*4
	case etherIPv6:
		if len(b) < 54 || b[20] != protoTCP {
			return s, false
		}
		copy(s.Src[:], b[22:38])
		copy(s.Dst[:], b[38:54])
		l4 = 54
	default:
		return s, false
	}
	if l4 > 80 || l4+20 > len(b) {
		return s, false
	}
	th := b[l4:]
	s.SPort, s.DPort = binary.BigEndian.Uint16(th[0:]), binary.BigEndian.Uint16(th[2:])
	s.Seq, s.Ack = binary.BigEndian.Uint32(th[4:]), binary.BigEndian.Uint32(th[8:])
	s.Flags = th[13]
	doff := int(th[12]>>4) * 4
	if doff < 20 {
		return s, false
	}
	if n := doff - 20; n > 0 && l4+doff <= len(b) {
		s.Opts = b[l4+20 : l4+doff]
	}
	return s, true
}

// synOptions are the options parse_options reads (the client's offer).
type synOptions struct {
	mss                    uint16
	wscale                 uint8
	wscaleOK, sackOK, tsOK bool
	tsval, tsecr           uint32
}

// parseSynOptions is parse_options and opt_step: one option per step,
// stopping at EOL, at a malformed length, or at the end.
func parseSynOptions(o []byte) synOptions {
	var r synOptions
	n := len(o)
	if n == 0 || n > 40 {
		return r
	}
	for off := 0; off < n && off < 40; {
		kind := o[off]
		if kind == 0 {
			break
		}
		if kind == 1 {
			off++
			continue
		}
		if off+1 >= n {
			break
		}
		l := int(o[off+1])
		if l < 2 || off+l > n {
			break
		}
		switch kind {
		case 2:
			if l == 4 {
				r.mss = binary.BigEndian.Uint16(o[off+2:])
			}
		case 3:
			if l == 3 {
				r.wscaleOK, r.wscale = true, o[off+2]
			}
		case 4:
			if l == 2 {
				r.sackOK = true
			}
		case 8:
			if l == 10 {
				r.tsOK = true
				r.tsval, r.tsecr = binary.BigEndian.Uint32(o[off+2:]), binary.BigEndian.Uint32(o[off+6:])
			}
		}
		off += l
	}
	return r
}

var (
	synMSS4 = [4]uint16{536, 1300, 1440, 1460}
	synMSS6 = [4]uint16{1220, 1420, 1440, 8940}
)

const (
	synCookieBits  = loader.SyncookieEgSynSizesEG_SYN_COOKIE_BITS
	synWindowShift = loader.SyncookieEgSynSizesEG_SYN_WINDOW_SHIFT
	synRateShift   = loader.SyncookieEgSynSizesEG_SYN_RATE_SHIFT
)

// SynCookieMAC is cookie_mac: SipHash-2-4 with the syn_secret key over the
// source and destination addresses, ports (network order, as the program
// holds them), the client's ISN and the time window, folded to 32 bits
// with the option bits cleared.
func SynCookieMAC(key loader.SyncookieEgSynSecret, src, dst [16]byte, sport, dport uint16, isn uint32, window uint64) uint32 {
	sw, dw := bits.ReverseBytes16(sport), bits.ReverseBytes16(dport)
	w := [7]uint64{
		binary.LittleEndian.Uint64(src[:8]), binary.LittleEndian.Uint64(src[8:]),
		binary.LittleEndian.Uint64(dst[:8]), binary.LittleEndian.Uint64(dst[8:]),
		uint64(sw)<<48 | uint64(dw)<<32 | uint64(isn), window, 48 << 56,
	}
	v0, v1 := key.K0^0x736f6d6570736575, key.K1^0x646f72616e646f6d
	v2, v3 := key.K0^0x6c7967656e657261, key.K1^0x7465646279746573
	round := func() {
		v0 += v1
		v1 = bits.RotateLeft64(v1, 13)
		v1 ^= v0
		v0 = bits.RotateLeft64(v0, 32)
		v2 += v3
		v3 = bits.RotateLeft64(v3, 16)
		v3 ^= v2
		v0 += v3
		v3 = bits.RotateLeft64(v3, 21)
		v3 ^= v0
		v2 += v1
		v1 = bits.RotateLeft64(v1, 17)
		v1 ^= v2
		v2 = bits.RotateLeft64(v2, 32)
	}
	for _, m := range w {
		v3 ^= m
		round()
		round()
		v0 ^= m
	}
	v2 ^= 0xff
	for range 4 {
		round()
	}
	h := v0 ^ v1 ^ v2 ^ v3
	return (uint32(h) ^ uint32(h>>32)) &^ (1<<synCookieBits - 1)
}

// synTables are the SYN path's maps in the model (LoadSyn).
type synTables struct {
	now       uint64
	endpoints map[loader.SyncookieEgSynEndpoint]uint32
	services  map[uint32]loader.SyncookieEgSynService
	state     map[uint32]loader.SyncookieEgSynState
	secret    loader.SyncookieEgSynSecret
	answers   map[loader.SyncookieEgSynPrefixKey]uint64
	live      *maps.SynState // answer budgets looked up as needed
	tried     map[loader.SyncookieEgSynPrefixKey]bool
}

// LoadSyn adds the SYN path's state (maps.Syn.ReadSynState) to a model
// of the limiter loaded from the same data plane (FromState): the lists
// and the standing table are the limiter's, shared. One loader per map.
func (m *Model) LoadSyn(s *maps.SynState) {
	t := &synTables{now: s.NowNS, answers: map[loader.SyncookieEgSynPrefixKey]uint64{}, live: s,
		tried: map[loader.SyncookieEgSynPrefixKey]bool{}}
	for _, load := range []func(*synTables, *maps.SynState){loadSynEndpoints, loadSynServices, loadSynState, loadSynSecret} {
		load(t, s)
	}
	m.syn = t
}

func loadSynEndpoints(t *synTables, s *maps.SynState) {
	t.endpoints = map[loader.SyncookieEgSynEndpoint]uint32{}
	for k, v := range s.Endpoints {
		t.endpoints[k] = v
	}
}

func loadSynServices(t *synTables, s *maps.SynState) {
	t.services = map[uint32]loader.SyncookieEgSynService{}
	for k, v := range s.Services {
		t.services[k] = v
	}
}

func loadSynState(t *synTables, s *maps.SynState) {
	t.state = map[uint32]loader.SyncookieEgSynState{}
	for k, v := range s.State {
		t.state[k] = v
	}
}

func loadSynSecret(t *synTables, s *maps.SynState) { t.secret = s.Secret }

// SynAnswerTAT is an answer budget as the model holds it.
func (m *Model) SynAnswerTAT(k loader.SyncookieEgSynPrefixKey) (uint64, bool) {
	m.faultSynAnswer(k)
	v, ok := m.syn.answers[k]
	return v, ok
}

// StandingEntry is a standing entry as the model holds it.
func (m *Model) StandingEntry(k StandingKey) (StandingVal, bool) {
	if m.live != nil {
		m.faultStanding(k)
	}
	v, ok := m.standing[k]
	return v, ok
}

func (m *Model) faultSynAnswer(k loader.SyncookieEgSynPrefixKey) {
	t := m.syn
	if _, ok := t.answers[k]; ok || t.live == nil || t.tried[k] {
		return
	}
	t.tried[k] = true
	v, ok, err := t.live.Answer(k)
	if m.live != nil {
		m.live.fail(err)
	}
	if ok {
		t.answers[k] = v
	}
}

// SynVerdict is the SYN path's decision for one segment.
type SynVerdict struct {
	Action SynAction
	// Service is the protected service's id; Protected false: the
	// segment is not one the SYN path decides (no counter).
	Service   uint32
	Protected bool
	// Counted are the service's counters the segment adds one to, in
	// the program's order; Reason is the last (what decided it).
	Counted []SynCounter
	Reason  SynCounter
	// Reply is the SYN-ACK frame (SynTX).
	Reply []byte
	// Meta is what a valid cookie leaves for the tcx program.
	Meta *loader.SyncookieEgSynMeta
}

func (v *SynVerdict) count(c SynCounter) {
	v.Counted = append(v.Counted, c)
	v.Reason = c
}

// SynTrace is what the SYN path's decision read, step by step.
type SynTrace struct {
	Parsed bool
	// Endpoint is the endpoint entry that matched (address zero: any
	// local address), nil: none.
	Endpoint *loader.SyncookieEgSynEndpoint
	Service  loader.SyncookieEgSynService
	// State is the service's state before the segment, StateAfter
	// after it.
	State, StateAfter loader.SyncookieEgSynState
	// Denied: the source's lists entry denies it now.
	Denied bool
	// BareSYN: SYN without ACK, RST or FIN. Active: protection on.
	BareSYN, Active bool
	// Standing is the source's standing entry, when looked at (a SYN,
	// with validated_for set); Bypass: validated within validated_for.
	Standing *StandingVal
	Bypass   bool
	// Answer budget: the source prefix's key and TAT before (Exists),
	// when the service has one.
	AnswerKey    *loader.SyncookieEgSynPrefixKey
	AnswerTAT    uint64
	AnswerExists bool
	// Conn is the socket lookup's result (not a bare SYN).
	Conn SynConn
	// Cookie: 0 not checked, 1 the current window, 2 the previous one,
	// -1 invalid.
	Cookie int
}

func synGCRA(tat *uint64, now, t, tau uint64) bool {
	if *tat > now+tau {
		return false
	}
	*tat = max(*tat, now) + t
	return true
}

// DecideSYN decides one frame as the SYN path's XDP program would at
// nowNS, with conn as what its socket lookup would find for the frame's
// tuple (asked only for a segment that is not a bare SYN to a protected
// service). The state changes as the program's would (answer budgets,
// auto state, out-of-state budget, standing of a validated source);
// a Continue goes on to the limiter (Run). LoadSyn first.
func (m *Model) DecideSYN(frame []byte, conn SynConn, nowNS uint64) (v SynVerdict, tr SynTrace) {
	s, ok := ParseSyn(frame)
	if !ok || m.syn == nil {
		return v, tr
	}
	tr.Parsed = true
	t := m.syn
	ep := loader.SyncookieEgSynEndpoint{Addr: s.Dst, Port: bits.ReverseBytes16(s.DPort)}
	id, ok := t.endpoints[ep]
	if !ok {
		ep.Addr = [16]byte{}
		if id, ok = t.endpoints[ep]; !ok {
			return v, tr
		}
	}
	tr.Endpoint = &ep
	svc, ok := t.services[id]
	if !ok || svc.Valid == 0 || maps.SynMode(svc.Mode) == maps.SynOff {
		return v, tr
	}
	st, ok := t.state[id]
	if !ok {
		return v, tr
	}
	tr.Service, tr.State = svc, st
	v.Service, v.Protected = id, true
	defer func() { t.state[id], tr.StateAfter = st, st }()
	now := nowNS

	if e, ok := m.lists.lookup(s.Src); ok && e.DenyUntil > now {
		tr.Denied = true
		v.count(loader.SyncookieEgSynCounterEG_SYNC_DENY)
		v.Action = SynDrop
		return v, tr
	}
	mode := maps.SynMode(svc.Mode)
	if s.Flags&(tcpSYN|tcpACK|tcpRST|tcpFIN) == tcpSYN {
		tr.BareSYN = true
		v.count(loader.SyncookieEgSynCounterEG_SYNC_SYN)
		if mode == maps.SynAuto {
			synAutoUpdate(&st, svc, now, &v)
		}
		active := mode == maps.SynAlways || (mode == maps.SynAuto && st.Active != 0)
		tr.Active = active
		if svc.ValidatedNs != 0 {
			k := maps.StandingKey(addrOf(s.Src))
			if e, ok := m.StandingEntry(k); ok {
				tr.Standing = &e
				if maps.Standing(e.Standing) == maps.StandingValidated && now-e.Since < svc.ValidatedNs {
					tr.Bypass = true
					v.count(loader.SyncookieEgSynCounterEG_SYNC_VALIDATED_PASS)
					return v, tr
				}
			}
		}
		if !active {
			v.count(loader.SyncookieEgSynCounterEG_SYNC_WOULD_ANSWER)
			return v, tr
		}
		if s.IPOpts {
			v.count(loader.SyncookieEgSynCounterEG_SYNC_BAD_SYN)
			v.Action = SynDrop
			return v, tr
		}
		if svc.AnsT != 0 {
			k := synAnswerKey(s.Src, s.V4, svc, id)
			tr.AnswerKey = &k
			tat, exists := m.SynAnswerTAT(k)
			tr.AnswerTAT, tr.AnswerExists = tat, exists
			ok := synGCRA(&tat, now, svc.AnsT, svc.AnsTau)
			t.answers[k] = tat
			if !ok {
				v.count(loader.SyncookieEgSynCounterEG_SYNC_ANSWER_LIMITED)
				v.Action = SynDrop
				return v, tr
			}
		}
		v.Reply = synAnswer(&s, svc, t.secret, now)
		v.count(loader.SyncookieEgSynCounterEG_SYNC_ANSWERED)
		v.Action = SynTX
		return v, tr
	}

	// Not a bare SYN: a known connection, a cookie, or out of state.
	tr.Conn = conn
	if conn >= 0 && conn != SynListen {
		v.count(loader.SyncookieEgSynCounterEG_SYNC_ESTABLISHED)
		return v, tr
	}
	active := mode == maps.SynAlways || (mode == maps.SynAuto && st.Active != 0)
	tr.Active = active
	bareACK := s.Flags&(tcpSYN|tcpACK|tcpRST|tcpFIN) == tcpACK
	if s.Flags&(tcpSYN|tcpACK|tcpRST) == tcpACK && conn == SynListen && !s.IPOpts {
		meta, w := synCheckCookie(&s, t.secret, now)
		tr.Cookie = w
		if meta != nil {
			o := parseSynOptions(s.Opts)
			meta.Tsval, meta.Tsecr = o.tsval, o.tsecr
			meta.TstampOk = b2u8(o.tsOK)
			if meta.WscaleOk != 0 {
				meta.RcvWscale = svc.Wscale
			}
			meta.Service = uint8(id)
			m.synValidate(maps.StandingKey(addrOf(s.Src)), now)
			v.Meta = meta
			v.count(loader.SyncookieEgSynCounterEG_SYNC_COOKIE_VALID)
			return v, tr
		}
	}
	oosCounter := loader.SyncookieEgSynCounterEG_SYNC_OOS_DROP
	if bareACK {
		oosCounter = loader.SyncookieEgSynCounterEG_SYNC_COOKIE_INVALID
	}
	if mode == maps.SynMonitor || !active {
		v.count(oosCounter)
		return v, tr
	}
	if svc.OosT != 0 && synGCRA(&st.OosTat, now, svc.OosT, svc.OosTau) {
		v.count(loader.SyncookieEgSynCounterEG_SYNC_OOS_BUDGET)
		return v, tr
	}
	v.count(oosCounter)
	v.Action = SynDrop
	return v, tr
}

func addrOf(a [16]byte) netip.Addr { return netip.AddrFrom16(a).Unmap() }

func b2u8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// synAutoUpdate is auto_update: the first SYN of a rate window closes the
// last one; protection turns on at on_syns in a window and off after a
// window under off_syns and hold since the last busy one.
func synAutoUpdate(st *loader.SyncookieEgSynState, svc loader.SyncookieEgSynService, now uint64, v *SynVerdict) {
	w := now >> synRateShift
	if cur := st.Win; w != cur {
		n := uint64(0)
		if w == cur+1 {
			n = st.Syns
		}
		st.Win, st.Syns = w, 0
		if n >= uint64(svc.OffSyns) {
			st.LastBusy = now
		}
		if st.Active != 0 && n < uint64(svc.OffSyns) && now-st.LastBusy >= svc.HoldNs {
			st.Active = 0
		}
	}
	st.Syns++
	if st.Syns >= uint64(svc.OnSyns) && st.Active == 0 {
		st.Active, st.LastBusy = 1, now
		v.count(loader.SyncookieEgSynCounterEG_SYNC_ACTIVATIONS)
	}
}

// synAnswerKey is the source's answer budget key: its address masked to
// the service's answer prefix.
func synAnswerKey(src [16]byte, v4 bool, svc loader.SyncookieEgSynService, id uint32) loader.SyncookieEgSynPrefixKey {
	b := int(min(svc.AnsLen6, 128))
	if v4 {
		b = 96 + int(min(svc.AnsLen4, 32))
	}
	return loader.SyncookieEgSynPrefixKey{Addr: maskAddr(src, b), Service: id}
}

// synValidate is validate(): a new source becomes validated (why: TCP)
// from now, its clean history going on; a handshake-validated one is
// renewed; an established source, one validated otherwise and a
// penalised one keep their standing (a handshake proves an address, not
// good intent).
func (m *Model) synValidate(k StandingKey, now uint64) {
	e, ok := m.StandingEntry(k)
	if !ok {
		m.standing[k] = StandingVal{Since: now, CleanSince: now, LastSeen: now,
			Standing: uint8(maps.StandingValidated), Why: uint8(maps.WhyTCP)}
		m.events.Created++
		m.events.Validated++
		return
	}
	if maps.Standing(e.Standing) == maps.StandingNew || handshakeOnly(e) {
		if maps.Standing(e.Standing) != maps.StandingValidated {
			m.events.Validated++
		}
		e.Standing, e.Why = uint8(maps.StandingValidated), uint8(maps.WhyTCP)
		e.Since = now
	}
	e.LastSeen = now
	m.standing[k] = e
}

// synCheckCookie is check_cookie: the ACK's cookie for the current or the
// previous window; the meta is what it decodes (nil: invalid), the int
// the window that matched (1 current, 2 previous, -1 none).
func synCheckCookie(s *SynSegment, key loader.SyncookieEgSynSecret, now uint64) (*loader.SyncookieEgSynMeta, int) {
	cookie, isn := s.Ack-1, s.Seq-1
	const mask = ^uint32(1<<synCookieBits - 1)
	w := now >> synWindowShift
	if cookie&(1<<5) != 0 {
		return nil, -1
	}
	matched := 1
	if SynCookieMAC(key, s.Src, s.Dst, s.SPort, s.DPort, isn, w) != cookie&mask {
		if w == 0 || SynCookieMAC(key, s.Src, s.Dst, s.SPort, s.DPort, isn, w-1) != cookie&mask {
			return nil, -1
		}
		matched = 2
	}
	tab := synMSS6
	if s.V4 {
		tab = synMSS4
	}
	ws := uint8(cookie & 15)
	meta := &loader.SyncookieEgSynMeta{Magic: uint32(loader.SyncookieEgSynSizesEG_SYN_META_MAGIC),
		Mss: tab[cookie>>6&3], SackOk: uint8(cookie >> 4 & 1)}
	if ws != 15 {
		meta.WscaleOk, meta.SndWscale = 1, ws
	}
	return meta, matched
}

// synAnswer is answer(): the SYN-ACK frame, Ethernet + IP header + 40
// bytes of TCP (MSS, window scale, SACK-permitted and timestamps, or
// NOPs), with the cookie as its sequence number.
func synAnswer(s *SynSegment, svc loader.SyncookieEgSynService, key loader.SyncookieEgSynSecret, now uint64) []byte {
	o := parseSynOptions(s.Opts)
	if o.mss == 0 {
		o.mss = 536
	}
	tab, mymss := synMSS6, svc.Mss6
	if s.V4 {
		tab, mymss = synMSS4, svc.Mss4
	}
	i := 3
	for ; i > 0; i-- {
		if o.mss >= tab[i] {
			break
		}
	}
	ws := uint32(15)
	if o.wscaleOK {
		ws = uint32(min(o.wscale, 14))
	}
	sack := uint32(0)
	if o.sackOK {
		sack = 1 << 4
	}
	cookie := SynCookieMAC(key, s.Src, s.Dst, s.SPort, s.DPort, s.Seq, now>>synWindowShift) | uint32(i)<<6 | sack | ws

	tcp := make([]byte, 40)
	binary.BigEndian.PutUint16(tcp[0:], s.DPort)
	binary.BigEndian.PutUint16(tcp[2:], s.SPort)
	binary.BigEndian.PutUint32(tcp[4:], cookie)
	binary.BigEndian.PutUint32(tcp[8:], s.Seq+1)
	tcp[12], tcp[13] = 10<<4, tcpSYN|tcpACK
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	opt := tcp[20:]
	opt[0], opt[1] = 2, 4
	binary.BigEndian.PutUint16(opt[2:], mymss)
	opt[4] = 1
	if o.wscaleOK {
		opt[5], opt[6], opt[7] = 3, 3, svc.Wscale
	} else {
		opt[5], opt[6], opt[7] = 1, 1, 1
	}
	if o.sackOK {
		opt[8], opt[9] = 4, 2
	} else {
		opt[8], opt[9] = 1, 1
	}
	if o.tsOK {
		opt[10], opt[11] = 8, 10
		binary.BigEndian.PutUint32(opt[12:], uint32(now/1000000))
		binary.BigEndian.PutUint32(opt[16:], o.tsval)
	} else {
		for j := 10; j < 20; j++ {
			opt[j] = 1
		}
	}
	f := append(append([]byte{}, s.SMAC[:]...), s.DMAC[:]...)
	var sum uint32
	if s.V4 {
		f = append(f, 0x08, 0x00)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], 60)
		binary.BigEndian.PutUint16(ip[6:], 0x4000)
		ip[8], ip[9] = 64, protoTCP
		copy(ip[12:], s.Dst[12:])
		copy(ip[16:], s.Src[12:])
		binary.BigEndian.PutUint16(ip[10:], csumFold(csumAdd(0, ip)))
		sum = csumAdd(csumAdd(0, ip[12:20]), []byte{0, protoTCP, 0, 40})
		f = append(f, ip...)
	} else {
		f = append(f, 0x86, 0xdd)
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], 40)
		ip[6], ip[7] = protoTCP, 64
		copy(ip[8:], s.Dst[:])
		copy(ip[24:], s.Src[:])
		sum = csumAdd(csumAdd(0, ip[8:40]), []byte{0, 0, 0, 40, 0, 0, 0, protoTCP})
		f = append(f, ip...)
	}
	binary.BigEndian.PutUint16(tcp[16:], csumFold(csumAdd(sum, tcp)))
	return append(f, tcp...)
}

func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
		sum = sum&0xffff + sum>>16
	}
	return sum
}

func csumFold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// SynCounterName names a counter as the metrics do
// (edgeguard_syn_packets_total's event label).
func SynCounterName(c SynCounter) string {
	switch c {
	case loader.SyncookieEgSynCounterEG_SYNC_SYN:
		return "syn"
	case loader.SyncookieEgSynCounterEG_SYNC_ANSWERED:
		return "answered"
	case loader.SyncookieEgSynCounterEG_SYNC_WOULD_ANSWER:
		return "would_answer"
	case loader.SyncookieEgSynCounterEG_SYNC_ANSWER_LIMITED:
		return "answer_limited"
	case loader.SyncookieEgSynCounterEG_SYNC_BAD_SYN:
		return "bad_syn"
	case loader.SyncookieEgSynCounterEG_SYNC_VALIDATED_PASS:
		return "validated_pass"
	case loader.SyncookieEgSynCounterEG_SYNC_COOKIE_VALID:
		return "cookie_valid"
	case loader.SyncookieEgSynCounterEG_SYNC_COOKIE_INVALID:
		return "cookie_invalid"
	case loader.SyncookieEgSynCounterEG_SYNC_OOS_DROP:
		return "out_of_state_drop"
	case loader.SyncookieEgSynCounterEG_SYNC_OOS_BUDGET:
		return "out_of_state_pass"
	case loader.SyncookieEgSynCounterEG_SYNC_ESTABLISHED:
		return "established"
	case loader.SyncookieEgSynCounterEG_SYNC_ACTIVATIONS:
		return "activation"
	case loader.SyncookieEgSynCounterEG_SYNC_REQSK:
		return "request"
	case loader.SyncookieEgSynCounterEG_SYNC_REQSK_FAIL:
		return "request_failed"
	case loader.SyncookieEgSynCounterEG_SYNC_DENY:
		return "deny"
	}
	return fmt.Sprintf("counter %d", c)
}

// SynProbeFrame is the segment explain asks the SYN path about: from src
// to dst (one family), a 20-byte TCP header with flags and no options.
func SynProbeFrame(src, dst netip.AddrPort, flags uint8) []byte {
	f := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1}
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], 1)
	tcp[12], tcp[13] = 5<<4, flags
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	if s, d := src.Addr().Unmap(), dst.Addr().Unmap(); s.Is4() {
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, protoTCP
		binary.BigEndian.PutUint16(ip[2:], 40)
		sa, da := s.As4(), d.As4()
		copy(ip[12:], sa[:])
		copy(ip[16:], da[:])
		f = append(append(f, 0x08, 0x00), ip...)
	} else {
		ip := make([]byte, 40)
		ip[0], ip[6], ip[7] = 0x60, protoTCP, 64
		binary.BigEndian.PutUint16(ip[4:], 20)
		sa, da := s.As16(), d.As16()
		copy(ip[8:], sa[:])
		copy(ip[24:], da[:])
		f = append(append(f, 0x86, 0xdd), ip...)
	}
	return append(f, tcp...)
}

// AnswersLeft reads the answer budget the decision looked at (AnswerKey
// set): how many SYN-ACKs its prefix could get before the segment, of its
// burst, at now.
func (tr SynTrace) AnswersLeft(now uint64) (avail, burst float64) {
	t, tau := tr.Service.AnsT, tr.Service.AnsTau
	if tr.AnswerKey == nil || t == 0 {
		return 0, 0
	}
	burst = float64(tau/t + 1)
	switch {
	case !tr.AnswerExists || tr.AnswerTAT <= now:
		return burst, burst
	case tr.AnswerTAT-now <= tau:
		return float64((tau-(tr.AnswerTAT-now))/t + 1), burst
	}
	return 0, burst
}

// AnswerPrefix is the source prefix of the answer budget looked at.
func (tr SynTrace) AnswerPrefix() netip.Prefix {
	if tr.AnswerKey == nil {
		return netip.Prefix{}
	}
	a := netip.AddrFrom16(tr.AnswerKey.Addr)
	if a.Is4In6() {
		return netip.PrefixFrom(a.Unmap(), int(min(tr.Service.AnsLen4, 32)))
	}
	return netip.PrefixFrom(a, int(min(tr.Service.AnsLen6, 128)))
}
