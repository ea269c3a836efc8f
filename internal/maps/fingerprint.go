package maps

import (
	"errors"
	"fmt"
	"net/netip"
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
// prefix length) may be in use at once: each costs one hash lookup per
// packet.
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

func (m *Maps) fpEntries() ([]fpEntry, error) {
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

// writeMasks makes fp_masks hold the masks of entries (plus extra, first
// when new), in a stable order: the masks already in the table first.
func (m *Maps) writeMasks(entries []fpEntry, extra *fpMask) error {
	var cur loader.LimiterEgFpMasks
	if err := m.o.FpMasks.Lookup(uint32(0), &cur); err != nil {
		return fmt.Errorf("read fingerprint masks: %w", err)
	}
	want := map[fpMask]bool{}
	for _, e := range entries {
		want[fpMask{e.k.Fields, e.k.SrcLen}] = true
	}
	if extra != nil {
		want[*extra] = true
	}
	var order []fpMask
	for i := 0; i < int(min(cur.N, uint32(MaxFingerprintMasks))); i++ {
		mk := fpMask{cur.Fields[i], cur.SrcLen[i]}
		if want[mk] {
			order = append(order, mk)
			delete(want, mk)
		}
	}
	for mk := range want {
		order = append(order, mk)
	}
	if len(order) > MaxFingerprintMasks {
		return fmt.Errorf("%w: %d needed, at most %d", ErrFingerprintMasks, len(order), MaxFingerprintMasks)
	}
	var next loader.LimiterEgFpMasks
	next.N = uint32(len(order))
	for i, mk := range order {
		next.Fields[i], next.SrcLen[i] = mk.fields, mk.srcLen
	}
	if next == cur {
		return nil
	}
	if err := m.o.FpMasks.Put(uint32(0), next); err != nil {
		return fmt.Errorf("write fingerprint masks: %w", err)
	}
	return nil
}

// SetFingerprint installs or replaces fingerprint f.ID. A replaced
// fingerprint with the same fields and budget keeps its bucket's state and
// its counters.
func (m *Maps) SetFingerprint(f Fingerprint) error {
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
	m.ovr.mu.Lock()
	defer m.ovr.mu.Unlock()
	entries, err := m.fpEntries()
	if err != nil {
		return err
	}
	// Another key with this id is replaced: deleted after the new one is in.
	var stale []loader.LimiterEgFpKey
	kept := entries[:0]
	for _, e := range entries {
		switch {
		case e.k == k:
			if e.v.Budget == v.Budget {
				v.Bucket = e.v.Bucket
			}
		case e.v.Id == f.ID:
			stale = append(stale, e.k)
			continue
		}
		kept = append(kept, e)
	}
	// The mask first, so that the entry is looked up as soon as it exists.
	if err := m.writeMasks(kept, &fpMask{k.Fields, k.SrcLen}); err != nil {
		return fmt.Errorf("fingerprint %d: %w", f.ID, err)
	}
	if err := m.o.FpRules.Put(k, v); err != nil {
		return fmt.Errorf("write fingerprint %d: %w", f.ID, err)
	}
	for _, sk := range stale {
		if err := m.o.FpRules.Delete(sk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete the old form of fingerprint %d: %w", f.ID, err)
		}
	}
	if len(stale) > 0 {
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

// DeleteFingerprint removes fingerprint id and its counters (no error if
// there is none).
func (m *Maps) DeleteFingerprint(id uint32) error {
	m.ovr.mu.Lock()
	defer m.ovr.mu.Unlock()
	return m.deleteFingerprints(func(e fpEntry) bool { return e.v.Id == id })
}

func (m *Maps) deleteFingerprints(gone func(fpEntry) bool) error {
	entries, err := m.fpEntries()
	if err != nil {
		return err
	}
	kept := entries[:0]
	for _, e := range entries {
		if !gone(e) {
			kept = append(kept, e)
			continue
		}
		if err := m.o.FpRules.Delete(e.k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete fingerprint %d: %w", e.v.Id, err)
		}
		if err := m.o.FpStats.Delete(e.v.Id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete counters of fingerprint %d: %w", e.v.Id, err)
		}
	}
	return m.writeMasks(kept, nil)
}

// PruneFingerprints deletes expired fingerprints (the data plane ignores
// them already) and frees their masks.
func (m *Maps) PruneFingerprints() (int, error) {
	ns, err := m.clockNS()
	if err != nil {
		return 0, err
	}
	m.ovr.mu.Lock()
	defer m.ovr.mu.Unlock()
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
func (m *Maps) Fingerprints() ([]FingerprintState, error) {
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

// ReasonFingerprint is the reason of a packet a fingerprint dropped.
const ReasonFingerprint = loader.LimiterEgReasonEG_R_FINGERPRINT
