package refmodel

import (
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// Fingerprint rules (bpf/xdp_limiter.c, eg_fingerprint): for packets of
// limit rules, after the lists and the rule and before every bucket, the
// first mask (in fp_masks' order) whose key names a live fingerprint
// charges the packet to its bucket; a refusal drops the packet with reason
// fingerprint, unless the fingerprint is a dry run (counted, on to the
// buckets) or the source is validated (counted as spared, on to the
// buckets).

// Fingerprint table types, as bpf2go generated them.
type (
	// FpKey keys a fingerprint rule (its fields, masked).
	FpKey = loader.LimiterEgFpKey
	// FpVal is a fingerprint rule: id, budget, bucket, expiry, dry run.
	FpVal = loader.LimiterEgFpVal
	// FpStats are a fingerprint's counters (summed over CPUs).
	FpStats = loader.LimiterEgFpStats
)

// FpMask is one entry of fp_masks: the fields, and the source prefix
// length (in the 128-bit space) with maps.FieldSrc.
type FpMask struct {
	Fields uint32
	SrcLen uint8
}

type fpState struct {
	masks []FpMask
	rules map[FpKey]FpVal
	stats map[uint32]FpStats
}

// SetFingerprintMasks makes the masks looked up, in order, what maps.Maps
// wrote to fp_masks (its order is the program's input, like a rule's
// slot); at most the program's maximum are used.
func (m *Model) SetFingerprintMasks(masks []FpMask) {
	m.fpInit()
	m.fp.masks = append(m.fp.masks[:0], masks[:min(len(masks), int(loader.LimiterEgFpFieldEG_FP_MAX_MASKS))]...)
}

// SetFingerprint installs or replaces a fingerprint as
// maps.FingerprintStore.Set writes it (v as compiled, Expires in the test clock's
// ns): the same key with the same budget keeps its bucket, else the bucket
// starts full; another key with the same id is replaced and the id's
// counters restart. v.Bucket is ignored.
func (m *Model) SetFingerprint(k FpKey, v FpVal) {
	m.fpInit()
	v.Bucket = Bucket{}
	if old, ok := m.fp.rules[k]; ok && old.Budget == v.Budget {
		v.Bucket = old.Bucket
	}
	stale := false
	for ok, ov := range m.fp.rules {
		if ok != k && ov.Id == v.Id {
			delete(m.fp.rules, ok)
			stale = true
		}
	}
	if stale {
		delete(m.fp.stats, v.Id)
	}
	if _, ok := m.fp.stats[v.Id]; !ok {
		m.fp.stats[v.Id] = FpStats{}
	}
	m.fp.rules[k] = v
}

// DeleteFingerprint removes fingerprint id and its counters.
func (m *Model) DeleteFingerprint(id uint32) {
	m.fpInit()
	for k, v := range m.fp.rules {
		if v.Id == id {
			delete(m.fp.rules, k)
		}
	}
	delete(m.fp.stats, id)
}

// FingerprintRules returns the fingerprint table (buckets included).
func (m *Model) FingerprintRules() map[FpKey]FpVal {
	m.fpInit()
	out := make(map[FpKey]FpVal, len(m.fp.rules))
	for k, v := range m.fp.rules {
		out[k] = v
	}
	return out
}

// FingerprintStats returns every fingerprint's counters by id.
func (m *Model) FingerprintStats() map[uint32]FpStats {
	m.fpInit()
	out := make(map[uint32]FpStats, len(m.fp.stats))
	for id, s := range m.fp.stats {
		out[id] = s
	}
	return out
}

func (m *Model) fpInit() {
	if m.fp == nil {
		m.fp = &fpState{rules: map[FpKey]FpVal{}, stats: map[uint32]FpStats{}}
	}
}

// fingerprint is eg_fingerprint: true when a fingerprint drops the packet.
func (m *Model) fingerprint(pi Packet, ss *srcState) bool {
	if m.fp == nil {
		return false
	}
	for _, mk := range m.fp.masks {
		f := mk.Fields
		k := FpKey{Fields: f}
		if f&uint32(maps.FieldProto) != 0 {
			k.Proto = pi.Proto
		}
		if f&uint32(maps.FieldDPort) != 0 {
			k.Dport = pi.DstPort
		}
		if f&uint32(maps.FieldSPort) != 0 {
			k.Sport = pi.SrcPort
		}
		if f&uint32(maps.FieldLen) != 0 {
			k.Len = pi.IPLen
		}
		if f&uint32(maps.FieldTTL) != 0 {
			k.Ttl = pi.TTL
		}
		if f&uint32(maps.FieldTCPFlags) != 0 {
			k.TcpFlags = pi.TCPFlags
		}
		if f&uint32(maps.FieldSrc) != 0 {
			k.SrcLen = min(mk.SrcLen, 128)
			k.Addr = maskAddr(ss.addr, int(k.SrcLen))
		}
		v, ok := m.fp.rules[k]
		if !ok || v.Expires <= ss.now>>maps.TickShift {
			continue
		}
		before := v
		refused := !limited(v.Budget) || !take(&v.Bucket, v.Budget, ss.now, ss.len)
		m.fp.rules[k] = v
		// The counters exist from SetFingerprint on (fp_stats).
		st, have := m.fp.stats[v.Id]
		count := func(c *loader.LimiterEgCounter) {
			c.Packets++
			c.Bytes += uint64(ss.len)
		}
		count(&st.Matched)
		drop := false
		switch {
		case !refused:
		case v.DryRun == 0 && m.class(ss, false) == maps.ClassValidated:
			count(&st.Spared)
		default:
			count(&st.Dropped)
			drop = v.DryRun == 0
		}
		if have {
			m.fp.stats[v.Id] = st
		}
		m.traceFingerprint(k, before, refused, drop, refused && !drop && v.DryRun == 0)
		return drop
	}
	return false
}
