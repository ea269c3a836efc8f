package testenv

import (
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// ExportedNames registers cs in a pedantic registry (which refuses an
// inconsistent family), gathers once and returns the names of the
// families they export: what a test checks the deployed dashboard and
// alerts against.
func ExportedNames(tb testing.TB, cs ...prometheus.Collector) map[string]bool {
	tb.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(cs...)
	fams, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
	}
	return exported
}

// fqName is where a Desc's String() holds its name (Desc has no name
// accessor).
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// DescribedNames returns the names of the families cs describe up front
// (a collector without a source describes what it would export).
func DescribedNames(tb testing.TB, cs ...prometheus.Collector) map[string]bool {
	tb.Helper()
	descs := make(chan *prometheus.Desc)
	go func() {
		for _, c := range cs {
			c.Describe(descs)
		}
		close(descs)
	}()
	names := map[string]bool{}
	var nameless []string
	for d := range descs {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			nameless = append(nameless, d.String())
			continue
		}
		names[m[1]] = true
	}
	if len(nameless) > 0 {
		tb.Fatalf("no name in %v", nameless)
	}
	return names
}
