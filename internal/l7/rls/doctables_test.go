package rls

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/policy.md's l7 field tables")

// TestPolicyDocTables: docs/policy.md's l7: field tables are what the
// tables the decoders walk say (FieldTables), with the policy's markers
// (internal/policy's TestPolicyDocTables checks the other sections'):
//
//	<!-- fields: NAME (generated: go test ./internal/l7/rls -run TestPolicyDocTables -update) -->
//	<!-- end fields: NAME -->
func TestPolicyDocTables(t *testing.T) {
	const path = "../../../docs/policy.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	out := doc
	for _, ft := range FieldTables() {
		begin := "<!-- fields: " + ft.Name + " (generated: go test ./internal/l7/rls -run TestPolicyDocTables -update) -->\n"
		end := "<!-- end fields: " + ft.Name + " -->\n"
		i, j := strings.Index(out, begin), strings.Index(out, end)
		if i < 0 || j < i {
			t.Errorf("docs/policy.md has no generated table for %s: add the lines\n%s%s where it belongs, then run with -update", ft.Name, begin, end)
			continue
		}
		out = out[:i+len(begin)] + ft.Markdown + out[j:]
	}
	if out == doc {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/policy.md's l7 field tables differ from the tables: run go test ./internal/l7/rls -run TestPolicyDocTables -update")
}
