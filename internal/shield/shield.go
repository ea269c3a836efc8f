package shield

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// Mode is what the shield does with its decisions: the policy's
// shield.mode.
type Mode = policy.ShieldMode

// Modes.
const (
	ModeOff     = policy.ShieldOff     // learns nothing, decides nothing
	ModeMonitor = policy.ShieldMonitor // learns, decides and reports; writes nothing to the data plane
	ModeEnforce = policy.ShieldEnforce // writes its actions to the data plane
)

// The shield's knobs are the policy's shield: section (policy.Shield,
// its defaults policy.DefaultShield; docs/shield.md): the engine takes it
// as it is. What the data plane holds is in Options.

// Options are what the engine needs to know of the data plane.
type Options struct {
	// MaxMasks is how many distinct fingerprint masks the data plane
	// holds at once (maps.MaxFingerprintMasks; a source prefix's length is
	// part of the mask). The shield's fingerprint actions never need
	// more; 0 is no limit.
	MaxMasks int
}

// policyForbids are the policy's shield.forbid entries as forbids.
func policyForbids(c policy.Shield) []Forbid {
	out := make([]Forbid, 0, len(c.Forbid))
	for _, f := range c.Forbid {
		out = append(out, Forbid{Prefix: f.Prefix, ASN: f.ASN, By: "policy"})
	}
	return out
}

// Forbid is an aggregate the shield never touches: a source prefix (every
// aggregate and fingerprint inside or around it), an ASN, or one exact
// aggregate.
type Forbid struct {
	Prefix netip.Prefix `json:"prefix,omitzero"`
	ASN    uint32       `json:"asn,omitempty"`
	Key    *Key         `json:"key,omitempty"`
	By     string       `json:"by,omitempty"`
}

func (f Forbid) String() string {
	switch {
	case f.Prefix.IsValid():
		return f.Prefix.String()
	case f.ASN != 0:
		return fmt.Sprintf("AS%d", f.ASN)
	case f.Key != nil:
		return f.Key.String()
	}
	return "nothing"
}

// ParseForbid reads a prefix, "AS64500" or an aggregate key.
func ParseForbid(s string) (Forbid, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return Forbid{Prefix: p.Masked()}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return Forbid{Prefix: netip.PrefixFrom(a, a.BitLen())}, nil
	}
	if len(s) > 2 && (s[:2] == "AS" || s[:2] == "as") {
		var n uint32
		if _, err := fmt.Sscanf(s[2:], "%d", &n); err == nil && n != 0 && fmt.Sprint(n) == s[2:] {
			return Forbid{ASN: n}, nil
		}
	}
	k, err := ParseKey(s)
	if err != nil {
		return Forbid{}, fmt.Errorf("forbid %q: use a prefix, an address, ASNNN or an aggregate: %w", s, err)
	}
	return Forbid{Key: &k}, nil
}

func (f Forbid) same(o Forbid) bool {
	if (f.Key == nil) != (o.Key == nil) || (f.Key != nil && *f.Key != *o.Key) {
		return false
	}
	return f.Prefix == o.Prefix && f.ASN == o.ASN
}

func (f Forbid) coversKey(k Key) bool {
	switch {
	case f.Key != nil:
		return *f.Key == k
	case f.ASN != 0:
		return k.Kind == KindASN && k.ASN == f.ASN
	case f.Prefix.IsValid():
		return k.Kind == KindPrefix && k.Prefix.Overlaps(f.Prefix)
	}
	return false
}

func (f Forbid) coversFingerprint(fp Fingerprint) bool {
	return f.Prefix.IsValid() && fp.Mask&FSrc != 0 && fp.Src.Overlaps(f.Prefix)
}

// ActionKind is what an action does.
type ActionKind string

// Action kinds.
const (
	// Tighten gives new (and penalised) sources of an aggregate a budget
	// of their own, toward the aggregate's baseline (never below it):
	// established and validated sources are not charged by it.
	Tighten ActionKind = "tighten"
	// FingerprintRule installs a fingerprint match with its own bucket.
	FingerprintRule ActionKind = "fingerprint"
)

// Action is one decision of the shield.
type Action struct {
	ID          uint32       `json:"id"`
	Kind        ActionKind   `json:"kind"`
	Key         Key          `json:"aggregate"` // the surging aggregate
	Shape       RuleShape    `json:"-"`
	Fingerprint *Fingerprint `json:"fingerprint,omitempty"`
	// Budget is packets per second: for Tighten, what new sources of the
	// aggregate share; for FingerprintRule, the rule's bucket.
	Budget     float64   `json:"budget"`
	Baseline   float64   `json:"baseline"` // the aggregate's, packets/s, at the decision
	Rate       float64   `json:"rate"`     // the aggregate's current rate at the decision
	Coverage   float64   `json:"coverage,omitempty"`
	Collateral float64   `json:"collateral,omitempty"`
	Reason     string    `json:"reason"`
	Since      time.Time `json:"since"`
	Expires    time.Time `json:"expires"`
	Pinned     bool      `json:"pinned,omitempty"`
	PinnedBy   string    `json:"pinned_by,omitempty"`
	// Enforced: written to the data plane (mode enforce); else the action
	// is what the shield would do (mode monitor).
	Enforced bool `json:"enforced"`
	// Adopted: found in the data plane's pinned maps at start (a
	// crashed or restarted daemon's); kept until its expiry, not renewed.
	Adopted bool `json:"adopted,omitempty"`

	installed bool
}

// Op is what a change does to the data plane.
type Op string

// Change operations.
const (
	OpInstall Op = "install"
	OpRenew   Op = "renew"
	OpRemove  Op = "remove"
)

// Change is an action entering, renewed in or leaving the data plane (or,
// for an action not Enforced, what the shield would do). Every change is
// a log event and an audit record.
type Change struct {
	Op     Op        `json:"op"`
	Action Action    `json:"action"`
	Why    string    `json:"why"`
	By     string    `json:"by"` // "shield" or the operator
	At     time.Time `json:"at"`
	// Mitigate is the time from the surge's start to this install.
	Mitigate time.Duration `json:"mitigate,omitempty"`
}

type surgeTrack struct {
	fps   *fingerprints
	total float64 // weight since the surge began
	start time.Time
	// noSlot: a fingerprint was found but every mask slot was taken
	// (reported once per surge).
	noSlot bool
}

// NoSlot is a fingerprint the shield found for a surge but did not
// install: it needs a mask the data plane has no slot for (every one of
// Options.MaxMasks is taken by the shield's other fingerprints).
type NoSlot struct {
	Key         Key
	Fingerprint Fingerprint
	Masks       int // distinct masks in use
	At          time.Time
}

// Engine is the shield's state. Its methods are safe for concurrent use;
// none does I/O.
type Engine struct {
	mu       sync.Mutex
	cfg      policy.Shield
	maxMasks int
	shapes   map[uint32]RuleShape
	global   GlobalShape
	asnOf    func(netip.Prefix) uint32
	tracked  map[Key]*aggState
	sketch   *cms
	base     *fingerprints
	baseAge  time.Duration
	surges   map[Key]*surgeTrack
	actions  map[uint32]*Action
	byKey    map[Key]uint32
	nextID   uint32
	// released are aggregates an operator released during their surge:
	// not acted on again until the surge ends.
	released map[Key]string
	forbid   []Forbid // the policy's, then the operator's
	opForbid []Forbid
	last     time.Time
	admitMin float64
	admitted int
	scans    int

	pending     []Sample // this interval's baseline samples (a reservoir)
	pendingSeen int
	rng         *rand.Rand

	surgeCount uint64
	wouldDrop  float64  // packets, monitor mode
	noSlots    []NoSlot // since the last TakeNoSlots
	keyBuf     []Key
}

const (
	sketchWidth     = 2048
	surgeSummaryK   = 64
	baseSummaryK    = 256
	admitsPerTick   = 64
	scansPerTick    = 1024 // victim searches per interval, each O(MaxAggregates)
	fingerprintKeys = 4    // at most this many surge summaries per MaxActive
	pendingCap      = 4096
	minSurgeSamples = 20
)

// New makes an engine for the policy's shield: section.
func New(cfg policy.Shield, o Options) *Engine {
	e := &Engine{
		shapes: map[uint32]RuleShape{}, tracked: map[Key]*aggState{}, sketch: newCMS(sketchWidth),
		base: newFingerprints(baseSummaryK), surges: map[Key]*surgeTrack{}, actions: map[uint32]*Action{},
		byKey: map[Key]uint32{}, released: map[Key]string{}, rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
	e.cfg, e.maxMasks = cfg, o.MaxMasks
	e.forbid = policyForbids(cfg)
	return e
}

// SetRules tells the engine what the data plane can tighten per rule id,
// and about the global bucket.
func (e *Engine) SetRules(shapes map[uint32]RuleShape, global GlobalShape) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shapes, e.global = shapes, global
	for k, a := range e.tracked {
		a.shape = shapes[k.Rule]
	}
}

// Reconfigure applies a new configuration (a policy reload; call SetRules
// first). Actions change as the mode says: monitor to enforce installs
// what the shield would do, enforce to monitor removes what it did;
// actions on aggregates forbidden now, or whose bucket the policy no
// longer has, are removed.
func (e *Engine) Reconfigure(cfg policy.Shield, now time.Time) []Change {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.cfg.Mode
	e.cfg = cfg
	e.forbid = append(policyForbids(cfg), e.opForbid...)
	var out []Change
	for _, id := range e.actionIDs() {
		a := e.actions[id]
		_, ruleKnown := e.shapes[a.Key.Rule]
		switch {
		case e.forbidden(a):
			out = append(out, e.remove(a, "forbidden by the policy", "policy", now))
		case a.Kind == Tighten && (!tightenable(a.Key, e.shapes[a.Key.Rule], e.global) || (a.Key.Kind != KindGlobal && !ruleKnown)):
			out = append(out, e.remove(a, "the policy no longer has this aggregate's bucket", "policy", now))
		case cfg.Mode == ModeOff:
			out = append(out, e.remove(a, "shield turned off", "policy", now))
		case old != ModeEnforce && cfg.Mode == ModeEnforce:
			a.Enforced, a.Expires = true, now.Add(cfg.TTL)
			a.installed = true
			out = append(out, Change{Op: OpInstall, Action: *a, Why: "mode monitor -> enforce", By: "policy", At: now})
		case old == ModeEnforce && cfg.Mode != ModeEnforce:
			out = append(out, Change{Op: OpRemove, Action: *a, Why: "mode enforce -> monitor", By: "policy", At: now})
			a.Enforced, a.installed = false, false
		}
	}
	return out
}

// Observe feeds one sample.
func (e *Engine) Observe(s Sample) {
	if s.Weight <= 0 || math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cfg.Mode == ModeOff {
		return
	}
	e.keyBuf = keys(e.keyBuf[:0], s, e.shapes[s.Rule])
	bytes := float64(s.Len) * s.Weight
	hotSeen := false
	shape := e.shapes[s.Rule]
	for _, k := range e.keyBuf {
		isCounted := counted(k, shape, e.global)
		a := e.tracked[k]
		if a == nil && !isCounted {
			a = e.admit(k, s.Weight)
		}
		if a == nil {
			continue
		}
		if !isCounted {
			a.accPkts += s.Weight
			a.accBits += 8 * bytes
			a.accN++
		}
		if !a.det.hot() {
			continue
		}
		// Keys are narrowest first: the first hot one owns the sample,
		// and only its fingerprint summary sees it (a broader one is
		// explained by it and not acted on).
		if !hotSeen {
			a.own += s.Weight
			hotSeen = true
			if st := e.surges[k]; st != nil {
				st.fps.add(s)
			}
		} else {
			a.explained += s.Weight
		}
		if st := e.surges[k]; st != nil {
			st.total += s.Weight
		}
	}
	if !hotSeen {
		// Held until the interval closes: the first interval of a surge
		// is not hot yet, and must not teach the baseline summary that
		// the flood's fingerprint is normal.
		e.pendingSeen++
		if len(e.pending) < pendingCap {
			e.pending = append(e.pending, s)
		} else if i := e.rng.IntN(e.pendingSeen); i < pendingCap {
			e.pending[i] = s // reservoir sampling
		}
	}
}

// Count adds exact packet and byte counts of an interval to a counted
// aggregate (from the data plane's per-aggregate counters, passed and
// dropped: the offered traffic).
func (e *Engine) Count(k Key, packets, bytes float64) {
	if packets <= 0 || math.IsNaN(packets) || math.IsInf(packets, 0) || math.IsNaN(bytes) || math.IsInf(bytes, 0) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cfg.Mode == ModeOff {
		return
	}
	a := e.tracked[k]
	if a == nil {
		a = e.admit(k, packets)
	}
	if a == nil {
		return
	}
	a.accPkts += packets
	a.accBits += 8 * max(bytes, 0)
}

// SetASNOf tells the engine which ASN a prefix belongs to (the ASN data),
// so a hot ASN's excess is known to explain its prefixes' and a rule's
// when no samples say so.
func (e *Engine) SetASNOf(f func(netip.Prefix) uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.asnOf = f
}

// contains reports whether aggregate n lies inside aggregate b.
func (e *Engine) contains(b, n Key) bool {
	if n.Kind >= b.Kind || b.Kind == KindCountry || b.Kind == KindPort || n.Kind == KindCountry || n.Kind == KindPort {
		return b.Kind == KindGlobal && n.Kind != KindGlobal
	}
	switch b.Kind {
	case KindGlobal:
		return true
	case KindRule:
		return n.Rule == b.Rule
	case KindASN:
		return n.Kind == KindPrefix && n.Rule == b.Rule && e.asnOf != nil && e.asnOf(n.Prefix) == b.ASN
	}
	return false
}

// admit starts tracking k if it is heavy enough: while the table has
// room, at once; when full, when the sketch's estimate of k's rate is
// above the least important tracked aggregate's, which it replaces (at
// most admitsPerTick per interval; hot aggregates and those with actions
// are never replaced).
func (e *Engine) admit(k Key, w float64) *aggState {
	est := e.sketch.add(k, w) / max(e.cfg.Current.Seconds(), 1e-3)
	if len(e.tracked) >= e.cfg.MaxAggregates {
		if e.admitted >= admitsPerTick || e.scans >= scansPerTick || est <= e.admitMin {
			return nil
		}
		e.scans++
		var victim Key
		vi, found := math.Inf(1), false
		for vk, va := range e.tracked {
			if va.det.hot() || e.byKey[vk] != 0 {
				continue
			}
			if imp := va.imp; imp < vi {
				victim, vi, found = vk, imp, true
			}
		}
		if !found || vi >= est {
			return nil
		}
		delete(e.tracked, victim)
		e.admitted++
	}
	a := &aggState{shape: e.shapes[k.Rule]}
	e.tracked[k] = a
	return a
}

func (e *Engine) importance(a *aggState) float64 {
	return max(a.baseline(e.cfg.Percentile), a.curPkts)
}

// Tick closes the interval that ends at now: rates, baselines, surges and
// actions. It returns the changes for the data plane, in order.
func (e *Engine) Tick(now time.Time) []Change {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last.IsZero() || !now.After(e.last) {
		e.last = now
		return nil
	}
	dt := now.Sub(e.last)
	e.last = now
	if e.cfg.Mode == ModeOff {
		return nil
	}
	sec := dt.Seconds()
	decay := float32(math.Exp(-sec * math.Ln2 / e.cfg.HalfLife.Seconds()))
	alpha := 1 - math.Exp(-sec/e.cfg.Current.Seconds())
	e.sketch.decay(float32(1 - alpha))
	e.base.decay(float64(decay))
	e.baseAge += dt
	var out []Change
	e.admitMin = math.Inf(1)
	e.admitted, e.scans = 0, 0
	becameHot := false
	for k, a := range e.tracked {
		pr, br := a.accPkts/sec, a.accBits/sec
		a.curN += alpha * (a.accN/sec - a.curN)
		a.accPkts, a.accBits, a.accN = 0, 0, 0
		if pr > 0 {
			a.Seen = now
		}
		a.curPkts += alpha * (pr - a.curPkts)
		a.curBits += alpha * (br - a.curBits)
		base := a.baseline(e.cfg.Percentile)
		// A rate made of a handful of 1-in-N samples is noise (one sample
		// of weight 1024 in an interval reads as 1024/s): an aggregate
		// learned from samples starts a surge only with at least
		// minSurgeSamples samples in its current window.
		resolved := counted(k, a.shape, e.global) || a.curN*e.cfg.Current.Seconds() >= minSurgeSamples || a.det.hot()
		if a.Learned >= e.cfg.LearnFor && resolved {
			wasHot, wasSurging := a.det.hot(), a.det.surging()
			if a.det.step(now, a.curPkts, base, e.cfg) {
				out = append(out, e.surgeEnded(k, now)...)
			}
			if !wasHot && a.det.hot() {
				becameHot = true
				a.own, a.explained = 0, 0
				e.startTrack(k, now)
			}
			if !a.det.hot() {
				delete(e.surges, k)
			}
			if !wasSurging && a.det.surging() {
				e.surgeCount++
			}
		}
		if !a.det.hot() {
			if e.surgeWhileLearning(a, pr) {
				a.pausedFor += dt
			} else {
				a.pausedFor = 0
				a.Packets.add(pr, decay)
				a.Bits.add(br, decay)
				a.Learned += dt
			}
		}
		a.imp = e.importance(a)
		e.admitMin = math.Min(e.admitMin, a.imp)
	}
	if !becameHot && len(e.pending) > 0 {
		scale := float64(e.pendingSeen) / float64(len(e.pending))
		for _, p := range e.pending {
			p.Weight *= scale
			e.base.add(p)
		}
	}
	e.pending, e.pendingSeen = e.pending[:0], 0
	out = append(out, e.plan(now)...)
	out = append(out, e.maintain(now)...)
	return out
}

// surgeWhileLearning says whether an aggregate still learning (not yet
// judged) is in a surge against what it learned so far, so that this
// interval is not learned: a surge while learning must not become the
// baseline (it would hide this surge and the next, and leave broader
// aggregates to take the blame). It needs a little history first
// (learnedEnough), since with none there is nothing to compare; and a
// level held for 10 x learn_for is learned after all, as the new normal.
func (e *Engine) surgeWhileLearning(a *aggState, rate float64) bool {
	if a.Learned >= e.cfg.LearnFor || a.Learned < e.learnedEnough() || a.pausedFor >= 10*e.cfg.LearnFor {
		return false
	}
	base := a.baseline(e.cfg.Percentile)
	return base > 0 && rate > e.cfg.Factor*base && rate >= e.cfg.MinRate.PerSecond()
}

// learnedEnough is the history an aggregate needs before a surge while
// learning is told from its normal: a quarter of learn_for, at least two
// intervals, at most a minute.
func (e *Engine) learnedEnough() time.Duration {
	return max(2*e.cfg.Interval, min(e.cfg.LearnFor/4, time.Minute))
}

// startTrack opens a fingerprint summary for a newly hot aggregate that
// cannot be tightened (one that can is tightened instead).
func (e *Engine) startTrack(k Key, now time.Time) {
	if !e.cfg.Fingerprints || len(e.surges) >= fingerprintKeys*max(e.cfg.MaxActive, 1) ||
		tightenable(k, e.tracked[k].shape, e.global) {
		return
	}
	e.surges[k] = &surgeTrack{fps: newFingerprints(surgeSummaryK), start: now}
}

func (e *Engine) surgeEnded(k Key, now time.Time) []Change {
	delete(e.surges, k)
	delete(e.released, k)
	id := e.byKey[k]
	if id == 0 {
		return nil
	}
	a := e.actions[id]
	if a.Pinned {
		return nil
	}
	return []Change{e.remove(a, "surge ended: the rate fell back under end_factor x baseline for cooldown", "shield", now)}
}

func (e *Engine) remove(a *Action, why, by string, now time.Time) Change {
	delete(e.actions, a.ID)
	delete(e.byKey, a.Key)
	return Change{Op: OpRemove, Action: *a, Why: why, By: by, At: now}
}

func (e *Engine) forbidden(a *Action) bool {
	for _, f := range e.forbid {
		if f.coversKey(a.Key) || (a.Fingerprint != nil && f.coversFingerprint(*a.Fingerprint)) {
			return true
		}
	}
	return false
}

func (e *Engine) keyForbidden(k Key) bool {
	for _, f := range e.forbid {
		if f.coversKey(k) {
			return true
		}
	}
	return false
}

// plan decides actions for surging aggregates without one.
func (e *Engine) plan(now time.Time) []Change {
	var cands []Key
	for k, a := range e.tracked {
		if a.det.surging() && e.byKey[k] == 0 && e.released[k] == "" && !e.keyForbidden(k) {
			cands = append(cands, k)
		}
	}
	// Narrowest first, then the biggest excess.
	slices.SortFunc(cands, func(x, y Key) int {
		if c := cmp.Compare(x.Kind, y.Kind); c != 0 {
			return c
		}
		ax, ay := e.tracked[x], e.tracked[y]
		return cmp.Compare(ay.curPkts-ay.baseline(e.cfg.Percentile), ax.curPkts-ax.baseline(e.cfg.Percentile))
	})
	var out []Change
	inUse := e.masksInUse()
	for _, k := range cands {
		if len(e.actions) >= e.cfg.MaxActive {
			break
		}
		a := e.tracked[k]
		if a.own+a.explained > 0 && a.own < a.explained {
			continue // samples say a narrower hot aggregate carries most of it
		}
		base := a.baseline(e.cfg.Percentile)
		if e.explainedByNarrower(k, a.curPkts-base) {
			continue
		}
		act := &Action{Key: k, Shape: a.shape, Baseline: base, Rate: a.curPkts, Since: now}
		switch {
		case tightenable(k, a.shape, e.global):
			act.Kind = Tighten
			act.Budget = math.Max(base*e.cfg.TightenTo, base)
			act.Reason = fmt.Sprintf("%s at %.0f/s, %.1fx its baseline %.0f/s for %s: new sources share %.0f/s",
				k, a.curPkts, a.curPkts/base, base, now.Sub(a.det.Start).Round(time.Second), act.Budget)
		case e.surges[k] != nil:
			st := e.surges[k]
			window := max(now.Sub(st.start).Seconds(), 1e-3)
			excess := st.total - base*window
			baseSec := math.Min(e.baseAge.Seconds(), e.cfg.HalfLife.Seconds()/math.Ln2)
			full := e.maxMasks > 0 && len(inUse) >= e.maxMasks
			c, ok, noSlot := st.fps.best(excess, e.base, max(baseSec, 1e-3), e.cfg.MinCoverage, e.cfg.MaxCollateral, inUse, full)
			if noSlot && !st.noSlot {
				// What it would have been, for the report.
				c, _, _ = st.fps.best(excess, e.base, max(baseSec, 1e-3), e.cfg.MinCoverage, e.cfg.MaxCollateral, nil, false)
				st.noSlot = true
				e.noSlots = append(e.noSlots, NoSlot{Key: k, Fingerprint: c.Fingerprint, Masks: len(inUse), At: now})
			}
			if !ok || e.fingerprintForbidden(c.Fingerprint) {
				continue
			}
			inUse[c.Fingerprint.slot()] = true
			fp := c.Fingerprint
			act.Kind, act.Fingerprint = FingerprintRule, &fp
			act.Coverage, act.Collateral = c.Coverage, c.Collateral
			act.Budget = math.Max(c.BaseRate*e.cfg.TightenTo, e.cfg.FingerprintMin.PerSecond())
			act.Reason = fmt.Sprintf("%s at %.0f/s, %.1fx its baseline %.0f/s: fingerprint %s covers %.0f%% of the surge, %.1f%% of the baseline; budget %.0f/s",
				k, a.curPkts, a.curPkts/base, base, fp, 100*c.Coverage, 100*c.Collateral, act.Budget)
		default:
			continue
		}
		e.nextID++
		if e.nextID == 0 {
			e.nextID = 1
		}
		act.ID = e.nextID
		act.Expires = now.Add(e.cfg.TTL)
		act.Enforced = e.cfg.Mode == ModeEnforce
		act.installed = act.Enforced
		e.actions[act.ID] = act
		e.byKey[k] = act.ID
		out = append(out, Change{Op: OpInstall, Action: *act, Why: act.Reason, By: "shield", At: now, Mitigate: now.Sub(a.det.Start)})
	}
	return out
}

// SeedIDs makes the ids of new actions start above id (the largest one
// the data plane holds, from before a restart), unless they already do.
func (e *Engine) SeedIDs(id uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.nextID = max(e.nextID, id)
}

// Adopt takes an action found in the data plane's pinned maps at start
// (Enforced, with its expiry there) into the engine, so that it is
// listed, counted and can be released: an action with ID 0 (a tighten:
// overrides carry no id) gets the next id. It is not renewed: it stays
// until its expiry, or until the shield decides the aggregate again. A
// tighten of an aggregate the engine holds an action for already is not
// taken (false).
func (e *Engine) Adopt(a Action, now time.Time) (Action, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if a.Kind == Tighten {
		if e.byKey[a.Key] != 0 {
			return Action{}, false
		}
	}
	if a.ID == 0 || e.actions[a.ID] != nil {
		e.nextID++
		if e.nextID == 0 {
			e.nextID = 1
		}
		a.ID = e.nextID
	}
	e.nextID = max(e.nextID, a.ID)
	a.Enforced, a.installed, a.Adopted = true, true, true
	if a.Since.IsZero() {
		a.Since = now
	}
	if a.Reason == "" {
		a.Reason = "adopted from the data plane at start (an earlier run's action, kept until it expires)"
	}
	act := a
	e.actions[a.ID] = &act
	if a.Kind == Tighten {
		e.byKey[a.Key] = a.ID
	}
	return act, true
}

// Holds reports whether the engine holds action id.
func (e *Engine) Holds(id uint32) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.actions[id] != nil
}

// ActionOn is the id of the engine's action on aggregate k, 0: none.
func (e *Engine) ActionOn(k Key) uint32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byKey[k]
}

// masksInUse are the mask slots the fingerprint actions take (monitor
// mode's too: they stand for what enforce would install).
func (e *Engine) masksInUse() map[maskSlot]bool {
	out := map[maskSlot]bool{}
	for _, a := range e.actions {
		if a.Fingerprint != nil {
			out[a.Fingerprint.slot()] = true
		}
	}
	return out
}

// TakeNoSlots returns the fingerprints not installed for lack of a mask
// slot since the last call (one per surge).
func (e *Engine) TakeNoSlots() []NoSlot {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.noSlots
	e.noSlots = nil
	return out
}

// explainedByNarrower reports whether hot aggregates inside k (judged,
// surging or pending) account for at least half of k's excess.
func (e *Engine) explainedByNarrower(k Key, excess float64) bool {
	if excess <= 0 || k.Kind == KindPrefix {
		return false
	}
	var inside float64
	for nk, na := range e.tracked {
		if nk.Kind < k.Kind && na.det.hot() && e.contains(k, nk) {
			inside += math.Max(0, na.curPkts-na.baseline(e.cfg.Percentile))
		}
	}
	return inside >= excess/2
}

func (e *Engine) fingerprintForbidden(fp Fingerprint) bool {
	for _, f := range e.forbid {
		if f.coversFingerprint(fp) {
			return true
		}
	}
	return false
}

// maintain renews actions past half their TTL, retries failed installs
// and counts what monitor-mode actions would drop.
func (e *Engine) maintain(now time.Time) []Change {
	var out []Change
	for _, id := range e.actionIDs() {
		a := e.actions[id]
		st := e.tracked[a.Key]
		if !a.Enforced {
			if st != nil {
				e.wouldDrop += math.Max(0, st.curPkts-a.Budget) * e.cfg.Interval.Seconds()
			}
			a.Expires = now.Add(e.cfg.TTL)
			continue
		}
		switch {
		case a.Adopted && !now.Before(a.Expires):
			out = append(out, e.remove(a, "expired (adopted from the data plane at start, not renewed)", "shield", now))
		case a.Adopted:
		case !a.installed:
			a.installed = true
			a.Expires = now.Add(e.cfg.TTL)
			out = append(out, Change{Op: OpInstall, Action: *a, Why: "retry: the last write failed", By: "shield", At: now})
		case a.Expires.Sub(now) < e.cfg.TTL/2:
			a.Expires = now.Add(e.cfg.TTL)
			out = append(out, Change{Op: OpRenew, Action: *a, Why: "still surging", By: "shield", At: now})
		}
	}
	return out
}

func (e *Engine) actionIDs() []uint32 {
	ids := make([]uint32, 0, len(e.actions))
	for id := range e.actions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Failed tells the engine an install or renewal of action id failed: it
// is retried next interval.
func (e *Engine) Failed(id uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if a := e.actions[id]; a != nil {
		a.installed = false
	}
}

// ErrNoAction is returned for an action id the shield does not hold.
var ErrNoAction = fmt.Errorf("no such shield action")

// Release removes an action now; the shield does not act on its
// aggregate again until that surge ends.
func (e *Engine) Release(id uint32, by string, now time.Time) (Change, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := e.actions[id]
	if a == nil {
		return Change{}, fmt.Errorf("release %d: %w", id, ErrNoAction)
	}
	if st := e.tracked[a.Key]; st != nil && st.det.hot() {
		e.released[a.Key] = by
	}
	return e.remove(a, "released by "+by, by, now), nil
}

// Pin keeps an action in force (renewed) after its surge ends, until it
// is released.
func (e *Engine) Pin(id uint32, by string) (Action, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a := e.actions[id]
	if a == nil {
		return Action{}, fmt.Errorf("pin %d: %w", id, ErrNoAction)
	}
	a.Pinned, a.PinnedBy = true, by
	return *a, nil
}

// AddForbid forbids an aggregate from now on; actions it covers are
// removed.
func (e *Engine) AddForbid(f Forbid, now time.Time) []Change {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, o := range e.forbid {
		if o.same(f) {
			return nil
		}
	}
	e.opForbid = append(e.opForbid, f)
	e.forbid = append(e.forbid, f)
	var out []Change
	for _, id := range e.actionIDs() {
		if a := e.actions[id]; e.forbidden(a) {
			out = append(out, e.remove(a, "forbidden by "+f.By, f.By, now))
		}
	}
	return out
}

// RemoveForbid lifts an operator's forbid; one from the policy stays.
func (e *Engine) RemoveForbid(f Forbid) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.opForbid)
	e.opForbid = slices.DeleteFunc(e.opForbid, f.same)
	e.forbid = append(policyForbids(e.cfg), e.opForbid...)
	return len(e.opForbid) != n
}

// Row is one aggregate in the shield's report.
type Row struct {
	Key          Key
	Baseline     float64 // packets/s
	BaselineBits float64 // bits/s
	Rate         float64 // packets/s, current (EWMA)
	Bits         float64
	Factor       float64 // Rate / Baseline
	State        SurgeState
	Learned      time.Duration
	Judged       bool // learned long enough to be judged
	// LearningPaused: still learning, and in a surge against what it
	// learned so far: the surge's intervals are not learned and nothing
	// acts on the aggregate until it is judged.
	LearningPaused bool
	Action         uint32
}

// Report is the shield's state for edgectl shield.
type Report struct {
	Mode        Mode
	Tracked     int
	Capacity    int
	Rows        []Row
	Actions     []Action
	Forbid      []Forbid
	Surges      uint64
	WouldDrop   float64
	HotByKind   map[string]int
	ActiveByKin map[string]int
}

// Report returns the n aggregates with the highest current rate (all of
// them hot ones first), the actions and the forbidden aggregates.
func (e *Engine) Report(n int) Report {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := Report{Mode: e.cfg.Mode, Tracked: len(e.tracked), Capacity: e.cfg.MaxAggregates,
		Surges: e.surgeCount, WouldDrop: e.wouldDrop, Forbid: slices.Clone(e.forbid)}
	for k, a := range e.tracked {
		base := a.baseline(e.cfg.Percentile)
		row := Row{Key: k, Baseline: base, BaselineBits: a.Bits.quantile(e.cfg.Percentile), Rate: a.curPkts, Bits: a.curBits,
			State: a.det.State, Learned: a.Learned, Judged: a.Learned >= e.cfg.LearnFor, Action: e.byKey[k],
			LearningPaused: a.pausedFor > 0}
		if base > 0 {
			row.Factor = a.curPkts / base
		}
		r.Rows = append(r.Rows, row)
	}
	slices.SortFunc(r.Rows, func(x, y Row) int {
		if hx, hy := x.State != Normal, y.State != Normal; hx != hy {
			if hx {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(y.Rate, x.Rate), cmp.Compare(x.Key.String(), y.Key.String()))
	})
	if n > 0 && len(r.Rows) > n {
		r.Rows = r.Rows[:n]
	}
	for _, id := range e.actionIDs() {
		r.Actions = append(r.Actions, *e.actions[id])
	}
	return r
}

// Tracked is how many aggregates have a baseline.
func (e *Engine) Tracked() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.tracked)
}

// Active counts the actions by kind and whether they are enforced.
func (e *Engine) Active() (enforced, would map[ActionKind]int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	enforced, would = map[ActionKind]int{Tighten: 0, FingerprintRule: 0}, map[ActionKind]int{Tighten: 0, FingerprintRule: 0}
	for _, a := range e.actions {
		if a.Enforced {
			enforced[a.Kind]++
		} else {
			would[a.Kind]++
		}
	}
	return enforced, would
}

// Counts are the engine's running totals: surges (aggregates that entered
// a confirmed surge), packets
// monitor-mode actions would have dropped (estimated: the rate above the
// action's budget, per interval).
func (e *Engine) Counts() (surges uint64, wouldDrop float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.surgeCount, e.wouldDrop
}

// ActionsFor returns the actions whose aggregate the sample's path
// crosses, or whose fingerprint it matches (edgectl explain); fields in
// unknown are not compared (a probe has no TTL or TCP flags).
func (e *Engine) ActionsFor(s Sample, unknown FieldMask) []Action {
	e.mu.Lock()
	defer e.mu.Unlock()
	ks := keys(nil, s, e.shapes[s.Rule])
	var out []Action
	for _, id := range e.actionIDs() {
		a := e.actions[id]
		if (a.Fingerprint != nil && a.Fingerprint.matchesExcept(s, unknown)) || (a.Fingerprint == nil && slices.Contains(ks, a.Key)) {
			out = append(out, *a)
		}
	}
	return out
}
