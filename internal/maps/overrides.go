package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// AggKind is the kind of an aggregate (enum eg_agg_kind).
type AggKind = loader.LimiterEgAggKind

// Aggregate kinds.
const (
	AggKindPrefix = loader.LimiterEgAggKindEG_AGG_KIND_PREFIX // a derived prefix aggregate: rule + masked source
	AggKindASN    = loader.LimiterEgAggKindEG_AGG_KIND_ASN    // rule + ASN
	AggKindWhole  = loader.LimiterEgAggKindEG_AGG_KIND_WHOLE  // a rule's whole aggregate
	AggKindGlobal = loader.LimiterEgAggKindEG_AGG_KIND_GLOBAL // the global bucket
)

// More origins (list entries, overrides, fingerprints).
const (
	OriginShield = loader.LimiterEgOriginEG_ORIGIN_SHIELD
	OriginFleet  = loader.LimiterEgOriginEG_ORIGIN_FLEET
)

// Aggregate names one aggregate instance: a rule's derived prefix (Prefix,
// masked to the rule's aggregate length), a rule's ASN, a rule's whole
// aggregate, or the global bucket (RuleID 0).
type Aggregate struct {
	RuleID uint32       // policy rule id (0 with Kind global)
	Kind   AggKind      // prefix | asn | whole | global
	Prefix netip.Prefix // the aggregate's masked prefix (Kind prefix)
	ASN    uint32       // Kind asn
}

// String is "rule 3 asn 64500", "rule 2 prefix 198.18.4.0/24", "rule 2
// whole" or "global".
func (a Aggregate) String() string {
	switch a.Kind {
	case AggKindPrefix:
		return fmt.Sprintf("rule %d prefix %s", a.RuleID, a.Prefix)
	case AggKindASN:
		return fmt.Sprintf("rule %d asn %d", a.RuleID, a.ASN)
	case AggKindWhole:
		return fmt.Sprintf("rule %d whole", a.RuleID)
	case AggKindGlobal:
		return "global"
	}
	return fmt.Sprintf("rule %d kind %d", a.RuleID, a.Kind)
}

// ParseAggregate reads an aggregate as Aggregate.String writes it.
func ParseAggregate(s string) (Aggregate, error) {
	f := strings.Fields(s)
	bad := fmt.Errorf("aggregate %q: use 'rule N prefix CIDR', 'rule N asn N', 'rule N whole' or 'global'", s)
	if len(f) == 1 && f[0] == "global" {
		return Aggregate{Kind: AggKindGlobal}, nil
	}
	if len(f) < 3 || f[0] != "rule" {
		return Aggregate{}, bad
	}
	id, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil {
		return Aggregate{}, bad
	}
	a := Aggregate{RuleID: uint32(id)}
	switch {
	case len(f) == 3 && f[2] == "whole":
		a.Kind = AggKindWhole
	case len(f) == 4 && f[2] == "asn":
		n, err := strconv.ParseUint(f[3], 10, 32)
		if err != nil {
			return Aggregate{}, bad
		}
		a.Kind, a.ASN = AggKindASN, uint32(n)
	case len(f) == 4 && f[2] == "prefix":
		p, err := netip.ParsePrefix(f[3])
		if err != nil {
			return Aggregate{}, bad
		}
		a.Kind, a.Prefix = AggKindPrefix, p.Masked()
	default:
		return Aggregate{}, bad
	}
	return a, nil
}

// key is the data plane's key of a, checked for form only (see checkRule
// for the rule's side).
func (a Aggregate) key() (loader.LimiterEgAggKey, error) {
	k := loader.LimiterEgAggKey{RuleId: a.RuleID, Kind: uint8(a.Kind)}
	switch a.Kind {
	case AggKindPrefix:
		if !a.Prefix.IsValid() {
			return k, fmt.Errorf("%v: no prefix", a)
		}
		if a.Prefix.Addr().Is4In6() {
			return k, fmt.Errorf("%v: write an IPv4 prefix as IPv4", a)
		}
		lk := LPMKey(a.Prefix)
		k.Len = uint8(lk.Prefixlen)
		k.Addr = lk.Addr
	case AggKindASN:
		if a.ASN == 0 {
			return k, fmt.Errorf("%v: asn 0 is no aggregate", a)
		}
		k.Asn = a.ASN
	case AggKindWhole:
	case AggKindGlobal:
		if a.RuleID != 0 {
			return k, fmt.Errorf("global aggregate with rule %d: the global bucket has no rule", a.RuleID)
		}
	default:
		return k, fmt.Errorf("aggregate kind %d unknown", a.Kind)
	}
	return k, nil
}

func aggregateFromKey(k loader.LimiterEgAggKey) Aggregate {
	a := Aggregate{RuleID: k.RuleId, Kind: AggKind(k.Kind)}
	switch a.Kind {
	case AggKindPrefix:
		a.Prefix = PrefixFromKey(loader.LimiterEgLpmKey{Prefixlen: uint32(k.Len), Addr: k.Addr})
	case AggKindASN:
		a.ASN = k.Asn
	}
	return a
}

// checkRule says whether a rule (as compiled: its aggregate mode and
// lengths, and which of its aggregates have a budget) has the aggregate a
// with a budget to override: a prefix aggregate needs a derived rule of
// the prefix's length, a whole one a whole rule. Overrides change budgets
// the policy has; they do not add limits where it has none.
func (a Aggregate) checkRule(mode AggMode, len4, len6 uint8, aggLimited, asnLimited bool) error {
	switch a.Kind {
	case AggKindPrefix:
		if mode != AggDerived {
			return fmt.Errorf("%v: the rule has no derived prefix aggregate", a)
		}
		want := len6
		if a.Prefix.Addr().Is4() {
			want = len4
		}
		if a.Prefix.Bits() != int(want) {
			return fmt.Errorf("%v: the rule's aggregates are /%d", a, want)
		}
		if !aggLimited {
			return fmt.Errorf("%v: the rule's prefix aggregates have no budget", a)
		}
	case AggKindWhole:
		if mode != AggWhole {
			return fmt.Errorf("%v: the rule has no whole aggregate", a)
		}
		if !aggLimited {
			return fmt.Errorf("%v: the rule's whole aggregate has no budget", a)
		}
	case AggKindASN:
		if !asnLimited {
			return fmt.Errorf("%v: the rule's ASN aggregates have no budget", a)
		}
	}
	return nil
}

// rateCfg is the data plane's packet-bucket parameters for r
// (BucketConfig's rounding).
func rateCfg(r Rate) (BucketCfg, error) {
	return BucketConfig(policy.Bucket{Packets: policy.Limit{Rate: policy.Rate{Count: r.Count, Per: r.Per}, Burst: r.Burst}})
}

// Override is what the shield or fleet mode decided for one aggregate since
// the policy was applied. It lives in a pinned hash map with expiry (a
// crash leaves it in force until Expires) and is written directly, with no
// generation swap. Overrides survive a policy swap unless the aggregate's
// rule is gone, or no longer has that aggregate (Apply deletes those).
type Override struct {
	Aggregate Aggregate
	// Budget and Bytes replace the aggregate's budget for all classes (a
	// fleet share): Budget its packet dimension, Bytes its byte dimension
	// (Count bytes per Per, Burst bytes). Its reserve share stays the
	// rule's. With either set they replace the whole budget: a dimension
	// left zero is not limited while the override is in force, so give
	// both when the rule has both. Both zero: unchanged.
	Budget Rate
	Bytes  Rate
	// NewBudget is an extra bucket only new and penalised sources are
	// charged against (shield tighten), in addition to the aggregate's;
	// established and validated sources are not charged by it. Zero
	// Count: none.
	NewBudget Rate
	// Expires is wall-clock time; the data plane stores CLOCK_MONOTONIC
	// ns, so a change of the wall clock after SetOverride does not move
	// it. On a write it is the expiry of the parts written; read back, the
	// latest of the parts' expiries (Parts has each).
	Expires time.Time
	// Origin is the writer. Read back, the origin of the budget part if
	// there is one, else of the new-source part (Parts has each).
	Origin Origin
	// Parts is read back only: the parts in force, the budget part first.
	Parts []OverridePart
}

// An override of one aggregate is composed of two parts, each with its own
// writer (origin) and expiry: the budget part (Budget, Bytes: fleet
// mode's share) and the new-source part (NewBudget and its bucket's
// state: the shield's tighten). A write sets the parts it carries and
// keeps the other; DeleteOverride deletes the parts of one origin. So
// fleet mode and the shield acting on one aggregate do not erase each
// other.
//
// The value holds each part's expiry (expires: the budget part's,
// new_expires: the new-source part's; 0: no such part) and origin, and the
// data plane honours each part until its own expiry: once the earlier part
// has expired the other applies alone, with no write in between. The next
// write of the aggregate or the next PruneOverrides (the daemon's runs
// every 10 s) clears the expired part, and deletes the entry once both are
// gone. A process that opens the pins afresh (a restart) reads both parts
// from the value.

// OverridePart is one part of an override as read back.
type OverridePart struct {
	NewSource bool // the new-source part (NewBudget); false: the budget part (Budget, Bytes)
	Origin    Origin
	Expires   time.Time
}

// ovrPart is one part's writer and expiry (CLOCK_MONOTONIC ns; 0: no
// such part).
type ovrPart struct {
	origin  Origin
	expires uint64
}

// ovrParts are the two parts of one override as this process wrote them.
type ovrParts struct{ budget, fresh ovrPart }

// The value's origin field packs the parts' origins: the budget part's in
// bits 0-7, the new-source part's in bits 8-15.
func packOrigins(p ovrParts, hasBudget, hasNew bool) uint32 {
	var v uint32
	if hasBudget {
		v |= uint32(p.budget.origin) & 0xff
	}
	if hasNew {
		v |= (uint32(p.fresh.origin) & 0xff) << 8
	}
	return v
}

// partsOf is the parts of a value: each part's expiry and packed origin.
// A part with no budget is absent, whatever its expiry field says.
func partsOf(v loader.LimiterEgOverride) ovrParts {
	hasB, hasN := bucketLimited(v.Budget), bucketLimited(v.NewBudget)
	bo, no := Origin(v.Origin&0xff), Origin(v.Origin>>8&0xff)
	var p ovrParts
	if hasB && v.Expires != 0 {
		p.budget = ovrPart{origin: bo, expires: v.Expires}
	}
	if hasN && v.NewExpires != 0 {
		p.fresh = ovrPart{origin: no, expires: v.NewExpires}
	}
	return p
}

// expired says whether a part of p has expired at ns (it is cleared by
// the next write or prune).
func (p ovrParts) expired(ns uint64) bool {
	return (p.budget.expires != 0 && p.budget.expires <= ns) || (p.fresh.expires != 0 && p.fresh.expires <= ns)
}

// expire drops the parts expired at ns.
func (p ovrParts) expire(ns uint64) ovrParts {
	if p.budget.expires <= ns {
		p.budget = ovrPart{}
	}
	if p.fresh.expires <= ns {
		p.fresh = ovrPart{}
	}
	return p
}

// compose is the value of parts p: the budget part's fields from b, the
// new-source part's (and its bucket state) from n, each with its own
// expiry.
func compose(p ovrParts, b, n loader.LimiterEgOverride) (loader.LimiterEgOverride, bool) {
	var v loader.LimiterEgOverride
	hasB, hasN := p.budget.expires != 0, p.fresh.expires != 0
	if hasB {
		v.Budget = b.Budget
		v.Expires = p.budget.expires
	}
	if hasN {
		v.NewBudget, v.NewBucket = n.NewBudget, n.NewBucket
		v.NewExpires = p.fresh.expires
	}
	v.Origin = packOrigins(p, hasB, hasN)
	return v, hasB || hasN
}

// ErrOverridesFull means the overrides table has no room for another
// aggregate.
var ErrOverridesFull = errors.New("overrides table full")

// ErrUnknownRule means an aggregate names a rule the live policy does not
// have.
var ErrUnknownRule = errors.New("rule not in the live policy")

// overrideLock serializes this process's writers of overrides, watches and
// the gate words derived from them (read-modify-write of agg_gate). The
// daemon is the one writer; edgectl goes through it.
type overrideLock struct {
	mu sync.Mutex
	// owners are who asked for each watch (WatchAggregates): a watch goes
	// when its last owner lets it go, or its rule goes. Guarded by mu.
	owners map[Watch]map[Origin]bool
}

// Watch names the watched aggregates of one (rule, kind): RuleID 0 with
// AggKindGlobal for the global bucket.
type Watch struct {
	RuleID uint32
	Kind   AggKind
}

// liveRules is what override writers need of the live generation: rule id
// -> slot, and each slot's compiled rule.
type liveRules struct {
	slots         map[uint32]uint32
	rules         map[uint32]loader.LimiterEgRule // by id
	globalLimited bool
}

func (m *core) liveRules() (liveRules, error) {
	gen, err := m.activeGen()
	if err != nil {
		return liveRules{}, err
	}
	maxRules := m.d.Sizes.MaxRules
	n := int(m.o.Rules.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]loader.LimiterEgRule, n)
	var cursor ebpf.MapBatchCursor
	got, err := m.o.Rules.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return liveRules{}, fmt.Errorf("read rules of generation %d: %w", gen, err)
	}
	var cfg loader.LimiterEgConfig
	if err := m.o.Configs.Lookup(gen, &cfg); err != nil {
		return liveRules{}, fmt.Errorf("read settings of generation %d: %w", gen, err)
	}
	lr := liveRules{slots: map[uint32]uint32{}, rules: map[uint32]loader.LimiterEgRule{}, globalLimited: bucketLimited(cfg.Global)}
	for i := 0; i < got; i++ {
		if keys[i]/maxRules == gen && vals[i].Valid != 0 {
			lr.slots[vals[i].Id] = keys[i] % maxRules
			lr.rules[vals[i].Id] = vals[i]
		}
	}
	return lr, nil
}

// check validates a against the live rules and returns its key.
func (lr liveRules) check(a Aggregate) (loader.LimiterEgAggKey, error) {
	k, err := a.key()
	if err != nil {
		return k, err
	}
	if a.Kind == AggKindGlobal {
		if !lr.globalLimited {
			return k, fmt.Errorf("global: the policy has no global budget")
		}
		return k, nil
	}
	r, ok := lr.rules[a.RuleID]
	if !ok {
		return k, fmt.Errorf("%v: %w", a, ErrUnknownRule)
	}
	return k, a.checkRule(AggMode(r.AggMode), r.AggLen4, r.AggLen6, bucketLimited(r.Agg), bucketLimited(r.Asn))
}

// monoOffset converts between wall-clock times and the data plane's clock.
type monoOffset struct {
	wall time.Time
	mono uint64
}

func (m *core) monoNow() (monoOffset, error) {
	ns, err := m.clockNS()
	if err != nil {
		return monoOffset{}, err
	}
	return monoOffset{wall: time.Now(), mono: ns}, nil
}

func (c monoOffset) toMono(t time.Time) (uint64, bool) {
	d := t.Sub(c.wall)
	if d <= 0 {
		return 0, false
	}
	return c.mono + uint64(d), true
}

func (c monoOffset) toWall(ns uint64) time.Time {
	if ns >= c.mono {
		return c.wall.Add(time.Duration(ns - c.mono))
	}
	return c.wall.Add(-time.Duration(c.mono - ns))
}

// SetOverride installs or replaces the override of o.Aggregate.
func (m *OverrideStore) Set(o Override) error { return m.SetMany([]Override{o}) }

// SetOverrides installs or replaces several overrides with one read of the
// live rules (fleet mode sets a share per aggregate each interval). A
// replaced override keeps its new-source bucket's state when it keeps a
// new-source budget. On error, the overrides before the failing one are in
// force.
func (m *OverrideStore) SetMany(list []Override) error {
	m.ovr.mu.Lock()
	defer m.ovr.mu.Unlock()
	lr, err := m.liveRules()
	if err != nil {
		return err
	}
	clock, err := m.monoNow()
	if err != nil {
		return err
	}
	gate, err := m.readGate()
	if err != nil {
		return err
	}
	changed := false
	for _, o := range list {
		k, err := lr.check(o.Aggregate)
		if err != nil {
			return err
		}
		v, err := o.compile(clock)
		if err != nil {
			return err
		}
		// The parts o does not carry stay as they are (unless
		// expired); a new-source part keeps its bucket's state when its
		// budget is unchanged.
		var old loader.LimiterEgOverride
		var parts ovrParts
		if err := m.o.Overrides.Lookup(k, &old); err == nil {
			parts = partsOf(old).expire(clock.mono)
		}
		b, n := old, old
		if bucketLimited(v.Budget) {
			parts.budget = ovrPart{origin: o.Origin, expires: v.Expires}
			b = v
		}
		if bucketLimited(v.NewBudget) {
			parts.fresh = ovrPart{origin: o.Origin, expires: v.Expires}
			n = v
			if old.NewBudget == v.NewBudget {
				n.NewBucket = old.NewBucket
			}
		}
		v, _ = compose(parts, b, n)
		if err := m.o.Overrides.Put(k, v); err != nil {
			if isFull(err) {
				return fmt.Errorf("override %v: %w (%d entries)", o.Aggregate, ErrOverridesFull, m.o.Overrides.MaxEntries())
			}
			return fmt.Errorf("write override %v: %w", o.Aggregate, err)
		}
		if gate.set(lr, o.Aggregate, 1<<uint32(o.Aggregate.Kind)) {
			changed = true
		}
	}
	if changed {
		return m.writeGate(gate)
	}
	return nil
}

func (o Override) compile(clock monoOffset) (loader.LimiterEgOverride, error) {
	var v loader.LimiterEgOverride
	if !o.Budget.Limited() && !o.Bytes.Limited() && !o.NewBudget.Limited() {
		return v, fmt.Errorf("override %v: neither a budget nor a new-source budget", o.Aggregate)
	}
	if o.Expires.IsZero() {
		return v, fmt.Errorf("override %v: no expiry", o.Aggregate)
	}
	exp, ok := clock.toMono(o.Expires)
	if !ok {
		return v, fmt.Errorf("override %v: expiry %v is past", o.Aggregate, o.Expires)
	}
	// Both parts carry the expiry; the caller keeps the parts o sets.
	v.Expires, v.NewExpires = exp, exp
	var err error
	if o.Budget.Limited() || o.Bytes.Limited() {
		var b policy.Bucket
		if o.Budget.Limited() {
			b.Packets = policy.Limit{Rate: policy.Rate{Count: o.Budget.Count, Per: o.Budget.Per}, Burst: o.Budget.Burst}
		}
		if o.Bytes.Limited() {
			b.Bytes = policy.Limit{Rate: policy.Rate{Count: o.Bytes.Count, Per: o.Bytes.Per}, Burst: o.Bytes.Burst}
		}
		if v.Budget, err = BucketConfig(b); err != nil {
			return v, fmt.Errorf("override %v budget: %w", o.Aggregate, err)
		}
	}
	if o.NewBudget.Limited() {
		if v.NewBudget, err = rateCfg(o.NewBudget); err != nil {
			return v, fmt.Errorf("override %v new-source budget: %w", o.Aggregate, err)
		}
	}
	return v, nil
}

// rateFromCfg is the inverse of Bucket.Cfg for a packet budget, per
// second: exact to the tick rounding of Cfg.
func rateFromCfg(c BucketCfg) Rate {
	if c.PktT == 0 {
		return Rate{}
	}
	perSec := float64(uint64(time.Second)<<TickShift) / float64(c.PktT)
	burst := (c.PktTau + c.PktT/2) / c.PktT
	return Rate{Count: uint64(perSec + 0.5), Per: time.Second, Burst: burst}
}

// isFull reports a hash map's "no room" error (E2BIG).
func isFull(err error) bool { return errors.Is(err, unix.E2BIG) }

// DeleteOverride removes the parts of a's override that origin wrote and
// keeps the others (no error if there are none).
func (m *OverrideStore) Delete(a Aggregate, origin Origin) error {
	k, err := a.key()
	if err != nil {
		return err
	}
	ns, err := m.clockNS()
	if err != nil {
		return err
	}
	m.ovr.mu.Lock()
	defer m.ovr.mu.Unlock()
	var old loader.LimiterEgOverride
	if err := m.o.Overrides.Lookup(k, &old); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("read override %v: %w", a, err)
	}
	parts := partsOf(old)
	if parts.budget.origin == origin {
		parts.budget = ovrPart{}
	}
	if parts.fresh.origin == origin {
		parts.fresh = ovrPart{}
	}
	parts = parts.expire(ns)
	if v, ok := compose(parts, old, old); ok {
		if err := m.o.Overrides.Put(k, v); err != nil {
			return fmt.Errorf("rewrite override %v without its %v part: %w", a, origin, err)
		}
		return nil
	}
	if err := m.o.Overrides.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete override %v: %w", a, err)
	}
	return m.rebuildGate()
}

type overrideEntry struct {
	k loader.LimiterEgAggKey
	v loader.LimiterEgOverride
}

func (m *OverrideStore) overrideEntries() ([]overrideEntry, error) {
	var out []overrideEntry
	var e overrideEntry
	it := m.o.Overrides.Iterate()
	for it.Next(&e.k, &e.v) {
		out = append(out, e)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read overrides: %w", err)
	}
	return out, nil
}

// Overrides returns the live overrides with their unexpired parts (an
// expired part is left out, and an override with none). Budgets read back are
// per second, exact to Bucket.Cfg's rounding of the emission interval.
func (m *OverrideStore) All() ([]Override, error) {
	entries, err := m.overrideEntries()
	if err != nil {
		return nil, err
	}
	clock, err := m.monoNow()
	if err != nil {
		return nil, err
	}
	out := make([]Override, 0, len(entries))
	for _, e := range entries {
		o := Override{Aggregate: aggregateFromKey(e.k)}
		p := partsOf(e.v).expire(clock.mono)
		if p.budget.expires != 0 {
			o.Budget = rateFromCfg(e.v.Budget)
			o.Parts = append(o.Parts, OverridePart{Origin: p.budget.origin, Expires: clock.toWall(p.budget.expires)})
		}
		if p.fresh.expires != 0 {
			o.NewBudget = rateFromCfg(e.v.NewBudget)
			o.Parts = append(o.Parts, OverridePart{NewSource: true, Origin: p.fresh.origin, Expires: clock.toWall(p.fresh.expires)})
		}
		if len(o.Parts) == 0 {
			continue
		}
		o.Origin = o.Parts[0].Origin
		o.Expires = o.Parts[0].Expires
		if len(o.Parts) == 2 && o.Parts[1].Expires.After(o.Expires) {
			o.Expires = o.Parts[1].Expires
		}
		if c := e.v.Budget; c.ByteT != 0 && p.budget.expires != 0 {
			// Bytes per second and the burst in bytes, exact to
			// BucketConfig's rounding.
			o.Bytes = Rate{Count: uint64(float64(uint64(time.Second)<<(TickShift+ByteShift))/float64(c.ByteT) + 0.5),
				Per: time.Second, Burst: uint64(float64(c.ByteTau)/float64(c.ByteT)*(1<<ByteShift) + 0.5)}
		}
		out = append(out, o)
	}
	return out, nil
}

// PruneOverrides clears the expired parts of overrides, deletes the
// overrides with no part left and returns how many it deleted. The data
// plane ignores expired parts already; this frees their entries and their
// gate bits.
func (m *OverrideStore) Prune() (int, error) {
	m.ovr.mu.Lock()
	defer m.ovr.mu.Unlock()
	entries, err := m.overrideEntries()
	if err != nil {
		return 0, err
	}
	ns, err := m.clockNS()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		parts := partsOf(e.v)
		if !parts.expired(ns) && (parts.budget.expires != 0 || parts.fresh.expires != 0) {
			continue
		}
		// A part expired: the survivor, if any, is written alone (the
		// data plane already honours it alone).
		parts = parts.expire(ns)
		if v, ok := compose(parts, e.v, e.v); ok {
			if err := m.o.Overrides.Put(e.k, v); err != nil {
				return n, fmt.Errorf("rewrite override %v without its expired part: %w", aggregateFromKey(e.k), err)
			}
			continue
		}
		if err := m.o.Overrides.Delete(e.k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("delete expired override %v: %w", aggregateFromKey(e.k), err)
		}
		n++
	}
	if n == 0 {
		return 0, nil
	}
	return n, m.rebuildGate()
}

// pruneOverridesFor is Apply's part: after the flip, overrides of rules
// that are gone, or that no longer have (a budget for) the aggregate they
// name, and watches of rules that are gone, are deleted, and the gate
// words are rebuilt for the new slots.
func (m *OverrideStore) pruneOverridesFor() error {
	m.ovr.mu.Lock()
	defer m.ovr.mu.Unlock()
	lr, err := m.liveRules()
	if err != nil {
		return err
	}
	entries, err := m.overrideEntries()
	if err != nil {
		return err
	}
	for _, e := range entries {
		a := aggregateFromKey(e.k)
		if _, err := lr.check(a); err == nil {
			continue
		}
		if err := m.o.Overrides.Delete(e.k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete override %v of a rule that is gone: %w", a, err)
		}
	}
	watches, err := m.watchKeys()
	if err != nil {
		return err
	}
	for _, w := range watches {
		if _, ok := lr.rules[w.RuleId]; !ok && AggKind(w.Kind) != AggKindGlobal {
			if err := m.unwatch(w); err != nil {
				return err
			}
		}
	}
	for w := range m.ovr.owners {
		if _, ok := lr.rules[w.RuleID]; !ok && w.Kind != AggKindGlobal {
			delete(m.ovr.owners, w) // the owners watch it again should the rule come back
		}
	}
	return m.rebuildGateWith(lr)
}

// gateWords is agg_gate as read: one word per rule slot.
type gateWords []uint32

func (m *OverrideStore) readGate() (gateWords, error) {
	n := m.d.Sizes.MaxRules
	keys := make([]uint32, n)
	vals := make([]uint32, n)
	var cursor ebpf.MapBatchCursor
	got, err := m.o.AggGate.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, fmt.Errorf("read override gate: %w", err)
	}
	g := make(gateWords, n)
	for i := 0; i < got; i++ {
		if keys[i] < n {
			g[keys[i]] = vals[i]
		}
	}
	return g, nil
}

func (m *OverrideStore) writeGate(g gateWords) error {
	keys := make([]uint32, len(g))
	for i := range keys {
		keys[i] = uint32(i)
	}
	if err := batchUpdate(m.o.AggGate, keys, []uint32(g)); err != nil {
		return fmt.Errorf("write override gate: %w", err)
	}
	return nil
}

// set ORs bits into the gate of a's rule (every slot for the global
// aggregate) and reports whether a word changed.
func (g gateWords) set(lr liveRules, a Aggregate, bits uint32) bool {
	changed := false
	if a.Kind == AggKindGlobal {
		for i := range g {
			if g[i]&bits != bits {
				g[i] |= bits
				changed = true
			}
		}
		return changed
	}
	slot, ok := lr.slots[a.RuleID]
	if !ok || int(slot) >= len(g) {
		return false
	}
	if g[slot]&bits != bits {
		g[slot] |= bits
		changed = true
	}
	return changed
}

const gateWatchShift = uint32(loader.LimiterEgGateEG_GATE_WATCH_SHIFT)

// rebuildGate recomputes every gate word from the overrides and watches
// tables and the live slots. Expired overrides keep their bit until they
// are pruned (the data plane checks the expiry).
func (m *OverrideStore) rebuildGate() error {
	lr, err := m.liveRules()
	if err != nil {
		return err
	}
	return m.rebuildGateWith(lr)
}

func (m *OverrideStore) rebuildGateWith(lr liveRules) error {
	g := make(gateWords, m.d.Sizes.MaxRules)
	entries, err := m.overrideEntries()
	if err != nil {
		return err
	}
	for _, e := range entries {
		g.set(lr, aggregateFromKey(e.k), 1<<uint32(e.k.Kind))
	}
	watches, err := m.watchKeys()
	if err != nil {
		return err
	}
	for _, w := range watches {
		g.set(lr, Aggregate{RuleID: w.RuleId, Kind: AggKind(w.Kind)}, 1<<(gateWatchShift+w.Kind))
	}
	return m.writeGate(g)
}

// Aggregate counters. The data plane counts, per CPU, every instance of a
// watched (rule, kind) pair: each packet of the rule that reaches the
// buckets counts once for each watched aggregate on its path, as passed or
// as dropped (refused by any bucket: per source, prefix, ASN, global;
// would-drops of dry-run rules included). Counts are exact; instances are
// created on their first packet in an LRU table (agg_stats), so when more
// instances are active than it holds, the least recently counted one is
// evicted and starts from zero if it comes back (readers take deltas and
// treat a decrease as a restart).

// AggregateCounters are one aggregate instance's counters.
type AggregateCounters struct {
	Aggregate Aggregate
	Passed    Counter
	Dropped   Counter
}

func (m *OverrideStore) watchKeys() ([]loader.LimiterEgWatchKey, error) {
	var out []loader.LimiterEgWatchKey
	var k loader.LimiterEgWatchKey
	var v uint32
	it := m.o.AggWatches.Iterate()
	for it.Next(&k, &v) {
		out = append(out, k)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read aggregate watches: %w", err)
	}
	return out, nil
}

// WatchAggregates makes the data plane count every instance of the rule's
// aggregates of one kind (rule 0 with AggKindGlobal for the global bucket)
// on behalf of owner (OriginShield, OriginFleet): the watch stays until
// every owner that asked for it let it go (UnwatchAggregates) or the rule
// leaves the live policy. Watching again is a no-op.
func (m *OverrideStore) Watch(ruleID uint32, kind AggKind, owner Origin) error {
	m.ovr.mu.Lock()
	defer m.ovr.mu.Unlock()
	lr, err := m.liveRules()
	if err != nil {
		return err
	}
	a := Aggregate{RuleID: ruleID, Kind: kind}
	switch kind {
	case AggKindGlobal:
		if ruleID != 0 {
			return fmt.Errorf("watch global aggregate of rule %d: the global bucket has no rule", ruleID)
		}
	case AggKindPrefix, AggKindASN, AggKindWhole:
		r, ok := lr.rules[ruleID]
		if !ok {
			return fmt.Errorf("watch %v: %w", a, ErrUnknownRule)
		}
		mode := AggMode(r.AggMode)
		if (kind == AggKindPrefix && mode != AggDerived) || (kind == AggKindWhole && mode != AggWhole) {
			return fmt.Errorf("watch %v: the rule has no such aggregate", a)
		}
	default:
		return fmt.Errorf("watch: aggregate kind %d unknown", kind)
	}
	if err := m.o.AggWatches.Put(loader.LimiterEgWatchKey{RuleId: ruleID, Kind: uint32(kind)}, uint32(1)); err != nil {
		return fmt.Errorf("watch %v: %w", a, err)
	}
	gate, err := m.readGate()
	if err != nil {
		return err
	}
	if gate.set(lr, a, 1<<(gateWatchShift+uint32(kind))) {
		if err := m.writeGate(gate); err != nil {
			return err
		}
	}
	w := Watch{RuleID: ruleID, Kind: kind}
	if m.ovr.owners == nil {
		m.ovr.owners = map[Watch]map[Origin]bool{}
	}
	if m.ovr.owners[w] == nil {
		m.ovr.owners[w] = map[Origin]bool{}
	}
	m.ovr.owners[w][owner] = true
	return nil
}

// UnwatchAggregates lets owner's watch of the rule's instances of kind
// go: when no other owner holds it, the data plane stops counting them and
// their counters are dropped. A watch nobody in this process asked for
// (left by an earlier daemon) goes at once.
func (m *OverrideStore) Unwatch(ruleID uint32, kind AggKind, owner Origin) error {
	m.ovr.mu.Lock()
	defer m.ovr.mu.Unlock()
	w := Watch{RuleID: ruleID, Kind: kind}
	if o := m.ovr.owners[w]; len(o) > 1 || (len(o) == 1 && !o[owner]) {
		delete(o, owner) // another owner keeps it
		return nil
	}
	if err := m.unwatch(loader.LimiterEgWatchKey{RuleId: ruleID, Kind: uint32(kind)}); err != nil {
		return err
	}
	delete(m.ovr.owners, w)
	return m.rebuildGate()
}

// WatchedBy is what owner watches now: what it asked for, less what went
// with its rule (a policy swap).
func (m *OverrideStore) WatchedBy(owner Origin) map[Watch]bool {
	m.ovr.mu.Lock()
	defer m.ovr.mu.Unlock()
	out := map[Watch]bool{}
	for w, o := range m.ovr.owners {
		if o[owner] {
			out[w] = true
		}
	}
	return out
}

func (m *OverrideStore) unwatch(w loader.LimiterEgWatchKey) error {
	if err := m.o.AggWatches.Delete(w); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unwatch rule %d kind %d: %w", w.RuleId, w.Kind, err)
	}
	var k loader.LimiterEgAggKey
	var stale []loader.LimiterEgAggKey
	it := m.o.AggStats.Iterate()
	var v []loader.LimiterEgAggStats
	for it.Next(&k, &v) {
		if k.RuleId == w.RuleId && uint32(k.Kind) == w.Kind {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read aggregate counters: %w", err)
	}
	for _, k := range stale {
		if err := m.o.AggStats.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete aggregate counters: %w", err)
		}
	}
	return nil
}

// AggregateCounters reads the counters of every counted instance, summed
// over CPUs.
func (m *OverrideStore) AggregateCounters() ([]AggregateCounters, error) {
	var k loader.LimiterEgAggKey
	var v []loader.LimiterEgAggStats
	var out []AggregateCounters
	it := m.o.AggStats.Iterate()
	for it.Next(&k, &v) {
		c := AggregateCounters{Aggregate: aggregateFromKey(k)}
		for _, s := range v {
			c.Passed.Packets += s.Passed.Packets
			c.Passed.Bytes += s.Passed.Bytes
			c.Dropped.Packets += s.Dropped.Packets
			c.Dropped.Bytes += s.Dropped.Bytes
		}
		out = append(out, c)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read aggregate counters: %w", err)
	}
	return out, nil
}
