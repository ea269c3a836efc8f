package asn

import (
	"bytes"
	"compress/gzip"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"testing"
)

// syntheticTSV generates n iptoasn lines in address order, 4/5 IPv4 and
// 1/5 IPv6, shaped like BGP data: 70% single aligned blocks (/20-/24 for
// IPv4, /32-/48 for IPv6), 30% unaligned unions of /24s or /48s, about 3% not
// routed, and one line in six continuing the previous ASN and country so the
// loader can merge it. Gaps between ranges are left unlisted.
func syntheticTSV(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var buf bytes.Buffer
	buf.Grow(n * 56)
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
			asn, country = lastASN, lastCC // contiguous below, so it merges
		}
		lastASN, lastCC = asn, country
		desc := "AS" + strconv.Itoa(int(asn)) + " Example Networks"
		aligned := r.IntN(10) < 7
		if i < n4 {
			size := uint64(256) * uint64(1+r.IntN(40))
			if aligned {
				size = uint64(256) << r.IntN(5)
				if asn != lastASN || r.IntN(2) == 0 {
					v4 = (v4 + size - 1) &^ (size - 1) // align; leaves a gap
				}
			}
			appendLine(&buf, addr4(v4), addr4(v4+size-1), asn, country, desc)
			v4 += size
			continue
		}
		size := uint64(1<<16) * uint64(1+r.IntN(40)) // in units of /64
		if aligned {
			size = uint64(1<<16) << r.IntN(17)
			v6hi = (v6hi + size - 1) &^ (size - 1)
		}
		appendLine(&buf, addr6(v6hi, 0), addr6(v6hi+size-1, ^uint64(0)), asn, country, desc)
		v6hi += size
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

func writeFileB(path string, data []byte) error { return os.WriteFile(path, data, 0o644) }

func gzipBytesB(b *testing.B, data []byte) []byte {
	b.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(data); err != nil {
		b.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}
