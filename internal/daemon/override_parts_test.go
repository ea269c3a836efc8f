package daemon

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/fleet"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/shield"
	"github.com/edgeguard/edgeguard/internal/testbed"
)

// TestShieldAndFleetShareOneOverride: on a scope: fleet aggregate, the
// shield's tighten (shieldRun.write) and fleet mode's share
// (ApplyShares) are two parts of one override: each write keeps the
// other's part, and the shield's removal keeps the share.
func TestShieldAndFleetShareOneOverride(t *testing.T) {
	dir := t.TempDir()
	asnPath := filepath.Join(dir, "ip2asn.tsv")
	if err := os.WriteFile(asnPath, []byte(testbed.LabASNData), 0o644); err != nil {
		t.Fatal(err)
	}
	src := `apiVersion: edgeguard/v1
mode: enforce
tables: {per_source_entries: 4096, aggregate_entries: 4096, prefix_entries: 4096, list_entries: 1024, max_rules: 16}
asn_data: {path: ` + asnPath + `}
fleet: {name: f, redis: {addrs: ["127.0.0.1:1"]}}
metrics: {listen: ""}
rules:
  - {name: fl, match: {prefixes: [198.18.0.0/15]}, scope: fleet, per_asn: {packets: {rate: 1000/s, burst: 100}}}
`
	d := loadedDaemon(t, Options{StateDir: dir}, src)
	pol, err := policy.Parse("p.yaml", []byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	rule := policy.RuleID("fl")
	agg := maps.Aggregate{RuleID: rule, Kind: maps.AggKindASN, ASN: 64500}
	fa := &fleetAggs{d: d, aggs: map[string]maps.Aggregate{agg.String(): agg}, budgets: fleetBudgets(pol)}
	share := []fleet.Share{{Key: agg.String(), Budget: 1000, Rate: 250, Hosts: 4}}

	tighten := shield.Change{Op: shield.OpInstall, Action: shield.Action{ID: 1, Kind: shield.Tighten,
		Key: shield.Key{Kind: shield.KindASN, Rule: rule, ASN: 64500}, Budget: 40, Expires: time.Now().Add(time.Minute)}}
	check := func(when string, wantBudget, wantNew uint64, origins ...maps.Origin) {
		t.Helper()
		list, err := d.m.Overrides.All()
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].Aggregate != agg || list[0].Budget.Count != wantBudget || list[0].NewBudget.Count != wantNew ||
			len(list[0].Parts) != len(origins) {
			t.Fatalf("%s: overrides %+v, want budget %d/s, new-source %d/s, parts of %v", when, list, wantBudget, wantNew, origins)
		}
		for i, p := range list[0].Parts {
			if p.Origin != origins[i] {
				t.Fatalf("%s: parts %+v, want origins %v", when, list[0].Parts, origins)
			}
		}
	}
	if err := d.shield.write(tighten); err != nil {
		t.Fatal(err)
	}
	if err := fa.ApplyShares(share, time.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	check("shield, then fleet", 250, 40, maps.OriginFleet, maps.OriginShield)
	if err := d.shield.write(tighten); err != nil { // the shield renews
		t.Fatal(err)
	}
	check("the shield renews", 250, 40, maps.OriginFleet, maps.OriginShield)
	remove := tighten
	remove.Op = shield.OpRemove
	if err := d.shield.write(remove); err != nil {
		t.Fatal(err)
	}
	check("the shield removes its action", 250, 0, maps.OriginFleet)
	if err := d.shield.write(tighten); err != nil {
		t.Fatal(err)
	}
	if err := fa.ApplyShares(share, time.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	check("fleet's next interval", 250, 40, maps.OriginFleet, maps.OriginShield)
}
