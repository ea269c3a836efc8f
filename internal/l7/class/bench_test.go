package class

import (
	"net/netip"
	"testing"
)

// BenchmarkClassify is the class ranking's cost per request: Classify
// and Done for one client (always cached) and for 4,096 and 65,536
// clients in turn, the data plane's standing read once per client (its
// TTL does not pass: the cached path).
func BenchmarkClassify(b *testing.B) {
	for _, n := range []int{1, 4096, 65536} {
		b.Run(itoa(n), func(b *testing.B) {
			tb := NewTable(0, nil, &fakeClock{}, Config{})
			addrs := make([]netip.Addr, n)
			for i := range addrs {
				addrs[i] = netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
				tb.Classify(addrs[i], true)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				tb.Done(tb.Classify(addrs[i%n], true), false)
				i++
			}
		})
	}
}

func itoa(n int) string {
	switch n {
	case 1:
		return "clients=1"
	case 4096:
		return "clients=4096"
	}
	return "clients=65536"
}
