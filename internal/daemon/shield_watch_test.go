package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testbed"
)

// watchPolicy is a policy with the rules web (198.18/16: AS64501) and
// other (198.20/16: AS64511), both with ASN budgets; web's scope is fleet
// when webFleet, the shield's section is there when shieldOn, other is
// there when withOther.
func watchPolicy(asnPath string, shieldOn, webFleet, withOther bool) string {
	p := `apiVersion: edgeguard/v1
mode: enforce
tables: {per_source_entries: 4096, aggregate_entries: 4096, prefix_entries: 4096, list_entries: 1024, max_rules: 16}
asn_data: {path: ` + asnPath + `}
metrics: {listen: ""}
sampling: {one_in: 1, max_per_second: 1000000}
fleet: {name: f, redis: {addrs: ["127.0.0.1:6379"]}}
rules:
`
	scope := ""
	if webFleet {
		scope = ", scope: fleet"
	}
	p += `  - {name: web, match: {prefixes: [198.18.0.0/16]}` + scope + `, per_asn: {packets: {rate: 1M/s, burst: 1M}}}` + "\n"
	if withOther {
		p += `  - {name: other, match: {prefixes: [198.20.0.0/16]}, per_asn: {packets: {rate: 1M/s, burst: 1M}}}` + "\n"
	}
	if shieldOn {
		p += "shield: {mode: monitor}\n"
	}
	return p
}

// TestShieldAndFleetWatchOwners runs the shield's policy follower and the
// fleet's counter reader (FleetCounters) on a real data plane across policy
// swaps: a watch both need survives the shield going off and fleet mode
// letting go, each alone; the rule's removal drops it for both; what the
// data plane counts (one packet per rule, AggregateCounters) is the proof.
func TestShieldAndFleetWatchOwners(t *testing.T) {
	dir := t.TempDir()
	asnPath := filepath.Join(dir, "ip2asn.tsv")
	if err := os.WriteFile(asnPath, []byte(testbed.LabASNData), 0o644); err != nil {
		t.Fatal(err)
	}
	d := loadedDaemon(t, Options{StateDir: dir}, watchPolicy(asnPath, true, true, true))
	fa := &fleetAggs{d: d}
	web, other := policy.RuleID("web"), policy.RuleID("other")
	webASN := fmt.Sprintf("rule %d asn 64501", web)
	otherASN := fmt.Sprintf("rule %d asn 64511", other)
	now := time.Now()
	step := func(pol string) {
		t.Helper()
		if pol != "" {
			if err := d.applyPolicy(t, pol); err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(time.Second)
		d.shield.tick(now)
		if _, err := fa.FleetCounters(); err != nil {
			t.Fatal(err)
		}
	}
	counted := func() []string {
		t.Helper()
		for _, src := range []string{"198.18.0.1", "198.20.0.1"} {
			if _, err := d.dp.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: packet.UDP4(src, 40000, 443, 64)}); err != nil {
				t.Fatal(err)
			}
		}
		cs, err := d.m.Overrides.AggregateCounters()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range cs {
			if c.Aggregate.Kind == maps.AggKindASN {
				out = append(out, c.Aggregate.String())
			}
		}
		slices.Sort(out)
		return out
	}
	want := func(what string, names ...string) {
		t.Helper()
		slices.Sort(names)
		if got := counted(); !slices.Equal(got, names) {
			t.Fatalf("%s: the data plane counts %v, want %v (shield holds %v, fleet %v)", what, got, names,
				d.m.Overrides.WatchedBy(maps.OriginShield), d.m.Overrides.WatchedBy(maps.OriginFleet))
		}
	}
	webW := maps.Watch{RuleID: web, Kind: maps.AggKindASN}

	step("")
	want("shield and fleet on", webASN, otherASN)
	if !d.m.Overrides.WatchedBy(maps.OriginShield)[webW] || !d.m.Overrides.WatchedBy(maps.OriginFleet)[webW] {
		t.Fatalf("web's ASN watch: shield holds %v, fleet %v; want both", d.m.Overrides.WatchedBy(maps.OriginShield), d.m.Overrides.WatchedBy(maps.OriginFleet))
	}

	step(watchPolicy(asnPath, false, true, true))
	want("shield off: fleet keeps web's", webASN)
	if w := d.m.Overrides.WatchedBy(maps.OriginShield); len(w) != 0 {
		t.Fatalf("the shield is off and holds %v", w)
	}

	step(watchPolicy(asnPath, true, true, true))
	want("shield back", webASN, otherASN)

	step(watchPolicy(asnPath, true, false, true))
	want("web no longer scope fleet: the shield keeps it", webASN, otherASN)
	if w := d.m.Overrides.WatchedBy(maps.OriginFleet); len(w) != 0 {
		t.Fatalf("no scope: fleet rule and fleet mode holds %v", w)
	}

	step(watchPolicy(asnPath, true, true, false))
	want("other removed", webASN)
	if d.m.Overrides.WatchedBy(maps.OriginShield)[maps.Watch{RuleID: other, Kind: maps.AggKindASN}] {
		t.Fatal("the shield still holds the watch of a removed rule")
	}

	step(watchPolicy(asnPath, false, true, true))
	d.fleet.stop()
	want("shield off and fleet stopped")
	if a, b := d.m.Overrides.WatchedBy(maps.OriginShield), d.m.Overrides.WatchedBy(maps.OriginFleet); len(a)+len(b) != 0 {
		t.Fatalf("nobody needs a watch: the shield holds %v, fleet %v", a, b)
	}
}
