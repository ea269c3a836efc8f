package asn

import (
	"math/bits"
	"net/netip"
)

// u128 is an address as an unsigned integer. IPv4 addresses use the low 32
// bits; the family is carried next to the value, not inside it.
type u128 struct{ hi, lo uint64 }

func u128From(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	return u128{
		hi: uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
			uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7]),
		lo: uint64(b[8])<<56 | uint64(b[9])<<48 | uint64(b[10])<<40 | uint64(b[11])<<32 |
			uint64(b[12])<<24 | uint64(b[13])<<16 | uint64(b[14])<<8 | uint64(b[15]),
	}
}

func (u u128) addr(is6 bool) netip.Addr {
	if !is6 {
		v := uint32(u.lo)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	var b [16]byte
	for i := range 8 {
		b[i] = byte(u.hi >> (56 - 8*i))
		b[8+i] = byte(u.lo >> (56 - 8*i))
	}
	return netip.AddrFrom16(b)
}

func (u u128) cmp(v u128) int {
	switch {
	case u.hi < v.hi:
		return -1
	case u.hi > v.hi:
		return 1
	case u.lo < v.lo:
		return -1
	case u.lo > v.lo:
		return 1
	}
	return 0
}

func (u u128) isZero() bool { return u.hi == 0 && u.lo == 0 }

func (u u128) add(v u128) u128 {
	lo, carry := bits.Add64(u.lo, v.lo, 0)
	hi, _ := bits.Add64(u.hi, v.hi, carry)
	return u128{hi, lo}
}

func (u u128) sub(v u128) u128 {
	lo, borrow := bits.Sub64(u.lo, v.lo, 0)
	hi, _ := bits.Sub64(u.hi, v.hi, borrow)
	return u128{hi, lo}
}

func (u u128) addOne() u128 { return u.add(u128{lo: 1}) }

// trailingZeros returns the number of trailing zero bits, 128 for zero.
func (u u128) trailingZeros() int {
	if u.lo != 0 {
		return bits.TrailingZeros64(u.lo)
	}
	return 64 + bits.TrailingZeros64(u.hi)
}

// bitLen returns the number of bits needed to represent u, 0 for zero.
func (u u128) bitLen() int {
	if u.hi != 0 {
		return 64 + bits.Len64(u.hi)
	}
	return bits.Len64(u.lo)
}

// lowMask returns 2^k - 1 for k in [0, 128].
func lowMask(k int) u128 {
	switch {
	case k <= 0:
		return u128{}
	case k < 64:
		return u128{lo: 1<<uint(k) - 1}
	case k < 128:
		return u128{hi: 1<<uint(k-64) - 1, lo: ^uint64(0)}
	}
	return u128{hi: ^uint64(0), lo: ^uint64(0)}
}

func familyBits(is6 bool) int {
	if is6 {
		return 128
	}
	return 32
}

func netipPrefix(first u128, is6 bool, bits int) netip.Prefix {
	return netip.PrefixFrom(first.addr(is6), bits)
}
