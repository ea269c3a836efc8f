package policy

// FieldTable is one section's table of fields as docs/policy.md shows it:
// key, what the file may write, default, meaning.
type FieldTable struct {
	// Name is the section's path ("standing", "fleet.redis"), or a list
	// item's name ("syn service").
	Name     string
	Markdown string
}

// FieldTables are the field tables of the policy's sections, written from
// the tables the parser walks and the defaults it starts from (edgectl
// policy fields prints them; docs/policy.md holds them, checked by
// TestPolicyDocTables).
func FieldTables() []FieldTable {
	standing, tables, sampling, shield := DefaultStanding(), DefaultTables(), DefaultSampling(), DefaultShield()
	metrics := Metrics{Listen: DefaultMetricsListen}
	asn := ASNData{Format: ASNFormatIPToASN}
	syn, svc := SYN{ValidatedFor: DefaultSYNValidatedFor}, defaultSYNService()
	fleet := defaultFleet()
	tls := FleetTLS{}
	nb := BGPNeighbor{Multihop: 1}
	global := Policy{GlobalReserve: DefaultReserve}
	limits := defaultLimits()
	rule := Rule{Action: ActionLimit, Mode: RuleModeInherit, Scope: ScopeHost, Limits: limits}
	return []FieldTable{
		{"interfaces entry", interfaceTable.Markdown(&Interface{XDPMode: XDPAuto})},
		{"global", globalTable.Markdown(&global)},
		{"lists", listsTable.Markdown(&global)},
		{"defaults", defaultsTable.Markdown(&limits)},
		{"rule", ruleTable(nil, "rule NAME").Markdown(&rule)},
		{"rule match", matchTable.Markdown(&matchSpec{})},
		{"tables", tablesTable.Markdown(&tables)},
		{"metrics", metricsTable.Markdown(&metrics)},
		{"asn_data", asnDataTable.Markdown(&asn)},
		{"syn", synTable.Markdown(&syn)},
		{"syn service", synServiceTable.Markdown(&svc)},
		{"fleet", fleetTable.Markdown(fleet)},
		{"fleet.redis", fleetRedisTable.Markdown(&fleet.Redis)},
		{"fleet.redis.tls", fleetTLSTable.Markdown(&tls)},
		{"bgp", bgpTable.Markdown(defaultBGP())},
		{"bgp neighbor", bgpNeighborTable.Markdown(&nb)},
		{"shield", shieldTable.Markdown(&shield)},
		{"standing", standingTable.Markdown(&standing)},
		{"sampling", samplingTable.Markdown(&sampling)},
	}
}
