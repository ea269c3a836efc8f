package rls

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update", false, "rewrite the generated tables of docs/policy.md")

// TestPolicyDocRLSTables: docs/policy.md's rls: field tables are the ones
// the tables write.
func TestPolicyDocRLSTables(t *testing.T) {
	const (
		path  = "../../../docs/policy.md"
		begin = "<!-- rls tables: generated from internal/l7/rls/config.go, do not edit -->\n"
		end   = "<!-- end of rls tables -->"
	)
	var b strings.Builder
	var c Config
	b.WriteString("\n`l7.rls`:\n\n" + rlsTable(nil).Markdown(&c))
	var tls TLS
	b.WriteString("\n`l7.rls.tls`:\n\n" + tlsTable.Markdown(&tls))
	var r Rule
	bad := false
	b.WriteString("\nA **rule** (an item of `l7.rls.rules`):\n\n" + ruleTable(nil, &r, &bad, nil).Markdown(&r))
	var tiers Tiers
	b.WriteString("\nA rule's **tiers**:\n\n" + tiersTable(nil, "", nil, nil).Markdown(&tiers) + "\n")
	want := b.String()

	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("docs/policy.md: no %q ... %q", begin, end)
	}
	if doc[i+len(begin):j] == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(doc[:i+len(begin)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/policy.md's rls tables differ from the tables in internal/l7/rls; run go test ./internal/l7/rls -run TestPolicyDocRLSTables -update")
}
