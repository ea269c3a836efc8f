package maps

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// Standing is what the data plane knows of a source address
// (docs/operations.md, "Standing"): new, established, validated or
// penalised. Established and validated sources may use an aggregate's whole
// burst tolerance; new and penalised ones all of it but the reserve.
type Standing = loader.LimiterEgStanding

// Standings.
const (
	StandingNew         = loader.LimiterEgStandingEG_STANDING_NEW
	StandingEstablished = loader.LimiterEgStandingEG_STANDING_ESTABLISHED
	StandingValidated   = loader.LimiterEgStandingEG_STANDING_VALIDATED
	StandingPenalised   = loader.LimiterEgStandingEG_STANDING_PENALISED
	numStandings        = int(loader.LimiterEgStandingEG_STANDING_MAX)
)

// StandingName is the display and metric label of a standing.
func StandingName(s Standing) string {
	if int(s) < len(loader.LimiterEgStandingNames) {
		return loader.LimiterEgStandingNames[s]
	}
	return fmt.Sprintf("standing_%d", s)
}

// StandingWhy says why a source's standing last changed.
type StandingWhy = loader.LimiterEgStandingWhy

// Reasons for a standing change.
const (
	WhyNone      = loader.LimiterEgStandingWhyEG_WHY_NONE
	WhyFirstSeen = loader.LimiterEgStandingWhyEG_WHY_FIRST_SEEN
	WhyClean     = loader.LimiterEgStandingWhyEG_WHY_CLEAN_HISTORY
	WhyOwnLimit  = loader.LimiterEgStandingWhyEG_WHY_OWN_LIMIT
	WhyDeny      = loader.LimiterEgStandingWhyEG_WHY_DENY_LIST
	WhyDecayed   = loader.LimiterEgStandingWhyEG_WHY_PENALTY_OVER
	WhyImport    = loader.LimiterEgStandingWhyEG_WHY_KNOWN_GOOD
	WhyL7        = loader.LimiterEgStandingWhyEG_WHY_L7PROMOTION
	WhyCongested = loader.LimiterEgStandingWhyEG_WHY_CONGESTED
	WhySet       = loader.LimiterEgStandingWhyEG_WHY_SET
	WhyTCP       = loader.LimiterEgStandingWhyEG_WHY_TCP_HANDSHAKE
)

// StandingWhyName is the display label of a standing change reason.
func StandingWhyName(w StandingWhy) string {
	if int(w) < len(loader.LimiterEgStandingWhyNames) {
		return loader.LimiterEgStandingWhyNames[w]
	}
	return fmt.Sprintf("why_%d", w)
}

// StandingEntry is one source's standing. Times are CLOCK_MONOTONIC ns as
// the data plane keeps them; Since is the same instant on the wall clock.
type StandingEntry struct {
	// Addr is the key: the IPv4 address, or the IPv6 address masked to /64.
	Addr     netip.Addr
	Standing Standing
	// Why is the last change's reason (WhyNone for a source the table
	// does not hold: it is new).
	Why StandingWhy
	// Tracked is false when the table holds no entry for the address.
	Tracked bool
	// KnownGood is set when the address is in standing.known_good and has
	// no entry of its own: the data plane treats it as established.
	KnownGood bool
	Since     time.Time
	SinceNS   uint64
	// CleanSinceNS starts the clean history of a new source (its
	// established_after runs from here).
	CleanSinceNS uint64
	LastSeenNS   uint64
	// UsualRate and CurrentRate are the source's usual rate (a decayed
	// peak) and its last measured one, packets per second (to 1/16);
	// RateAtNS is when it was measured, 0: never (docs/operations.md,
	// "Usual rate"). Jumped: current > jump_factor × usual.
	UsualRate, CurrentRate float64
	RateAtNS               uint64
	RateAge                time.Duration // how long ago RateAtNS was
	Jumped                 bool
	// MeanRate is the mean rate the personal budget is headroom × of
	// (packets/s, to 1/16; docs/operations.md "Personal budget").
	MeanRate float64
	// Raw is the entry as the data plane holds it (zero when untracked):
	// internal/refmodel computes the personal budget, its use and the
	// class of the next packet from it (refmodel.Personal, Model.NextCharge).
	Raw loader.LimiterEgStandingVal
}

// StandingKey is the standing table's key of an address: an IPv4 address
// as itself (IPv4-mapped), an IPv6 address masked to its /64, since one
// host owns a whole /64.
func StandingKey(a netip.Addr) loader.LimiterEgStandingKey {
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		a = p.Addr()
	}
	return loader.LimiterEgStandingKey{Addr: Addr16(a)}
}

func standingAddr(k loader.LimiterEgStandingKey) netip.Addr {
	return netip.AddrFrom16(k.Addr).Unmap()
}

// MonoNow reads CLOCK_MONOTONIC, the clock of the data plane's expiry and
// standing times, in nanoseconds.
func MonoNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read monotonic clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

func (m *StandingStore) entry(k loader.LimiterEgStandingKey, v loader.LimiterEgStandingVal, mono uint64, wall time.Time) StandingEntry {
	e := StandingEntry{
		Addr: standingAddr(k), Standing: Standing(v.Standing), Why: StandingWhy(v.Why), Tracked: true,
		SinceNS: v.Since, CleanSinceNS: v.CleanSince, LastSeenNS: v.LastSeen,
		UsualRate: float64(v.Usual) / (1 << RateShift), CurrentRate: float64(v.Current) / (1 << RateShift),
		RateAtNS: v.RateAt, Jumped: v.Jumped != 0, MeanRate: float64(v.Mean) / (1 << RateShift), Raw: v,
	}
	if v.RateAt != 0 && v.RateAt <= mono {
		e.RateAge = time.Duration(mono - v.RateAt)
	}
	if v.Since <= mono {
		e.Since = wall.Add(-time.Duration(mono - v.Since))
	} else {
		e.Since = wall // a test clock ahead of the kernel's
	}
	return e
}

// LookupStanding returns an address's standing. An address the table does
// not hold is new (Tracked false), or established when it is covered by
// standing.known_good (KnownGood true).
func (m *StandingStore) Lookup(a netip.Addr) (StandingEntry, error) {
	if !a.IsValid() {
		return StandingEntry{}, fmt.Errorf("lookup standing: invalid address")
	}
	k := StandingKey(a)
	var v loader.LimiterEgStandingVal
	err := m.o.Standing.Lookup(k, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		e := StandingEntry{Addr: standingAddr(k), Standing: StandingNew}
		var one uint32
		lk := loader.LimiterEgLpmKey{Prefixlen: 128, Addr: k.Addr}
		if err := m.o.KnownGood.Lookup(lk, &one); err == nil {
			e.Standing, e.Why, e.KnownGood = StandingEstablished, WhyImport, true
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return StandingEntry{}, fmt.Errorf("lookup known_good %s: %w", a, err)
		}
		return e, nil
	}
	if err != nil {
		return StandingEntry{}, fmt.Errorf("lookup standing %s: %w", a, err)
	}
	mono, err := MonoNow()
	if err != nil {
		return StandingEntry{}, err
	}
	return m.entry(k, v, mono, time.Now()), nil
}

// defaultWhy is the reason SetStanding records for a standing.
func defaultWhy(s Standing) StandingWhy {
	switch s {
	case StandingValidated:
		return WhyL7
	case StandingEstablished:
		return WhyImport
	}
	return WhySet
}

// SetStanding sets an address's standing now (an import, an L7 promotion to
// validated, an operator's decision). The recorded reason is l7_promotion
// for validated, known_good for established, set otherwise; SetStandingWhy
// names it. It fails when the table is full.
func (m *StandingStore) Set(a netip.Addr, s Standing) error {
	return m.SetWhy(a, s, defaultWhy(s))
}

// SetStandingWhy is SetStanding with the reason to record.
func (m *StandingStore) SetWhy(a netip.Addr, s Standing, why StandingWhy) error {
	if !a.IsValid() {
		return fmt.Errorf("set standing: invalid address")
	}
	if int(s) >= numStandings {
		return fmt.Errorf("set standing of %s: unknown standing %d", a, s)
	}
	if why >= loader.LimiterEgStandingWhyEG_WHY_MAX {
		return fmt.Errorf("set standing of %s: unknown reason %d", a, why)
	}
	now, err := m.clockNS()
	if err != nil {
		return err
	}
	v := loader.LimiterEgStandingVal{Since: now, CleanSince: now, LastSeen: now, Standing: uint8(s), Why: uint8(why)}
	if err := m.o.Standing.Put(StandingKey(a), v); err != nil {
		if errors.Is(err, unix.E2BIG) {
			return fmt.Errorf("set standing of %s: standing table full (%d entries): raise tables.standing_entries: %w",
				a, m.o.Standing.MaxEntries(), err)
		}
		return fmt.Errorf("set standing of %s: %w", a, err)
	}
	return nil
}

// DeleteStanding forgets an address: it is new again.
func (m *StandingStore) Delete(a netip.Addr) error {
	if err := m.o.Standing.Delete(StandingKey(a)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete standing of %s: %w", a, err)
	}
	return nil
}

// Standings returns every entry of the standing table (a batch read: call it
// from a background loop, not per request).
func (m *StandingStore) All() ([]StandingEntry, error) {
	mono, err := MonoNow()
	if err != nil {
		return nil, err
	}
	wall := time.Now()
	const chunk = 4096
	keys := make([]loader.LimiterEgStandingKey, chunk)
	vals := make([]loader.LimiterEgStandingVal, chunk)
	var cursor ebpf.MapBatchCursor
	var out []StandingEntry
	for {
		n, err := m.o.Standing.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			out = append(out, m.entry(keys[i], vals[i], mono, wall))
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) || (err == nil && n == 0) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("read standing table: %w", err)
		}
	}
}

// clockNS is the data plane's notion of now: the test clock when the
// program reads one, else CLOCK_MONOTONIC.
func (m *core) clockNS() (uint64, error) {
	if m.d.TestClock() {
		var ns uint64
		if err := m.o.TestClock.Lookup(uint32(0), &ns); err != nil {
			return 0, fmt.Errorf("read test clock: %w", err)
		}
		return ns, nil
	}
	return MonoNow()
}

// StandingConfig is a generation's standing rules as the data plane holds
// them (known_good is a table of its own, see Stage).
func StandingConfig(s policy.Standing) loader.LimiterEgStandingCfg {
	c := loader.LimiterEgStandingCfg{EstablishedAfterNs: uint64(max(s.EstablishedAfter, 0)), PenaltyNs: uint64(max(s.Penalty, 0))}
	if s.RateHistory > 0 {
		c.RateHalfLifeMs = uint32(min(s.RateHistory.Milliseconds(), math.MaxUint32))
		c.JumpFactor16 = uint32(math.Round(s.JumpFactor * 16)) // 0: jumps off
		c.JumpMin = uint32(min(s.JumpMin.PerSecond()*(1<<RateShift), math.MaxUint32))
	}
	if s.PersonalHeadroom > 0 {
		c.Headroom16 = uint32(math.Round(s.PersonalHeadroom * 16))
		c.DefaultRate = uint32(max(min(s.PersonalDefault.PerSecond()*(1<<RateShift), math.MaxUint32), 1))
		c.BurstSeconds = s.PersonalBurstSeconds
	}
	return c
}

// setKnownGood makes the known_good trie hold exactly want; new entries are
// written first, stale ones deleted last.
func (m *StandingStore) setKnownGood(want []netip.Prefix) error {
	if uint32(len(want)) > m.o.KnownGood.MaxEntries() {
		return fmt.Errorf("standing.known_good has %d prefixes, the table holds %d", len(want), m.o.KnownGood.MaxEntries())
	}
	keep := make(map[loader.LimiterEgLpmKey]bool, len(want))
	for _, p := range want {
		if !p.IsValid() {
			return fmt.Errorf("standing.known_good: invalid prefix")
		}
		k := LPMKey(p)
		keep[k] = true
		if err := m.o.KnownGood.Put(k, uint32(1)); err != nil {
			return fmt.Errorf("write known_good %s: %w", p, err)
		}
	}
	var k loader.LimiterEgLpmKey
	var v uint32
	var stale []loader.LimiterEgLpmKey
	it := m.o.KnownGood.Iterate()
	for it.Next(&k, &v) {
		if !keep[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list known_good: %w", err)
	}
	for _, k := range stale {
		if err := m.o.KnownGood.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete known_good %s: %w", PrefixFromKey(k), err)
		}
	}
	return nil
}

// StandingCounts are the standing table's event counters.
type StandingCounts struct {
	Created, Full, Established, Penalised uint64
	// Validated counts validations by a completed TCP handshake.
	Validated uint64
	// Jumped counts established sources whose rate jumped (each jump once):
	// they are charged as new inside aggregates the shield tightened.
	Jumped uint64
}

// StandingCounts reads the standing table's event counters, summed over
// CPUs.
func (m *StandingStore) Counts() (StandingCounts, error) {
	ncpu, err := possibleCPUs()
	if err != nil {
		return StandingCounts{}, err
	}
	var out [loader.LimiterEgStandingEventEG_SE_MAX]uint64
	for i := range out {
		vals := make([]uint64, ncpu)
		if err := m.o.StandingStats.Lookup(uint32(i), &vals); err != nil {
			return StandingCounts{}, fmt.Errorf("read standing counters: %w", err)
		}
		for _, v := range vals {
			out[i] += v
		}
	}
	return StandingCounts{
		Created: out[loader.LimiterEgStandingEventEG_SE_CREATED], Full: out[loader.LimiterEgStandingEventEG_SE_FULL],
		Established: out[loader.LimiterEgStandingEventEG_SE_ESTABLISHED], Penalised: out[loader.LimiterEgStandingEventEG_SE_PENALISED],
		Validated: out[loader.LimiterEgStandingEventEG_SE_VALIDATED], Jumped: out[loader.LimiterEgStandingEventEG_SE_JUMPED],
	}, nil
}

// Class is a source's admission class at an aggregate bucket: its standing,
// or ClassUnknown for a packet admitted below the reserve band without a
// standing lookup.
type Class = loader.LimiterEgClass

// Classes.
const (
	ClassNew         = loader.LimiterEgClassEG_CLASS_NEW
	ClassEstablished = loader.LimiterEgClassEG_CLASS_ESTABLISHED
	ClassValidated   = loader.LimiterEgClassEG_CLASS_VALIDATED
	ClassPenalised   = loader.LimiterEgClassEG_CLASS_PENALISED
	ClassOverBudget  = loader.LimiterEgClassEG_CLASS_OVER_BUDGET
	ClassUnknown     = loader.LimiterEgClassEG_CLASS_UNKNOWN
	numClasses       = int(loader.LimiterEgClassEG_CLASS_MAX)
)

// ClassName is the metric label of a class.
func ClassName(c Class) string {
	if int(c) < len(loader.LimiterEgClassNames) {
		return loader.LimiterEgClassNames[c]
	}
	return fmt.Sprintf("class_%d", c)
}

// ClassAgg names the aggregates the class counters are kept for.
type ClassAgg = loader.LimiterEgClassAgg

// Class counter aggregates.
const (
	ClassAggPrefix = loader.LimiterEgClassAggEG_CAGG_PREFIX
	ClassAggASN    = loader.LimiterEgClassAggEG_CAGG_ASN
	ClassAggGlobal = loader.LimiterEgClassAggEG_CAGG_GLOBAL
	numClassAggs   = int(loader.LimiterEgClassAggEG_CAGG_MAX)
)

// ClassAggName is the metric label of a class counter aggregate.
func ClassAggName(a ClassAgg) string {
	if int(a) < len(loader.LimiterEgClassAggNames) {
		return loader.LimiterEgClassAggNames[a]
	}
	return fmt.Sprintf("aggregate_%d", a)
}

// Outcome is what happened to a packet at a congested aggregate.
type Outcome = loader.LimiterEgClassOutcome

// Outcomes.
const (
	OutcomeAdmitted        = loader.LimiterEgClassOutcomeEG_CO_ADMITTED
	OutcomeAdmittedReserve = loader.LimiterEgClassOutcomeEG_CO_ADMITTED_RESERVE
	OutcomeRefusedReserve  = loader.LimiterEgClassOutcomeEG_CO_REFUSED_RESERVE
	OutcomeRefusedFull     = loader.LimiterEgClassOutcomeEG_CO_REFUSED_FULL
	numOutcomes            = int(loader.LimiterEgClassOutcomeEG_CO_MAX)
)

// OutcomeName is the metric label of an outcome.
func OutcomeName(o Outcome) string {
	if int(o) < len(loader.LimiterEgClassOutcomeNames) {
		return loader.LimiterEgClassOutcomeNames[o]
	}
	return fmt.Sprintf("outcome_%d", o)
}

// ClassCounters count packets at congested aggregates by mode (0 enforce,
// 1 dry-run: refusals there are "would drop"), aggregate, class and outcome.
type ClassCounters [2][numClassAggs][numClasses][numOutcomes]Counter

// ClassCounters reads the class counters summed over CPUs.
func (m *StandingStore) ClassCounters() (ClassCounters, error) {
	var out ClassCounters
	ncpu, err := possibleCPUs()
	if err != nil {
		return out, err
	}
	n := int(m.o.ClassStats.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]loader.LimiterEgCounter, n*ncpu)
	var cursor ebpf.MapBatchCursor
	got, err := m.o.ClassStats.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return out, fmt.Errorf("read class counters: %w", err)
	}
	for i := 0; i < got; i++ {
		idx := int(keys[i])
		o := idx % numOutcomes
		idx /= numOutcomes
		c := idx % numClasses
		idx /= numClasses
		a := idx % numClassAggs
		dry := idx / numClassAggs
		if dry > 1 {
			continue
		}
		for _, v := range vals[i*ncpu : (i+1)*ncpu] {
			out[dry][a][c][o].Packets += v.Packets
			out[dry][a][c][o].Bytes += v.Bytes
		}
	}
	return out, nil
}
