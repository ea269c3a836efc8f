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
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
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

func parseProbe(r *http.Request) (maps.Probe, error) {
	q := r.URL.Query()
	ip, err := netip.ParseAddr(q.Get("ip"))
	if err != nil {
		return maps.Probe{}, fmt.Errorf("bad ip %q: %w", q.Get("ip"), err)
	}
	p := maps.Probe{Addr: ip.Unmap(), Len: 64}
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

// Explain computes the explanation of a probe packet: the data plane's
// path read from the live maps, with the names, origins, ASN data and
// samples only the daemon knows.
func (d *Daemon) Explain(p maps.Probe) (control.Explanation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	path, err := d.m.ExplainPath(p)
	if err != nil {
		return control.Explanation{}, err
	}
	slots, err := d.m.RuleSlots()
	if err != nil {
		return control.Explanation{}, err
	}
	ip := p.Addr.Unmap()
	e := control.Explanation{
		IP: ip, Generation: d.generation,
		Packet:  control.ExplainPacket{SPort: p.SPort, DPort: p.DPort, Len: p.Len},
		Verdict: maps.ActionName(path.Verdict), Reason: maps.ReasonName(path.Reason),
		Samples: []control.ExplainSample{},
		Buckets: []control.ExplainBucket{},
	}
	if p.Proto != 0 {
		e.Packet.Proto = protoName(p.Proto)
	}
	e.ASN = d.explainASN(ip, path)
	if path.List != nil {
		kind := control.ListKind("")
		switch path.Reason {
		case maps.ReasonDeny:
			kind = control.Deny
		case maps.ReasonAllow:
			kind = control.Allow
		}
		if kind != "" {
			e.List = d.listEntryFor(kind, ip)
		}
	}
	var rule *policy.CompiledRule
	if !path.NoRule && e.List == nil {
		rule = d.compiledRule(path.RuleID)
		e.Rule = d.explainRule(ip, path, rule)
	}
	global := d.cur.compiled.Global
	for _, b := range path.Buckets {
		e.Buckets = append(e.Buckets, explainBucket(b, rule, global))
	}
	st, err := d.m.LookupStanding(ip)
	if err != nil {
		d.log.Warn("explain: read standing", "ip", ip, "err", err)
	} else {
		xs := &control.ExplainStanding{Standing: maps.StandingName(st.Standing), Tracked: st.Tracked}
		if st.Why != maps.WhyNone {
			xs.Why = maps.StandingWhyName(st.Why)
		}
		if st.Tracked {
			t := st.Since
			xs.Since = &t
		}
		if st.RateAtNS != 0 {
			xs.Rate = &control.ExplainRate{Usual: st.UsualRate, Current: st.CurrentRate, Jumped: st.Jumped,
				Measured: st.RateAge.Seconds()}
		}
		e.Standing = xs
	}
	e.SYN = d.explainSYN(ip, p, path.Reason == maps.ReasonDeny, st)
	names := map[uint32]string{}
	for id, slot := range slots {
		names[slot] = d.cur.names[id]
	}
	e.Samples = d.recent.of(ip, 10, names)
	e.Shield = d.shieldOnPath(p, path, rule)
	e.L7 = d.explainL7(ip)
	e.Why = explainWhy(e, path)
	return e, nil
}

func (d *Daemon) explainASN(ip netip.Addr, path maps.Path) control.ExplainASN {
	var a control.ExplainASN
	if t := d.cur.asn; t != nil {
		a.Data, a.Entries = true, t.Len()
		if en, ok := t.Lookup(ip); ok {
			a.Found, a.Prefix, a.ASN, a.Country = true, en.Prefix, en.ASN, asn.CountryString(en.Country)
		}
	}
	if path.Fact != nil {
		a.DataPlaneASN = path.Fact.ASN
	}
	return a
}

// listEntryFor is the operator's entry of a list that covers ip: the most
// specific of the policy's and the run-time ones still in force.
func (d *Daemon) listEntryFor(kind control.ListKind, ip netip.Addr) *control.ExplainList {
	var best *control.ExplainList
	now := time.Now()
	consider := func(l control.ExplainList) {
		if l.Prefix.Contains(ip) && (best == nil || l.Prefix.Bits() > best.Prefix.Bits()) {
			best = &l
		}
	}
	src := d.cur.pol.Deny
	if kind == control.Allow {
		src = d.cur.pol.Allow
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
	for pfx, de := range d.dyn[kind] {
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

func (d *Daemon) compiledRule(id uint32) *policy.CompiledRule {
	for i := range d.cur.compiled.Rules {
		if d.cur.compiled.Rules[i].ID == id {
			return &d.cur.compiled.Rules[i]
		}
	}
	return nil
}

func (d *Daemon) explainRule(ip netip.Addr, path maps.Path, rule *policy.CompiledRule) *control.ExplainRule {
	r := &control.ExplainRule{ID: path.RuleID, Name: d.cur.names[path.RuleID], Action: "limit"}
	switch path.Action {
	case maps.RuleDrop:
		r.Action = "drop"
	case maps.RulePass:
		r.Action = "pass"
	}
	r.Mode = "enforce"
	if m := path.Mode; m == maps.ModeDryRun || (m == maps.ModeInherit && path.GlobalMode == maps.ModeDryRun) {
		r.Mode = "dry-run"
	}
	switch {
	case path.L4 != nil:
		r.From = "l4"
		r.Match = protoName(path.L4.Proto)
		switch path.L4.Dir {
		case maps.L4Src:
			r.Match += fmt.Sprintf(" src port %d", path.L4.Port)
		case maps.L4Dst:
			r.Match += fmt.Sprintf(" dst port %d", path.L4.Port)
			if path.L4.Proto == 1 || path.L4.Proto == 58 {
				r.Match = fmt.Sprintf("%s type %d", protoName(path.L4.Proto), path.L4.Port)
			}
		}
	case path.RuleID == 0 || rule == nil:
		r.From = "default"
	default:
		switch rule.Match.Kind {
		case policy.MatchPrefix:
			r.From = "prefix"
			best := -1
			for _, f := range d.cur.compiled.Prefixes {
				if f.Prefix.Contains(ip) && f.Prefix.Bits() > best && f.RuleID == path.RuleID {
					best, r.Match = f.Prefix.Bits(), f.Prefix.String()
				}
			}
		case policy.MatchASN:
			r.From = "asn"
			if path.Fact != nil {
				r.Match = "AS" + strconv.FormatUint(uint64(path.Fact.ASN), 10)
			}
		case policy.MatchCountry:
			r.From = "country"
			if path.Fact != nil {
				r.Match = strings.TrimSpace(string(path.Fact.Country[:]))
			}
		default:
			r.From = rule.Match.Kind.String()
		}
	}
	return r
}

func explainBucket(b maps.PathBucket, rule *policy.CompiledRule, global policy.Bucket) control.ExplainBucket {
	out := control.ExplainBucket{Kind: string(b.Kind), Exists: b.Exists, Admits: b.Admits, ReserveRefuses: b.ReserveRefuses}
	var pb policy.Bucket
	switch b.Kind {
	case maps.BucketSource:
		out.Key = b.Key.String()
		if rule != nil {
			pb = rule.PerSource
		}
	case maps.BucketPrefix:
		out.Key = b.Key.String()
		if b.Whole {
			out.Key = "whole"
		}
		if rule != nil {
			pb = rule.PerPrefix
		}
	case maps.BucketASN:
		out.Key = "AS" + strconv.FormatUint(uint64(b.ASN), 10)
		if rule != nil {
			pb = rule.PerASN
		}
	case maps.BucketGlobal:
		out.Key = "global"
		pb = global
	}
	lvl := func(l maps.BucketLevel, pl policy.Limit, unit policy.Unit) *control.ExplainLevel {
		if !l.Limited {
			return nil
		}
		x := &control.ExplainLevel{Burst: l.Burst, Available: l.Available, Reserve: l.Reserve}
		if pl.IsSet() {
			x.Limit = policy.FormatRate(pl.Rate, unit) + " burst " + policy.FormatBurst(pl.Burst, unit)
		}
		return x
	}
	out.Packets = lvl(b.Packets, pb.Packets, policy.Packets)
	out.Bytes = lvl(b.Bytes, pb.Bytes, policy.Bytes)
	return out
}

func explainWhy(e control.Explanation, path maps.Path) string {
	verb := map[string]string{"pass": "passes", "drop": "is dropped", "would_drop": "would be dropped (dry-run: it passes)"}[e.Verdict]
	switch path.Reason {
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
		if path.Reason == maps.ReasonDeny {
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
	switch path.Reason {
	case maps.ReasonRulePass:
		return s + " passes everything: the next packet passes without limits"
	case maps.ReasonRuleDrop:
		return s + " drops everything: the next packet " + verb
	case maps.ReasonOK:
		if len(e.Buckets) == 0 {
			return s + " has no limits: the next packet passes"
		}
		return s + ": every bucket on the path has room, the next packet passes"
	}
	for _, b := range e.Buckets {
		if b.Admits {
			continue
		}
		if maps.ReasonName(path.Reason) != kindReason[b.Kind] {
			continue
		}
		avail := ""
		if b.Packets != nil {
			avail = fmt.Sprintf(" (%.2f of %.0f packets available)", b.Packets.Available, b.Packets.Burst)
		}
		if b.ReserveRefuses {
			rsv := ""
			if b.Packets != nil {
				rsv = fmt.Sprintf(" (%.2f of %.0f packets available, the last %.0f only for established and validated sources)",
					b.Packets.Available, b.Packets.Burst, b.Packets.Reserve)
			}
			return fmt.Sprintf("%s: its %s bucket %s is in its reserve band%s and the source is %s: the next packet %s (%s)",
				s, b.Kind, b.Key, rsv, e.Standing.Standing, verb, e.Reason)
		}
		return fmt.Sprintf("%s: its %s bucket %s is empty%s: the next packet %s (%s)", s, b.Kind, b.Key, avail, verb, e.Reason)
	}
	return s + ": the next packet " + verb + " (" + e.Reason + ")"
}

var kindReason = map[string]string{
	string(maps.BucketSource): "source_limit", string(maps.BucketPrefix): "prefix_limit",
	string(maps.BucketASN): "asn_limit", string(maps.BucketGlobal): "global_limit",
}

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
			Rule: names[t.s.RuleID], Proto: t.s.Proto, SPort: t.s.SPort, DPort: t.s.DPort, Len: t.s.Len,
		})
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}
