package policy

import (
	"testing"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestPolicyDocTables: docs/policy.md's field tables are what the tables
// the parser walks say (FieldTables); `go test ./internal/policy -run
// TestPolicyDocTables -update` rewrites them in place, leaving the prose
// around them as it is (testenv.CheckGeneratedParts).
func TestPolicyDocTables(t *testing.T) {
	var parts []testenv.DocPart
	for _, ft := range FieldTables() {
		parts = append(parts, testenv.DocPart{Name: ft.Name, Text: ft.Markdown})
	}
	testenv.CheckGeneratedParts(t, "../../docs/policy.md",
		"go test ./internal/policy -run TestPolicyDocTables -update", parts, *update)
}
