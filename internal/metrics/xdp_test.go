package metrics_test

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/metrics"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

const (
	xdpDrop = 1
	xdpPass = 2
	loIndex = 1 // the loopback device: BPF_PROG_TEST_RUN receives there
)

var reloadAt = time.Unix(1_764_460_800, 250_000_000) // 2025-11-30T00:00:00.25Z

// scenario is a policy and a scripted sequence of frames with known
// verdicts.
type scenario struct {
	src *mapsSource
	// frame lengths, to check byte counters exactly
	okLen, deniedLen, blockedLen, dryLen, badLen int
}

// scenarioGen: rule 0 "default" limits each source to 1/s with a burst of
// 2; rule 1 "blocked" drops 198.18.1.0/24; rule 2 "dry" limits
// 198.18.3.0/24 in dry-run; 198.18.2.0/24 is on the deny list; malformed
// frames are dropped.
func scenarioGen() policy.Compiled {
	return policy.Compiled{
		Mode:      policy.ModeEnforce,
		Malformed: policy.VerdictDrop,
		Rules: []policy.CompiledRule{
			{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}, PerSource: policy.Bucket{Packets: policy.Limit{Rate: policy.Rate{Count: 1, Per: time.Second}, Burst: 2}}},
			{ID: 1, Action: policy.ActionDrop},
			{ID: 2, SourceKey: policy.KeyBits{V4: 32, V6: 64}, Mode: policy.RuleModeDryRun, PerSource: policy.Bucket{Packets: policy.Limit{Rate: policy.Rate{Count: 1, Per: time.Second}, Burst: 1}}},
		},
		Prefixes: []policy.PrefixFact{
			{Prefix: netip.MustParsePrefix("198.18.1.0/24"), RuleID: 1},
			{Prefix: netip.MustParsePrefix("198.18.3.0/24"), RuleID: 2},
		},
	}
}

// runScenario loads the data plane, applies the policy, and sends on the
// frozen test clock, first while the loopback device has no counter slot of
// its own (so it counts under "other"), then with slot 1 named "lo":
//
//	other: 3 from 198.18.1.5 (blocked)  -> 3 drop/rule_drop
//	other: 2 from 198.18.2.2 (denied)   -> 2 drop/deny_list
//	other: 3 from 198.18.3.3 (dry)      -> 1 pass/ok, 2 would_drop/source_limit
//	other: 1 IPv4 frame cut in its header -> 1 drop/bad_ipv4
//	lo:    5 from 198.18.0.1 (default)  -> 2 pass/ok, 3 drop/source_limit
func runScenario(t *testing.T) *scenario {
	t.Helper()
	src := loadSource(t)
	src.rules = map[string]uint32{"default": 0, "blocked": 1, "dry": 2}
	if err := src.apply(t, scenarioGen(), reloadAt); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if err := src.m.Lists.Set([]maps.ListEntry{{
		Prefix: netip.MustParsePrefix("198.18.2.0/24"), DenyUntil: maps.Forever, Origin: maps.OriginCLI,
	}}); err != nil {
		t.Fatalf("set lists: %v", err)
	}
	if err := src.m.SetTestClock(uint64(time.Hour)); err != nil {
		t.Fatal(err)
	}

	ok := packet.UDP4("198.18.0.1", 1000, 53, 10)
	blocked := packet.UDP4("198.18.1.5", 1000, 53, 20)
	denied := packet.UDP4("198.18.2.2", 1000, 53, 30)
	dry := packet.UDP4("198.18.3.3", 1000, 53, 40)
	bad := packet.UDP4("198.18.0.9", 1000, 53, 0)[:14+10]

	want := func(name string, got, want uint32) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: xdp action %d, want %d", name, got, want)
		}
	}
	for range 3 {
		want("blocked", src.run(t, blocked), xdpDrop)
	}
	for range 2 {
		want("denied", src.run(t, denied), xdpDrop)
	}
	for range 3 {
		want("dry-run", src.run(t, dry), xdpPass)
	}
	want("malformed", src.run(t, bad), xdpDrop)
	src.setSlot(t, loIndex, 1, "lo")
	for i := range 5 {
		act := uint32(xdpPass)
		if i >= 2 {
			act = xdpDrop
		}
		want("default", src.run(t, ok), act)
	}
	return &scenario{src: src, okLen: len(ok), deniedLen: len(denied), blockedLen: len(blocked), dryLen: len(dry), badLen: len(bad)}
}

func TestCollectorExportsRealCounters(t *testing.T) {
	sc := runScenario(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewXDPCollector(sc.src, nil))
	text := scrape(t, reg)
	e := parse(t, text)

	type series struct {
		name   string
		labels []string
		want   float64
	}
	pkts, byts := "edgeguard_xdp_packets_total", "edgeguard_xdp_bytes_total"
	cases := []series{
		{pkts, []string{"iface", "lo", "action", "pass", "reason", "ok"}, 2},
		{byts, []string{"iface", "lo", "action", "pass", "reason", "ok"}, float64(2 * sc.okLen)},
		{pkts, []string{"iface", "lo", "action", "drop", "reason", "source_limit"}, 3},
		{byts, []string{"iface", "lo", "action", "drop", "reason", "source_limit"}, float64(3 * sc.okLen)},
		{pkts, []string{"iface", "other", "action", "drop", "reason", "rule_drop"}, 3},
		{byts, []string{"iface", "other", "action", "drop", "reason", "rule_drop"}, float64(3 * sc.blockedLen)},
		{pkts, []string{"iface", "other", "action", "drop", "reason", "deny_list"}, 2},
		{byts, []string{"iface", "other", "action", "drop", "reason", "deny_list"}, float64(2 * sc.deniedLen)},
		{pkts, []string{"iface", "other", "action", "pass", "reason", "ok"}, 1},
		{pkts, []string{"iface", "other", "action", "would_drop", "reason", "source_limit"}, 2},
		{byts, []string{"iface", "other", "action", "would_drop", "reason", "source_limit"}, float64(2 * sc.dryLen)},
		{pkts, []string{"iface", "other", "action", "drop", "reason", "bad_ipv4"}, 1},
		{byts, []string{"iface", "other", "action", "drop", "reason", "bad_ipv4"}, float64(sc.badLen)},
		// A combination that never happened is exported at zero.
		{pkts, []string{"iface", "lo", "action", "drop", "reason", "deny_list"}, 0},

		{"edgeguard_xdp_rule_packets_total", []string{"rule", "default", "action", "pass"}, 2},
		{"edgeguard_xdp_rule_packets_total", []string{"rule", "default", "action", "drop"}, 3},
		{"edgeguard_xdp_rule_bytes_total", []string{"rule", "default", "action", "drop"}, float64(3 * sc.okLen)},
		{"edgeguard_xdp_rule_packets_total", []string{"rule", "blocked", "action", "drop"}, 3},
		{"edgeguard_xdp_rule_packets_total", []string{"rule", "dry", "action", "pass"}, 1},
		{"edgeguard_xdp_rule_packets_total", []string{"rule", "dry", "action", "would_drop"}, 2},
		{"edgeguard_xdp_rule_packets_total", []string{"rule", "dry", "action", "drop"}, 0},

		{"rate_limit_rejected_total", []string{"layer", "xdp", "rule", "default", "reason", "rule"}, 3},
		{"rate_limit_rejected_total", []string{"layer", "xdp", "rule", "blocked", "reason", "rule"}, 3},
		{"rate_limit_rejected_total", []string{"layer", "xdp", "rule", "dry", "reason", "rule"}, 0},
		{"rate_limit_rejected_total", []string{"layer", "xdp", "rule", "", "reason", "deny_list"}, 2},
		{"rate_limit_rejected_total", []string{"layer", "xdp", "rule", "", "reason", "bad_ipv4"}, 1},
		{"rate_limit_rejected_total", []string{"layer", "xdp", "rule", "", "reason", "bad_l4"}, 0},
		{"rate_limit_rejected_total", []string{"layer", "xdp", "rule", "", "reason", "bad_ip_length"}, 0},
		{"rate_limit_rejected_total", []string{"layer", "xdp", "rule", "", "reason", "icmp_wrong_family"}, 0},

		// Two sources got a bucket (198.18.0.1 and 198.18.3.3); a drop
		// rule and the deny list create none.
		{"edgeguard_table_entries", []string{"table", "sources"}, 2},
		{"edgeguard_table_capacity_entries", []string{"table", "sources"}, float64(smallSizes.SrcEntries)},
		{"edgeguard_table_entries", []string{"table", "aggregates"}, 0},
		{"edgeguard_table_capacity_entries", []string{"table", "aggregates"}, float64(smallSizes.AggEntries)},
		{"edgeguard_table_entries", []string{"table", "lists"}, 1},
		{"edgeguard_table_capacity_entries", []string{"table", "lists"}, float64(smallSizes.ListEntries)},

		{"edgeguard_policy_generation", nil, 1},
		{"edgeguard_policy_last_reload_success", nil, 1},
		{"edgeguard_policy_last_reload_timestamp_seconds", nil, 1_764_460_800.25},
		{"edgeguard_policy_reloads_total", []string{"result", "success"}, 1},
		{"edgeguard_policy_reloads_total", []string{"result", "failure"}, 0},
		{"edgeguard_scrape_errors_total", []string{"read", "iface_counters"}, 0},
		{"edgeguard_scrape_errors_total", []string{"read", "rule_counters"}, 0},
		{"edgeguard_scrape_errors_total", []string{"read", "tables"}, 0},
	}
	for _, c := range cases {
		got, ok := e.value(c.name, c.labels...)
		if !ok {
			t.Errorf("%s%v missing", c.name, c.labels)
			continue
		}
		if got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	// Every packet is counted once per family, and each drop once in
	// rate_limit_rejected_total: the rule series hold exactly the drops
	// of the reasons decided under a rule.
	if got := e.sum(pkts); got != 14 {
		t.Errorf("edgeguard_xdp_packets_total sums to %v, want the 14 frames sent", got)
	}
	if got := e.sum("edgeguard_xdp_rule_packets_total"); got != 11 {
		t.Errorf("rule packets sum to %v, want the 11 frames that reached a rule", got)
	}
	rejected := e.sum("rate_limit_rejected_total", "layer", "xdp")
	drops := e.sum(pkts, "action", "drop")
	if rejected != drops || drops != 9 {
		t.Errorf("rate_limit_rejected_total{layer=xdp} sums to %v, drops to %v; want both 9", rejected, drops)
	}
	ruleDrops := 0.0
	for _, r := range []string{"source_limit", "prefix_limit", "asn_limit", "global_limit", "rule_drop"} {
		ruleDrops += e.sum(pkts, "action", "drop", "reason", r)
	}
	var underRules float64
	for _, m := range e["rate_limit_rejected_total"].Metric {
		for _, l := range m.Label {
			if l.GetName() == "rule" && l.GetValue() != "" {
				underRules += m.Counter.GetValue()
			}
		}
	}
	if underRules != ruleDrops {
		t.Errorf("rejections under rules = %v, drops of rule reasons = %v", underRules, ruleDrops)
	}
	for name, f := range e {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if _, err := netip.ParseAddr(l.GetValue()); err == nil {
					t.Errorf("%s has an address in label %s=%q", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
	promtoolCheckMetrics(t, text)
}

// TestCollectorReadsAtScrapeTime checks that a second scrape sees traffic
// and reloads that happened after the first one.
func TestCollectorReadsAtScrapeTime(t *testing.T) {
	sc := runScenario(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewXDPCollector(sc.src, nil))
	before := parse(t, scrape(t, reg))

	// One second later the default rule's source has one more token.
	if err := sc.src.m.SetTestClock(uint64(time.Hour + time.Second)); err != nil {
		t.Fatal(err)
	}
	frame := packet.UDP4("198.18.0.1", 1000, 53, 10)
	if got := sc.src.run(t, frame); got != xdpPass {
		t.Fatalf("after 1s: action %d, want pass", got)
	}
	if got := sc.src.run(t, frame); got != xdpDrop {
		t.Fatalf("after 1s, second frame: action %d, want drop", got)
	}
	// A reload that fails (a rule id used twice) leaves generation 1
	// running.
	bad := scenarioGen()
	bad.Rules = append(bad.Rules, policy.CompiledRule{ID: 0})
	failedAt := reloadAt.Add(time.Minute)
	if err := sc.src.apply(t, bad, failedAt); err == nil {
		t.Fatal("apply of a rule id used twice succeeded")
	}
	after := parse(t, scrape(t, reg))

	for _, c := range []struct {
		name        string
		labels      []string
		delta, want float64
	}{
		{"edgeguard_xdp_packets_total", []string{"iface", "lo", "action", "pass", "reason", "ok"}, 1, 3},
		{"edgeguard_xdp_packets_total", []string{"iface", "lo", "action", "drop", "reason", "source_limit"}, 1, 4},
		{"rate_limit_rejected_total", []string{"layer", "xdp", "rule", "default", "reason", "rule"}, 1, 4},
		{"edgeguard_policy_generation", nil, 0, 1},
		{"edgeguard_policy_last_reload_success", nil, -1, 0},
		{"edgeguard_policy_last_reload_timestamp_seconds", nil, 60, float64(failedAt.Unix()) + 0.25},
		{"edgeguard_policy_reloads_total", []string{"result", "failure"}, 1, 1},
		{"edgeguard_policy_reloads_total", []string{"result", "success"}, 0, 1},
	} {
		b, ok1 := before.value(c.name, c.labels...)
		a, ok2 := after.value(c.name, c.labels...)
		if !ok1 || !ok2 {
			t.Errorf("%s%v missing from a scrape", c.name, c.labels)
			continue
		}
		if a != c.want || a-b != c.delta {
			t.Errorf("%s%v: %v then %v, want %v (+%v)", c.name, c.labels, b, a, c.want, c.delta)
		}
	}
}

// TestCollectorNeverReloaded: before the first reload the last-reload
// gauges are absent (not a false "failed" 0), the rest is there.
func TestCollectorNeverReloaded(t *testing.T) {
	src := loadSource(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewXDPCollector(src, nil))
	e := parse(t, scrape(t, reg))
	for _, name := range []string{"edgeguard_policy_last_reload_success", "edgeguard_policy_last_reload_timestamp_seconds"} {
		if _, ok := e[name]; ok {
			t.Errorf("%s exported before any reload", name)
		}
	}
	if v, ok := e.value("edgeguard_policy_generation"); !ok || v != 0 {
		t.Errorf("edgeguard_policy_generation = %v (present %v), want 0", v, ok)
	}
	if v, ok := e.value("edgeguard_table_capacity_entries", "table", "sources"); !ok || v != float64(smallSizes.SrcEntries) {
		t.Errorf("sources capacity = %v (present %v)", v, ok)
	}
}

// TestCollectorPartialFailure: a read that fails is left out and counted;
// the scrape still succeeds with everything else.
func TestCollectorPartialFailure(t *testing.T) {
	sc := runScenario(t)
	// The rule counters' map is gone (its file descriptor closed): every
	// lookup in it fails, the other maps still answer.
	if err := sc.src.d.Objects.RuleStats.Close(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewXDPCollector(sc.src, nil))

	for i := 1; i <= 2; i++ {
		text := scrape(t, reg)
		e := parse(t, text)
		if v, _ := e.value("edgeguard_scrape_errors_total", "read", "rule_counters"); v != float64(i) {
			t.Errorf("scrape %d: rule_counters errors = %v, want %d", i, v, i)
		}
		if v, _ := e.value("edgeguard_scrape_errors_total", "read", "iface_counters"); v != 0 {
			t.Errorf("scrape %d: iface_counters errors = %v, want 0", i, v)
		}
		if _, ok := e["edgeguard_xdp_rule_packets_total"]; ok {
			t.Errorf("scrape %d: rule counters exported although their read failed", i)
		}
		if v, ok := e.value("edgeguard_xdp_packets_total", "iface", "other", "action", "drop", "reason", "rule_drop"); !ok || v != 3 {
			t.Errorf("scrape %d: interface counters = %v (present %v), want 3", i, v, ok)
		}
		if v, ok := e.value("rate_limit_rejected_total", "layer", "xdp", "rule", "", "reason", "deny_list"); !ok || v != 2 {
			t.Errorf("scrape %d: deny-list rejections = %v (present %v), want 2", i, v, ok)
		}
		if v, ok := e.value("edgeguard_table_entries", "table", "lists"); !ok || v != 1 {
			t.Errorf("scrape %d: lists entries = %v (present %v), want 1", i, v, ok)
		}
		promtoolCheckMetrics(t, text)
	}

	// With the data plane's file descriptors closed every read fails: the
	// scrape still answers, with the policy status and the error counts.
	sc.src.d.Close()
	e := parse(t, scrape(t, reg))
	for read, want := range map[string]float64{"iface_counters": 1, "rule_counters": 3, "tables": 1} {
		if v, _ := e.value("edgeguard_scrape_errors_total", "read", read); v != want {
			t.Errorf("closed datapath: %s errors = %v, want %v", read, v, want)
		}
	}
	if v, ok := e.value("edgeguard_policy_generation"); !ok || v != 1 {
		t.Errorf("closed datapath: generation = %v (present %v), want 1", v, ok)
	}
	for _, name := range []string{"edgeguard_xdp_packets_total", "edgeguard_table_entries", "rate_limit_rejected_total"} {
		if _, ok := e[name]; ok {
			t.Errorf("closed datapath: %s exported", name)
		}
	}
}

// BenchmarkGather is the cost of one scrape of the XDP collector over the
// real maps of the scenario (16 interface slots x 3 actions x 19 reasons
// read per CPU, 3 rules, 3 tables walked), without HTTP.
func BenchmarkGather(b *testing.B) {
	requireRoot(b)
	src := loadSource(b)
	src.rules = map[string]uint32{"default": 0, "blocked": 1, "dry": 2}
	if err := src.apply(b, scenarioGen(), reloadAt); err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewXDPCollector(src, nil))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGatherSources is a scrape with 65536 live per-source buckets:
// counting them walks the table, two syscalls per entry.
func BenchmarkGatherSources(b *testing.B) {
	requireRoot(b)
	b.StopTimer()
	sizes := smallSizes
	sizes.SrcEntries = 1 << 16
	src := loadSizedSource(b, sizes)
	src.rules = map[string]uint32{"default": 0, "blocked": 1, "dry": 2}
	if err := src.apply(b, scenarioGen(), reloadAt); err != nil {
		b.Fatal(err)
	}
	if err := src.m.SetTestClock(uint64(time.Hour)); err != nil {
		b.Fatal(err)
	}
	for i := range 1 << 16 {
		a := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		src.run(b, packet.Frame{Src: a, Proto: packet.ProtoUDP, SrcPort: 1, DstPort: 53}.Build())
	}
	tables, err := src.Tables()
	if err != nil || tables["sources"].Entries < 1<<15 {
		b.Fatalf("sources table holds %d entries (%v), want most of 65536", tables["sources"].Entries, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewXDPCollector(src, nil))
	b.ReportAllocs()
	b.StartTimer()
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestConcurrentScrapes gathers from several goroutines at once (run with
// -race): every failed read is counted once, none lost.
func TestConcurrentScrapes(t *testing.T) {
	sc := runScenario(t)
	if err := sc.src.d.Objects.RuleStats.Close(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewXDPCollector(sc.src, nil))
	const workers, each = 4, 10
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				if _, err := reg.Gather(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	e := parse(t, scrape(t, reg))
	if v, _ := e.value("edgeguard_scrape_errors_total", "read", "rule_counters"); v != workers*each+1 {
		t.Errorf("rule_counters errors = %v, want %d", v, workers*each+1)
	}
	if v, _ := e.value("edgeguard_xdp_packets_total", "iface", "lo", "action", "pass", "reason", "ok"); v != 2 {
		t.Errorf("lo pass/ok = %v, want 2", v)
	}
}

// TestCollectorFingerprintDropsOnce: a packet a fingerprint drops was
// charged to its rule (the rule's counters have it), so
// rate_limit_rejected_total has it once, under the rule, as it has the
// override reasons' drops; not again with rule="".
func TestCollectorFingerprintDropsOnce(t *testing.T) {
	src := loadSource(t)
	src.rules = map[string]uint32{"default": 0, "blocked": 1, "dry": 2}
	if err := src.apply(t, scenarioGen(), reloadAt); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if err := src.m.SetTestClock(uint64(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := src.m.Fingerprints.Set(maps.Fingerprint{ID: 1, Mask: maps.FieldSrc, Src: netip.MustParsePrefix("198.18.0.0/24"),
		Expires: time.Now().Add(time.Hour), Origin: maps.OriginShield}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got := src.run(t, packet.UDP4("198.18.0.1", 1000, 53, 10)); got != xdpDrop {
			t.Fatalf("xdp action %d, want a fingerprint drop", got)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewXDPCollector(src, nil))
	e := parse(t, scrape(t, reg))
	if got := e.sum("edgeguard_xdp_packets_total", "action", "drop", "reason", "fingerprint"); got != 3 {
		t.Fatalf("drop/fingerprint = %v, want 3", got)
	}
	if got := e.sum("rate_limit_rejected_total", "layer", "xdp"); got != 3 {
		t.Errorf("rate_limit_rejected_total{layer=xdp} sums to %v, want the 3 drops once", got)
	}
}
