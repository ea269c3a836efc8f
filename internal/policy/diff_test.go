package policy

import (
	"testing"

	"github.com/edgeguard/edgeguard/internal/asn"
)

func compileFile(t *testing.T, path string, data []asn.Entry) *Compiled {
	t.Helper()
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Compile(p, data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDiffGolden(t *testing.T) {
	data := []asn.Entry{ent("10.1.0.0/16", 64500, "DE"), ent("172.16.0.0/12", 64501, "US")}
	old := compileFile(t, "testdata/diff_old.yaml", data)
	new := compileFile(t, "testdata/diff_new.yaml", data)
	example := compileFile(t, "../../examples/edgeguard.yaml", nil)
	t.Run("changes", func(t *testing.T) { golden(t, "diff_changes", FormatDiff(Diff(old, new))) })
	t.Run("reverse", func(t *testing.T) { golden(t, "diff_reverse", FormatDiff(Diff(new, old))) })
	t.Run("from nothing", func(t *testing.T) { golden(t, "diff_from_nothing", FormatDiff(Diff(nil, example))) })
	t.Run("identical", func(t *testing.T) {
		again := compileFile(t, "../../examples/edgeguard.yaml", nil)
		if d := Diff(example, again); len(d) != 0 {
			t.Errorf("diff of a policy with itself = %q", FormatDiff(d))
		}
	})
	t.Run("deterministic", func(t *testing.T) {
		first := FormatDiff(Diff(old, new))
		for i := 0; i < 20; i++ {
			if got := FormatDiff(Diff(compileFile(t, "testdata/diff_old.yaml", data), compileFile(t, "testdata/diff_new.yaml", data))); got != first {
				t.Fatalf("diff changed between runs:\n%s\nvs\n%s", got, first)
			}
		}
	})
}

func TestDiffEqualRatesWrittenDifferently(t *testing.T) {
	a, _ := Compile(mustParse(t, "global: {packets: {rate: 60/min, burst: 5}}\n"), nil)
	b, _ := Compile(mustParse(t, "global: {packets: {rate: 1/s, burst: 5}}\n"), nil)
	if d := Diff(a, b); len(d) != 0 {
		t.Errorf("60/min vs 1/s: %q", FormatDiff(d))
	}
	c, _ := Compile(mustParse(t, "rules: [{name: web, match: {prefixes: [10.0.0.0/8]}, per_source: {packets: 100/s}}]\n"), nil)
	e, _ := Compile(mustParse(t, "rules: [{name: web, match: {prefixes: [10.0.0.0/8]}, per_source: {packets: {rate: 200/s, burst: 100}}}]\n"), nil)
	if got, want := FormatDiff(Diff(c, e)), "~ rule web per_source packets 100/s -> 200/s\n"; got != want {
		t.Errorf("diff = %q, want %q", got, want)
	}
}
