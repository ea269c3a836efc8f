package asn

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"strconv"
)

// syntheticTSV generates n contiguous iptoasn lines, about 4/5 IPv4 and 1/5
// IPv6, with realistic shapes: range sizes from 1 address to /12, about 3%
// not routed, some neighbours sharing ASN and country so they merge.
func syntheticTSV(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var buf bytes.Buffer
	buf.Grow(n * 48)
	countries := []string{"US", "DE", "NL", "FR", "BR", "CN", "JP", "None", "Unknown", "gb"}
	n4 := n * 4 / 5
	v4 := uint64(16 << 24) // 16.0.0.0
	v6hi := uint64(0x2001_0400) << 32
	lastASN, lastCC := uint32(0), ""
	for i := range n {
		asn := uint32(r.IntN(70000)) + 1
		country := countries[r.IntN(len(countries))]
		switch {
		case r.IntN(32) == 0:
			asn, country = 0, "None"
		case r.IntN(6) == 0 && lastASN != 0:
			asn, country = lastASN, lastCC // will merge with the previous line
		}
		lastASN, lastCC = asn, country
		desc := "AS" + strconv.Itoa(int(asn)) + " Example Networks"
		if i < n4 {
			size := uint64(1) << r.IntN(13)
			if r.IntN(4) == 0 {
				size += uint64(r.IntN(300))
			}
			start, end := v4, v4+size-1
			v4 += size
			appendLine(&buf, addr4(start), addr4(end), asn, country, desc)
			continue
		}
		size := uint64(1) << (16 + r.IntN(16))
		start, end := v6hi, v6hi+size-1
		v6hi += size
		appendLine(&buf, addr6(start, 0), addr6(end, ^uint64(0)), asn, country, desc)
	}
	return buf.Bytes()
}

func addr4(v uint64) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func addr6(hi, lo uint64) netip.Addr { return u128{hi, lo}.addr(true) }

func appendLine(buf *bytes.Buffer, start, end netip.Addr, asn uint32, country, desc string) {
	b := buf.AvailableBuffer()
	b = start.AppendTo(b)
	b = append(b, '\t')
	b = end.AppendTo(b)
	b = append(b, '\t')
	b = strconv.AppendUint(b, uint64(asn), 10)
	b = append(b, '\t')
	b = append(b, country...)
	b = append(b, '\t')
	b = append(b, desc...)
	b = append(b, '\n')
	buf.Write(b)
}
