package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/shield"
	"github.com/edgeguard/edgeguard/internal/testbed"
)

// TestShieldDeployedQueries: every edgeguard_shield_* series the dashboard
// and the alerts read is one the shield's collector exports.
func TestShieldDeployedQueries(t *testing.T) {
	d := newDaemon(Options{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newShieldCollector(d)...)
	d.shield.mitigate.Observe(1)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			exported[f.GetName()+"_bucket"], exported[f.GetName()+"_count"], exported[f.GetName()+"_sum"] = true, true, true
		}
	}
	for _, file := range []string{"../../deploy/prometheus/alerts.yml", "../../deploy/grafana/edgeguard.json"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		read := regexp.MustCompile(`edgeguard_shield_[a-z_]+`).FindAllString(string(b), -1)
		if len(read) == 0 {
			t.Errorf("%s reads no edgeguard_shield_* series", file)
		}
		for _, n := range read {
			if !exported[n] {
				t.Errorf("%s reads %s, which the shield does not export (it exports %v)", file, n, exported)
			}
		}
	}
	for _, want := range []string{"edgeguard_shield_actions_active", "edgeguard_shield_surges_total", "edgeguard_shield_time_to_mitigate_seconds"} {
		if !exported[want] {
			t.Errorf("%s not exported", want)
		}
	}
}

func shieldTestPolicy(asnPath string) string {
	return `apiVersion: edgeguard/v1
mode: enforce
tables: {per_source_entries: 4096, aggregate_entries: 4096, prefix_entries: 4096, list_entries: 1024, max_rules: 16}
asn_data: {path: ` + asnPath + `}
defaults:
  per_asn: {packets: {rate: 1M/s, burst: 1M}}
global: {packets: {rate: 10M/s, burst: 10M}}
metrics: {listen: ""}
sampling: {one_in: 1, max_per_second: 1000000}
shield:
  mode: enforce
  baseline: {learn_for: 20s, half_life: 1m}
  surge: {min_rate: 50/s, sustain: 2s, cooldown: 3s}
  actions: {ttl: 30s}
`
}

// TestShieldTightensThroughOverride runs the shield's loop on a real data
// plane (BPF_PROG_TEST_RUN, no interface): real per-aggregate counters
// teach it a baseline, a 20x surge from one ASN becomes a shield override
// in the pinned overrides map (new sources only, budget at the baseline),
// visible in the report, the audit file and the metrics, and it goes when
// the surge ends. Time is the loop's argument: one call is one second.
func TestShieldTightensThroughOverride(t *testing.T) {
	dir := t.TempDir()
	asnPath := filepath.Join(dir, "ip2asn.tsv")
	if err := os.WriteFile(asnPath, []byte(testbed.LabASNData), 0o644); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	os.Mkdir(state, 0o700)
	d := loadedDaemon(t, Options{StateDir: state}, shieldTestPolicy(asnPath))
	ctx, cancel := context.WithCancel(context.Background())
	readerDone := make(chan error, 1)
	go func() { readerDone <- d.samples.readRates(ctx) }()
	t.Cleanup(func() { cancel(); <-readerDone })
	send := func(src string, n int) {
		t.Helper()
		frame := packet.UDP4(src, 40000, 443, 64)
		if _, err := d.dp.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: frame, Repeat: uint32(n)}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	sec := func(flood int) {
		send("198.18.0.1", 150) // users of AS64501
		send("198.18.1.1", 150)
		send("198.20.0.1", 300) // AS64511
		if flood > 0 {
			for i := range 10 {
				send(fmt.Sprintf("198.18.5.%d", i+1), flood/10)
			}
		}
		now = now.Add(time.Second)
		d.shield.tick(now)
	}
	for range 40 {
		sec(0)
	}
	// The port aggregate has no bucket: only the 1-in-N samples (read by
	// the daemon's reader) teach it.
	time.Sleep(200 * time.Millisecond)
	sec(0)
	r := d.ShieldReport(50)
	var port *control.ShieldAggregate
	for _, a := range r.Aggregates {
		if a.Aggregate == "port udp/443" {
			port = &a
		}
	}
	if port == nil || port.Rate <= 0 {
		t.Fatalf("port udp/443 not learned from samples: %+v", r.Aggregates)
	}
	var base float64
	for _, a := range r.Aggregates {
		if a.Aggregate == "rule 0 (default) asn 64501" {
			base = a.Baseline
		}
	}
	if r.Mode != "enforce" || base < 300 || base > 360 {
		t.Fatalf("report %+v: want mode enforce and AS64501's baseline at 300/s (+19%%), got %.0f", r, base)
	}
	for range 6 {
		sec(20 * 300)
	}
	ovr, err := d.m.Overrides.All()
	if err != nil {
		t.Fatal(err)
	}
	want := maps.Aggregate{RuleID: 0, Kind: maps.AggKindASN, ASN: 64501}
	if len(ovr) != 1 || ovr[0].Aggregate != want || ovr[0].Origin != maps.OriginShield {
		t.Fatalf("overrides %+v, want one shield override of %v (nothing broader)", ovr, want)
	}
	if nb := float64(ovr[0].NewBudget.Count); nb < base || nb > 1.02*base+1 || ovr[0].Budget.Count != 0 {
		t.Fatalf("override %+v: new-source budget must be the baseline %.0f, the aggregate's budget unchanged", ovr[0], base)
	}
	r = d.ShieldReport(5)
	if len(r.Actions) != 1 || !r.Actions[0].Enforced || r.Actions[0].Kind != "tighten" {
		t.Fatalf("actions %+v", r.Actions)
	}
	for ip, want := range map[string]int{"198.18.5.3": 1, "198.18.0.1": 1, "198.20.0.1": 0} {
		e, err := d.Explain(Probe{Addr: netip.MustParseAddr(ip), Proto: 17, SPort: 40000, DPort: 443, Len: 106, TTL: 64})
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Shield) != want {
			t.Errorf("explain %s: shield actions %+v, want %d", ip, e.Shield, want)
		}
		// Explain reads the override from the data plane: on the ASN
		// aggregate's steps, the shield's new-source part.
		ovr := 0
		for _, b := range e.Buckets {
			if b.Kind == "per_asn" && b.Override != nil && b.Override.NewSource != nil && b.Override.NewSource.Origin == "shield" {
				ovr++
			}
		}
		if (ovr > 0) != (want > 0) {
			t.Errorf("explain %s: %d per_asn steps show the shield's override, want them iff the source is in AS64501: %+v", ip, ovr, e.Buckets)
		}
	}
	if got := shieldGauge(t, d, "edgeguard_shield_actions_active", "tighten"); got != 1 {
		t.Fatalf("edgeguard_shield_actions_active{kind=tighten} = %v", got)
	}
	// The current rate (EWMA, 2 s) falls under end_factor x baseline about
	// 7 s after the surge, then cooldown (3 s).
	for range 14 {
		sec(0)
	}
	if ovr, _ := d.m.Overrides.All(); len(ovr) != 0 {
		t.Fatalf("after the surge: overrides %+v", ovr)
	}
	audit, err := os.ReadFile(filepath.Join(state, shieldAuditFile))
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, line := range strings.Split(strings.TrimSpace(string(audit)), "\n") {
		var rec auditRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		ops = append(ops, rec.Op+" "+rec.Aggregate+" by "+rec.By)
	}
	if want := []string{"install rule 0 asn 64501 by shield", "remove rule 0 asn 64501 by shield"}; !slices.Equal(ops, want) {
		t.Fatalf("audit %q, want %q", ops, want)
	}
	d.shield.save()
	b, err := os.ReadFile(filepath.Join(state, shieldStateFile))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := shield.New(shieldConfig(d.cur.pol.Shield), shieldOptions()).Load(b, now); err != nil || n == 0 {
		t.Fatalf("saved baselines: %d, %v", n, err)
	}
	// A restart (a new daemon on the same state directory) judges at once.
	d2 := loadedDaemon(t, Options{StateDir: state}, shieldTestPolicy(asnPath))
	d2.shield.tick(time.Now())
	var back *control.ShieldAggregate
	for _, a := range d2.ShieldReport(50).Aggregates {
		if a.Aggregate == "rule 0 (default) asn 64501" {
			back = &a
		}
	}
	if back == nil || !back.Judged || back.Baseline < 300 || back.Baseline > 360 {
		t.Fatalf("after a restart: %+v, want AS64501 judged with its baseline", back)
	}
	// A state file that does not load is moved aside; the next start
	// learns from scratch.
	os.WriteFile(filepath.Join(state, shieldStateFile), []byte(`{"version":1,"aggregates":[{"key":{"Kind":77}}]}`), 0o600)
	d3 := loadedDaemon(t, Options{StateDir: state}, shieldTestPolicy(asnPath))
	d3.shield.tick(time.Now())
	if _, err := os.Stat(filepath.Join(state, shieldStateFile+".corrupt")); err != nil {
		t.Fatalf("bad state file not moved aside: %v", err)
	}
	if r := d3.ShieldReport(5); len(r.Aggregates) != 0 {
		t.Fatalf("bad state file half loaded: %+v", r.Aggregates)
	}
}

// TestShieldOperator: release, pin and forbid through the daemon, with who
// asked in the audit; a forbidden ASN is never tightened.
func TestShieldOperator(t *testing.T) {
	dir := t.TempDir()
	asnPath := filepath.Join(dir, "ip2asn.tsv")
	os.WriteFile(asnPath, []byte(testbed.LabASNData), 0o644)
	d := loadedDaemon(t, Options{StateDir: dir}, shieldTestPolicy(asnPath))
	now := time.Now()
	d.shield.tick(now)
	if err := d.ShieldDo("release", control.ShieldRequest{ID: 42}, "alice"); !errors.Is(err, shield.ErrNoAction) {
		t.Fatalf("release of nothing: %v", err)
	}
	if err := d.ShieldDo("forbid", control.ShieldRequest{Aggregate: "AS64501"}, "bob (uid 0)"); err != nil {
		t.Fatal(err)
	}
	if err := d.ShieldDo("forbid", control.ShieldRequest{Aggregate: "not an aggregate"}, "bob"); err == nil {
		t.Fatal("forbid of junk accepted")
	}
	if r := d.ShieldReport(1); len(r.Forbid) != 1 || r.Forbid[0] != "AS64501 (bob (uid 0))" {
		t.Fatalf("forbid %q", r.Forbid)
	}
	if err := d.ShieldDo("forbid", control.ShieldRequest{Aggregate: "AS64501", Remove: true}, "bob"); err != nil {
		t.Fatal(err)
	}
}

func shieldGauge(t *testing.T, d *Daemon, name, kind string) float64 {
	t.Helper()
	fams, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("%s{kind=%q} not gathered", name, kind)
	return 0
}

// TestShieldControlHostile: the shield's control endpoints refuse what is
// not a request, and a shield that is off says so.
func TestShieldControlHostile(t *testing.T) {
	d := newDaemon(Options{})
	mux := d.controlMux()
	do := func(method, path, body string) int {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req = req.WithContext(context.WithValue(req.Context(), peerUIDKey{}, 0))
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		return w.Code
	}
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"GET", "/v1/shield", "", 200},
		{"GET", "/v1/shield?n=-1", "", 400},
		{"GET", "/v1/shield?n=abc", "", 400},
		{"GET", "/v1/shield?n=99999999999999999999", "", 400},
		{"POST", "/v1/shield/release", `{"id": "x"}`, 400},
		{"POST", "/v1/shield/release", `[`, 400},
		{"POST", "/v1/shield/release", `{"id": 1}`, 422}, // the shield is off
		{"POST", "/v1/shield/pin", `{"id": 4294967296}`, 400},
		{"POST", "/v1/shield/forbid", `{"aggregate": "AS1"}`, 422},
		{"POST", "/v1/shield/forbid", strings.Repeat(" ", maxSmallBody+10), 413},
		{"POST", "/v1/shield/nonsense", `{}`, 404},
	} {
		if got := do(c.method, c.path, c.body); got != c.want {
			t.Errorf("%s %s %.40q: %d, want %d", c.method, c.path, c.body, got, c.want)
		}
	}
}

// fingerprintFlood runs the daemon's shield over a real data plane with
// 1-in-1 samples: 40 seconds of users (one port), then 6 with a flood
// from random sources to port 9999 with one length. It returns a runner
// of frames through the program.
func fingerprintFlood(t *testing.T, d *Daemon) func(frame []byte, n int) uint32 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	readerDone := make(chan error, 1)
	go func() { readerDone <- d.samples.readRates(ctx) }()
	t.Cleanup(func() { cancel(); <-readerDone })
	run := func(frame []byte, n int) uint32 {
		t.Helper()
		ret, err := d.dp.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: frame, Repeat: uint32(n)})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}
	now := time.Now()
	sec := func(flood bool) {
		run(packet.UDP4("198.18.0.1", 40000, 443, 64), 150)
		run(packet.UDP4("198.20.0.1", 40001, 443, 200), 150)
		if flood {
			for i := range 10 {
				run(packet.UDP4(fmt.Sprintf("198.19.%d.%d", i*7, i+1), uint16(1000+i), 9999, 100), 300)
			}
		}
		time.Sleep(30 * time.Millisecond) // the reader delivers this second's samples
		now = now.Add(time.Second)
		d.shield.tick(now)
	}
	for range 40 {
		sec(false)
	}
	for range 6 {
		sec(true)
	}
	return run
}

// TestShieldFingerprintThroughMaps: a flood from random sources to one
// port with one length, on a real data plane with 1-in-1 samples, becomes
// a shield fingerprint rule in the data plane that names the port and the
// length, and the flood's packets are dropped by it while users' pass.
func TestShieldFingerprintThroughMaps(t *testing.T) {
	dir := t.TempDir()
	asnPath := filepath.Join(dir, "ip2asn.tsv")
	os.WriteFile(asnPath, []byte(testbed.LabASNData), 0o644)
	d := loadedDaemon(t, Options{StateDir: dir}, shieldTestPolicy(asnPath))
	run := fingerprintFlood(t, d)
	fps, err := d.m.Fingerprints.All()
	if err != nil {
		t.Fatal(err)
	}
	if len(fps) != 1 || fps[0].Origin != maps.OriginShield || fps[0].Mask&maps.FieldDPort == 0 || fps[0].DPort != 9999 {
		t.Fatalf("fingerprints %+v; actions %+v", fps, d.ShieldReport(5).Actions)
	}
	const xdpPass = 2
	if ret := run(packet.UDP4("198.19.200.1", 5555, 9999, 100), 1000); ret == xdpPass {
		t.Errorf("a flood packet past its fingerprint's budget passed")
	}
	if ret := run(packet.UDP4("198.18.0.1", 40000, 443, 64), 1); ret != xdpPass {
		t.Errorf("a user's packet got %d", ret)
	}
}

// TestShieldIDsAboveLeftovers: fingerprints a crashed daemon left in the
// pinned map (ids 1 and 41, live for an hour) keep their ids: the new
// daemon's shield numbers its first fingerprint 42, and both leftovers
// are still there after it installs it.
func TestShieldIDsAboveLeftovers(t *testing.T) {
	dir := t.TempDir()
	asnPath := filepath.Join(dir, "ip2asn.tsv")
	os.WriteFile(asnPath, []byte(testbed.LabASNData), 0o644)
	d := loadedDaemonWith(t, Options{StateDir: dir}, shieldTestPolicy(asnPath), func(d *Daemon) {
		for _, id := range []uint32{1, 41} {
			f := maps.Fingerprint{ID: id, Mask: maps.FieldProto | maps.FieldDPort, Proto: 6, DPort: uint16(7000 + id),
				Expires: time.Now().Add(time.Hour), Budget: maps.Rate{Count: 1, Per: time.Second, Burst: 1}, Origin: maps.OriginShield}
			if err := d.m.Fingerprints.Set(f); err != nil {
				t.Fatalf("leftover %d: %v", id, err)
			}
		}
	})
	fingerprintFlood(t, d)
	fps, err := d.m.Fingerprints.All()
	if err != nil {
		t.Fatal(err)
	}
	byID := map[uint32]maps.FingerprintState{}
	for _, f := range fps {
		byID[f.ID] = f
	}
	if len(fps) != 3 || byID[1].DPort != 7001 || byID[41].DPort != 7041 || byID[42].DPort != 9999 {
		t.Fatalf("fingerprints %+v, want the leftovers 1 and 41 and the flood's as 42; actions %+v",
			fps, d.ShieldReport(5).Actions)
	}
	// The shield adopted the leftovers: listed (adopted, not renewed),
	// counted in the metric, and released through it.
	adopted := map[uint32]bool{}
	for _, a := range d.ShieldReport(5).Actions {
		if a.Adopted {
			adopted[a.ID] = true
		}
	}
	if !adopted[1] || !adopted[41] || len(adopted) != 2 {
		t.Errorf("adopted actions %v, want 1 and 41", adopted)
	}
	if got := shieldGauge(t, d, "edgeguard_shield_actions_active", "fingerprint"); got != 3 {
		t.Errorf("edgeguard_shield_actions_active{kind=fingerprint} = %v, want 3 (two adopted)", got)
	}
	if err := d.ShieldDo("release", control.ShieldRequest{ID: 41}, "test"); err != nil {
		t.Fatalf("release the adopted 41: %v", err)
	}
	if fps, err := d.m.Fingerprints.All(); err != nil || len(fps) != 2 {
		t.Errorf("after releasing 41: %+v, %v", fps, err)
	}
}
