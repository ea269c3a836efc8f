package redislimit

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// Without redis-server on PATH the Redis tests skip with the reason, and
// fail when CI=true (a skip must not hide a regression in CI).
func TestMissingRedisServer(t *testing.T) {
	if os.Getenv("REDISLIMIT_HARNESS_CHILD") == "1" {
		testenv.StartRedis(t)
		return
	}
	for _, tc := range []struct {
		ci       string
		wantFail bool
		wantText string
	}{
		{"", false, "redis-server not on PATH: apt-get install"},
		{"true", true, "redis-server not on PATH (CI=true)"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingRedisServer$", "-test.v", "-test.count=1")
		cmd.Env = []string{"PATH=" + t.TempDir(), "REDISLIMIT_HARNESS_CHILD=1", "CI=" + tc.ci, "HOME=" + os.Getenv("HOME")}
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tc.wantFail || !strings.Contains(string(out), tc.wantText) {
			t.Errorf("CI=%q: failed=%v (want %v), output lacks %q:\n%s", tc.ci, failed, tc.wantFail, tc.wantText, out)
		}
	}
}
