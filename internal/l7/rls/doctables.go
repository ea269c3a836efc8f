package rls

import (
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// FieldTables are the field tables of the whole l7: section, the proxy's
// and the rate-limit service's, as docs/policy.md shows them (checked by
// TestPolicyDocTables; edgectl policy fields prints them).
func FieldTables() []policy.FieldTable {
	var (
		c     Config
		tls   TLS
		r     Rule
		tiers Tiers
		bad   bool
	)
	return append(proxy.FieldTables(),
		policy.FieldTable{Name: "l7.rls", Markdown: rlsTable(nil).Markdown(&c)},
		policy.FieldTable{Name: "l7.rls.tls", Markdown: tlsTable.Markdown(&tls)},
		policy.FieldTable{Name: "l7 rls rule", Markdown: ruleTable(nil, &r, &bad, nil).Markdown(&r)},
		policy.FieldTable{Name: "l7 rls rule tiers", Markdown: tiersTable(nil, "", nil, nil).Markdown(&tiers)},
	)
}
