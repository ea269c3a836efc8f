package asn

import (
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"
)

// BenchmarkLoadTSV loads a synthetic 500k-range iptoasn TSV (about the size
// of the public combined table) from a temp dir. It reports the entry count
// and the heap retained by the loaded table.
func BenchmarkLoadTSV(b *testing.B) {
	for _, gz := range []bool{false, true} {
		name := "plain"
		if gz {
			name = "gzip"
		}
		b.Run(name, func(b *testing.B) {
			data := syntheticTSV(500_000, 1)
			dir := b.TempDir()
			path := filepath.Join(dir, "ip2asn-combined.tsv")
			if gz {
				data = gzipBytesB(b, data)
			}
			if err := writeFileB(path, data); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			var tbl *Table
			for b.Loop() {
				var err error
				tbl, err = Load(b.Context(), []string{path}, Options{})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			st := tbl.Stats()
			b.ReportMetric(float64(st.Ranges+st.NotRouted), "ranges")
			b.ReportMetric(float64(st.Entries), "entries")
			b.ReportMetric(float64(len(data))/(1<<20), "MiB-file")
			b.ReportMetric(float64(retainedHeap(func() any {
				t, err := Load(b.Context(), []string{path}, Options{})
				if err != nil {
					b.Fatal(err)
				}
				return t
			}))/(1<<20), "MiB-table")
		})
	}
}

// retainedHeap measures the live heap growth caused by keeping build's result.
func retainedHeap(build func() any) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	if after.HeapAlloc < before.HeapAlloc {
		return 0
	}
	return after.HeapAlloc - before.HeapAlloc
}

func BenchmarkLookup(b *testing.B) {
	path := filepath.Join(b.TempDir(), "asn.tsv")
	if err := writeFileB(path, syntheticTSV(500_000, 1)); err != nil {
		b.Fatal(err)
	}
	tbl, err := Load(b.Context(), []string{path}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	addrs := make([]netip.Addr, 4096)
	for i := range addrs {
		addrs[i] = randomAddr(r, i%5 == 0)
		if i%2 == 0 { // half inside the generated v4 space
			addrs[i] = addr4(16<<24 + uint64(r.IntN(1<<28)))
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tbl.Lookup(addrs[i&4095])
		i++
	}
}
