package proxy

import (
	"flag"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
)

var updateDocs = flag.Bool("update", false, "rewrite the generated tables of docs/policy.md")

// docTables is the l7: part of docs/policy.md written from the tables
// (tables.go, routes.go): the field tables, one per sub-section.
func docTables() string {
	d := &decoder{}
	def := DefaultConfig()
	var b strings.Builder
	part := func(title, md string) {
		b.WriteString("\n" + title + "\n\n" + md)
	}
	part("Top level (`l7:`):", d.l7Table().Markdown(&def))
	part("`l7.paths`:", pathsTable.Markdown(&def.Paths))
	part("`l7.headers`:", headersTable.Markdown(&def.Headers))
	timeouts := DefaultTimeouts()
	part("`l7.timeouts` (so N bytes take at most one period plus N/`min_rate`; docs/l7-proxy.md, \"Engines\"):",
		timeoutsTable.Markdown(&timeouts))
	part("`l7.escalation`:", escalationTable.Markdown(&def.Escalation))
	part("`l7.classes`:", classesTable.Markdown(&def.Classes))
	redis := DefaultRedis()
	part("`l7.redis` (when set):", redisTable.Markdown(&redis))
	conc := DefaultConcurrency()
	part("A **concurrency** section (`l7.concurrency`, or a route's); see docs/l7-shedding.md:", concurrencyTable.Markdown(&conc))
	var r Route
	part("A **route** (an item of `l7.routes`):", d.routeTable(&r, nil).Markdown(&r))
	var m matchSpec
	part("A route's **match**:", matchTable.Markdown(&m))
	var t Tiers
	tiers := d.tiersSection(func() string { return "" }, nil)
	part("A route's **tiers**:", tiers.Table.Markdown(&t))
	l := limitSpec{Limit: Limit{Algorithm: AlgGCRA, Backend: BackendLocal, Capacity: DefaultLocalCapacity}}
	bad := false
	part("A **limit** (of a route, a tier, or an `rls:` rule):", d.limitTable(&l, &bad).Markdown(&l))
	return b.String()
}

// TestPolicyDocL7Tables: docs/policy.md's l7: field tables are the ones
// the tables write.
func TestPolicyDocL7Tables(t *testing.T) {
	l7test.GeneratedPart(t, "../../../docs/policy.md",
		"<!-- l7 tables: generated from internal/l7/proxy/tables.go, do not edit -->\n",
		"<!-- end of l7 tables -->", docTables()+"\n", *updateDocs)
}
