package refmodel

import (
	"math"
	"net/netip"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// Standing table types, as bpf2go generated them.
type (
	// StandingKey keys the standing table (the address masked to /32 or /64).
	StandingKey = loader.LimiterEgStandingKey
	// StandingVal is one source's standing.
	StandingVal = loader.LimiterEgStandingVal
	// StandingCfg is a generation's standing settings.
	StandingCfg = loader.LimiterEgStandingCfg
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

// handshakeOnly is handshake_only: validated by a TCP handshake and
// nothing else, which ranks as new.
func handshakeOnly(e StandingVal) bool {
	return maps.Standing(e.Standing) == maps.StandingValidated && maps.StandingWhy(e.Why) == maps.WhyTCP
}

// knownStanding: the entry's standing is established, validated or
// penalised (the cases source_class ranks by).
func knownStanding(e StandingVal) bool {
	switch maps.Standing(e.Standing) {
	case maps.StandingEstablished, maps.StandingValidated, maps.StandingPenalised:
		return true
	}
	return false
}

// PersonalBudget is a privileged source's personal budget as the data
// plane computes it from its standing entry (personal_take): Rate is
// packets/s << RateShift, T and Tau the GCRA's emission interval and
// tolerance in ticks. Off: budgets are off (standing.personal_budget:
// off), the source is not metered.
type PersonalBudget struct {
	Off       bool
	Rate      uint64
	T, Tau    uint64
	BurstPkts float64 // the burst in packets (Tau/T)
}

// Personal is the personal budget of entry e under the standing settings
// cfg; vouched: known_good or validated (at least the default).
func Personal(cfg StandingCfg, e StandingVal, vouched bool) PersonalBudget {
	if cfg.Headroom16 == 0 {
		return PersonalBudget{Off: true}
	}
	rate := (uint64(e.Mean) * uint64(cfg.Headroom16)) >> 4
	if e.MeanW == 0 || (vouched && rate < uint64(cfg.DefaultRate)) {
		rate = uint64(cfg.DefaultRate)
	}
	rate = max(rate, 1)
	burst := min(max(uint64(e.Usual)*uint64(cfg.BurstSeconds), rate, 1<<maps.RateShift), 1<<28)
	const sec = uint64(1000000000) << maps.TickShift
	b := PersonalBudget{Rate: rate, T: (sec << maps.RateShift) / rate, Tau: burst * sec / rate}
	b.BurstPkts = float64(b.Tau) / float64(b.T)
	return b
}

// RatePerSecond is the budget's rate in packets per second.
func (b PersonalBudget) RatePerSecond() float64 {
	return float64(b.Rate) / float64(uint64(1)<<maps.RateShift)
}

// Take charges one packet at now (ticks) to a personal budget whose GCRA
// word is *tat: true within it (and charged), false over it.
func (b PersonalBudget) Take(tat *uint64, now uint64) bool {
	if b.Off {
		return true
	}
	next := max(*tat, now) + b.T
	if next-now > b.Tau {
		return false
	}
	*tat = next
	return true
}

// personalTake is personal_take.
func personalTake(cfg StandingCfg, e *StandingVal, now uint64, vouched bool) bool {
	return Personal(cfg, *e, vouched).Take(&e.BudgetTat, now)
}

// standingClass is the ranking source_class applies to a standing entry
// (ok: the source has one) and known_good, before the personal budget:
// the class, and whether the source is vouched for (known_good or
// validated: its budget is at least the default). A handshake alone
// ranks as new; a penalty that is over ranks as new.
func standingClass(cfg StandingCfg, e StandingVal, ok, knownGood bool, now uint64) (maps.Class, bool) {
	cls, vouched := maps.ClassNew, false
	if ok {
		switch maps.Standing(e.Standing) {
		case maps.StandingEstablished:
			cls = maps.ClassEstablished
		case maps.StandingValidated:
			if !handshakeOnly(e) {
				cls, vouched = maps.ClassValidated, true
			}
		case maps.StandingPenalised:
			cls = maps.ClassPenalised
			if now>>maps.TickShift-e.Since >= cfg.PenaltyNs {
				cls = maps.ClassNew
			}
		}
	}
	if cls == maps.ClassNew && knownGood {
		cls, vouched = maps.ClassEstablished, true
	}
	return cls, vouched
}

// NextCharge is what explain shows of a source's standing: the class its
// next packet would be charged as at now (ticks) if it met an aggregate's
// reserve band, its personal budget (metered: it has one that applies)
// and how full its burst would be with that packet (0 to 1; 1 when it is
// over: charged as new). Nothing is
// charged; the entry is read through the live state as the decision
// reads it.
func (m *Model) NextCharge(addr netip.Addr, now uint64) (cls maps.Class, b PersonalBudget, metered bool, inUse float64) {
	ss := srcState{now: now, addr: maps.Addr16(addr), v4: addr.Unmap().Is4()}
	k := ss.key()
	m.faultStanding(k)
	e, ok := m.standing[k]
	_, kg := m.knownGood.lookup(ss.addr)
	cls, vouched := standingClass(m.gen.standing, e, ok, kg, now)
	if !privileged(cls) || !ok {
		return cls, PersonalBudget{}, false, 0
	}
	b = Personal(m.gen.standing, e, vouched)
	if !b.Off && b.Tau > 0 {
		inUse = min(float64(max(e.BudgetTat, now)+b.T-now)/float64(b.Tau), 1)
	}
	if !b.Take(&e.BudgetTat, now) {
		cls = maps.ClassOverBudget
	}
	return cls, b, !b.Off, inUse
}

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
	k := ss.key()
	m.faultStanding(k)
	e, ok := m.standing[k]
	if ok {
		if !ss.counted {
			e.Pkts++
			ss.counted = true
			m.standing[k] = e
		}
		ss.jumped = e.Jumped != 0
		// A source with no history of its own (none, or a handshake's
		// validation only) starts its clean history again.
		if reset && (handshakeOnly(e) || !knownStanding(e)) {
			e.CleanSince = ss.now >> maps.TickShift
			m.standing[k] = e
		}
	}
	_, kg := m.knownGood.lookup(ss.addr)
	cls, vouched := standingClass(m.gen.standing, e, ok, kg, ss.now)
	if privileged(cls) && ok {
		if !personalTake(m.gen.standing, &e, ss.now, vouched) {
			cls = maps.ClassOverBudget
		}
		m.standing[k] = e
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
			cls := m.class(ss, false)
			if cls == maps.ClassPenalised {
				// Penalised last: refused, the charge given back.
				if c.PktT != 0 {
					b.PktTat -= c.PktT
				}
				if c.ByteT != 0 {
					b.ByteTat -= maps.ByteCost(c, ss.len)
				}
				ss.refusedAgg, ss.refusedOutcome = agg, maps.OutcomeRefusedReserve
				return false
			}
			o := maps.OutcomeAdmitted
			if band {
				o = maps.OutcomeAdmittedReserve
			}
			m.countClass(0, agg, cls, o, ss.len)
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
	if !ss.counted {
		e.Pkts++
		ss.counted = true
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
	case maps.StandingNew, maps.StandingValidated:
		if !handshakeOnly(e) && maps.Standing(e.Standing) != maps.StandingNew {
			break
		}
		switch {
		case ss.congested:
			e.CleanSince = ns
			if maps.Standing(e.Standing) == maps.StandingNew {
				e.Why = uint8(maps.WhyCongested)
			}
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
		if ns-e.RateAt < 1<<seenEpochShift {
			return
		}
		dt := (ns - e.RateAt) / 1000000
		d := src
		if src >= e.SrcMark {
			d = src - e.SrcMark
		}
		cur := (uint64(d+(e.Pkts-e.PktsMark)) << maps.RateShift) * 1000 / dt
		cur = min(cur, math.MaxUint32)
		usual := uint64(e.Usual)
		step := uint64(hl) * (1000000 / 16)
		if e.Jumped != 0 || ss.congested || ns < e.UsualAt {
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
		if !jump && e.Jumped == 0 && e.Held == 0 {
			usual = max(usual, uint64(e.Current))
		}
		if !jump {
			e.Usual = uint32(usual)
		}
		if !ss.congested && !jump {
			w := uint64(e.MeanW)
			dt = min(dt, uint64(hl))
			e.Mean = uint32((uint64(e.Mean)*w + cur*dt) / (w + dt))
			e.MeanW = uint32(min(w+dt, uint64(hl)))
		}
		e.Jumped, e.Held = 0, 0
		if jump {
			e.Jumped = 1
		}
		if ss.congested {
			e.Held = 1
		}
		e.Current = uint32(cur)
	}
	if e.RateAt == 0 {
		e.UsualAt = ns
	}
	e.RateAt, e.SrcMark, e.PktsMark = ns, src, e.Pkts
}

// SetStanding is maps.StandingStore.SetWhy at time nowNS.
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
