package asn

import (
	"fmt"
	"net/netip"
)

// AppendRangePrefixes appends to dst the minimal list of CIDRs that cover
// exactly the inclusive range [start, end], in ascending order, and returns
// the extended slice.
//
// The list is the set of maximal aligned blocks inside the range, which is the
// unique smallest set of disjoint prefixes covering it. Both ends must be valid
// addresses of the same family without a zone, and start must not be after end.
func AppendRangePrefixes(dst []netip.Prefix, start, end netip.Addr) ([]netip.Prefix, error) {
	if !start.IsValid() || !end.IsValid() {
		return dst, fmt.Errorf("range %v-%v: invalid address", start, end)
	}
	if start.Zone() != "" || end.Zone() != "" {
		return dst, fmt.Errorf("range %v-%v: addresses must not carry a zone", start, end)
	}
	if start.Is4() != end.Is4() {
		return dst, fmt.Errorf("range %v-%v: start and end are of different address families", start, end)
	}
	if end.Less(start) {
		return dst, fmt.Errorf("range end %v is before start %v", end, start)
	}
	is6 := start.Is6()
	forEachRangeBlock(u128From(start), u128From(end), is6, func(first u128, hostBits int) {
		dst = append(dst, netip.PrefixFrom(first.addr(is6), familyBits(is6)-hostBits))
	})
	return dst, nil
}

// forEachRangeBlock calls emit for every maximal aligned block of 2^hostBits
// addresses inside [start, end] (start <= end), in ascending order. It never
// computes an address past end, so ranges ending at the top of the address
// space do not wrap.
func forEachRangeBlock(start, end u128, is6 bool, emit func(first u128, hostBits int)) {
	width := familyBits(is6)
	for {
		k := start.trailingZeros() // alignment of start bounds the block size
		if k > width {
			k = width
		}
		// The block must also fit: 2^k <= end-start+1. The count overflows
		// 128 bits only for ::/0, where the whole space fits.
		if count := end.sub(start).addOne(); !count.isZero() {
			if fit := count.bitLen() - 1; fit < k {
				k = fit
			}
		}
		emit(start, k)
		last := start.add(lowMask(k))
		if last == end {
			return
		}
		start = last.addOne()
	}
}
