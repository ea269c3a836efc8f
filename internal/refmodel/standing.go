package refmodel

import (
	"math"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// Standing table types, as bpf2go generated them.
type (
	// StandingKey keys the standing table (the address masked to /32 or /64).
	StandingKey = loader.LimiterEgStandingKey
	// StandingVal is one source's standing.
	StandingVal = loader.LimiterEgStandingVal
)

// Touch states of srcState (EG_TOUCH_* in the C).
const (
	touchUnknown = iota
	touchFirst
	touchNo
)

// srcState mirrors struct src_state: what the standing functions know of
// the packet's source.
type srcState struct {
	now            uint64
	addr           [16]byte
	len            uint32
	v4             bool
	looked         bool
	cls            maps.Class
	congested      bool
	refusedAgg     maps.ClassAgg
	refusedOutcome maps.Outcome // 0: not refused by an aggregate
	refusedReason  maps.Reason  // refused_reason: an override's, 0: none
	touched        int
	// The usual rate's (EG_SS_* bits of looked in the C): the rule's
	// per-source key is the standing key; the packet is counted; its
	// entry says jumped.
	ruleID                  uint32
	srckey, counted, jumped bool
}

func reserveCut(tau uint64, r uint16) uint64 {
	return (tau>>16)*uint64(r) + ((tau&0xffff)*uint64(r))>>16
}

func withReserve(c maps.BucketCfg, r uint16) maps.BucketCfg {
	c.PktTau -= reserveCut(c.PktTau, r)
	c.ByteTau -= reserveCut(c.ByteTau, r)
	return c
}

func privileged(c maps.Class) bool { return c == maps.ClassEstablished || c == maps.ClassValidated }

func (ss *srcState) key() StandingKey {
	n := 64
	if ss.v4 {
		n = 128
	}
	return StandingKey{Addr: maskAddr(ss.addr, n)}
}

// class is source_class.
func (m *Model) class(ss *srcState, reset bool) maps.Class {
	if ss.looked {
		return ss.cls
	}
	ss.looked = true
	cls := maps.ClassNew
	k := ss.key()
	m.faultStanding(k)
	if e, ok := m.standing[k]; ok {
		if !ss.counted {
			e.Pkts++
			ss.counted = true
			m.standing[k] = e
		}
		ss.jumped = e.Jumped != 0
		switch maps.Standing(e.Standing) {
		case maps.StandingEstablished:
			cls = maps.ClassEstablished
		case maps.StandingValidated:
			cls = maps.ClassValidated
		case maps.StandingPenalised:
			cls = maps.ClassPenalised
			if ss.now>>maps.TickShift-e.Since >= m.gen.standing.PenaltyNs {
				cls = maps.ClassNew
			}
		default:
			if reset {
				e.CleanSince = ss.now >> maps.TickShift
				m.standing[k] = e
			}
		}
	}
	if cls == maps.ClassNew {
		if _, ok := m.knownGood.lookup(ss.addr); ok {
			cls = maps.ClassEstablished
		}
	}
	ss.cls = cls
	m.traceClass(cls, ss.jumped)
	return cls
}

func (m *Model) countClass(dry int, agg maps.ClassAgg, cls maps.Class, o maps.Outcome, n uint32) {
	c := &m.classes[dry][agg][cls][o]
	c.Packets++
	c.Bytes += uint64(n)
}

// aggPeek is eg_agg_peek.
func (m *Model) aggPeek(b Bucket, c maps.BucketCfg, reserve uint16, agg maps.ClassAgg, ss *srcState) bool {
	if !wouldAdmit(b, c, ss.now, ss.len) {
		ss.congested, ss.refusedAgg, ss.refusedOutcome = true, agg, maps.OutcomeRefusedFull
		return false
	}
	if reserve != 0 && !wouldAdmit(b, withReserve(c, reserve), ss.now, ss.len) {
		ss.congested = true
		if !privileged(m.class(ss, true)) {
			ss.refusedAgg, ss.refusedOutcome = agg, maps.OutcomeRefusedReserve
			return false
		}
	}
	return true
}

func congestedAfter(b Bucket, c maps.BucketCfg, now uint64, reserve uint16) bool {
	n := withReserve(c, reserve)
	if c.PktT != 0 && b.PktTat > now && b.PktTat-now > n.PktTau/2 {
		return true
	}
	return c.ByteT != 0 && b.ByteTat > now && b.ByteTat-now > n.ByteTau/2
}

// aggTake is eg_agg_take.
func (m *Model) aggTake(b *Bucket, c maps.BucketCfg, reserve uint16, agg maps.ClassAgg, ss *srcState) bool {
	r, band := reserve, false
	if reserve != 0 && !wouldAdmit(*b, withReserve(c, reserve), ss.now, ss.len) {
		ss.congested, band = true, true
		if !privileged(m.class(ss, true)) {
			ss.refusedAgg, ss.refusedOutcome = agg, maps.OutcomeRefusedFull
			if wouldAdmit(*b, c, ss.now, ss.len) {
				ss.refusedOutcome = maps.OutcomeRefusedReserve
			}
			return false
		}
		r = 0
	}
	if !take(b, withReserve(c, r), ss.now, ss.len) {
		ss.congested, ss.refusedAgg, ss.refusedOutcome = true, agg, maps.OutcomeRefusedFull
		return false
	}
	if band || congestedAfter(*b, c, ss.now, reserve) {
		ss.congested = true
		if reserve != 0 {
			o := maps.OutcomeAdmitted
			if band {
				o = maps.OutcomeAdmittedReserve
			}
			m.countClass(0, agg, m.class(ss, false), o, ss.len)
		}
	}
	return true
}

// standingTouch is standing_touch: the first packet of the address in this
// epoch under the salt's keys, marking it.
func (m *Model) standingTouch(ss *srcState, salt uint32) bool {
	n := 64
	if ss.v4 {
		n = 128
	}
	k := SrcKey{RuleId: salt, Addr: maskAddr(ss.addr, n)}
	h := keyHash(srcKeyBytes(k))
	idx := (h >> 6) & m.seenMask
	epoch := ((ss.now >> maps.TickShift) >> seenEpochShift) & 0xff
	bit := uint64(1)<<(uint64(h&63)%seenBits) | uint64(1)<<(uint64((h*0x9e3779b1)>>26)%seenBits)
	mask := uint64(1)<<seenBits - 1
	m.faultSeen(idx)
	old := m.seen[idx]
	tag := old >> (2 * seenBits)
	var cur, prev uint64
	switch {
	case tag == epoch:
		cur, prev = (old>>seenBits)&mask, old&mask
	case (tag+1)&0xff == epoch:
		prev = (old >> seenBits) & mask
	}
	if cur&bit == bit {
		return false
	}
	m.seen[idx] = epoch<<(2*seenBits) | (cur|bit)<<seenBits | prev
	return true
}

func setStanding(e *StandingVal, st maps.Standing, why maps.StandingWhy, ns uint64) {
	e.Standing, e.Why, e.Since, e.CleanSince = uint8(st), uint8(why), ns, ns
}

// standingUpdate is eg_standing_update, as a program on the test clock
// runs it (every refusal by the own limit is looked at), for packets that
// belong to no TCP connection of the host: the model has no sockets, so it
// never validates by handshake (the differential test's frames name none).
func (m *Model) standingUpdate(ss *srcState, ownLimit bool) {
	if !ownLimit && ss.touched == touchNo {
		return
	}
	salt := uint32(0xfffffffd)
	if ownLimit {
		salt = 0xfffffffc
	}
	if (ownLimit || ss.touched != touchFirst) && !m.standingTouch(ss, salt) {
		return
	}
	cfg := m.gen.standing
	if cfg.EstablishedAfterNs == 0 {
		return
	}
	ns := ss.now >> maps.TickShift
	k := ss.key()
	m.faultStanding(k)
	e, ok := m.standing[k]
	if ownLimit {
		if !ok {
			return
		}
		if maps.Standing(e.Standing) != maps.StandingPenalised {
			setStanding(&e, maps.StandingPenalised, maps.WhyOwnLimit, ns)
			m.events.Penalised++
		} else {
			e.Since = ns
		}
		e.LastSeen = ns
		m.standing[k] = e
		return
	}
	if !ok {
		m.standing[k] = StandingVal{Since: ns, CleanSince: ns, LastSeen: ns, Why: uint8(maps.WhyFirstSeen)}
		m.events.Created++
		return
	}
	m.foldRate(&e, ss, ns)
	switch maps.Standing(e.Standing) {
	case maps.StandingPenalised:
		if ns-e.Since < cfg.PenaltyNs {
			e.LastSeen = ns
			m.standing[k] = e
			return
		}
		setStanding(&e, maps.StandingNew, maps.WhyDecayed, ns)
	case maps.StandingNew:
		switch {
		case ss.congested:
			e.CleanSince, e.Why = ns, uint8(maps.WhyCongested)
		case ns-e.LastSeen > cfg.EstablishedAfterNs:
			e.CleanSince = ns
		case ns-e.CleanSince >= cfg.EstablishedAfterNs:
			setStanding(&e, maps.StandingEstablished, maps.WhyClean, ns)
			m.events.Established++
		}
	}
	e.LastSeen = ns
	m.standing[k] = e
}

// foldRate is fold_rate: the source's rate since the last measurement
// (its bucket's count and its standing lookups' count), folded into its
// usual rate (a decayed peak, in whole steps of half-life/16), and the
// jump rule.
func (m *Model) foldRate(e *StandingVal, ss *srcState, ns uint64) {
	cfg := m.gen.standing
	hl := cfg.RateHalfLifeMs
	if hl == 0 || !ss.srckey {
		return
	}
	n := 64
	if ss.v4 {
		n = 128
	}
	sk := SrcKey{RuleId: ss.ruleID, Addr: maskAddr(ss.addr, n)}
	m.faultSrc(sk)
	src := m.srcPkts[sk]
	if e.RateAt != 0 && ns > e.RateAt {
		dt := (ns - e.RateAt) / 1000000
		if dt == 0 {
			return
		}
		d := src
		if src >= e.SrcMark {
			d = src - e.SrcMark
		}
		cur := (uint64(d+(e.Pkts-e.PktsMark)) << maps.RateShift) * 1000 / dt
		cur = min(cur, math.MaxUint32)
		usual := uint64(e.Usual)
		step := uint64(hl) * (1000000 / 16)
		if e.Jumped != 0 || ns < e.UsualAt {
			e.UsualAt = ns
		} else {
			k := (ns - e.UsualAt) / step
			e.UsualAt += k * step
			if k >= 32*16 {
				usual = 0
			} else {
				usual >>= k / 16
			}
			for range k % 16 {
				usual = (usual * 62757) >> 16
			}
		}
		st := maps.Standing(e.Standing)
		jump := cfg.JumpFactor16 != 0 && (st == maps.StandingEstablished || st == maps.StandingValidated) &&
			cur > uint64(cfg.JumpMin) && cur<<4 > uint64(cfg.JumpFactor16)*usual
		if jump && e.Jumped == 0 && st == maps.StandingEstablished {
			m.events.Jumped++
		}
		if !jump && e.Jumped == 0 {
			usual = max(usual, uint64(e.Current))
		}
		if !jump {
			e.Usual = uint32(usual)
		}
		e.Jumped = 0
		if jump {
			e.Jumped = 1
		}
		e.Current = uint32(cur)
	}
	if e.RateAt == 0 {
		e.UsualAt = ns
	}
	e.RateAt, e.SrcMark, e.PktsMark = ns, src, e.Pkts
}

// SetStanding is maps.Maps.SetStandingWhy at time nowNS.
func (m *Model) SetStanding(k StandingKey, s maps.Standing, why maps.StandingWhy, nowNS uint64) {
	m.standing[k] = StandingVal{Since: nowNS, CleanSince: nowNS, LastSeen: nowNS, Standing: uint8(s), Why: uint8(why)}
}

// Standing returns the standing table.
func (m *Model) Standing() map[StandingKey]StandingVal {
	out := make(map[StandingKey]StandingVal, len(m.standing))
	for k, v := range m.standing {
		out[k] = v
	}
	return out
}

// ClassCounters returns the class counters.
func (m *Model) ClassCounters() maps.ClassCounters { return m.classes }

// StandingCounts returns the standing table's event counters (Full is
// always 0: the model's table is unbounded).
func (m *Model) StandingCounts() maps.StandingCounts { return m.events }
