package daemon

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// snapshot is one reading of the counters.
type snapshot struct {
	at    time.Time
	slots [maps.IfaceSlots]maps.Counters
	total maps.Counters
	rules map[uint32]maps.RuleCounters
}

// history keeps the last few counter readings, for rates.
type history struct {
	mu   sync.Mutex
	ring []snapshot
	size int
}

func newHistory(size int) *history { return &history{size: size} }

func (h *history) add(s snapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ring = append(h.ring, s)
	if len(h.ring) > h.size {
		h.ring = h.ring[1:]
	}
}

// span returns the newest reading and the oldest one at most window older.
func (h *history) span(window time.Duration) (old, cur snapshot, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ring) < 2 {
		return snapshot{}, snapshot{}, false
	}
	cur = h.ring[len(h.ring)-1]
	old = h.ring[len(h.ring)-2]
	for i := len(h.ring) - 2; i >= 0; i-- {
		if cur.at.Sub(h.ring[i].at) > window {
			break
		}
		old = h.ring[i]
	}
	return old, cur, true
}

// counterWatch is the counters subsystem: a reading of the verdict
// counters each second into history (rates for stats, the offered rate
// for BGP's automatic blackhole), and the counter lines on Out. It
// follows the committed generation for the rules whose counters it reads;
// it writes no map.
type counterWatch struct {
	log      *slog.Logger
	store    *maps.CounterStore // nil before the data plane loads
	history  *history
	out      io.Writer // counter lines every interval; nil: none
	interval time.Duration

	mu  sync.Mutex // guards ids; a leaf
	ids []uint32   // the followed generation's rule ids
}

// follow takes the committed generation's rule ids. It cannot fail.
func (c *counterWatch) follow(_ context.Context, gen committed) error {
	ids := make([]uint32, 0, len(gen.run.names))
	for id := range gen.run.names {
		ids = append(ids, id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ids = ids
	return nil
}

func (c *counterWatch) snapshot() (snapshot, error) {
	s := snapshot{at: time.Now()}
	var err error
	if s.slots, err = c.store.BySlot(); err != nil {
		return s, err
	}
	for _, c := range s.slots {
		for a := range c {
			for r := range c[a] {
				s.total[a][r].Packets += c[a][r].Packets
				s.total[a][r].Bytes += c[a][r].Bytes
			}
		}
	}
	c.mu.Lock()
	ids := c.ids
	c.mu.Unlock()
	if s.rules, err = c.store.Rules(ids); err != nil {
		return s, err
	}
	return s, nil
}

// run reads the counters every second for rates, and prints a counters
// line every interval.
func (c *counterWatch) run(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	lastLine := time.Now()
	out := c.out
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s, err := c.snapshot()
		if err != nil {
			c.log.Error("read counters", "err", err)
			continue
		}
		c.history.add(s)
		if c.interval > 0 && out != nil && time.Since(lastLine) >= c.interval {
			if old, cur, ok := c.history.span(c.interval); ok {
				occ, _ := c.store.Tables()
				if _, err := fmt.Fprintln(out, CounterLine(old.total, cur.total, cur.at.Sub(old.at), occ)); err != nil {
					// Stdout went away (edgectl run | head -1): the
					// daemon goes on enforcing, without counter lines.
					c.log.Warn("counter lines stopped: stdout is gone; the daemon keeps running", "err", err)
					out = nil
				}
			}
			lastLine = time.Now()
		}
	}
}

// offeredRate is every byte the data plane saw (passed, dropped, any
// reason) per second over about the last second, from the counters.
func (c *counterWatch) offeredRate() (float64, bool) {
	old, cur, ok := c.history.span(time.Second)
	dt := cur.at.Sub(old.at).Seconds()
	if !ok || dt <= 0 {
		return 0, false
	}
	var sum uint64
	for a := range cur.total {
		for r := range cur.total[a] {
			sum += cur.total[a][r].Bytes - old.total[a][r].Bytes
		}
	}
	return float64(sum) / dt, true
}

// CounterLine formats one line of rates between two counter readings.
func CounterLine(prev, cur maps.Counters, dt time.Duration, occ map[string]maps.Occupancy) string {
	sec := dt.Seconds()
	if sec <= 0 {
		sec = 1
	}
	rate := func(a maps.Action, r maps.Reason) float64 {
		return float64(cur.Get(a, r).Packets-prev.Get(a, r).Packets) / sec
	}
	total := func(a maps.Action) float64 {
		return float64(cur.Total(a).Packets-prev.Total(a).Packets) / sec
	}
	line := fmt.Sprintf("pass %.0f/s  drop %.0f/s (deny %.0f, source %.0f, prefix %.0f, asn %.0f, global %.0f, "+
		"fingerprint %.0f, shield %.0f, fleet %.0f, override %.0f)  would-drop %.0f/s",
		total(maps.ActPass), total(maps.ActDrop),
		rate(maps.ActDrop, maps.ReasonDeny), rate(maps.ActDrop, maps.ReasonSrcLimit),
		rate(maps.ActDrop, maps.ReasonPrefixLimit), rate(maps.ActDrop, maps.ReasonASNLimit),
		rate(maps.ActDrop, maps.ReasonGlobalLimit), rate(maps.ActDrop, maps.ReasonFingerprint),
		rate(maps.ActDrop, maps.ReasonShieldTighten), rate(maps.ActDrop, maps.ReasonFleetShare),
		rate(maps.ActDrop, maps.ReasonOverride), total(maps.ActWouldDrop))
	if o, ok := occ["sources"]; ok {
		line += fmt.Sprintf("  sources %d/%d", o.Entries, o.Capacity)
	}
	return line
}

// Stats builds the answer of `edgectl stats`.
func (d *Daemon) Stats() (control.Stats, error) {
	const window = 5 * time.Second
	old, cur, ok := d.counters.history.span(window)
	if !ok {
		s, err := d.counters.snapshot()
		if err != nil {
			return control.Stats{}, err
		}
		old, cur = s, s
	}
	st := buildStats(old, cur, d.ruleNames(), d.counters.tables())
	if s, err := d.standing.stats(); err == nil {
		st.Standing = s
	}
	st.SYN = d.synStats()
	st.Sampler = d.samples.stats()
	st.L7 = d.l7.stats()
	st.L7Classes = d.l7.classes()
	return st, nil
}

func (d *Daemon) ruleNames() map[uint32]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cur.names
}

// tables are the data plane's tables' fill.
func (c *counterWatch) tables() map[string]control.Fill {
	occ, err := c.store.Tables()
	if err != nil {
		return nil
	}
	out := map[string]control.Fill{}
	for k, v := range occ {
		out[k] = control.Fill{Entries: v.Entries, Capacity: v.Capacity}
	}
	return out
}

// buildStats is pure, so its JSON can be golden-tested.
func buildStats(old, cur snapshot, names map[uint32]string, tables map[string]control.Fill) control.Stats {
	dt := cur.at.Sub(old.at).Seconds()
	per := func(a, b uint64) float64 {
		if dt <= 0 {
			return 0
		}
		return float64(b-a) / dt
	}
	st := control.Stats{Window: control.Duration(cur.at.Sub(old.at).Round(time.Millisecond)), Tables: tables}
	for a := range cur.total {
		for r := range cur.total[a] {
			c, o := cur.total[a][r], old.total[a][r]
			if c.Packets == 0 {
				continue
			}
			st.Totals = append(st.Totals, control.CounterStat{
				Action: maps.ActionName(maps.Action(a)), Reason: maps.ReasonName(maps.Reason(r)),
				Packets: c.Packets, Bytes: c.Bytes,
				PacketRate: per(o.Packets, c.Packets), ByteRate: per(o.Bytes, c.Bytes),
			})
		}
	}
	for id, name := range names {
		c, o := cur.rules[id], old.rules[id]
		st.Rules = append(st.Rules, control.RuleStat{
			Rule: name, ID: id,
			Passed: c[maps.ActPass].Packets, Dropped: c[maps.ActDrop].Packets, WouldDrop: c[maps.ActWouldDrop].Packets,
			PassedRate:    per(o[maps.ActPass].Packets, c[maps.ActPass].Packets),
			DroppedRate:   per(o[maps.ActDrop].Packets, c[maps.ActDrop].Packets),
			WouldDropRate: per(o[maps.ActWouldDrop].Packets, c[maps.ActWouldDrop].Packets),
		})
	}
	slices.SortFunc(st.Rules, func(a, b control.RuleStat) int { return cmp.Compare(a.Rule, b.Rule) })
	return st
}

// topTalkers counts samples per second, per source, prefix, ASN, reason
// and rule, each split by action: a dry-run rule's would-drops are never
// counted as drops.
type topTalkers struct {
	mu      sync.Mutex
	keep    time.Duration
	seconds []topSecond
}

// topKind is which table a count belongs to.
type topKind uint8

const (
	topSource topKind = iota
	topPrefix
	topASN
	topReason
	topRule // key: the rule's table slot, named at report time
)

type topKey struct {
	kind   topKind
	key    string
	action maps.Action
}

type topSecond struct {
	at     int64 // unix second
	n      uint64
	counts map[topKey]uint64
}

func newTopTalkers(keep time.Duration) *topTalkers { return &topTalkers{keep: keep} }

// sourcePrefix is the aggregate a source is reported under: /24 or /48.
func sourcePrefix(a netip.Addr) netip.Prefix {
	bits := 48
	if a.Is4() {
		bits = 24
	}
	p, _ := a.Prefix(bits)
	return p
}

func (t *topTalkers) add(now time.Time, s maps.Sample) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sec := now.Unix()
	if len(t.seconds) == 0 || t.seconds[len(t.seconds)-1].at != sec {
		t.seconds = append(t.seconds, topSecond{at: sec, counts: map[topKey]uint64{}})
		cut := 0
		for cut < len(t.seconds) && time.Duration(sec-t.seconds[cut].at)*time.Second > t.keep {
			cut++
		}
		t.seconds = t.seconds[cut:]
	}
	b := &t.seconds[len(t.seconds)-1]
	b.n++
	a := s.Action
	b.counts[topKey{topSource, s.Source.String(), a}]++
	b.counts[topKey{topPrefix, sourcePrefix(s.Source).String(), a}]++
	if s.ASN != 0 {
		b.counts[topKey{topASN, "AS" + strconv.FormatUint(uint64(s.ASN), 10), a}]++
	}
	b.counts[topKey{topReason, maps.ReasonName(s.Reason), a}]++
	b.counts[topKey{topRule, strconv.FormatUint(uint64(s.RuleSlot), 10), a}]++
}

// report sums the window; ruleName names a rule table slot ("" for a slot
// that holds no rule of the live generation).
func (t *topTalkers) report(now time.Time, window time.Duration, n int, ruleName func(slot uint32) string) control.Top {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := control.Top{Window: control.Duration(window)}
	sums := map[topKind]map[[2]string]uint64{}
	for k := topSource; k <= topRule; k++ {
		sums[k] = map[[2]string]uint64{}
	}
	for _, b := range t.seconds {
		if time.Duration(now.Unix()-b.at)*time.Second >= window {
			continue
		}
		out.Samples += b.n
		for k, v := range b.counts {
			key := k.key
			if k.kind == topRule {
				slot, _ := strconv.ParseUint(key, 10, 32)
				key = cmp.Or(ruleName(uint32(slot)), "slot "+key)
			}
			sums[k.kind][[2]string{key, maps.ActionName(k.action)}] += v
		}
	}
	out.Sources = topN(sums[topSource], out.Samples, n)
	out.Prefixes = topN(sums[topPrefix], out.Samples, n)
	out.ASNs = topN(sums[topASN], out.Samples, n)
	out.Reasons = topN(sums[topReason], out.Samples, n)
	out.Rules = topN(sums[topRule], out.Samples, n)
	return out
}

func topN(m map[[2]string]uint64, total uint64, n int) []control.TopEntry {
	out := make([]control.TopEntry, 0, len(m))
	for k, v := range m {
		out = append(out, control.TopEntry{Key: k[0], Action: k[1], Samples: v, Share: float64(v) / float64(max(total, 1))})
	}
	slices.SortFunc(out, func(a, b control.TopEntry) int {
		if c := cmp.Compare(b.Samples, a.Samples); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Action, b.Action))
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
