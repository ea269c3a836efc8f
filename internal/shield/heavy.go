package shield

import (
	"fmt"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"
)

// FieldMask says which header fields a fingerprint matches.
type FieldMask uint32

// Fingerprint fields.
const (
	FProto FieldMask = 1 << iota
	FDPort
	FSPort
	FLen
	FTTL
	FTCPFlags
	FSrc // the source's /24 (IPv4) or /48 (IPv6)
)

var fieldNames = []string{"proto", "dport", "sport", "len", "ttl", "tcp_flags", "src"}

func (m FieldMask) String() string {
	var parts []string
	for i, n := range fieldNames {
		if m&(1<<i) != 0 {
			parts = append(parts, n)
		}
	}
	return strings.Join(parts, "+")
}

// Fields is how many fields the mask matches.
func (m FieldMask) Fields() int { return bits.OnesCount32(uint32(m)) }

// Masks are the field combinations the shield searches. They are more
// than the data plane holds at once (Options.MaxMasks): the shield uses at
// most that many distinct ones. Every one includes the protocol: a
// fingerprint never spans protocols.
var Masks = []FieldMask{
	FProto | FDPort,
	FProto | FDPort | FLen,
	FProto | FDPort | FTTL,
	FProto | FDPort | FLen | FTTL,
	FProto | FDPort | FTCPFlags,
	FProto | FDPort | FLen | FTCPFlags,
	FProto | FSPort,
	FProto | FSPort | FLen,
	FProto | FLen,
	FProto | FLen | FTTL,
	FProto | FSrc,
	FProto | FDPort | FSrc,
}

// Fingerprint is a header-field combination: the fields of Mask are set.
type Fingerprint struct {
	Mask     FieldMask    `json:"mask"`
	Proto    uint8        `json:"proto,omitempty"`
	DPort    uint16       `json:"dport,omitempty"`
	SPort    uint16       `json:"sport,omitempty"`
	Len      uint16       `json:"len,omitempty"`
	TTL      uint8        `json:"ttl,omitempty"`
	TCPFlags uint8        `json:"tcp_flags,omitempty"`
	Src      netip.Prefix `json:"src,omitzero"`
}

func (f Fingerprint) String() string {
	var parts []string
	add := func(m FieldMask, s string) {
		if f.Mask&m != 0 {
			parts = append(parts, s)
		}
	}
	add(FProto, "proto "+ProtoName(f.Proto))
	add(FDPort, "dport "+strconv.Itoa(int(f.DPort)))
	add(FSPort, "sport "+strconv.Itoa(int(f.SPort)))
	add(FLen, "len "+strconv.Itoa(int(f.Len)))
	add(FTTL, "ttl "+strconv.Itoa(int(f.TTL)))
	add(FTCPFlags, fmt.Sprintf("tcp_flags 0x%02x", f.TCPFlags))
	add(FSrc, "src "+f.Src.String())
	return strings.Join(parts, " ")
}

// Matches reports whether a sample has the fingerprint's fields.
func (f Fingerprint) Matches(s Sample) bool { return project(s, f.Mask) == f }

func (f Fingerprint) matchesExcept(s Sample, unknown FieldMask) bool {
	m := f.Mask &^ unknown
	g := f
	g.Mask = m
	return project(s, m) == project(sampleOf(g), m)
}

// sampleOf is a sample with a fingerprint's fields.
func sampleOf(f Fingerprint) Sample {
	return Sample{Proto: f.Proto, DPort: f.DPort, SPort: f.SPort, Len: f.Len, TTL: f.TTL, TCPFlags: f.TCPFlags, Src: f.Src.Addr()}
}

// project keeps the fields of mask of a sample.
func project(s Sample, m FieldMask) Fingerprint {
	f := Fingerprint{Mask: m}
	if m&FProto != 0 {
		f.Proto = s.Proto
	}
	if m&FDPort != 0 {
		f.DPort = s.DPort
	}
	if m&FSPort != 0 {
		f.SPort = s.SPort
	}
	if m&FLen != 0 {
		f.Len = s.Len
	}
	if m&FTTL != 0 {
		f.TTL = s.TTL
	}
	if m&FTCPFlags != 0 {
		f.TCPFlags = s.TCPFlags
	}
	if m&FSrc != 0 {
		b := 24
		if s.Src.Is6() && !s.Src.Is4In6() {
			b = 48
		}
		f.Src, _ = s.Src.Unmap().Prefix(b)
	}
	return f
}

// spaceSaving is the Space-Saving heavy-hitter summary (Metwally, Agrawal,
// El Abbadi 2005) over weighted items: at most k counters; an item not
// held replaces the smallest, inheriting its count as error. Any item
// whose weight exceeds total/k is held, and count-err <= true <= count.
// The counters are a binary min-heap on count with an index, so an update
// costs O(log k).
type spaceSaving[K comparable] struct {
	k     int
	heap  []*ssEntry[K]
	index map[K]*ssEntry[K]
	total float64
}

type ssEntry[K comparable] struct {
	key        K
	count, err float64
	pos        int // in heap
}

func newSpaceSaving[K comparable](k int) *spaceSaving[K] {
	return &spaceSaving[K]{k: k, index: make(map[K]*ssEntry[K], k)}
}

func (s *spaceSaving[K]) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.heap[i].pos, s.heap[j].pos = i, j
}

func (s *spaceSaving[K]) down(i int) {
	for {
		l, small := 2*i+1, i
		if l < len(s.heap) && s.heap[l].count < s.heap[small].count {
			small = l
		}
		if r := l + 1; r < len(s.heap) && s.heap[r].count < s.heap[small].count {
			small = r
		}
		if small == i {
			return
		}
		s.swap(i, small)
		i = small
	}
}

func (s *spaceSaving[K]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if s.heap[p].count <= s.heap[i].count {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *spaceSaving[K]) add(key K, w float64) {
	s.total += w
	if e, ok := s.index[key]; ok {
		e.count += w
		s.down(e.pos)
		return
	}
	if len(s.heap) < s.k {
		e := &ssEntry[K]{key: key, count: w, pos: len(s.heap)}
		s.heap = append(s.heap, e)
		s.index[key] = e
		s.up(e.pos)
		return
	}
	m := s.heap[0] // reused for the newcomer
	delete(s.index, m.key)
	m.key, m.err, m.count = key, m.count, m.count+w
	s.index[key] = m
	s.down(0)
}

// bound is the most an item may have: its count if held, else the
// smallest count (0 while the summary is not full).
func (s *spaceSaving[K]) bound(key K) float64 {
	if e, ok := s.index[key]; ok {
		return e.count
	}
	if len(s.heap) < s.k {
		return 0
	}
	return max(s.heap[0].count, 0)
}

// top is the held item with the highest guaranteed weight (count-err).
func (s *spaceSaving[K]) top() (K, float64, bool) {
	var best K
	bestW, found := -1.0, false
	for _, e := range s.heap {
		if w := e.count - e.err; w > bestW {
			best, bestW, found = e.key, w, true
		}
	}
	return best, bestW, found
}

// decay scales every count alike: the heap's order stays.
func (s *spaceSaving[K]) decay(f float64) {
	s.total *= f
	for i := range s.heap {
		s.heap[i].count *= f
		s.heap[i].err *= f
	}
}

// fingerprints holds one Space-Saving summary per mask.
type fingerprints struct{ byMask []*spaceSaving[Fingerprint] }

func newFingerprints(k int) *fingerprints {
	f := &fingerprints{}
	for range Masks {
		f.byMask = append(f.byMask, newSpaceSaving[Fingerprint](k))
	}
	return f
}

func (f *fingerprints) add(s Sample) {
	for i, m := range Masks {
		f.byMask[i].add(project(s, m), s.Weight)
	}
}

func (f *fingerprints) decay(x float64) {
	for _, ss := range f.byMask {
		ss.decay(x)
	}
}

// Candidate is a fingerprint proposed for a surge.
type Candidate struct {
	Fingerprint Fingerprint
	// Coverage is the share of the surge's excess weight the fingerprint
	// is guaranteed to match (Space-Saving's lower bound), at most 1.
	Coverage float64
	// Collateral is the most of the baseline traffic (the weight of
	// samples taken outside surges) it may match, as a share.
	Collateral float64
	// BaseRate is the most baseline traffic per second it may match.
	BaseRate float64
}

// maskSlot is what the data plane holds one mask slot per distinct value
// of: the fields, and with FSrc the prefix length as the data plane keys
// it (an IPv4 prefix as IPv4-mapped IPv6: /24 is 120, /48 is 48).
type maskSlot struct {
	mask    FieldMask
	srcBits int
}

func (f Fingerprint) slot() maskSlot {
	s := maskSlot{mask: f.Mask}
	if f.Mask&FSrc != 0 && f.Src.IsValid() {
		s.srcBits = f.Src.Bits()
		if f.Src.Addr().Is4() {
			s.srcBits += 96
		}
	}
	return s
}

// best picks the fingerprint for a surge: among masks whose top item
// covers at least minCoverage of the excess and at most maxCollateral of
// the baseline, the highest coverage minus collateral; near ties (within
// 0.02) go to a mask the data plane holds already (inUse), then to the
// mask with more fields, which matches less besides the flood. With full
// (every mask slot taken) only masks in inUse qualify; noSlot reports
// that one did not qualify for that reason alone and nothing else did.
// excess is the surge's weight above baseline in the summary's window;
// base is the baseline summary; baseSeconds converts its decayed weights
// to rates.
func (f *fingerprints) best(excess float64, base *fingerprints, baseSeconds, minCoverage, maxCollateral float64,
	inUse map[maskSlot]bool, full bool) (best Candidate, found, noSlot bool) {
	score := func(c Candidate) float64 { return c.Coverage - c.Collateral }
	reuses := func(c Candidate) bool { return inUse[c.Fingerprint.slot()] }
	for i := range Masks {
		fp, w, ok := f.byMask[i].top()
		if !ok || excess <= 0 {
			continue
		}
		c := Candidate{Fingerprint: fp, Coverage: min(w/excess, 1)}
		if bt := base.byMask[i].total; bt > 0 {
			b := base.byMask[i].bound(fp)
			c.Collateral = b / bt
			c.BaseRate = b / baseSeconds
		}
		if c.Coverage < minCoverage || c.Collateral > maxCollateral {
			continue
		}
		if full && !reuses(c) {
			noSlot = true
			continue
		}
		near := score(c) >= score(best)-0.02 && score(c) <= score(best)+0.02
		switch {
		case !found, score(c) > score(best)+0.02,
			near && reuses(c) && !reuses(best),
			near && reuses(c) == reuses(best) && c.Fingerprint.Mask.Fields() > best.Fingerprint.Mask.Fields():
			best, found = c, true
		}
	}
	return best, found, noSlot && !found
}
