package metrics_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/fleet"
	"github.com/edgeguard/edgeguard/internal/metrics"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// repoFile returns the path of a file relative to the repository root.
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test file")
	}
	return filepath.Join(filepath.Dir(self), "..", "..", rel)
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []struct {
			Expr string `json:"expr"`
		} `json:"list"`
	} `json:"annotations"`
}

type panel struct {
	ID      int     `json:"id"`
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(repoFile(t, "deploy/grafana/edgeguard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("deploy/grafana/edgeguard.json: %v", err)
	}
	return d
}

// dashboardExprs returns every PromQL expression of the dashboard, by where
// it is.
func dashboardExprs(t *testing.T, d dashboard) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for i, tg := range p.Targets {
				out[p.Title+"/"+string(rune('A'+i))] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: query: %v", v.Name, err)
		}
		out["variable "+v.Name] = q.Query
	}
	for i, a := range d.Annotations.List {
		if a.Expr != "" {
			out["annotation "+string(rune('0'+i))] = a.Expr
		}
	}
	return out
}

var (
	promqlStrings   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promqlMatchers  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promqlGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	labelValuesArg  = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	promqlKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "offset": true, "bool": true, "inf": true, "nan": true}
	labelValuesCall = regexp.MustCompile(`^\s*label_values\(`)
)

// metricNames returns the metric names an expression reads: identifiers
// that are not functions, keywords, label names, durations or strings.
func metricNames(expr string) []string {
	if labelValuesCall.MatchString(expr) {
		if m := labelValuesArg.FindStringSubmatch(expr); m != nil {
			return []string{m[1]}
		}
		return nil
	}
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	var out []string
	for _, loc := range promqlIdent.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsAny(s[loc[0]-1:loc[0]], "0123456789$.") {
			continue // a duration (5m), a number or a variable ($instance)
		}
		rest := strings.TrimLeft(s[loc[1]:], " \t\n")
		if strings.HasPrefix(rest, "(") || promqlKeywords[strings.ToLower(name)] {
			continue // a function or a keyword
		}
		out = append(out, name)
	}
	return out
}

func TestMetricNamesExtraction(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (reason) (rate(edgeguard_xdp_packets_total{instance=~"$instance", action="pass"}[$__rate_interval]))`: {"edgeguard_xdp_packets_total"},
		`edgeguard_table_entries{a="b"} / edgeguard_table_capacity_entries > 0.9`:                                     {"edgeguard_table_entries", "edgeguard_table_capacity_entries"},
		`time() - edgeguard_policy_last_reload_timestamp_seconds`:                                                     {"edgeguard_policy_last_reload_timestamp_seconds"},
		`rate(x_total[1h] offset 1h) and on (instance) y`:                                                             {"x_total", "y"},
		`label_values(edgeguard_xdp_rule_packets_total{instance=~"$instance"}, rule)`:                                 {"edgeguard_xdp_rule_packets_total"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %v, want %v", expr, got, want)
		}
	}
}

func TestDashboardParses(t *testing.T) {
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard without title or uid")
	}
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q has an empty query", p.Title)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
}

// alertExprs returns the expression of every rule of alerts.yml by name.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(repoFile(t, "deploy/prometheus/alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	out := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = r.Expr
		}
	}
	return out
}

// daemonFamilies are exported by internal/daemon's own collectors, not by
// this package's; TestAlertsReadExportedDaemonMetrics (internal/daemon)
// checks the alerts that read them against the real collector.
var daemonFamilies = map[string]bool{
	"edgeguard_ipv4_direct_table_in_use":          true,
	"edgeguard_ipv4_direct_table_over_budget":     true,
	"edgeguard_ipv4_direct_table_chunks":          true,
	"edgeguard_ipv4_direct_table_capacity_chunks": true,
	"edgeguard_interfaces_unprotected":            true,
	"edgeguard_build_info":                        true,
	"edgeguard_state_unsaved":                     true,
	"up":                                          true, // Prometheus's own, per scrape target
}

// l7StageFamilies are exported by the L7 stage (internal/l7/stage and the
// proxy it serves); TestDashboardL7Panels (internal/l7/stage) checks the
// dashboard's queries of them against a real stage.
var l7StageFamilies = map[string]bool{
	"edgeguard_l7_requests_total":                   true,
	"edgeguard_l7_stage_info":                       true,
	"edgeguard_l7_stage_engine_starts_total":        true,
	"edgeguard_l7_stage_engine_failures_total":      true,
	"edgeguard_l7_responses_total":                  true,
	"edgeguard_l7_in_flight":                        true,
	"edgeguard_l7_request_duration_seconds_bucket":  true,
	"edgeguard_l7_upstream_duration_seconds_bucket": true,
	"edgeguard_l7_access_log_lines_total":           true,
	"edgeguard_l7_access_log_write_errors_total":    true,
}

// synFamilies are exported by the daemon's SYN path collector
// (internal/daemon/syn.go); TestDashboardSynPanels (internal/daemon) checks
// the dashboard's queries of them against it.
var synFamilies = map[string]bool{
	"edgeguard_syn_packets_total":     true,
	"edgeguard_syn_protection_active": true,
	"edgeguard_syn_path_loaded":       true,
	"edgeguard_syn_activations_total": true,
	"edgeguard_syn_mptcp_listener":    true,
}

// bgpFamilies are exported by the daemon's BGP collector
// (internal/daemon/bgp.go); TestBGPDeployedQueries (internal/daemon)
// checks the alerts' queries of them against it.
var bgpFamilies = map[string]bool{
	"edgeguard_bgp_sessions":      true,
	"edgeguard_bgp_configured":    true,
	"edgeguard_bgp_announcements": true,
	"edgeguard_bgp_refused_total": true,
}

// shieldFamilies are exported by the daemon's shield collector;
// TestShieldDeployedQueries (internal/daemon) checks the dashboard's and the
// alerts' queries of them against it.
var shieldFamilies = map[string]bool{
	"edgeguard_shield_actions_active":                  true,
	"edgeguard_shield_actions_would":                   true,
	"edgeguard_shield_aggregates_tracked":              true,
	"edgeguard_shield_surges_total":                    true,
	"edgeguard_shield_would_drop_packets_total":        true,
	"edgeguard_shield_samples_dropped_total":           true,
	"edgeguard_shield_write_failures_total":            true,
	"edgeguard_shield_time_to_mitigate_seconds_bucket": true,
	"edgeguard_shield_time_to_mitigate_seconds_count":  true,
	// The sampler's (internal/daemon/sampler.go; TestSamplerCounters).
	"edgeguard_sampler_chosen_packets_total": true,
	"edgeguard_sampler_samples_read_total":   true,
}

// TestDeployedQueriesUseExportedMetrics checks every metric the dashboard
// and the alerts read against what a real XDP collector and a real L7
// middleware export (or, for daemonFamilies, the daemon), and that the
// dashboard shows every XDP family.
func TestDeployedQueriesUseExportedMetrics(t *testing.T) {
	sc := runScenario(t)
	mw, _ := newL7(t, 3)
	// A fleet's collector (it exports without ever reaching Redis).
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rc.Close()
	fl, err := fleet.New(fleet.Options{Name: "t", Host: "h", Interval: time.Second, Client: rc})
	if err != nil {
		t.Fatal(err)
	}
	exported := testenv.ExportedNames(t, mw, metrics.NewXDPCollector(sc.src, nil), fl.Collector())

	dashExprs := dashboardExprs(t, readDashboard(t))
	used := map[string]bool{}
	for where, expr := range dashExprs {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("dashboard %s: no metric in %q", where, expr)
		}
		for _, n := range names {
			used[n] = true
			if !exported[n] && !l7StageFamilies[n] && !synFamilies[n] && !shieldFamilies[n] {
				t.Errorf("dashboard %s reads %s, which nothing exports", where, n)
			}
		}
	}
	for where, expr := range alertExprs(t) {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, expr)
		}
		for _, n := range names {
			if !exported[n] && !daemonFamilies[n] && !shieldFamilies[n] && !bgpFamilies[n] {
				t.Errorf("%s reads %s, which nothing exports", where, n)
			}
		}
	}
	for n := range exported {
		if strings.HasPrefix(n, "edgeguard_") && n != "edgeguard_xdp_rule_bytes_total" && !used[n] {
			t.Errorf("dashboard does not show %s", n)
		}
	}
	if !used["rate_limit_rejected_total"] {
		t.Error("dashboard does not show rate_limit_rejected_total")
	}
}

func TestAlertRulesCheck(t *testing.T) {
	promtool := requirePromtool(t)
	out, err := exec.Command(promtool, "check", "rules", repoFile(t, "deploy/prometheus/alerts.yml")).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestAlertRulesFire runs the promtool unit tests of the alerts: each alert
// fires on its scripted series, with its rendered annotations, and stays
// quiet before.
func TestAlertRulesFire(t *testing.T) {
	promtool := requirePromtool(t)
	b, err := os.ReadFile("testdata/alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := filepath.Abs(repoFile(t, "deploy/prometheus/alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	test := filepath.Join(t.TempDir(), "alerts_test.yml")
	if err := os.WriteFile(test, bytes.Replace(b, []byte("  - RULES\n"), []byte("  - "+rules+"\n"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "test", "rules", test).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// TestSystemdUnitVerifies runs systemd-analyze verify on the unit. The only
// finding allowed is that /usr/local/bin/edgectl is not installed on the
// machine running the test.
func TestSystemdUnitVerifies(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not on PATH: unit not verified")
	}
	unit := repoFile(t, "deploy/systemd/edgeguard.service")
	out, _ := exec.Command(sa, "verify", unit).CombinedOutput()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		if strings.Contains(line, "Command /usr/local/bin/edgectl is not executable") {
			if _, err := os.Stat("/usr/local/bin/edgectl"); os.IsNotExist(err) {
				continue
			}
		}
		t.Errorf("systemd-analyze verify: %s", line)
	}
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ExecStart=/usr/local/bin/edgectl run --config /etc/edgeguard/edgeguard.yaml --keep\n",
		"ExecReload=/bin/kill -HUP $MAINPID\n",
		"Restart=on-failure\n",
		"RuntimeDirectory=edgeguard\n",
		"RuntimeDirectoryMode=0700\n",
		"ProtectSystem=strict\n",
		"CapabilityBoundingSet=CAP_BPF CAP_NET_ADMIN CAP_PERFMON\n",
	} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("unit lacks %q", strings.TrimSpace(want))
		}
	}
	if m := regexp.MustCompile(`(?m)^ReadWritePaths=(.*)$`).FindSubmatch(b); m == nil ||
		!slices.Contains(strings.Fields(string(m[1])), "/sys/fs/bpf") || !slices.Contains(strings.Fields(string(m[1])), "/run/edgeguard") {
		t.Errorf("ReadWritePaths must hold /sys/fs/bpf and /run/edgeguard")
	}
}

// TestKernelRequirementAgrees (issue 25): the systemd unit and the README
// name the same oldest kernel.
func TestKernelRequirementAgrees(t *testing.T) {
	unit, err := os.ReadFile(repoFile(t, "deploy/systemd/edgeguard.service"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(repoFile(t, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	u := regexp.MustCompile(`Needs Linux >= ([0-9.]+)`).FindSubmatch(unit)
	r := regexp.MustCompile(`Linux ≥ ([0-9.]+), the oldest kernel`).FindSubmatch(readme)
	if u == nil || r == nil || string(u[1]) != string(r[1]) {
		t.Errorf("the unit needs Linux %s, the README %s: they must agree", u, r)
	}
}
