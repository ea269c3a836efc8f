package daemon

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/refmodel"
)

// `edgectl explain ADDR`: what the data plane would do with the next
// packet from an address, and why (docs/operations.md, "Explain").

// explainRoutes adds the explain endpoint to the control API.
func (d *Daemon) explainRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/explain", func(w http.ResponseWriter, r *http.Request) {
		probe, err := parseProbe(r)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		e, err := d.Explain(probe)
		if err != nil {
			writeError(w, http.StatusInternalServerError, err)
			return
		}
		writeJSON(w, e)
	})
}

var protoNumbers = map[string]uint8{"tcp": 6, "udp": 17, "icmp": 1, "icmpv6": 58}

func protoName(p uint8) string {
	for n, v := range protoNumbers {
		if v == p {
			return n
		}
	}
	return strconv.Itoa(int(p))
}

// Probe is the packet explain decides: its source, the protocol, ports,
// TTL and TCP flags the L4 rules and fingerprints look at, and the frame's
// length for byte limits. Proto 0 is a packet no L4 rule or fingerprint
// field but src and len can match.
type Probe struct {
	Addr         netip.Addr
	Proto        uint8
	SPort, DPort uint16 // ICMP: DPort is the type
	Len          uint32 // frame bytes
	TTL, Flags   uint8
}

func parseProbe(r *http.Request) (Probe, error) {
	q := r.URL.Query()
	ip, err := netip.ParseAddr(q.Get("ip"))
	if err != nil {
		return Probe{}, fmt.Errorf("bad ip %q: %w", q.Get("ip"), err)
	}
	p := Probe{Addr: ip.Unmap(), Len: 64, TTL: 64}
	if s := q.Get("proto"); s != "" {
		n, ok := protoNumbers[strings.ToLower(s)]
		if !ok {
			return p, fmt.Errorf("bad proto %q: use tcp, udp, icmp or icmpv6", s)
		}
		p.Proto = n
	}
	for _, f := range []struct {
		name string
		bits int
		set  func(uint64)
	}{
		{"sport", 16, func(v uint64) { p.SPort = uint16(v) }},
		{"dport", 16, func(v uint64) { p.DPort = uint16(v) }},
		{"len", 32, func(v uint64) { p.Len = uint32(v) }},
		{"ttl", 8, func(v uint64) { p.TTL = uint8(v) }},
		{"flags", 8, func(v uint64) { p.Flags = uint8(v) }},
	} {
		if s := q.Get(f.name); s != "" {
			v, err := strconv.ParseUint(s, 10, f.bits)
			if err != nil {
				return p, fmt.Errorf("bad %s %q: %w", f.name, s, err)
			}
			f.set(v)
		}
	}
	if p.Len < 14 || p.Len > 65535 {
		return p, fmt.Errorf("bad len %d: a frame has 14 to 65535 bytes", p.Len)
	}
	if (p.SPort != 0 || p.DPort != 0) && p.Proto == 0 {
		return p, fmt.Errorf("ports without a protocol: add proto")
	}
	return p, nil
}

// Explain decides a probe packet the way the data plane would decide it
// now: the data plane's maps are read (maps.ReadState), loaded into the
// reference model the differential tests hold to the program
// (refmodel.FromState) and the packet is decided there, step by step.
// Nothing in the data plane is charged or created. The names, origins of
// list entries, ASN data and samples are the daemon's.
//
// d.mu is held only to copy what Explain needs of the daemon's state
// (explainView), never across the map reads; an explanation whose
// generation was replaced while the maps were read is made again (at most
// twice more), so the names and the maps it shows are of one generation.
func (d *Daemon) Explain(p Probe) (control.Explanation, error) {
	for attempt := 0; ; attempt++ {
		v := d.explainView()
		e, err := d.explain(p, &v)
		if err != nil {
			return e, err
		}
		d.mu.Lock()
		same := d.generation == v.gen
		d.mu.Unlock()
		if same || attempt == 2 {
			return e, nil
		}
	}
}

// explainView is what Explain reads of the daemon's own state, copied
// under d.mu: the running policy (never changed once committed: a change
// replaces it), its generation, the run-time list entries and the SYN
// stage.
type explainView struct {
	cur running
	gen uint64
	dyn map[control.ListKind]map[netip.Prefix]dynEntry
	syn *synStage
}

func (d *Daemon) explainView() explainView {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := explainView{cur: d.cur, gen: d.generation, dyn: map[control.ListKind]map[netip.Prefix]dynEntry{}, syn: d.syn}
	for kind, entries := range d.lists.dyn {
		m := make(map[netip.Prefix]dynEntry, len(entries))
		for pfx, e := range entries {
			m[pfx] = e
		}
		v.dyn[kind] = m
	}
	return v
}

// explain is Explain on one view; it reads the maps without d.mu.
func (d *Daemon) explain(p Probe, vw *explainView) (control.Explanation, error) {
	st, err := d.m.ReadState()
	if err != nil {
		return control.Explanation{}, err
	}
	wall := time.Now()
	model, err := refmodel.FromState(st)
	if err != nil {
		return control.Explanation{}, fmt.Errorf("explain: %w", err)
	}
	ip := p.Addr.Unmap()
	// The standing's next charge, before the probe charges the model's
	// copy of the state.
	next, budget, metered, inUse := model.NextCharge(ip, st.NowNS)
	v, tr := model.Explain(refmodel.ProbePacket(ip, p.Proto, p.SPort, p.DPort, p.Len, p.TTL, p.Flags), st.NowNS)
	if err := model.LiveErr(); err != nil {
		return control.Explanation{}, fmt.Errorf("explain: read the data plane's tables: %w", err)
	}
	e := control.Explanation{
		IP: ip, Generation: vw.gen,
		Packet:  control.ExplainPacket{SPort: p.SPort, DPort: p.DPort, Len: p.Len},
		Verdict: maps.ActionName(v.Action), Reason: maps.ReasonName(v.Reason),
		Samples: []control.ExplainSample{},
		Buckets: []control.ExplainBucket{},
	}
	if p.Proto != 0 {
		e.Packet.Proto = protoName(p.Proto)
	}
	e.ASN = explainASN(vw, ip, tr)
	if tr.List != nil {
		switch v.Reason {
		case maps.ReasonDeny:
			e.List = listEntryFor(vw, control.Deny, ip)
		case maps.ReasonAllow:
			e.List = listEntryFor(vw, control.Allow, ip)
		}
	}
	var rule *policy.CompiledRule
	if tr.Rule != nil {
		rule = compiledRule(vw, tr.Rule.ID)
		e.Rule = explainRule(vw, tr, rule)
	}
	if f := tr.Fingerprint; f != nil {
		e.Fingerprint = explainFingerprint(st, f, wall)
	}
	for _, b := range tr.Buckets {
		e.Buckets = append(e.Buckets, explainBucket(st, b, rule, vw.cur.compiled.Global, ip, wall))
	}
	if tr.Class != nil {
		e.Class = maps.ClassName(*tr.Class)
	}
	std, err := d.m.Standing.Lookup(ip)
	if err != nil {
		d.log.Warn("explain: read standing", "ip", ip, "err", err)
	} else {
		xs := &control.ExplainStanding{Standing: maps.StandingName(std.Standing), Tracked: std.Tracked}
		if std.Why != maps.WhyNone {
			xs.Why = maps.StandingWhyName(std.Why)
		}
		if std.Tracked {
			t := std.Since
			xs.Since = &t
		}
		if std.RateAtNS != 0 {
			xs.Rate = &control.ExplainRate{Usual: std.UsualRate, Current: std.CurrentRate, Jumped: std.Jumped,
				Measured: std.RateAge.Seconds()}
		}
		xs.Next = maps.ClassName(next)
		if metered {
			xs.Budget = &control.ExplainBudget{Rate: budget.RatePerSecond(), Burst: budget.BurstPkts, InUse: inUse}
		}
		e.Standing = xs
	}
	if e.SYN, err = explainSYN(vw, st, ip, p); err != nil {
		return control.Explanation{}, err
	}
	slots, err := d.m.Generations.RuleSlots()
	if err != nil {
		return control.Explanation{}, err
	}
	names := map[uint32]string{}
	for id, slot := range slots {
		names[slot] = vw.cur.names[id]
	}
	e.Samples = d.recent.of(ip, 10, names)
	e.Shield = d.shieldOnPath(vw, p, tr, rule)
	e.L7 = d.l7.explain(ip)
	e.Why = explainWhy(e, v)
	return e, nil
}

func explainASN(v *explainView, ip netip.Addr, tr refmodel.Trace) control.ExplainASN {
	var a control.ExplainASN
	if t := v.cur.asn; t != nil {
		a.Data, a.Entries = true, t.Len()
		if en, ok := t.Lookup(ip); ok {
			a.Found, a.Prefix, a.ASN, a.Country = true, en.Prefix, en.ASN, asn.CountryString(en.Country)
		}
	}
	if tr.Fact != nil {
		a.DataPlaneASN = tr.Fact.ASN
	}
	return a
}

// listEntryFor is the operator's entry of a list that covers ip: the most
// specific of the policy's and the run-time ones still in force.
func listEntryFor(v *explainView, kind control.ListKind, ip netip.Addr) *control.ExplainList {
	var best *control.ExplainList
	now := time.Now()
	consider := func(l control.ExplainList) {
		if l.Prefix.Contains(ip) && (best == nil || l.Prefix.Bits() > best.Prefix.Bits()) {
			best = &l
		}
	}
	src := v.cur.pol.Deny
	if kind == control.Allow {
		src = v.cur.pol.Allow
	}
	for _, le := range src {
		if !le.Expires.IsZero() && !le.Expires.After(now) {
			continue
		}
		l := control.ExplainList{List: kind, Prefix: le.Prefix.Masked(), Origin: "policy", Reason: le.Source}
		if !le.Expires.IsZero() {
			t := le.Expires
			l.Expires = &t
		}
		consider(l)
	}
	for pfx, de := range v.dyn[kind] {
		if !de.expires.IsZero() && !de.expires.After(now) {
			continue
		}
		l := control.ExplainList{List: kind, Prefix: pfx, Origin: de.origin, Reason: de.reason}
		if !de.expires.IsZero() {
			t := de.expires
			l.Expires = &t
		}
		consider(l)
	}
	if best == nil {
		// The data plane holds an entry the daemon does not know (pins
		// of an earlier daemon whose lists were not saved).
		best = &control.ExplainList{List: kind, Origin: "unknown"}
	}
	return best
}

func compiledRule(v *explainView, id uint32) *policy.CompiledRule {
	for i := range v.cur.compiled.Rules {
		if v.cur.compiled.Rules[i].ID == id {
			return &v.cur.compiled.Rules[i]
		}
	}
	return nil
}

func explainRule(v *explainView, tr refmodel.Trace, rule *policy.CompiledRule) *control.ExplainRule {
	tru := tr.Rule
	r := &control.ExplainRule{ID: tru.ID, Name: v.cur.names[tru.ID], Action: "limit"}
	switch tru.Action {
	case maps.RuleDrop:
		r.Action = "drop"
	case maps.RulePass:
		r.Action = "pass"
	}
	r.Mode = "enforce"
	if m := tru.Mode; m == maps.ModeDryRun || (m == maps.ModeInherit && tru.GenerationMode == maps.ModeDryRun) {
		r.Mode = "dry-run"
	}
	switch {
	case tr.L4 != nil:
		r.From = "l4"
		r.Match = protoName(tr.L4.Proto)
		switch tr.L4.Dir {
		case maps.L4Src:
			r.Match += fmt.Sprintf(" src port %d", tr.L4.Port)
		case maps.L4Dst:
			r.Match += fmt.Sprintf(" dst port %d", tr.L4.Port)
			if tr.L4.Proto == 1 || tr.L4.Proto == 58 {
				r.Match = fmt.Sprintf("%s type %d", protoName(tr.L4.Proto), tr.L4.Port)
			}
		}
	case tr.Fact == nil || tru.ID == 0 || rule == nil:
		r.From = "default"
	default:
		switch rule.Match.Kind {
		case policy.MatchPrefix:
			r.From, r.Match = "prefix", tr.Fact.Prefix.String()
		case policy.MatchASN:
			r.From, r.Match = "asn", "AS"+strconv.FormatUint(uint64(tr.Fact.ASN), 10)
		case policy.MatchCountry:
			r.From = "country"
			for _, f := range v.cur.compiled.Prefixes {
				if f.Prefix.Masked() == tr.Fact.Prefix {
					r.Match = strings.TrimSpace(string(f.Country[:]))
				}
			}
		default:
			r.From = rule.Match.Kind.String()
		}
	}
	return r
}

// explainLevel reads a GCRA dimension: tolerance tau and debt max(tat-now,
// 0), both in ticks, as events of t ticks (bytes: t per 2^ByteShift
// bytes); reserve is the share of tau only privileged sources may use.
func explainLevel(tat, now, t, tau uint64, scale float64, reserve uint16, limit string) *control.ExplainLevel {
	if t == 0 {
		return nil
	}
	debt := uint64(0)
	if tat > now {
		debt = tat - now
	}
	l := &control.ExplainLevel{Limit: limit, Burst: float64(tau) / float64(t) * scale}
	if debt < tau {
		l.Available = float64(tau-debt) / float64(t) * scale
	}
	if reserve != 0 {
		cut := (tau>>16)*uint64(reserve) + ((tau&0xffff)*uint64(reserve))>>16
		l.Reserve = float64(cut) / float64(t) * scale
	}
	return l
}

// cfgLimit writes a data-plane budget as "100/s burst 10" (packets).
func cfgLimit(c maps.BucketCfg) string {
	if c.PktT == 0 {
		return ""
	}
	per := float64(uint64(time.Second)<<maps.TickShift) / float64(c.PktT)
	return fmt.Sprintf("%.4g/s burst %.4g", per, float64(c.PktTau)/float64(c.PktT))
}

func explainBucket(st *maps.State, b refmodel.BucketStep, rule *policy.CompiledRule, global policy.Bucket, ip netip.Addr, wall time.Time) control.ExplainBucket {
	out := control.ExplainBucket{Step: "look", Exists: b.Exists, Admits: b.Admitted, NewSource: b.NewPart}
	if b.Charge {
		out.Step = "charge"
		out.Uncharged = !b.Charged
	}
	var pb policy.Bucket
	switch b.Kind {
	case 0:
		out.Kind = string(bucketSource)
		out.Key = maps.PrefixFromKey(loader.LimiterEgLpmKey{Prefixlen: srcKeyLen(ip, rule), Addr: b.Src.Addr}).String()
		if rule != nil {
			pb = rule.PerSource
		}
	case refmodel.AggKindPrefix, refmodel.AggKindWhole:
		out.Kind = string(bucketPrefix)
		out.Key = "whole"
		if b.Kind == refmodel.AggKindPrefix {
			out.Key = maps.PrefixFromKey(loader.LimiterEgLpmKey{Prefixlen: uint32(b.Agg.Len), Addr: b.Agg.Addr}).String()
		}
		if rule != nil {
			pb = rule.PerPrefix
		}
	case refmodel.AggKindASN:
		out.Kind, out.Key = string(bucketASN), "AS"+strconv.FormatUint(uint64(b.Agg.Asn), 10)
		if rule != nil {
			pb = rule.PerASN
		}
	case refmodel.AggKindGlobal:
		out.Kind, out.Key = string(bucketGlobal), "global"
		pb = global
	}
	now := st.NowNS << maps.TickShift
	cfg := b.Policy
	pktLimit, byteLimit := "", ""
	if pb.Packets.IsSet() {
		pktLimit = policy.FormatRate(pb.Packets.Rate, policy.Packets) + " burst " + policy.FormatBurst(pb.Packets.Burst, policy.Packets)
	}
	if pb.Bytes.IsSet() {
		byteLimit = policy.FormatRate(pb.Bytes.Rate, policy.Bytes) + " burst " + policy.FormatBurst(pb.Bytes.Burst, policy.Bytes)
	}
	if o := b.Override; o != nil {
		x := &control.ExplainOverride{}
		if o.Expires > st.NowNS && (o.Budget.PktT != 0 || o.Budget.ByteT != 0) {
			x.Budget = &control.ExplainOverridePart{Origin: maps.OriginName(maps.Origin(o.Origin & 0xff)),
				Expires: st.WallTime(o.Expires, wall), Limit: cfgLimit(o.Budget)}
		}
		if o.NewExpires > st.NowNS && (o.NewBudget.PktT != 0 || o.NewBudget.ByteT != 0) {
			x.NewSource = &control.ExplainOverridePart{Origin: maps.OriginName(maps.Origin(o.Origin >> 8 & 0xff)),
				Expires: st.WallTime(o.NewExpires, wall), Limit: cfgLimit(o.NewBudget),
				Packets: explainLevel(o.NewBucket.PktTat, now, o.NewBudget.PktT, o.NewBudget.PktTau, 1, 0, cfgLimit(o.NewBudget))}
		}
		if x.Budget != nil || x.NewSource != nil {
			out.Override = x
		}
		if b.BudgetPart {
			cfg = o.Budget
			pktLimit = cfgLimit(o.Budget) + " (override, " + x.Budget.Origin + ")"
			byteLimit = "(override, " + x.Budget.Origin + ")"
		}
	}
	out.Packets = explainLevel(b.Bucket.PktTat, now, cfg.PktT, cfg.PktTau, 1, b.Reserve, pktLimit)
	out.Bytes = explainLevel(b.Bucket.ByteTat, now, cfg.ByteT, cfg.ByteTau, 1<<maps.ByteShift, b.Reserve, byteLimit)
	if !b.Admitted {
		out.Refused = "budget"
		switch {
		case b.RefusedNew:
			out.Refused = "new_source"
		case b.Outcome == maps.OutcomeRefusedReserve:
			out.Refused, out.ReserveRefuses = "reserve", true
		}
	}
	return out
}

// srcKeyLen is the per-source key's length in the 128-bit space.
func srcKeyLen(ip netip.Addr, rule *policy.CompiledRule) uint32 {
	if rule == nil {
		return 128
	}
	if ip.Is4() {
		return 96 + uint32(min(rule.SourceKey.V4, 32))
	}
	return uint32(min(rule.SourceKey.V6, 128))
}

func explainFingerprint(st *maps.State, f *refmodel.TraceFingerprint, wall time.Time) *control.ExplainFingerprint {
	fp := st.FingerprintOf(f.Key, f.Val, wall)
	x := &control.ExplainFingerprint{ID: fp.ID, Match: fp.Match(), Origin: maps.OriginName(fp.Origin), DryRun: fp.DryRun,
		Expires: st.WallTime(f.Val.Expires, wall), Refused: f.Refused, Dropped: f.Dropped, Spared: f.Spared}
	x.Packets = explainLevel(f.Val.Bucket.PktTat, st.NowNS<<maps.TickShift, f.Val.Budget.PktT, f.Val.Budget.PktTau, 1, 0, cfgLimit(f.Val.Budget))
	return x
}

func explainWhy(e control.Explanation, v refmodel.Verdict) string {
	verb := map[string]string{"pass": "passes", "drop": "is dropped", "would_drop": "would be dropped (dry-run: it passes)"}[e.Verdict]
	switch v.Reason {
	case maps.ReasonDeny, maps.ReasonAllow:
		l := e.List
		s := fmt.Sprintf("%s-listed by %s (%s", l.List, l.Prefix, l.Origin)
		if l.Reason != "" {
			s += ", " + l.Reason
		}
		if l.Expires != nil {
			s += ", until " + l.Expires.UTC().Format(time.RFC3339)
		}
		s += ")"
		if v.Reason == maps.ReasonDeny {
			return s + ": the next packet " + verb + " before any rule"
		}
		return s + ": the next packet passes without limits"
	case maps.ReasonNoPolicy:
		return "no valid rule in the live generation: the next packet passes uncounted (no_policy)"
	}
	r := e.Rule
	from := r.From
	switch {
	case r.From == "default":
		from = "the default rule: no prefix, ASN or country rule covers the address"
	case r.Match != "":
		from = r.From + " " + r.Match
	}
	s := fmt.Sprintf("rule %s (%s)", r.Name, from)
	switch v.Reason {
	case maps.ReasonRulePass:
		return s + " passes everything: the next packet passes without limits"
	case maps.ReasonRuleDrop:
		return s + " drops everything: the next packet " + verb
	case maps.ReasonFingerprint:
		f := e.Fingerprint
		return fmt.Sprintf("%s: fingerprint #%d (%s, by %s) matches and its bucket has no room: the next packet %s (%s)",
			s, f.ID, f.Match, f.Origin, verb, e.Reason)
	}
	if f := e.Fingerprint; f != nil && f.Refused && !f.Dropped {
		s += fmt.Sprintf("; fingerprint #%d (%s) refuses it but does not drop it (dry run, or a validated source)", f.ID, f.Match)
	}
	if v.Reason == maps.ReasonOK {
		if len(e.Buckets) == 0 {
			return s + " has no limits: the next packet passes"
		}
		return s + ": every bucket on the path has room, the next packet passes"
	}
	for _, b := range e.Buckets {
		if b.Admits {
			continue
		}
		avail := ""
		if b.Packets != nil {
			avail = fmt.Sprintf(" (%.2f of %.0f packets available)", b.Packets.Available, b.Packets.Burst)
		}
		switch b.Refused {
		case "new_source":
			np := b.Override.NewSource
			return fmt.Sprintf("%s: the %s aggregate %s is overridden by %s: new and penalised sources share %s, and that is spent: the next packet %s (%s)",
				s, b.Kind, b.Key, np.Origin, np.Limit, verb, e.Reason)
		case "reserve":
			rsv := ""
			if b.Packets != nil {
				rsv = fmt.Sprintf(" (%.2f of %.0f packets available, the last %.0f only for established and validated sources)",
					b.Packets.Available, b.Packets.Burst, b.Packets.Reserve)
			}
			return fmt.Sprintf("%s: its %s bucket %s is in its reserve band%s and the source is %s: the next packet %s (%s)",
				s, b.Kind, b.Key, rsv, e.Class, verb, e.Reason)
		}
		if b.Override != nil && b.Override.Budget != nil {
			return fmt.Sprintf("%s: its %s bucket %s, held to %s by an override of %s, is empty%s: the next packet %s (%s)",
				s, b.Kind, b.Key, b.Override.Budget.Limit, b.Override.Budget.Origin, avail, verb, e.Reason)
		}
		return fmt.Sprintf("%s: its %s bucket %s is empty%s: the next packet %s (%s)", s, b.Kind, b.Key, avail, verb, e.Reason)
	}
	return s + ": the next packet " + verb + " (" + e.Reason + ")"
}

// Bucket kinds, as explain names them.
const (
	bucketSource = "per_source"
	bucketPrefix = "per_prefix"
	bucketASN    = "per_asn"
	bucketGlobal = "global"
)

// recentSamples remembers the last drop samples, for explain: a bounded
// ring (the data plane sends at most its sample budget per second, so a
// few thousand cover the last seconds of a flood and much longer
// otherwise).
type recentSamples struct {
	mu   sync.Mutex
	ring []timedSample
	next int
}

type timedSample struct {
	at time.Time
	s  maps.Sample
}

const recentSampleCap = 4096

func newRecentSamples() *recentSamples {
	return &recentSamples{ring: make([]timedSample, 0, recentSampleCap)}
}

func (r *recentSamples) add(at time.Time, s maps.Sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ring) < recentSampleCap {
		r.ring = append(r.ring, timedSample{at, s})
		return
	}
	r.ring[r.next] = timedSample{at, s}
	r.next = (r.next + 1) % recentSampleCap
}

// of returns up to n of ip's samples, oldest first; names maps rule slots
// to rule names.
func (r *recentSamples) of(ip netip.Addr, n int, names map[uint32]string) []control.ExplainSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []control.ExplainSample{}
	for i := 0; i < len(r.ring) && len(out) < n; i++ {
		// Newest first: walk back from the last written.
		j := (r.next - 1 - i + 2*len(r.ring)) % len(r.ring)
		if len(r.ring) < recentSampleCap {
			j = len(r.ring) - 1 - i
		}
		t := r.ring[j]
		if t.s.Source != ip {
			continue
		}
		out = append(out, control.ExplainSample{
			Time: t.at, Action: maps.ActionName(t.s.Action), Reason: maps.ReasonName(t.s.Reason),
			Rule: names[t.s.RuleSlot], Proto: t.s.Proto, SPort: t.s.SPort, DPort: t.s.DPort, Len: t.s.Len,
		})
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}
