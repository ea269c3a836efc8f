package daemon

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestEveryFamilyDocumented: every metric family the daemon's collectors
// and its L7 stage describe is named in docs/metrics.md (which says what
// it is, or where it is explained).
func TestEveryFamilyDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	d := newDaemon(Options{})
	var missing, names []string
	for n := range testenv.DescribedNames(t, append(d.edgeguardCollectors(), d.l7.stage.Collector())...) {
		names = append(names, n)
	}
	// Families of collectors that describe nothing up front (the L7
	// stage's vectors, the XDP collector's) show up when gathered; a
	// daemon with nothing loaded gathers what it can.
	fams, _ := d.reg.Gather()
	for _, f := range fams {
		if n := f.GetName(); !strings.HasPrefix(n, "go_") && !strings.HasPrefix(n, "process_") {
			names = append(names, n)
		}
	}
	for _, n := range names {
		if !regexp.MustCompile(`(^|[^a-z0-9_])` + regexp.QuoteMeta(n) + `($|[^a-z0-9_])`).Match(doc) {
			missing = append(missing, n)
		}
	}
	slices.Sort(missing)
	missing = slices.Compact(missing)
	t.Logf("%d families described or gathered", len(slices.Compact(slices.Sorted(slices.Values(names)))))
	if len(missing) > 0 {
		t.Errorf("%d metric families are not named in docs/metrics.md:\n%s", len(missing), strings.Join(missing, "\n"))
	}
}
