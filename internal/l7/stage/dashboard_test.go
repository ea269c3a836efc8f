package stage

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestDashboardL7Panels: every L7 stage series the Grafana dashboard reads
// (deploy/grafana/edgeguard.json) is exported by a real stage serving a
// request, and the dashboard shows each of them.
func TestDashboardL7Panels(t *testing.T) {
	raw, err := os.ReadFile("../../../deploy/grafana/edgeguard.json")
	if err != nil {
		t.Fatal(err)
	}
	read := map[string]bool{}
	for _, m := range regexp.MustCompile(`edgeguard_l7_(?:requests_total|responses_total|in_flight|(?:request|upstream)_duration_seconds|access_log_[a-z_]+|stage_[a-z_]+)`).FindAll(raw, -1) {
		read[string(m)] = true
	}
	up := startUpstream(t)
	s := newStage(t, Options{})
	addr := freeAddr(t)
	apply(t, s, section(addr, up.srv.URL, "event-loop", limited+"access_log: "+filepath.Join(t.TempDir(), "access.log")+"\n"))
	if _, code := rawGet(t, addr, "/x"); code != 200 {
		t.Fatalf("status %d", code)
	}
	exported := testenv.ExportedNames(t, s.Collector())
	for n := range read {
		if !exported[n] {
			t.Errorf("the dashboard reads %s, which the stage does not export", n)
		}
	}
	for _, n := range []string{"edgeguard_l7_requests_total", "edgeguard_l7_stage_info", "edgeguard_l7_responses_total",
		"edgeguard_l7_in_flight", "edgeguard_l7_request_duration_seconds", "edgeguard_l7_upstream_duration_seconds",
		"edgeguard_l7_access_log_lines_total",
		"edgeguard_l7_stage_engine_starts_total", "edgeguard_l7_stage_engine_failures_total"} {
		if !read[n] {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
}
