package maps

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// Probe is the packet a Path is computed for: its source, and the
// protocol, ports and length the L4 rules and byte limits look at. Proto
// 0 is a packet the L4 rules never match.
type Probe struct {
	Addr         netip.Addr
	Proto        uint8
	SPort, DPort uint16 // ICMP: DPort is the type, as the data plane reads it
	Len          uint32 // frame length in bytes; 0 means 64
}

// Path is what the data plane would do with the probe's packet, read from
// the live maps, step by step in the order of bpf/xdp_limiter.c: lists,
// prefix facts, L4 override, rule, then each bucket. It changes nothing:
// no bucket is charged, no entry created.
type Path struct {
	Gen uint32 // the live generation
	// NowNS is CLOCK_MONOTONIC when the maps were read.
	NowNS uint64
	// List is the most specific lists-trie entry covering the address.
	List *ListEntry
	// Fact is the most specific prefix fact of the live generation (its
	// RuleID is the rule's table slot); nil: none, the default rule.
	Fact *policy.PrefixFact
	// L4 is the L4 rules entry that replaced the prefix fact's rule for
	// this probe (its RuleID is the slot), nil: none did.
	L4 *L4Match
	// Slot and RuleID name the rule the packet is charged to; NoRule when
	// the slot holds no valid rule (the packet passes as no_policy).
	Slot, RuleID uint32
	NoRule       bool
	Action       RuleAction
	// Mode is the rule's mode (ModeInherit: the generation's GlobalMode).
	Mode, GlobalMode Mode
	// Buckets on the packet's path in the order the data plane charges
	// them: per source, prefix aggregate, ASN aggregate, global. Only the
	// limited ones are listed.
	Buckets []PathBucket
	// Standing is the source's standing as the aggregates see it (a
	// penalty that is over reads as new); Privileged is set when it may
	// use the aggregates' reserve (established or validated). Read only
	// for rules with buckets.
	Standing   StandingEntry
	Privileged bool
	// Verdict and Reason are what the next packet gets (ReasonOK: passed
	// by every bucket).
	Verdict Action
	Reason  Reason
}

// BucketKind names a bucket on a packet's path.
type BucketKind string

// Bucket kinds, as `edgectl explain` prints them.
const (
	BucketSource BucketKind = "per_source"
	BucketPrefix BucketKind = "per_prefix"
	BucketASN    BucketKind = "per_asn"
	BucketGlobal BucketKind = "global"
)

// PathBucket is one bucket on the path and how full it is.
type PathBucket struct {
	Kind BucketKind
	// Key is the source masked to the rule's key length (per_source,
	// derived per_prefix); Whole is set for a rule-wide aggregate; ASN for
	// per_asn.
	Key   netip.Prefix
	Whole bool
	ASN   uint32
	// Exists is false when the table holds no entry for the key: the
	// data plane creates it full on the first admitted packet.
	Exists bool
	// Packets and Bytes are the two dimensions (Limited false: none).
	Packets, Bytes BucketLevel
	// Admits says whether the next probe packet fits; ReserveRefuses that
	// it would fit the whole tolerance but the source may not use the
	// reserve band it is in.
	Admits         bool
	ReserveRefuses bool
}

// BucketLevel is one dimension of a GCRA bucket, in events (packets or
// bytes): Burst is the tolerance, Available what a burst could take now.
// Both are exact to one tick (1/16 ns) of the emission interval.
type BucketLevel struct {
	Limited          bool
	Burst, Available float64
	// Reserve is the part of Burst only established and validated
	// sources may use (aggregates with a reserve): new and penalised ones
	// find Available - Reserve.
	Reserve float64
}

// explainMonoNS is CLOCK_MONOTONIC in ns, the data plane's clock (a
// coarse-clock generation reads it as of the last tick: a few ms behind).
func explainMonoNS() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read monotonic clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// ExplainPath computes the probe's path (see Path). Test-clock programs
// are read against the kernel's clock.
func (m *Maps) ExplainPath(p Probe) (Path, error) {
	if !p.Addr.IsValid() {
		return Path{}, errors.New("explain: invalid address")
	}
	if p.Len == 0 {
		p.Len = 64
	}
	addr := p.Addr.Unmap()
	gen, err := m.ActiveGen()
	if err != nil {
		return Path{}, err
	}
	ns, err := explainMonoNS()
	if err != nil {
		return Path{}, err
	}
	out := Path{Gen: gen, NowNS: ns, Verdict: ActPass, Reason: ReasonOK}
	now := ns << TickShift
	var cfg loader.LimiterEgConfig
	if err := m.o.Configs.Lookup(gen, &cfg); err != nil {
		return out, fmt.Errorf("read settings of generation %d: %w", gen, err)
	}
	if cfg.Valid == 0 {
		out.NoRule, out.Reason = true, ReasonNoPolicy
		return out, nil
	}
	out.GlobalMode = Mode(cfg.Mode)
	key := loader.LimiterEgLpmKey{Prefixlen: 128, Addr: Addr16(addr)}

	// 1. Lists: the most specific entry answers deny, then allow.
	var lv loader.LimiterEgListVal
	if err := m.o.Lists.Lookup(key, &lv); err == nil {
		e, err := m.listEntryCovering(addr, lv)
		if err != nil {
			return out, err
		}
		out.List = &e
		if lv.DenyUntil > ns {
			return out.drop(ReasonDeny, nil, cfg), nil
		}
		if lv.AllowUntil > ns {
			out.Reason = ReasonAllow
			return out, nil
		}
	} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return out, fmt.Errorf("look up lists: %w", err)
	}

	// 2. Prefix facts (the trie holds what the IPv4 direct table holds).
	var pv loader.LimiterEgPrefixVal
	found, err := m.lookupFact(gen, key, &pv)
	if err != nil {
		return out, err
	}
	if found {
		out.Fact = &policy.PrefixFact{RuleID: pv.RuleId, ASN: pv.Asn, Country: [2]byte{byte(pv.Country >> 8), byte(pv.Country)}}
		out.Slot = pv.RuleId
	}

	// 3. L4 rules.
	if bit := L4Bit(p.Proto); bit != 0 && cfg.L4Protos&bit != 0 {
		if l4, ok, err := m.l4Lookup(uint8(gen), p); err != nil {
			return out, err
		} else if ok {
			out.Slot, out.L4 = l4.RuleID, &l4
		}
	}

	maxRules := m.d.Sizes.MaxRules
	var rule loader.LimiterEgRule
	if out.Slot >= maxRules {
		out.NoRule, out.Reason = true, ReasonNoPolicy
		return out, nil
	}
	if err := m.o.Rules.Lookup(gen*maxRules+out.Slot, &rule); err != nil {
		return out, fmt.Errorf("read rule slot %d: %w", out.Slot, err)
	}
	if rule.Valid == 0 {
		out.NoRule, out.Reason = true, ReasonNoPolicy
		return out, nil
	}
	out.RuleID, out.Action, out.Mode = rule.Id, RuleAction(rule.Action), Mode(rule.Mode)
	switch out.Action {
	case RulePass:
		out.Reason = ReasonRulePass
		return out, nil
	case RuleDrop:
		return out.drop(ReasonRuleDrop, &rule, cfg), nil
	}

	// 4. Buckets, in charge order.
	v4 := addr.Is4()
	var asn uint32
	if out.Fact != nil {
		asn = out.Fact.ASN
	}
	if out.Standing, err = m.LookupStanding(addr); err != nil {
		return out, err
	}
	switch out.Standing.Standing {
	case StandingEstablished:
		out.Privileged = true
	case StandingValidated:
		// Validated by a TCP handshake only ranks as new
		// (docs/operations.md, "Class ranking").
		out.Privileged = out.Standing.Why != WhyTCP
	case StandingPenalised:
		var sc loader.LimiterEgStandingCfg
		if err := m.o.StandingCfg.Lookup(gen, &sc); err != nil {
			return out, fmt.Errorf("read standing settings of generation %d: %w", gen, err)
		}
		if ns-out.Standing.SinceNS >= sc.PenaltyNs {
			out.Standing.Standing = StandingNew // the data plane reads an ended penalty as new
		}
	}
	type step struct {
		b       PathBucket
		cfg     loader.LimiterEgBucketCfg
		reason  Reason
		reserve uint16
		read    func(*loader.LimiterEgBucket) (bool, error)
	}
	var steps []step
	if bucketLimited(rule.Src) {
		bits := int(min(rule.SrcLen6, 128))
		if v4 {
			bits = int(min(rule.SrcLen4, 32))
		}
		pfx, _ := addr.Prefix(bits)
		k := loader.LimiterEgSrcKey{RuleId: rule.Id, Addr: LPMKey(pfx).Addr}
		steps = append(steps, step{PathBucket{Kind: BucketSource, Key: pfx}, rule.Src, ReasonSrcLimit, 0,
			func(b *loader.LimiterEgBucket) (bool, error) {
				var sb loader.LimiterEgSrcBucket
				err := m.o.SrcBuckets.Lookup(k, &sb)
				if errors.Is(err, ebpf.ErrKeyNotExist) {
					*b = loader.LimiterEgBucket{}
					return false, nil
				}
				*b = sb.B
				return err == nil, err
			}})
	}
	if AggMode(rule.AggMode) != AggNone && bucketLimited(rule.Agg) {
		if AggMode(rule.AggMode) == AggDerived {
			bits := int(min(rule.AggLen6, 128))
			if v4 {
				bits = int(min(rule.AggLen4, 32))
			}
			pfx, _ := addr.Prefix(bits)
			lk := LPMKey(pfx)
			k := loader.LimiterEgAggKey{RuleId: rule.Id, Kind: uint8(loader.LimiterEgAggKindEG_AGG_KIND_PREFIX),
				Len: uint8(lk.Prefixlen), Addr: lk.Addr}
			steps = append(steps, step{PathBucket{Kind: BucketPrefix, Key: pfx}, rule.Agg, ReasonPrefixLimit, rule.Reserve,
				func(b *loader.LimiterEgBucket) (bool, error) { return lookupBucket(m.o.AggBuckets, k, b) }})
		} else {
			slot := out.Slot
			steps = append(steps, step{PathBucket{Kind: BucketPrefix, Whole: true}, rule.Agg, ReasonPrefixLimit, rule.Reserve,
				func(b *loader.LimiterEgBucket) (bool, error) { return lookupBucket(m.o.WholeBuckets, slot, b) }})
		}
	}
	if asn != 0 && bucketLimited(rule.Asn) {
		k := loader.LimiterEgAggKey{RuleId: rule.Id, Kind: uint8(loader.LimiterEgAggKindEG_AGG_KIND_ASN), Asn: asn}
		steps = append(steps, step{PathBucket{Kind: BucketASN, ASN: asn}, rule.Asn, ReasonASNLimit, rule.Reserve,
			func(b *loader.LimiterEgBucket) (bool, error) { return lookupBucket(m.o.AggBuckets, k, b) }})
	}
	if bucketLimited(cfg.Global) {
		slot := uint32(loader.LimiterEgGlobalSlotEG_GLOBAL_BUCKET)
		steps = append(steps, step{PathBucket{Kind: BucketGlobal}, cfg.Global, ReasonGlobalLimit, cfg.Reserve,
			func(b *loader.LimiterEgBucket) (bool, error) { return lookupBucket(m.o.GlobalBuckets, slot, b) }})
	}
	// The data plane first peeks at the aggregates (global, ASN, prefix)
	// and drops at the first empty one without touching per-source state;
	// only then does it charge, per source first.
	refusedBy := map[BucketKind]Reason{}
	for _, s := range steps {
		var b loader.LimiterEgBucket
		exists, err := s.read(&b)
		if err != nil {
			return out, fmt.Errorf("read %s bucket: %w", s.b.Kind, err)
		}
		s.b.Exists = exists
		s.b.Packets = level(b.PktTat, now, s.cfg.PktT, s.cfg.PktTau, 1)
		s.b.Bytes = level(b.ByteTat, now, s.cfg.ByteT, s.cfg.ByteTau, 1<<ByteShift)
		fits := func(cut func(uint64) uint64) bool {
			return (s.cfg.PktT == 0 || GCRA{TAT: b.PktTat}.WouldAdmit(now, s.cfg.PktT, s.cfg.PktTau-cut(s.cfg.PktTau))) &&
				(s.cfg.ByteT == 0 || GCRA{TAT: b.ByteTat}.WouldAdmit(now, ByteCost(s.cfg, p.Len), s.cfg.ByteTau-cut(s.cfg.ByteTau)))
		}
		s.b.Admits = fits(func(uint64) uint64 { return 0 })
		if s.reserve != 0 {
			cut := func(tau uint64) uint64 { return reserveCut(tau, s.reserve) }
			if s.b.Packets.Limited {
				s.b.Packets.Reserve = float64(cut(s.cfg.PktTau)) / float64(s.cfg.PktT)
			}
			if s.b.Bytes.Limited {
				s.b.Bytes.Reserve = float64(cut(s.cfg.ByteTau)) / float64(s.cfg.ByteT) * (1 << ByteShift)
			}
			if s.b.Admits && !out.Privileged && !fits(cut) {
				s.b.Admits, s.b.ReserveRefuses = false, true
			}
		}
		if !s.b.Admits {
			refusedBy[s.b.Kind] = s.reason
		}
		out.Buckets = append(out.Buckets, s.b)
	}
	for _, k := range []BucketKind{BucketGlobal, BucketASN, BucketPrefix, BucketSource} {
		if r, ok := refusedBy[k]; ok {
			return out.drop(r, &rule, cfg), nil
		}
	}
	return out, nil
}

// drop sets a drop verdict, or would-drop where the rule's or the
// generation's mode is dry-run (the deny list obeys the global mode only,
// as in the data plane).
func (p Path) drop(r Reason, rule *loader.LimiterEgRule, cfg loader.LimiterEgConfig) Path {
	p.Verdict, p.Reason = ActDrop, r
	dry := Mode(cfg.Mode) == ModeDryRun
	if r != ReasonDeny && rule != nil && Mode(rule.Mode) != ModeInherit {
		dry = Mode(rule.Mode) == ModeDryRun
	}
	if dry {
		p.Verdict = ActWouldDrop
	}
	return p
}

func bucketLimited(c loader.LimiterEgBucketCfg) bool { return c.PktT != 0 || c.ByteT != 0 }

// reserveCut is the data plane's reserve_cut: tau × reserve / 65536,
// without overflow.
func reserveCut(tau uint64, reserve uint16) uint64 {
	return (tau>>16)*uint64(reserve) + ((tau&0xffff)*uint64(reserve))>>16
}

// level reads a GCRA dimension: tolerance tau and debt max(tat-now, 0),
// both in ticks, as events of t ticks (bytes: t per 2^ByteShift bytes).
func level(tat, now, t, tau uint64, scale float64) BucketLevel {
	if t == 0 {
		return BucketLevel{}
	}
	debt := uint64(0)
	if tat > now {
		debt = tat - now
	}
	l := BucketLevel{Limited: true, Burst: float64(tau) / float64(t) * scale}
	if debt < tau {
		l.Available = float64(tau-debt) / float64(t) * scale
	}
	return l
}

func lookupBucket[K any](mp *ebpf.Map, k K, b *loader.LimiterEgBucket) (bool, error) {
	err := mp.Lookup(k, b)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		*b = loader.LimiterEgBucket{}
		return false, nil
	}
	return err == nil, err
}

// lookupFact looks the address up in the generation's prefix trie.
func (m *Maps) lookupFact(gen uint32, key loader.LimiterEgLpmKey, pv *loader.LimiterEgPrefixVal) (bool, error) {
	var id uint32
	if err := m.o.PrefixGens.Lookup(gen, &id); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("read prefix trie of generation %d: %w", gen, err)
	}
	trie, err := ebpf.NewMapFromID(ebpf.MapID(id))
	if err != nil {
		return false, fmt.Errorf("open prefix trie of generation %d: %w", gen, err)
	}
	defer trie.Close()
	if err := trie.Lookup(key, pv); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("look up prefix facts: %w", err)
	}
	return true, nil
}

// L4Match is an L4 rules entry as the data plane holds it: RuleID is the
// rule's table slot.
type L4Match struct {
	Proto  uint8
	Dir    L4Dir
	Port   uint16
	RuleID uint32
}

// l4Lookup is the data plane's l4_rule: source port, then destination
// port, then the protocol alone.
func (m *Maps) l4Lookup(gen uint8, p Probe) (L4Match, bool, error) {
	keys := []loader.LimiterEgL4Key{
		{Gen: gen, Proto: p.Proto, Dir: uint8(L4Src), Port: p.SPort},
		{Gen: gen, Proto: p.Proto, Dir: uint8(L4Dst), Port: p.DPort},
		{Gen: gen, Proto: p.Proto, Dir: uint8(L4Any)},
	}
	for _, k := range keys {
		var slot uint32
		err := m.o.L4Rules.Lookup(k, &slot)
		if err == nil {
			return L4Match{Proto: k.Proto, Dir: L4Dir(k.Dir), Port: k.Port, RuleID: slot}, true, nil
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return L4Match{}, false, fmt.Errorf("look up l4 rules: %w", err)
		}
	}
	return L4Match{}, false, nil
}

// listEntryCovering finds which entry of the lists trie a lookup matched:
// the most specific one containing addr with the value the trie returned.
func (m *Maps) listEntryCovering(addr netip.Addr, v loader.LimiterEgListVal) (ListEntry, error) {
	all, err := m.Lists()
	if err != nil {
		return ListEntry{}, err
	}
	best := ListEntry{Prefix: netip.PrefixFrom(addr, addr.BitLen()), DenyUntil: v.DenyUntil, AllowUntil: v.AllowUntil,
		Origin: Origin(v.Origin)}
	bestBits := -1
	for _, e := range all {
		if e.Prefix.Contains(addr) && e.Prefix.Bits() > bestBits {
			best, bestBits = e, e.Prefix.Bits()
		}
	}
	return best, nil
}
