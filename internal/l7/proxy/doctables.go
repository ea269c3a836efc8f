package proxy

import "github.com/edgeguard/edgeguard/internal/policy"

// FieldTables are the field tables of the l7: section, as
// docs/policy.md shows them: written from the tables Decode walks and the
// defaults it starts from (edgectl policy fields prints them with the
// policy's; internal/l7/rls adds the rls: section's and checks
// docs/policy.md holds them).
func FieldTables() []policy.FieldTable {
	d := &decoder{}
	def := DefaultConfig()
	timeouts, redis, conc := DefaultTimeouts(), DefaultRedis(), DefaultConcurrency()
	var (
		r     Route
		m     matchSpec
		tiers Tiers
		bad   bool
	)
	l := limitSpec{Limit: Limit{Algorithm: AlgGCRA, Backend: BackendLocal, Capacity: DefaultLocalCapacity}}
	return []policy.FieldTable{
		{Name: "l7", Markdown: d.l7Table().Markdown(&def)},
		{Name: "l7.paths", Markdown: pathsTable.Markdown(&def.Paths)},
		{Name: "l7.headers", Markdown: headersTable.Markdown(&def.Headers)},
		{Name: "l7.timeouts", Markdown: timeoutsTable.Markdown(&timeouts)},
		{Name: "l7.escalation", Markdown: escalationTable.Markdown(&def.Escalation)},
		{Name: "l7.classes", Markdown: classesTable.Markdown(&def.Classes)},
		{Name: "l7.redis", Markdown: redisTable.Markdown(&redis)},
		{Name: "l7 concurrency", Markdown: concurrencyTable.Markdown(&conc)},
		{Name: "l7 route", Markdown: d.routeTable(&r, nil).Markdown(&r)},
		{Name: "l7 route match", Markdown: matchTable.Markdown(&m)},
		{Name: "l7 route tiers", Markdown: d.tiersSection(func() string { return "" }, nil).Table.Markdown(&tiers)},
		{Name: "l7 limit", Markdown: d.limitTable(&l, &bad).Markdown(&l)},
	}
}
