package daemon

import (
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// TestFleetRedisFromL7: fleet.redis: l7 takes the decoded l7.redis's
// address and timeout (its default when the file writes none), and is
// refused without an l7.redis.
func TestFleetRedisFromL7(t *testing.T) {
	const l7 = "l7:\n  listen: 127.0.0.1:8080\n  upstream: http://127.0.0.1:9000\n"
	for _, tc := range []struct {
		name, doc string
		addr      string
		timeout   time.Duration
		problem   string
	}{
		{"written", l7 + "  redis: {addr: \"198.18.0.10:6379\", timeout: 50ms}\n", "198.18.0.10:6379", 50 * time.Millisecond, ""},
		{"default timeout", l7 + "  redis: {addr: \"198.18.0.10:6379\"}\n", "198.18.0.10:6379", 100 * time.Millisecond, ""},
		{"no l7 redis", l7, "", 0, "p.yaml:1:8: fleet.redis: l7 needs an l7: redis: addr: section"},
		{"no l7", "", "", 0, "p.yaml:1:8: fleet.redis: l7 needs an l7: redis: addr: section"},
	} {
		p, err := policy.Parse("p.yaml", []byte("fleet: {name: f, redis: l7}\napiVersion: edgeguard/v1\n"+tc.doc), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		_, _, _, err = decodeL7(p, "p.yaml")
		if tc.problem != "" {
			if err == nil || !strings.Contains(err.Error(), tc.problem) {
				t.Errorf("%s: %v, want %q", tc.name, err, tc.problem)
			}
			continue
		}
		if r := p.Fleet.Redis; err != nil || !r.FromL7 || len(r.Addrs) != 1 || r.Addrs[0] != tc.addr || r.Timeout != tc.timeout {
			t.Errorf("%s: %v, redis = %+v", tc.name, err, r)
		}
	}
}
