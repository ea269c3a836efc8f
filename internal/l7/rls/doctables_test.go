package rls

import (
	"flag"
	"testing"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/policy.md's l7 field tables")

// TestPolicyDocTables: docs/policy.md's l7: field tables are what the
// tables the decoders walk say (FieldTables), with the policy's markers
// (internal/policy's TestPolicyDocTables checks the other sections').
func TestPolicyDocTables(t *testing.T) {
	var parts []testenv.DocPart
	for _, ft := range FieldTables() {
		parts = append(parts, testenv.DocPart{Name: ft.Name, Text: ft.Markdown})
	}
	testenv.CheckGeneratedParts(t, "../../../docs/policy.md",
		"go test ./internal/l7/rls -run TestPolicyDocTables -update", parts, *updateDocs)
}
