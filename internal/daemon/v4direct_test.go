package daemon

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps/mapstest"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/internal/version"
)

// TestIPv4DirectChunksDefault: a policy that leaves tables.
// ipv4_direct_chunks out gets the data plane's default budget.
func TestIPv4DirectChunksDefault(t *testing.T) {
	if got, want := policy.DefaultTables().IPv4DirectChunks, loader.DefaultSizes().V4Chunks; got != want {
		t.Errorf("policy default ipv4_direct_chunks %d, data plane default %d", got, want)
	}
}

// v4Policy is a policy with small tables (the test loads real maps) and
// one rule over the given IPv4 prefixes.
func v4Policy(chunks int, prefixes ...string) string {
	return fmt.Sprintf(`apiVersion: edgeguard/v1
mode: enforce
tables:
  per_source_entries: 4096
  aggregate_entries: 4096
  prefix_entries: 4096
  list_entries: 1024
  max_rules: 16
  ipv4_direct_chunks: %d
rules:
  - name: listed
    match: {prefixes: [%s]}
metrics: {listen: ""}
`, chunks, strings.Join(prefixes, ", "))
}

// loadedDaemon is a daemon whose data plane is loaded for real (no pins)
// with policy applied, attached nowhere: the policy's generation is live,
// no L7 stage. Tests and benchmarks share it.
func loadedDaemon(tb testing.TB, o Options, policy string) *Daemon {
	tb.Helper()
	return loadedDaemonWith(tb, o, policy, nil)
}

// loadedDaemonWith is loadedDaemon with before run on the loaded data
// plane before the first generation is committed (what an earlier
// daemon left in the pinned maps).
func loadedDaemonWith(tb testing.TB, o Options, policy string, before func(*Daemon)) *Daemon {
	tb.Helper()
	testenv.RequireRoot(tb)
	d := newDaemon(o)
	next, err := d.prepare(context.Background(), []byte(policy), "p.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	if err := d.loadDatapath(next); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		d.fleet.stop()
		d.bgp.stop()
		d.dp.Close()
	})
	if before != nil {
		before(d)
	}
	if err := d.commitData(next); err != nil {
		tb.Fatal(err)
	}
	return d
}

// commitData is the data-plane half of apply (a generation and the lists,
// no interfaces and no L7 stage), as the tests without interfaces need;
// the subscribers are told of the generation as apply tells them.
func (d *Daemon) commitData(next running) error {
	d.mu.Lock()
	if err := mapstest.StageCommit(d.m, next.compiled); err != nil {
		d.mu.Unlock()
		return err
	}
	d.cur = next
	d.generation++
	c := committed{seq: d.generation, run: next, at: time.Now()}
	err := d.lists.sync(d.cur.pol)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	d.publish(context.Background(), c)
	return nil
}

// applyPolicy applies a new policy as a reload does, without touching
// attachments.
func (d *Daemon) applyPolicy(t *testing.T, policy string) error {
	t.Helper()
	d.changeMu.Lock()
	defer d.changeMu.Unlock()
	next, err := d.prepare(context.Background(), []byte(policy), "p.yaml")
	if err != nil {
		return err
	}
	return d.commitData(next)
}

// v4Gauges are the IPv4 direct table's metrics in one gather of the
// daemon's registry, by name.
func v4Gauges(t *testing.T, d *Daemon) map[string]float64 {
	t.Helper()
	fams, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "edgeguard_ipv4_direct_table_") {
			continue
		}
		if f.GetType() != dto.MetricType_GAUGE || len(f.Metric) != 1 {
			t.Fatalf("%s: %v with %d series, want one gauge", f.GetName(), f.GetType(), len(f.Metric))
		}
		m := f.Metric[0]
		if f.GetName() == "edgeguard_ipv4_direct_table_chunks" {
			if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "generation" || l[0].GetValue() != "active" {
				t.Errorf("%s labels = %v, want generation=active", f.GetName(), l)
			}
		}
		out[f.GetName()] = m.GetGauge().GetValue()
	}
	return out
}

func checkV4(t *testing.T, d *Daemon, want control.IPv4Direct, reason string) {
	t.Helper()
	got := d.Status().IPv4Direct
	gotReason := got.Reason
	got.Reason, want.Reason = "", ""
	if got != want || !strings.Contains(gotReason, reason) || (reason == "") != (gotReason == "") {
		t.Errorf("status ipv4_direct_table = %+v, reason %q; want %+v, reason containing %q", got, gotReason, want, reason)
	}
	gauges := v4Gauges(t, d)
	wantGauges := map[string]float64{
		"edgeguard_ipv4_direct_table_in_use":          float64(b2i(want.InUse)),
		"edgeguard_ipv4_direct_table_over_budget":     float64(b2i(want.OverBudget)),
		"edgeguard_ipv4_direct_table_chunks":          float64(want.Chunks),
		"edgeguard_ipv4_direct_table_capacity_chunks": float64(want.CapacityChunks),
	}
	if fmt.Sprint(gauges) != fmt.Sprint(wantGauges) {
		t.Errorf("metrics = %v\nwant %v", gauges, wantGauges)
	}
}

// TestIPv4DirectTableStatusAndMetrics applies policies to a real data
// plane and checks that `edgectl status` (the daemon's Status) and the
// metrics say how the active generation looks IPv4 sources up, with the
// reason when it uses the trie.
func TestIPv4DirectTableStatusAndMetrics(t *testing.T) {
	d := loadedDaemon(t, Options{}, v4Policy(8, "240.0.0.0/24"))
	if d.dp.Sizes.V4Chunks != 8 {
		t.Fatalf("loaded with %d chunks, want the policy's 8", d.dp.Sizes.V4Chunks)
	}
	// One fact: below the threshold, the trie.
	checkV4(t, d, control.IPv4Direct{IPv4Facts: 1, CapacityChunks: 8}, "fewer than 1024")

	// Every generation gets a table: a /24 takes two chunks (/20, /24).
	d.m.Generations.SetV4DirectMinFacts(0)
	if err := d.applyPolicy(t, v4Policy(8, "240.0.0.0/24")); err != nil {
		t.Fatal(err)
	}
	checkV4(t, d, control.IPv4Direct{InUse: true, IPv4Facts: 1, Chunks: 2, CapacityChunks: 8}, "")

	// Three /32s in different /16s take four chunks each: over budget.
	if err := d.applyPolicy(t, v4Policy(8, "240.0.0.1/32", "240.1.0.1/32", "240.2.0.1/32")); err != nil {
		t.Fatal(err)
	}
	checkV4(t, d, control.IPv4Direct{IPv4Facts: 3, CapacityChunks: 8, OverBudget: true},
		"needs more than 8 chunks: raise the policy's tables.ipv4_direct_chunks")

	// A new budget is a new map size: refused, the running policy stays.
	err := d.applyPolicy(t, v4Policy(16, "240.0.0.0/24"))
	if err == nil || !strings.Contains(err.Error(), "edgectl detach --unpin") {
		t.Fatalf("reload with another ipv4_direct_chunks: %v, want refused with the detach --unpin hint", err)
	}
	checkV4(t, d, control.IPv4Direct{IPv4Facts: 3, CapacityChunks: 8, OverBudget: true}, "needs more than 8 chunks")

	problems, err := testutil.CollectAndLint(newV4DirectCollector(d))
	if err != nil || len(problems) != 0 {
		t.Errorf("metric lint: %v %v", problems, err)
	}
}

// TestIPv4DirectChunksFlagWins: edgectl run --ipv4-direct-chunks sizes the
// table whatever the policy says, and then policies with another
// tables.ipv4_direct_chunks still apply.
func TestIPv4DirectChunksFlagWins(t *testing.T) {
	d := loadedDaemon(t, Options{IPv4DirectChunks: 32}, v4Policy(8, "240.0.0.0/24"))
	if d.dp.Sizes.V4Chunks != 32 {
		t.Fatalf("loaded with %d chunks, want the flag's 32", d.dp.Sizes.V4Chunks)
	}
	if err := d.applyPolicy(t, v4Policy(16, "240.0.0.0/24")); err != nil {
		t.Fatalf("reload with another ipv4_direct_chunks under the flag: %v", err)
	}
	checkV4(t, d, control.IPv4Direct{IPv4Facts: 1, CapacityChunks: 32}, "fewer than 1024")
}

// TestAlertsReadExportedDaemonMetrics checks that every IPv4 direct table
// series deploy/prometheus/alerts.yml reads is one this daemon's collector
// exports (internal/metrics checks the rest of the alerts).
func TestAlertsReadExportedDaemonMetrics(t *testing.T) {
	b, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	read := regexp.MustCompile(`edgeguard_ipv4_direct_table_[a-z_]+`).FindAllString(string(b), -1)
	if len(read) == 0 {
		t.Fatal("no alert reads an edgeguard_ipv4_direct_table_* series")
	}
	exported := testenv.DescribedNames(t, newV4DirectCollector(nil))
	for _, n := range read {
		if !exported[n] {
			t.Errorf("alerts.yml reads %s, which the daemon does not export (it exports %v)", n, exported)
		}
	}
}

// TestControlFamiliesExported: the daemon's own families (read by
// alerts.yml and docs/metrics.md) gather, with the build's labels.
func TestControlFamiliesExported(t *testing.T) {
	d := newDaemon(Options{Build: version.Info{Version: "v9.9.9", Commit: "abc", GoVersion: "go1.x"}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(d.controlCollectors()...)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range fams {
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName()+"="+l.GetValue())
		}
		got[f.GetName()] = strings.Join(labels, ",")
	}
	if got["edgeguard_build_info"] != "commit=abc,goversion=go1.x,version=v9.9.9" {
		t.Errorf("edgeguard_build_info labels %q", got["edgeguard_build_info"])
	}
	if _, ok := got["edgeguard_interfaces_unprotected"]; !ok {
		t.Errorf("edgeguard_interfaces_unprotected not exported: %v", got)
	}
	b, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "edgeguard_interfaces_unprotected > 0") {
		t.Error("alerts.yml has no alert on edgeguard_interfaces_unprotected")
	}
}
