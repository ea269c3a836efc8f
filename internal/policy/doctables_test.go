package policy

import (
	"os"
	"strings"
	"testing"
)

const policyDoc = "../../docs/policy.md"

// TestPolicyDocTables: docs/policy.md's field tables are what the tables
// the parser walks say (FieldTables). Each sits between
//
//	<!-- fields: NAME (generated: ...) -->
//	<!-- end fields: NAME -->
//
// and `go test ./internal/policy -run TestPolicyDocTables -update` rewrites
// them in place, leaving the prose around them as it is.
func TestPolicyDocTables(t *testing.T) {
	data, err := os.ReadFile(policyDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	out := doc
	for _, ft := range FieldTables() {
		begin := "<!-- fields: " + ft.Name + " (generated: go test ./internal/policy -run TestPolicyDocTables -update) -->\n"
		end := "<!-- end fields: " + ft.Name + " -->\n"
		i := strings.Index(out, begin)
		j := strings.Index(out, end)
		if i < 0 || j < i {
			t.Errorf("docs/policy.md has no generated table for %s: add the lines\n%s%s where it belongs, then run with -update", ft.Name, begin, end)
			continue
		}
		out = out[:i+len(begin)] + ft.Markdown + out[j:]
	}
	if out == doc {
		return
	}
	if *update {
		if err := os.WriteFile(policyDoc, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/policy.md's field tables differ from the policy's tables: run go test ./internal/policy -run TestPolicyDocTables -update")
}
