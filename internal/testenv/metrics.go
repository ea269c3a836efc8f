package testenv

import (
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
