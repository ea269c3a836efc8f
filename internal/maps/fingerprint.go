package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// FieldMask says which header fields a fingerprint matches (enum
// eg_fp_field).
type FieldMask uint32

// Fingerprint fields.
const (
	FieldProto    = FieldMask(loader.LimiterEgFpFieldEG_FP_PROTO)
	FieldDPort    = FieldMask(loader.LimiterEgFpFieldEG_FP_DPORT) // ICMP: the type
	FieldSPort    = FieldMask(loader.LimiterEgFpFieldEG_FP_SPORT)
	FieldLen      = FieldMask(loader.LimiterEgFpFieldEG_FP_LEN) // IP total length
	FieldTTL      = FieldMask(loader.LimiterEgFpFieldEG_FP_TTL) // TTL or hop limit
	FieldTCPFlags = FieldMask(loader.LimiterEgFpFieldEG_FP_TCP_FLAGS)
	FieldSrc      = FieldMask(loader.LimiterEgFpFieldEG_FP_SRC) // source prefix (Fingerprint.Src)
	fieldAll      = FieldMask(loader.LimiterEgFpFieldEG_FP_ALL)
)

// MaxFingerprintMasks is how many distinct masks (FieldMask with the source
// prefix length) may be in use at once: each costs one hash lookup for a
// packet the prefilter does not rule out of it.
const MaxFingerprintMasks = int(loader.LimiterEgFpFieldEG_FP_MAX_MASKS)

// Fingerprint is a data-plane rule over header fields with its own bucket.
// It applies to packets of limit rules, after the deny and allow lists and
// before every bucket; a packet it refuses is dropped with reason
// fingerprint. Validated sources are never dropped by a fingerprint.
type Fingerprint struct {
	ID    uint32
	Mask  FieldMask
	Proto uint8
	DPort uint16
	SPort uint16
	Len   uint16 // IP total length
	TTL   uint8
	// TCPFlags are the whole flags byte (CWR ... FIN), matched exactly.
	TCPFlags uint8
	Src      netip.Prefix // with FieldSrc
	// Budget is the fingerprint's own bucket; zero Count: every match is
	// refused (with DryRun: counted only).
	Budget  Rate
	DryRun  bool // monitor mode: count would-drops, never drop
	Expires time.Time
	Origin  Origin
}

// FingerprintState is a fingerprint as read back, with its counters.
type FingerprintState struct {
	Fingerprint
	Matched Counter // packets that matched
	Dropped Counter // refused by its bucket and dropped (would-dropped for DryRun)
	Spared  Counter // refused, but from a validated source: passed
}

// ErrFingerprintMasks means a fingerprint would need a mask beyond
// MaxFingerprintMasks distinct ones.
var ErrFingerprintMasks = errors.New("too many distinct fingerprint masks")

func (f Fingerprint) key() (loader.LimiterEgFpKey, error) {
	k := loader.LimiterEgFpKey{Fields: uint32(f.Mask)}
	if f.Mask == 0 || f.Mask&^fieldAll != 0 {
		return k, fmt.Errorf("fingerprint %d: mask %#x: want fields among proto, dport, sport, len, ttl, tcp flags, src", f.ID, f.Mask)
	}
	if f.Mask&FieldProto != 0 {
		k.Proto = f.Proto
	}
	if f.Mask&FieldDPort != 0 {
		k.Dport = f.DPort
	}
	if f.Mask&FieldSPort != 0 {
		k.Sport = f.SPort
	}
	if f.Mask&FieldLen != 0 {
		k.Len = f.Len
	}
	if f.Mask&FieldTTL != 0 {
		k.Ttl = f.TTL
	}
	if f.Mask&FieldTCPFlags != 0 {
		k.TcpFlags = f.TCPFlags
	}
	if f.Mask&FieldSrc != 0 {
		if !f.Src.IsValid() || f.Src.Addr().Is4In6() {
			return k, fmt.Errorf("fingerprint %d: field src needs a prefix (IPv4 written as IPv4)", f.ID)
		}
		lk := LPMKey(f.Src)
		k.SrcLen = uint8(lk.Prefixlen)
		k.Addr = lk.Addr
	}
	return k, nil
}

func fingerprintFrom(k loader.LimiterEgFpKey, v loader.LimiterEgFpVal, clock monoOffset) Fingerprint {
	f := Fingerprint{
		ID: v.Id, Mask: FieldMask(k.Fields), Proto: k.Proto, DPort: k.Dport, SPort: k.Sport, Len: k.Len, TTL: k.Ttl,
		TCPFlags: k.TcpFlags, Budget: rateFromCfg(v.Budget), DryRun: v.DryRun != 0, Expires: clock.toWall(v.Expires),
		Origin: Origin(v.Origin),
	}
	if f.Mask&FieldSrc != 0 {
		f.Src = PrefixFromKey(loader.LimiterEgLpmKey{Prefixlen: uint32(k.SrcLen), Addr: k.Addr})
	}
	return f
}

type fpEntry struct {
	k loader.LimiterEgFpKey
	v loader.LimiterEgFpVal
}

func (m *FingerprintStore) fpEntries() ([]fpEntry, error) {
	var out []fpEntry
	var e fpEntry
	it := m.o.FpRules.Iterate()
	for it.Next(&e.k, &e.v) {
		out = append(out, e)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read fingerprints: %w", err)
	}
	return out, nil
}

type fpMask struct {
	fields uint32
	srcLen uint8
}

func maskOf(k loader.LimiterEgFpKey) fpMask { return fpMask{k.Fields, k.SrcLen} }

// fpSlots is fp_masks as slots: a mask keeps its slot while it has
// fingerprints, since the prefilter's bits name slots.
type fpSlots [MaxFingerprintMasks]fpMask

func (m *FingerprintStore) readFpSlots() (fpSlots, error) {
	var cur loader.LimiterEgFpMasks
	var s fpSlots
	if err := m.o.FpMasks.Lookup(uint32(0), &cur); err != nil {
		return s, fmt.Errorf("read fingerprint masks: %w", err)
	}
	for i := 0; i < int(min(cur.N, uint32(MaxFingerprintMasks))); i++ {
		s[i] = fpMask{cur.Fields[i], cur.SrcLen[i]}
	}
	return s, nil
}

func (s fpSlots) slot(mk fpMask) int {
	for i, x := range s {
		if x == mk && x.fields != 0 {
			return i
		}
	}
	return -1
}

// writeFpSlots writes fp_masks. Callers change one slot at a time, a slot
// with no installed fingerprint, so a packet that reads the entry while
// it is written sees every other slot whole.
func (m *FingerprintStore) writeFpSlots(s fpSlots) error {
	var next loader.LimiterEgFpMasks
	for i, mk := range s {
		next.Fields[i], next.SrcLen[i] = mk.fields, mk.srcLen
		if mk.fields != 0 {
			next.N = uint32(i + 1)
		}
	}
	if err := m.o.FpMasks.Put(uint32(0), next); err != nil {
		return fmt.Errorf("write fingerprint masks: %w", err)
	}
	return nil
}

// The prefilter's layout (enum eg_fp_field, EG_FP_PRE_*).
const fpPreWords = uint32(loader.LimiterEgFpFieldEG_FP_PRE_WORDS)

type fpPreField struct {
	field FieldMask
	hdr   uint   // header byte
	base  uint32 // first word of the field's region
	value func(k *loader.LimiterEgFpKey) (uint32, bool)
}

var fpPreFields = []fpPreField{
	{FieldDPort, uint(loader.LimiterEgFpFieldEG_FP_PRE_H_DPORT), uint32(loader.LimiterEgFpFieldEG_FP_PRE_DPORT),
		func(k *loader.LimiterEgFpKey) (uint32, bool) { return uint32(k.Dport), true }},
	{FieldSPort, uint(loader.LimiterEgFpFieldEG_FP_PRE_H_SPORT), uint32(loader.LimiterEgFpFieldEG_FP_PRE_SPORT),
		func(k *loader.LimiterEgFpKey) (uint32, bool) { return uint32(k.Sport), true }},
	{FieldLen, uint(loader.LimiterEgFpFieldEG_FP_PRE_H_LEN), uint32(loader.LimiterEgFpFieldEG_FP_PRE_LEN),
		func(k *loader.LimiterEgFpKey) (uint32, bool) { return uint32(k.Len), true }},
	{FieldTTL, uint(loader.LimiterEgFpFieldEG_FP_PRE_H_TTL), uint32(loader.LimiterEgFpFieldEG_FP_PRE_TTL),
		func(k *loader.LimiterEgFpKey) (uint32, bool) { return uint32(k.Ttl), true }},
	{FieldTCPFlags, uint(loader.LimiterEgFpFieldEG_FP_PRE_H_TCP_FLAGS), uint32(loader.LimiterEgFpFieldEG_FP_PRE_TCP_FLAGS),
		func(k *loader.LimiterEgFpKey) (uint32, bool) { return uint32(k.TcpFlags), true }},
	{FieldSrc, uint(loader.LimiterEgFpFieldEG_FP_PRE_H_SRC), uint32(loader.LimiterEgFpFieldEG_FP_PRE_SRC), fpSrcIndex},
	{FieldProto, uint(loader.LimiterEgFpFieldEG_FP_PRE_H_PROTO), uint32(loader.LimiterEgFpFieldEG_FP_PRE_PROTO),
		func(k *loader.LimiterEgFpKey) (uint32, bool) { return uint32(k.Proto), true }},
}

var v4Mapped = [12]byte{10: 0xff, 11: 0xff}

// fpSrcIndex is the prefilter index every address of the key's prefix
// has (fp_src_index in C), if they share one: an IPv4 prefix of /16 or
// longer, or an IPv6 one of /32 or longer that starts with nonzero bits
// (so it holds no IPv4-mapped address).
func fpSrcIndex(k *loader.LimiterEgFpKey) (uint32, bool) {
	a := k.Addr
	if k.SrcLen >= 96+16 && [12]byte(a[:12]) == v4Mapped {
		return uint32(a[13])<<8 | uint32(a[12]), true
	}
	if k.SrcLen >= 32 && (a[0]|a[1]|a[2]|a[3]) != 0 {
		return (uint32(a[1])<<8 | uint32(a[0])) ^ (uint32(a[3])<<8 | uint32(a[2])), true
	}
	return 0, false
}

// fpPreWord is the word and bit of slot i for value v of field f.
func (f fpPreField) bit(v uint32, slot int) (uint32, uint64) {
	return f.base + v>>3, 1 << (8*(v&7) + uint32(slot))
}

// fpPre is what the prefilter must hold for a set of fingerprints.
type fpPre struct {
	header uint64
	words  map[uint32]uint64
}

func prefilterFor(slots fpSlots, entries []fpEntry) fpPre {
	p := fpPre{words: map[uint32]uint64{}}
	for _, e := range entries {
		i := slots.slot(maskOf(e.k))
		if i < 0 {
			continue // not looked up by the data plane either
		}
		p.header |= 1 << i
		for _, f := range fpPreFields {
			v, ok := f.value(&e.k)
			if FieldMask(e.k.Fields)&f.field == 0 || !ok {
				p.header |= 1 << (8*f.hdr + uint(i))
				continue
			}
			w, b := f.bit(v, i)
			p.words[w] |= b
		}
	}
	return p
}

// preWords are the prefilter words the entries' values are in.
func preWords(slots fpSlots, entries ...fpEntry) map[uint32]bool {
	out := map[uint32]bool{}
	for _, e := range entries {
		i := max(slots.slot(maskOf(e.k)), 0)
		for _, f := range fpPreFields {
			if v, ok := f.value(&e.k); ok && FieldMask(e.k.Fields)&f.field != 0 {
				w, _ := f.bit(v, i)
				out[w] = true
			}
		}
	}
	return out
}

// writePrefilter makes the prefilter's header and the given words (all,
// if nil) what entries need. Called with entries a superset of the
// installed fingerprints (before adding, after removing), every bit a
// packet reads, old or new, covers what is installed. The prefilter is one
// map value (fp_pre_words), read and written whole: the kernel copies a
// written value over the old in place, so a packet may read each byte old
// or new, and each byte is one value's slots, so either covers what is
// installed. A whole rebuild writes the value words first and the header,
// which turns the slots on, in a second write.
func (m *FingerprintStore) writePrefilter(slots fpSlots, entries []fpEntry, words map[uint32]bool) error {
	want := prefilterFor(slots, entries)
	cur := new(loader.LimiterEgFpPre)
	if err := m.o.FpPreWords.Lookup(uint32(0), cur); err != nil {
		return fmt.Errorf("read fingerprint prefilter: %w", err)
	}
	next := new(loader.LimiterEgFpPre)
	*next = *cur
	if words == nil {
		for w := uint32(1); w < fpPreWords; w++ {
			next.W[w] = want.words[w]
		}
	} else {
		for w := range words {
			next.W[w] = want.words[w]
		}
	}
	if words == nil && next.W != cur.W {
		if err := m.o.FpPreWords.Put(uint32(0), next); err != nil {
			return fmt.Errorf("write fingerprint prefilter: %w", err)
		}
	}
	next.W[0] = want.header
	if next.W == cur.W {
		return nil
	}
	if err := m.o.FpPreWords.Put(uint32(0), next); err != nil {
		return fmt.Errorf("write fingerprint prefilter: %w", err)
	}
	return nil
}

// checkPrefilter rebuilds the whole prefilter if a fingerprint's slot is
// not on in it: pins of a version without the prefilter, which the
// program of this one would not look up.
func (m *FingerprintStore) checkPrefilter(slots fpSlots, entries []fpEntry) error {
	cur := new(loader.LimiterEgFpPre)
	if err := m.o.FpPreWords.Lookup(uint32(0), cur); err != nil {
		return fmt.Errorf("read fingerprint prefilter: %w", err)
	}
	want := prefilterFor(slots, entries)
	if want.header&0xff&^cur.W[0] == 0 {
		return nil
	}
	return m.writePrefilter(slots, entries, nil)
}

// freeFpSlots frees the slots no entry uses (their fingerprints are gone).
func (m *FingerprintStore) freeFpSlots(slots fpSlots, entries []fpEntry) (fpSlots, error) {
	used := map[fpMask]bool{}
	for _, e := range entries {
		used[maskOf(e.k)] = true
	}
	for i, mk := range slots {
		if mk.fields == 0 || used[mk] {
			continue
		}
		slots[i] = fpMask{}
		if err := m.writeFpSlots(slots); err != nil {
			return slots, err
		}
	}
	return slots, nil
}

// SetFingerprint installs or replaces fingerprint f.ID. A replaced
// fingerprint with the same fields and budget keeps its bucket's state and
// its counters. The order keeps every installed fingerprint matched: its
// mask's slot and the prefilter first, the rule, then the old form of a
// replaced one is removed (unless the new form needs the old one's slot,
// the ninth: then the old form goes first).
func (m *FingerprintStore) Set(f Fingerprint) error {
	k, err := f.key()
	if err != nil {
		return err
	}
	clock, err := m.monoNow()
	if err != nil {
		return err
	}
	if f.Expires.IsZero() {
		return fmt.Errorf("fingerprint %d: no expiry", f.ID)
	}
	exp, ok := clock.toMono(f.Expires)
	if !ok {
		return fmt.Errorf("fingerprint %d: expiry %v is past", f.ID, f.Expires)
	}
	v := loader.LimiterEgFpVal{Expires: exp, Id: f.ID, Origin: uint32(f.Origin)}
	if f.DryRun {
		v.DryRun = 1
	}
	if f.Budget.Limited() {
		if v.Budget, err = rateCfg(f.Budget); err != nil {
			return fmt.Errorf("fingerprint %d budget: %w", f.ID, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	entries, err := m.fpEntries()
	if err != nil {
		return err
	}
	slots, err := m.readFpSlots()
	if err != nil {
		return err
	}
	if err := m.checkPrefilter(slots, entries); err != nil {
		return err
	}
	// Another key with this id is replaced: deleted after the new one is in.
	var stale []fpEntry
	var others []fpEntry // installed, neither stale nor the same key
	for _, e := range entries {
		switch {
		case e.k == k:
			if e.v.Budget == v.Budget {
				v.Bucket = e.v.Bucket
			}
		case e.v.Id == f.ID:
			stale = append(stale, e)
		default:
			others = append(others, e)
		}
	}
	replaced := len(stale) > 0
	mk := maskOf(k)
	slot := slots.slot(mk)
	if slot < 0 {
		slot = freeSlot(slots, entries)
		if slot < 0 && freeSlot(slots, others) >= 0 {
			// Only the old form of this fingerprint holds the slot
			// the new one needs: it goes first.
			if err := m.dropFingerprints(slots, entries, stale, nil); err != nil {
				return err
			}
			entries, stale = without(entries, stale), nil
			if slots, err = m.freeFpSlots(slots, entries); err != nil {
				return err
			}
			slot = freeSlot(slots, entries)
		}
		if slot < 0 {
			return fmt.Errorf("fingerprint %d: %w: %d in use, at most %d", f.ID, ErrFingerprintMasks, MaxFingerprintMasks, MaxFingerprintMasks)
		}
		slots[slot] = mk
		if err := m.writeFpSlots(slots); err != nil {
			return fmt.Errorf("fingerprint %d: %w", f.ID, err)
		}
	}
	e := fpEntry{k, v}
	with := append(without(entries, []fpEntry{e}), e)
	if err := m.writePrefilter(slots, with, preWords(slots, e)); err != nil {
		return fmt.Errorf("fingerprint %d: %w", f.ID, err)
	}
	if err := m.o.FpRules.Put(k, v); err != nil {
		// Take back what was added for it (a leftover bit would cost a
		// lookup, never a match).
		err = fmt.Errorf("write fingerprint %d: %w", f.ID, err)
		undo := m.writePrefilter(slots, entries, preWords(slots, e))
		_, undoSlots := m.freeFpSlots(slots, entries)
		return errors.Join(err, undo, undoSlots)
	}
	if len(stale) > 0 {
		if err := m.dropFingerprints(slots, with, stale, nil); err != nil {
			return err
		}
		with = without(with, stale)
		if _, err := m.freeFpSlots(slots, with); err != nil {
			return err
		}
	}
	if replaced {
		// Reset the counters only when the match changed.
		if err := m.o.FpStats.Delete(f.ID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("reset counters of fingerprint %d: %w", f.ID, err)
		}
	}
	ncpu, err := possibleCPUs()
	if err != nil {
		return err
	}
	zero := make([]loader.LimiterEgFpStats, ncpu)
	if err := m.o.FpStats.Update(f.ID, zero, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("create counters of fingerprint %d: %w", f.ID, err)
	}
	return nil
}

// freeSlot is the lowest slot no entry uses, or -1.
func freeSlot(slots fpSlots, entries []fpEntry) int {
	used := map[fpMask]bool{}
	for _, e := range entries {
		used[maskOf(e.k)] = true
	}
	for i, mk := range slots {
		if mk.fields == 0 || !used[mk] {
			return i
		}
	}
	return -1
}

// without is entries less those with a key in gone.
func without(entries, gone []fpEntry) []fpEntry {
	drop := map[loader.LimiterEgFpKey]bool{}
	for _, g := range gone {
		drop[g.k] = true
	}
	out := make([]fpEntry, 0, len(entries))
	for _, e := range entries {
		if !drop[e.k] {
			out = append(out, e)
		}
	}
	return out
}

// dropFingerprints deletes the gone rules (and, with stats, their
// counters), then narrows the prefilter to what is left of entries.
func (m *FingerprintStore) dropFingerprints(slots fpSlots, entries, gone []fpEntry, stats func(fpEntry) bool) error {
	for _, e := range gone {
		if err := m.o.FpRules.Delete(e.k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete fingerprint %d: %w", e.v.Id, err)
		}
		if stats != nil && stats(e) {
			if err := m.o.FpStats.Delete(e.v.Id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete counters of fingerprint %d: %w", e.v.Id, err)
			}
		}
	}
	return m.writePrefilter(slots, without(entries, gone), preWords(slots, gone...))
}

// DeleteFingerprint removes fingerprint id and its counters (no error if
// there is none).
func (m *FingerprintStore) Delete(id uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.deleteFingerprints(func(e fpEntry) bool { return e.v.Id == id })
}

func (m *FingerprintStore) deleteFingerprints(gone func(fpEntry) bool) error {
	entries, err := m.fpEntries()
	if err != nil {
		return err
	}
	slots, err := m.readFpSlots()
	if err != nil {
		return err
	}
	if err := m.checkPrefilter(slots, entries); err != nil {
		return err
	}
	var drop []fpEntry
	for _, e := range entries {
		if gone(e) {
			drop = append(drop, e)
		}
	}
	if err := m.dropFingerprints(slots, entries, drop, func(fpEntry) bool { return true }); err != nil {
		return err
	}
	_, err = m.freeFpSlots(slots, without(entries, drop))
	return err
}

// PruneFingerprints deletes expired fingerprints (the data plane ignores
// them already) and frees their masks.
func (m *FingerprintStore) Prune() (int, error) {
	ns, err := m.clockNS()
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	err = m.deleteFingerprints(func(e fpEntry) bool {
		if e.v.Expires <= ns {
			n++
			return true
		}
		return false
	})
	return n, err
}

// Fingerprints returns the live (unexpired) fingerprints with their
// counters, summed over CPUs.
func (m *FingerprintStore) All() ([]FingerprintState, error) {
	entries, err := m.fpEntries()
	if err != nil {
		return nil, err
	}
	clock, err := m.monoNow()
	if err != nil {
		return nil, err
	}
	out := make([]FingerprintState, 0, len(entries))
	for _, e := range entries {
		if e.v.Expires <= clock.mono {
			continue
		}
		st := FingerprintState{Fingerprint: fingerprintFrom(e.k, e.v, clock)}
		var per []loader.LimiterEgFpStats
		if err := m.o.FpStats.Lookup(e.v.Id, &per); err == nil {
			for _, c := range per {
				st.Matched.Packets += c.Matched.Packets
				st.Matched.Bytes += c.Matched.Bytes
				st.Dropped.Packets += c.Dropped.Packets
				st.Dropped.Bytes += c.Dropped.Bytes
				st.Spared.Packets += c.Spared.Packets
				st.Spared.Bytes += c.Spared.Bytes
			}
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, fmt.Errorf("read counters of fingerprint %d: %w", e.v.Id, err)
		}
		out = append(out, st)
	}
	return out, nil
}

// MaxFingerprintID is the largest id among the fingerprints in the map,
// expired ones included, and their counters (0: none). A daemon that
// starts over pinned maps numbers its new fingerprints above it, so none
// replaces a fingerprint from before, or starts on its counters.
func (m *FingerprintStore) MaxID() (uint32, error) {
	entries, err := m.fpEntries()
	if err != nil {
		return 0, err
	}
	var top uint32
	for _, e := range entries {
		top = max(top, e.v.Id)
	}
	var id uint32
	var per []loader.LimiterEgFpStats
	it := m.o.FpStats.Iterate()
	for it.Next(&id, &per) {
		top = max(top, id)
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("read fingerprint counters: %w", err)
	}
	return top, nil
}

// ReasonFingerprint is the reason of a packet a fingerprint dropped.
const ReasonFingerprint = loader.LimiterEgReasonEG_R_FINGERPRINT

// FingerprintSlot is a mask slot in use: its fields and source prefix
// length (Mask and Src's bits of the fingerprints in it).
type FingerprintSlot struct {
	Slot   int
	Mask   FieldMask
	SrcLen int // in the 128-bit space (IPv4 /24 is 120); 0 without FieldSrc
}

// FingerprintSlots returns the mask slots in use, in slot order.
func (m *FingerprintStore) Slots() ([]FingerprintSlot, error) {
	s, err := m.readFpSlots()
	if err != nil {
		return nil, err
	}
	var out []FingerprintSlot
	for i, mk := range s {
		if mk.fields == 0 {
			continue
		}
		out = append(out, FingerprintSlot{Slot: i, Mask: FieldMask(mk.fields), SrcLen: int(mk.srcLen)})
	}
	return out, nil
}

// SlotOf is the mask slot a fingerprint is in (-1: none).
func SlotOf(slots []FingerprintSlot, f Fingerprint) int {
	k, err := f.key()
	if err != nil {
		return -1
	}
	for _, s := range slots {
		if uint32(s.Mask) == k.Fields && uint8(s.SrcLen) == k.SrcLen {
			return s.Slot
		}
	}
	return -1
}

// MaskName is a mask's fields ("proto dport len").
func MaskName(mask FieldMask) string {
	var parts []string
	for _, f := range []struct {
		m    FieldMask
		name string
	}{{FieldProto, "proto"}, {FieldDPort, "dport"}, {FieldSPort, "sport"}, {FieldLen, "len"}, {FieldTTL, "ttl"},
		{FieldTCPFlags, "tcp_flags"}, {FieldSrc, "src"}} {
		if mask&f.m != 0 {
			parts = append(parts, f.name)
		}
	}
	return strings.Join(parts, " ")
}
