package refmodel

import (
	"encoding/binary"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// The new-source filter, mirrored from seen_mark in bpf/xdp_limiter.c.
const (
	seenBits        = uint64(loader.LimiterEgSizesEG_SEEN_BITS)
	seenEpochShift  = uint64(loader.LimiterEgSizesEG_SEEN_EPOCH_SHIFT)
	seenMaxInterval = uint64(1) << (seenEpochShift + maps.TickShift)
)

// keyHash is key_hash: FNV-1a over the key's little-endian 32-bit words,
// then a murmur3 finalizer.
func keyHash(key []byte) uint32 {
	h := uint32(0x811c9dc5)
	for i := 0; i+4 <= len(key) && i < 32; i += 4 {
		h = (h ^ binary.LittleEndian.Uint32(key[i:])) * 0x01000193
	}
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	return h
}

func srcKeyBytes(k SrcKey) []byte {
	b := make([]byte, 0, 24)
	b = binary.LittleEndian.AppendUint32(b, k.RuleId)
	b = binary.LittleEndian.AppendUint32(b, k.Pad)
	return append(b, k.Addr[:]...)
}

func aggKeyBytes(k AggKey) []byte {
	b := make([]byte, 0, 32)
	b = binary.LittleEndian.AppendUint32(b, k.RuleId)
	b = append(b, k.Kind, k.Len)
	b = binary.LittleEndian.AppendUint16(b, k.Pad0)
	b = binary.LittleEndian.AppendUint32(b, k.Asn)
	b = binary.LittleEndian.AppendUint32(b, k.Pad1)
	return append(b, k.Addr[:]...)
}

// The answers of seen_mark.
const (
	seenNew = iota
	seenDeferred
	seenActive
)

// seenMark is seen_mark: whether key is marked in the previous epoch
// (seenActive), only in this one (seenDeferred) or in neither (seenNew);
// it marks key in this epoch and, with settle, a deferred key in the
// previous one too.
// first is whether key was not yet marked in this epoch (standing's
// once-per-epoch update rides on it).
func (m *Model) seenMark(key []byte, now uint64, settle bool) (state int, first bool) {
	h := keyHash(key)
	idx := (h >> 6) & m.seenMask
	epoch := ((now >> maps.TickShift) >> seenEpochShift) & 0xff
	bit := uint64(1)<<(uint64(h&63)%seenBits) | uint64(1)<<(uint64((h*0x9e3779b1)>>26)%seenBits)
	mask := uint64(1)<<seenBits - 1
	m.faultSeen(idx)
	old := m.seen[idx]
	tag := old >> (2 * seenBits)
	var cur, prev uint64
	switch {
	case tag == epoch:
		cur, prev = (old>>seenBits)&mask, old&mask
	case (tag+1)&0xff == epoch:
		prev = (old >> seenBits) & mask
	}
	state = seenNew
	switch {
	case prev&bit == bit:
		state = seenActive
	case cur&bit == bit:
		state = seenDeferred
	}
	ncur, nprev := cur|bit, prev
	if settle && state == seenDeferred {
		nprev |= bit
	}
	if tag != epoch || ncur != cur || nprev != prev {
		m.seen[idx] = epoch<<(2*seenBits) | ncur<<seenBits | nprev
	}
	return state, cur&bit != bit
}

// gated is gated(): creation through the filter only for packet limits
// faster than one per epoch.
func gated(c maps.BucketCfg) bool { return c.PktT != 0 && c.PktT < seenMaxInterval }

// charge is bucket_charge: the deferred charge of a packet already
// admitted, whatever the bucket holds.
func charge(b *Bucket, c maps.BucketCfg, now uint64, length uint32) {
	if c.PktT != 0 {
		b.PktTat = max(b.PktTat, now) + c.PktT
	}
	if c.ByteT != 0 {
		b.ByteTat = max(b.ByteTat, now) + maps.ByteCost(c, length)
	}
}

// charged is the state create_charged inserts.
func charged(c maps.BucketCfg, now uint64, length uint32) Bucket {
	var b Bucket
	if c.PktT != 0 {
		b.PktTat = now + c.PktT
	}
	if c.ByteT != 0 {
		b.ByteTat = now + maps.ByteCost(c, length)
	}
	return b
}
