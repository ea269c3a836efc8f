package l7test

import (
	"os"
	"strings"
	"testing"
)

// GeneratedPart checks that the text of the file at path between the
// lines begin and end is want; with update it rewrites it instead. The
// tests of the l7: tables use it for docs/policy.md.
func GeneratedPart(t *testing.T, path, begin, end, want string, update bool) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s: no %q ... %q", path, begin, end)
	}
	if doc[i+len(begin):j] == want {
		return
	}
	if update {
		if err := os.WriteFile(path, []byte(doc[:i+len(begin)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the generated part after %q differs from the tables; run the test with -update", path, strings.TrimSpace(begin))
}
