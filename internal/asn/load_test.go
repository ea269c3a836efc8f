package asn

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/maxmind/mmdbwriter"
	"github.com/maxmind/mmdbwriter/mmdbtype"
)

const sampleTSV = "# iptoasn sample\n" +
	"1.0.0.0\t1.0.0.255\t13335\tUS\tCLOUDFLARENET\n" +
	"1.0.1.0\t1.0.3.255\t13335\tUS\tCLOUDFLARENET\n" + // merges with the line above
	"1.0.4.0\t1.0.7.255\t0\tNone\tNot routed\n" +
	"1.0.8.0\t1.0.8.9\t64500\tUnknown\tEXAMPLE\n" +
	"1.0.8.10\t1.0.8.10\t64500\tde\tEXAMPLE-DE\n" + // same ASN, other country: not merged
	"1.0.8.11\t1.0.8.255\t64500\tUnknown\tEXAMPLE\n" +
	"\n" +
	"1.0.9.0\t1.0.9.255\t64502\tFR\n" + // description is optional
	"2001:db8::\t2001:db8:0:ffff:ffff:ffff:ffff:ffff\t64501\tNL\tEXAMPLE-V6\r\n" +
	"2001:db8:1::\t2001:db8:1::ffff\t64501\tNL\tEXAMPLE-V6\n" // gap before it: not merged

func sampleEntries(t *testing.T) []Entry {
	t.Helper()
	e := func(p string, asn uint32, country string) Entry {
		var c [2]byte
		if country != "" {
			c = cc(country)
		}
		return Entry{Prefix: netip.MustParsePrefix(p), ASN: asn, Country: c}
	}
	return []Entry{
		e("1.0.0.0/22", 13335, "US"),
		e("1.0.8.0/29", 64500, ""),
		e("1.0.8.8/31", 64500, ""),
		e("1.0.8.10/32", 64500, "DE"),
		e("1.0.8.11/32", 64500, ""),
		e("1.0.8.12/30", 64500, ""),
		e("1.0.8.16/28", 64500, ""),
		e("1.0.8.32/27", 64500, ""),
		e("1.0.8.64/26", 64500, ""),
		e("1.0.8.128/25", 64500, ""),
		e("1.0.9.0/24", 64502, "FR"),
		e("2001:db8::/48", 64501, "NL"),
		e("2001:db8:1::/112", 64501, "NL"),
	}
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func gzipBytes(t *testing.T, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func entriesOf(tbl *Table) []Entry { return slices.Collect(tbl.All()) }

func TestLoadTSV(t *testing.T) {
	dir := t.TempDir()
	plain := writeFile(t, dir, "asn.tsv", []byte(sampleTSV))
	// The gzip file is named like a plain file: detection is by magic bytes.
	gz := writeFile(t, dir, "asn-compressed.tsv", gzipBytes(t, []byte(sampleTSV)))
	// Separate v4 and v6 files, given v6 first: the loader sorts.
	lines := strings.SplitAfter(sampleTSV, "\n")
	v4 := writeFile(t, dir, "ip2asn-v4.tsv", []byte(strings.Join(lines[:9], "")))
	v6 := writeFile(t, dir, "ip2asn-v6.tsv.gz", gzipBytes(t, []byte(strings.Join(lines[9:], ""))))

	for _, tc := range []struct {
		name  string
		paths []string
	}{
		{"plain", []string{plain}},
		{"gzip", []string{gz}},
		{"split files", []string{v6, v4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, err := Load(t.Context(), tc.paths, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := entriesOf(tbl), sampleEntries(t); !slices.Equal(got, want) {
				t.Fatalf("entries:\n got %v\nwant %v", got, want)
			}
			st := tbl.Stats()
			if st.Entries != 13 || st.IPv4Entries != 11 || st.IPv6Entries != 2 || st.Ranges != 8 ||
				st.NotRouted != 1 || st.Lines != 11 || st.Files != len(tc.paths) {
				t.Errorf("stats %+v", st)
			}
			if e, ok := tbl.Lookup(netip.MustParseAddr("1.0.3.7")); !ok || e.ASN != 13335 {
				t.Errorf("Lookup(1.0.3.7) = %+v, %v", e, ok)
			}
			if _, ok := tbl.Lookup(netip.MustParseAddr("1.0.5.1")); ok {
				t.Error("not-routed range 1.0.4.0-1.0.7.255 must not be in the table")
			}
		})
	}
	for p, want := range map[string]Format{plain: FormatTSV, gz: FormatTSVGzip, v6: FormatTSVGzip} {
		if f, err := DetectFormat(p); err != nil || f != want {
			t.Errorf("DetectFormat(%s) = %v, %v; want %v", filepath.Base(p), f, err, want)
		}
	}
}

func TestLoadTSVU32(t *testing.T) {
	// ip2asn-v4-u32 writes IPv4 addresses as decimal integers; IPv4-mapped
	// IPv6 ranges are stored as IPv4.
	p := writeFile(t, t.TempDir(), "ip2asn-v4-u32.tsv", []byte(
		"16777216\t16777471\t13335\tUS\tCLOUDFLARENET\n"+
			"0\t0\t64500\tNone\tZERO\n"+
			"::ffff:2.0.0.0\t::ffff:2.0.0.255\t64502\tNone\tMAPPED\n"+
			"4294967295\t4294967295\t64501\tNone\tTOP\n"))
	tbl, err := Load(t.Context(), []string{p}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{Prefix: netip.MustParsePrefix("0.0.0.0/32"), ASN: 64500},
		{Prefix: netip.MustParsePrefix("1.0.0.0/24"), ASN: 13335, Country: cc("US")},
		{Prefix: netip.MustParsePrefix("2.0.0.0/24"), ASN: 64502}, // IPv4-mapped → IPv4
		{Prefix: netip.MustParsePrefix("255.255.255.255/32"), ASN: 64501},
	}
	if got := entriesOf(tbl); !slices.Equal(got, want) {
		t.Fatalf("entries:\n got %v\nwant %v", got, want)
	}
	p = writeFile(t, t.TempDir(), "big.tsv", []byte("4294967296\t4294967296\t1\tUS\tX\n"))
	if _, err := Load(t.Context(), []string{p}, Options{}); err == nil ||
		!strings.Contains(err.Error(), `big.tsv:1: range_start "4294967296" is not an IP address`) {
		t.Fatalf("err = %v", err)
	}
}

func TestLoadTSVProblems(t *testing.T) {
	t.Chdir(t.TempDir())
	bad := "1.2.3.9\t1.2.3.0\t64500\tUS\tX\n" +
		"1.2.3\t1.2.3.0\t64500\tUS\tX\n" +
		"1.2.3.0 1.2.3.9 64500 US X\n" +
		"1.2.4.0\t1.2.4.255\t64500\tUS\tfine\n" +
		"1.2.3.0\t::1\t64500\tUS\tX\n" +
		"1.2.3.0\t1.2.3.9\tAS64500\tUS\tX\n" +
		"1.2.3.0\t1.2.3.9\t64500\tUSA\tX\n" +
		"fe80::1%eth0\tfe80::2\t1\tUS\tX\n" +
		"1.2.3.0\t1.2.3.09\t1\tUS\tX\n" +
		"1.2.3.0\t1.2.3.9\t4294967296\tUS\tX\n"
	writeFile(t, ".", "asn.tsv", []byte(bad))
	want := []string{
		"asn.tsv:1: range end 1.2.3.0 is before start 1.2.3.9",
		`asn.tsv:2: range_start "1.2.3" is not an IP address`,
		"asn.tsv:3: expected 5 tab-separated fields (range_start, range_end, AS_number, country_code, AS_description), got 1",
		"asn.tsv:5: range start 1.2.3.0 and end ::1 are of different address families",
		`asn.tsv:6: AS_number "AS64500" is not a decimal number in 0..4294967295`,
		`asn.tsv:7: country_code "USA" is not a two-letter ISO 3166 code, None or Unknown`,
		`asn.tsv:8: range_start "fe80::1%eth0" is not an IP address`,
		`asn.tsv:9: range_end "1.2.3.09" is not an IP address`,
		`asn.tsv:10: AS_number "4294967296" is not a decimal number in 0..4294967295`,
	}

	tbl, err := Load(t.Context(), []string{"asn.tsv"}, Options{})
	if tbl != nil {
		t.Fatal("a file with bad lines must not produce a table")
	}
	var le *LoadError
	if !errors.As(err, &le) || !errors.Is(err, ErrRejected) {
		t.Fatalf("err = %v, want *LoadError wrapping ErrRejected", err)
	}
	var got []string
	for _, p := range le.Problems {
		got = append(got, p.Error())
	}
	if !slices.Equal(got, want) || le.More {
		t.Fatalf("problems (more=%v):\n%s\nwant:\n%s", le.More, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.HasPrefix(err.Error(), "load asn data: asn data rejected: 9 problems; asn.tsv:1: range end") {
		t.Errorf("error text: %v", err)
	}

	// With a limit, reading stops at the limit and says there may be more.
	_, err = Load(t.Context(), []string{"asn.tsv"}, Options{MaxProblems: 3})
	if !errors.As(err, &le) || len(le.Problems) != 3 || !le.More || le.Problems[2].Line != 3 {
		t.Fatalf("limited load: %v", err)
	}
	if !strings.Contains(err.Error(), "3 problems (stopped at the limit, there may be more)") {
		t.Errorf("limited error text: %v", err)
	}
}

func TestLoadRejectsOverlaps(t *testing.T) {
	t.Chdir(t.TempDir())
	writeFile(t, ".", "a.tsv", []byte("1.0.0.0\t1.0.0.255\t1\tUS\tA\n"))
	writeFile(t, ".", "b.tsv", []byte("5.0.0.0\t5.0.0.255\t2\tUS\tB\n1.0.0.128\t1.0.1.0\t2\tUS\tB\n"))
	_, err := Load(t.Context(), []string{"a.tsv", "b.tsv"}, Options{})
	want := "load asn data: asn data rejected: 1 problem; b.tsv:2: range 1.0.0.128-1.0.1.0 overlaps range 1.0.0.0-1.0.0.255 from a.tsv:1"
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v\nwant %s", err, want)
	}
	// The message names the overlapped input line, not the merged run.
	writeFile(t, ".", "c.tsv", []byte("1.0.0.0\t1.0.0.255\t1\tUS\tA\n1.0.1.0\t1.0.1.255\t1\tUS\tA\n1.0.1.7\t1.0.1.7\t1\tUS\tA\n"))
	_, err = Load(t.Context(), []string{"c.tsv"}, Options{})
	want = "load asn data: asn data rejected: 1 problem; c.tsv:3: range 1.0.1.7-1.0.1.7 overlaps range 1.0.1.0-1.0.1.255 from c.tsv:2"
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v\nwant %s", err, want)
	}
	// Duplicates are overlaps too, even with equal values.
	writeFile(t, ".", "dup.tsv", []byte("1.0.0.0\t1.0.0.255\t1\tUS\tA\n1.0.0.0\t1.0.0.255\t1\tUS\tA\n"))
	if _, err := Load(t.Context(), []string{"dup.tsv"}, Options{}); !errors.Is(err, ErrRejected) {
		t.Fatalf("duplicate range: err = %v", err)
	}
}

func TestLoadCorruptGzipAndIOErrors(t *testing.T) {
	t.Chdir(t.TempDir())
	big := syntheticTSV(5000, 1)
	z := gzipBytes(t, big)
	writeFile(t, ".", "truncated.tsv.gz", z[:len(z)/2])
	_, err := Load(t.Context(), []string{"truncated.tsv.gz"}, Options{})
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "compressed data is corrupt or truncated") {
		t.Fatalf("truncated gzip: err = %v", err)
	}
	if _, err := Load(t.Context(), []string{"missing.tsv"}, Options{}); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrRejected) {
		t.Fatalf("missing file: err = %v", err)
	}
	if _, err := Load(t.Context(), nil, Options{}); err == nil {
		t.Fatal("no files: want an error")
	}
	writeFile(t, ".", "long.tsv", append(bytes.Repeat([]byte("x"), tsvBufferSize+10), '\n'))
	_, err = Load(t.Context(), []string{"long.tsv"}, Options{})
	if err == nil || !strings.Contains(err.Error(), "long.tsv:1: line is longer than 65536 bytes") {
		t.Fatalf("long line: err = %v", err)
	}
}

func TestLoadProgressAndCancel(t *testing.T) {
	dir := t.TempDir()
	data := syntheticTSV(60000, 2) // a few MiB: several progress steps
	p := writeFile(t, dir, "asn.tsv", data)
	gz := writeFile(t, dir, "asn.tsv.gz", gzipBytes(t, data))
	fi, err := os.Stat(gz)
	if err != nil {
		t.Fatal(err)
	}
	total := int64(len(data)) + fi.Size()
	var calls [][2]int64
	_, err = Load(t.Context(), []string{p, gz}, Options{
		Progress:    func(done, total int64) { calls = append(calls, [2]int64{done, total}) },
		MaxProblems: 1,
	})
	// The two files carry the same ranges: the load is rejected for overlaps
	// after reading both. Progress counts compressed bytes against the sum
	// of the file sizes, and a rejected load gets no final done == total call.
	if !errors.Is(err, ErrRejected) {
		t.Fatalf("err = %v", err)
	}
	if len(calls) < 3 {
		t.Fatalf("progress called %d times: %v", len(calls), calls)
	}
	for _, c := range calls {
		if c[1] != total || c[0] > total {
			t.Fatalf("progress %v, want total %d: %v", c, total, calls)
		}
	}
	if last := calls[len(calls)-1]; last[0] == total || last[0] < int64(len(data)) {
		t.Fatalf("last progress %v: want past the plain file, short of the total", last)
	}
	calls = nil
	tbl, err := Load(t.Context(), []string{p}, Options{
		Progress: func(done, total int64) { calls = append(calls, [2]int64{done, total}) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) < 3 {
		t.Fatalf("progress called %d times for %d bytes: %v", len(calls), len(data), calls)
	}
	for i, c := range calls {
		if c[1] != int64(len(data)) || c[0] > c[1] || (i > 0 && c[0] < calls[i-1][0]) {
			t.Fatalf("progress call %d = %v (total %d): %v", i, c, len(data), calls)
		}
	}
	if last := calls[len(calls)-1]; last[0] != last[1] {
		t.Fatalf("last progress %v, want done == total", last)
	}
	if st := tbl.Stats(); st.Ranges+st.NotRouted != 60000 || st.Lines != 60000 {
		t.Errorf("stats %+v", st)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Load(ctx, []string{p}, Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled load: err = %v", err)
	}
}

// TestLoadSyntheticMatchesRanges loads a generated table and checks, for
// every generated range, that the first and last addresses and the addresses
// just outside it look up as the range says.
func TestLoadSyntheticMatchesRanges(t *testing.T) {
	data := syntheticTSV(20000, 3)
	p := writeFile(t, t.TempDir(), "asn.tsv", data)
	tbl, err := Load(t.Context(), []string{p}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		start, end := netip.MustParseAddr(f[0]), netip.MustParseAddr(f[1])
		var asn uint32
		fmt.Sscan(f[2], &asn)
		for _, a := range []netip.Addr{start, end} {
			e, ok := tbl.Lookup(a)
			if asn == 0 {
				if ok {
					t.Fatalf("%v in not-routed range found as %+v", a, e)
				}
				continue
			}
			country := strings.ToUpper(f[3])
			if country == "NONE" || country == "UNKNOWN" {
				country = ""
			}
			if !ok || e.ASN != asn || CountryString(e.Country) != country {
				t.Fatalf("Lookup(%v) = %+v, %v; line %q", a, e, ok, line)
			}
		}
	}
	prefixes := 0
	for range tbl.All() {
		prefixes++
	}
	if prefixes != tbl.Len() || tbl.Len() == 0 {
		t.Fatalf("Len %d, iterated %d", tbl.Len(), prefixes)
	}
	// No two neighbouring entries with equal values may be mergeable siblings.
	es := entriesOf(tbl)
	for i := 1; i < len(es); i++ {
		a, b := es[i-1], es[i]
		if a.ASN == b.ASN && a.Country == b.Country && a.Prefix.Bits() == b.Prefix.Bits() && a.Prefix.Bits() > 0 {
			if parent, _ := b.Prefix.Addr().Prefix(b.Prefix.Bits() - 1); parent.Addr() == a.Prefix.Addr() {
				t.Fatalf("%v and %v should have been merged", a.Prefix, b.Prefix)
			}
		}
	}
}

// writeMMDB writes a MaxMind DB with mmdbwriter. Reserved networks are
// allowed so the tests can use documentation prefixes.
func writeMMDB(t *testing.T, path string, ipVersion int, records map[string]mmdbtype.DataType) {
	t.Helper()
	tree, err := mmdbwriter.New(mmdbwriter.Options{
		DatabaseType:            "Edgeguard-Test-ASN",
		IPVersion:               ipVersion,
		RecordSize:              24,
		IncludeReservedNetworks: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	for cidr, rec := range records {
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			t.Fatal(err)
		}
		if err := tree.Insert(n, rec); err != nil {
			t.Fatalf("insert %s: %v", cidr, err)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tree.WriteTo(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func asRecord(asn uint32, org string) mmdbtype.Map {
	return mmdbtype.Map{
		"autonomous_system_number":       mmdbtype.Uint32(asn),
		"autonomous_system_organization": mmdbtype.String(org),
	}
}

func TestLoadMMDB(t *testing.T) {
	dir := t.TempDir()
	// Named without .mmdb: detection is by the metadata marker.
	asnDB := filepath.Join(dir, "GeoLite2-ASN.bin")
	writeMMDB(t, asnDB, 6, map[string]mmdbtype.DataType{
		"1.0.0.0/24":     asRecord(13335, "CLOUDFLARENET"),
		"1.0.1.0/24":     asRecord(13335, "CLOUDFLARENET"), // merges into 1.0.0.0/23
		"8.8.8.0/24":     asRecord(15169, "GOOGLE"),
		"8.8.9.0/24":     asRecord(15170, "OTHER"),
		"2001:4860::/32": asRecord(15169, "GOOGLE"),
		"2001:db8::/33":  asRecord(64500, "DOC"),
		"9.9.9.0/24":     mmdbtype.Map{"autonomous_system_organization": mmdbtype.String("NO NUMBER")}, // skipped
	})
	countryDB := filepath.Join(dir, "GeoLite2-Country.mmdb")
	writeMMDB(t, countryDB, 4, map[string]mmdbtype.DataType{
		"5.0.0.0/8": mmdbtype.Map{"country": mmdbtype.Map{"iso_code": mmdbtype.String("DE")}},
		"6.0.0.0/8": mmdbtype.Map{"registered_country": mmdbtype.Map{"iso_code": mmdbtype.String("fr")}},
	})
	if f, err := DetectFormat(asnDB); err != nil || f != FormatMMDB {
		t.Fatalf("DetectFormat = %v, %v", f, err)
	}
	var progress []int64
	tbl, err := Load(t.Context(), []string{asnDB, countryDB}, Options{Progress: func(done, total int64) { progress = append(progress, done, total) }})
	if err != nil {
		t.Fatal(err)
	}
	e := func(p string, asn uint32, c [2]byte) Entry {
		return Entry{Prefix: netip.MustParsePrefix(p), ASN: asn, Country: c}
	}
	want := []Entry{
		e("1.0.0.0/23", 13335, [2]byte{}),
		e("5.0.0.0/8", 0, cc("DE")),
		e("6.0.0.0/8", 0, cc("FR")),
		e("8.8.8.0/24", 15169, [2]byte{}),
		e("8.8.9.0/24", 15170, [2]byte{}),
		e("2001:db8::/33", 64500, [2]byte{}),
		e("2001:4860::/32", 15169, [2]byte{}),
	}
	if got := entriesOf(tbl); !slices.Equal(got, want) {
		t.Fatalf("entries:\n got %v\nwant %v", got, want)
	}
	// mmdbwriter itself joins the two equal 1.0.x.0/24 into one /23 node.
	if tbl.Stats().Ranges != 7 {
		t.Errorf("stats %+v", tbl.Stats())
	}
	if n := len(progress); n < 2 || progress[n-2] != progress[n-1] {
		t.Errorf("progress %v: want a final call with done == total", progress)
	}
	if got, ok := tbl.Lookup(netip.MustParseAddr("2001:4860:4860::8888")); !ok || got.ASN != 15169 {
		t.Errorf("Lookup = %+v, %v", got, ok)
	}
}

func TestLoadMMDBProblems(t *testing.T) {
	t.Chdir(t.TempDir())
	writeMMDB(t, "bad-country.mmdb", 6, map[string]mmdbtype.DataType{
		"5.0.0.0/8": mmdbtype.Map{"country": mmdbtype.Map{"iso_code": mmdbtype.String("Germany")}},
	})
	writeMMDB(t, "bad-type.mmdb", 6, map[string]mmdbtype.DataType{
		"5.0.0.0/8": mmdbtype.Map{"autonomous_system_number": mmdbtype.String("AS3320")},
	})
	for name, want := range map[string]string{
		"bad-country.mmdb": `bad-country.mmdb: network 5.0.0.0/8: country iso_code "Germany" is not a two-letter ISO 3166 code`,
		"bad-type.mmdb":    "bad-type.mmdb: network 5.0.0.0/8: record is not a map with autonomous_system_number or country.iso_code",
	} {
		_, err := Load(t.Context(), []string{name}, Options{})
		if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v\nwant it to contain %s", name, err, want)
		}
	}
	// A file with the marker but a broken tree is rejected, not a panic.
	writeFile(t, ".", "broken.mmdb", append([]byte("garbage"), mmdbMarker...))
	if _, err := Load(t.Context(), []string{"broken.mmdb"}, Options{}); !errors.Is(err, ErrRejected) ||
		!strings.Contains(err.Error(), "broken.mmdb: not a readable MaxMind DB") {
		t.Errorf("broken: err = %v", err)
	}
	// TSV and MaxMind data overlapping are rejected like any overlap.
	writeMMDB(t, "asn.mmdb", 6, map[string]mmdbtype.DataType{"1.0.0.0/24": asRecord(1, "A")})
	writeFile(t, ".", "asn.tsv", []byte("1.0.0.0\t1.0.0.0\t1\tUS\tA\n"))
	_, err := Load(t.Context(), []string{"asn.mmdb", "asn.tsv"}, Options{})
	if want := "asn.tsv:1: range 1.0.0.0-1.0.0.0 overlaps range 1.0.0.0-1.0.0.255 from asn.mmdb network 1.0.0.0-1.0.0.255"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v\nwant it to contain %s", err, want)
	}
}
