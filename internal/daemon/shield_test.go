package daemon

import (
	"os"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
