package rls

import (
	"flag"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
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
	l7test.GeneratedPart(t, path, begin, end, b.String(), *updateDocs)
}
