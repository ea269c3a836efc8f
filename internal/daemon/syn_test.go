package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestSynSysctls: the shipped sysctl.d file sets exactly what the daemon
// checks, and the check names every setting that differs.
func TestSynSysctls(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "sysctl.d", "60-edgeguard-syn.conf"))
	if err != nil {
		t.Fatal(err)
	}
	shipped := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("bad line %q", line)
		}
		shipped[strings.ReplaceAll(strings.TrimSpace(k), ".", "/")] = strings.TrimSpace(v)
	}
	if len(shipped) != len(synSysctls) {
		t.Errorf("shipped %v, checked %v", shipped, synSysctls)
	}
	for _, s := range synSysctls {
		if shipped[s.key] != s.want {
			t.Errorf("%s: shipped %q, checked %q", s.key, shipped[s.key], s.want)
		}
	}
	fake := func(vals map[string]string) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			v, ok := vals[strings.TrimPrefix(p, "/proc/sys/")]
			if !ok {
				return nil, errors.New("no such file")
			}
			return []byte(v + "\n"), nil
		}
	}
	good := map[string]string{}
	for k, v := range shipped {
		good[k] = v
	}
	if bad := checkSynSysctls(fake(good)); len(bad) != 0 {
		t.Errorf("all set: %v", bad)
	}
	good["net/ipv4/tcp_syncookies"] = "2"
	delete(good, "net/ipv4/tcp_sack")
	bad := checkSynSysctls(fake(good))
	if len(bad) != 2 || !strings.Contains(bad[0], "net.ipv4.tcp_syncookies=2 (want 1)") || !strings.Contains(bad[1], "tcp_sack=unreadable") {
		t.Errorf("check = %v", bad)
	}
}

// TestDashboardSynPanels: every SYN path series the Grafana dashboard
// reads (deploy/grafana/edgeguard.json) is one the daemon's SYN collector
// exports, every one it exports is shown, and every event label value a
// panel selects is one the collector writes.
func TestDashboardSynPanels(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "edgeguard.json"))
	if err != nil {
		t.Fatal(err)
	}
	read := map[string]bool{}
	for _, m := range regexp.MustCompile(`edgeguard_syn_[a-z_]+`).FindAllString(string(raw), -1) {
		read[m] = true
	}
	c := newSynCollector(nil)
	exported := testenv.DescribedNames(t, c)
	for n := range read {
		if !exported[n] {
			t.Errorf("the dashboard reads %s, which the SYN collector does not export", n)
		}
	}
	for n := range exported {
		if !read[n] {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
	// The events Collect writes, from a stats reading with one service.
	d := newDaemon(Options{})
	d.syn = &synStage{}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newSynCollector(d))
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	events := map[string]bool{}
	ch := make(chan prometheus.Metric, 64)
	go func() {
		synStatsToMetrics(c, &control.SYNStats{Available: true, Services: []control.SYNServiceStat{{Service: "api"}}}, ch)
		close(ch)
	}()
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		for _, l := range pb.Label {
			if l.GetName() == "event" {
				events[l.GetValue()] = true
			}
		}
	}
	if len(events) < 10 {
		t.Fatalf("events written: %v", events)
	}
	for _, m := range regexp.MustCompile(`event=\\"([a-z_]+)\\"`).FindAllStringSubmatch(string(raw), -1) {
		if !events[m[1]] {
			t.Errorf("the dashboard selects event=%q, which the collector never writes (it writes %v)", m[1], events)
		}
	}
}
