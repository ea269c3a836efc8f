package asn

import (
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/maxmind/mmdbwriter"
	"github.com/maxmind/mmdbwriter/mmdbtype"
	"go4.org/netipx"
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
			cpu := startCPU()
			for b.Loop() {
				var err error
				tbl, err = Load(b.Context(), []string{path}, Options{})
				if err != nil {
					b.Fatal(err)
				}
			}
			cpu.report(b)
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

// BenchmarkLoadMMDB loads a MaxMind DB written by mmdbwriter from the same
// synthetic ranges as BenchmarkLoadTSV (each range inserted as its CIDRs),
// with GeoLite2-ASN-shaped records.
func BenchmarkLoadMMDB(b *testing.B) {
	dir := b.TempDir()
	tsv := filepath.Join(dir, "src.tsv")
	if err := writeFileB(tsv, syntheticTSV(500_000, 1)); err != nil {
		b.Fatal(err)
	}
	src, err := Load(b.Context(), []string{tsv}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	tree, err := mmdbwriter.New(mmdbwriter.Options{DatabaseType: "GeoLite2-ASN", RecordSize: 28, IncludeReservedNetworks: true})
	if err != nil {
		b.Fatal(err)
	}
	records := make(map[uint32]mmdbtype.Map)
	for e := range src.All() {
		rec, ok := records[e.ASN]
		if !ok {
			rec = mmdbtype.Map{
				"autonomous_system_number":       mmdbtype.Uint32(e.ASN),
				"autonomous_system_organization": mmdbtype.String("AS" + strconv.Itoa(int(e.ASN)) + " Example Networks"),
			}
			records[e.ASN] = rec
		}
		if err := tree.Insert(netipx.PrefixIPNet(e.Prefix), rec); err != nil {
			b.Fatal(err)
		}
	}
	path := filepath.Join(dir, "GeoLite2-ASN.mmdb")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := tree.WriteTo(f); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var tbl *Table
	cpu := startCPU()
	for b.Loop() {
		if tbl, err = Load(b.Context(), []string{path}, Options{}); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
	b.ReportMetric(float64(fi.Size())/(1<<20), "MiB-file")
	b.ReportMetric(float64(tbl.Stats().Ranges), "networks")
	b.ReportMetric(float64(tbl.Len()), "entries")
}

// cpuClock measures process CPU time (user+system, all threads including GC),
// which on a shared machine says more than wall time.
type cpuClock struct{ start time.Duration }

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuClock { return cpuClock{start: processCPU()} }

func (c cpuClock) report(b *testing.B) {
	b.ReportMetric(float64(processCPU()-c.start)/float64(b.N), "cpu-ns/op")
}
