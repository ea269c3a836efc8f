package daemon

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSubscribersOrderDocumented: the order the committed generation is
// handed to the subsystems is the one docs/architecture.md states.
func TestSubscribersOrderDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, m := range regexp.MustCompile(`(?m)^\d\. \*\*([a-z0-9]+)\*\*:`).FindAllStringSubmatch(string(doc), -1) {
		documented = append(documented, m[1])
	}
	var inCode []string
	for _, s := range newDaemon(Options{}).subscribers() {
		inCode = append(inCode, s.name)
	}
	if !slices.Equal(documented, inCode) {
		t.Fatalf("docs/architecture.md lists the subscribers %v, the code tells them in the order %v", documented, inCode)
	}
}

// TestSubscriberFailureIsSaid: a generation the BGP speaker cannot follow
// (a neighbor's password file that does not read) still applies; the
// failure is the last reload's problem and counted, the speaker does not
// start, and it starts once the file reads (its loop retries).
func TestSubscriberFailureIsSaid(t *testing.T) {
	dir := t.TempDir()
	pass := filepath.Join(dir, "bgp.pass")
	pol := v4Policy(1, "198.18.0.0/16") + `bgp:
  local_as: 64512
  router_id: 198.18.250.1
  destinations: [198.18.0.1/32]
  neighbors: [{address: 127.0.0.1, as: 64513, password_file: ` + pass + `}]
`
	d := loadedDaemon(t, Options{StateDir: dir}, pol)
	d.mu.Lock()
	problems, gen := d.lastReload.Problems, d.generation
	d.mu.Unlock()
	if gen != 1 || len(problems) != 1 || !strings.HasPrefix(problems[0], "bgp: not started") || !strings.Contains(problems[0], pass) {
		t.Fatalf("generation %d, problems %q: want generation 1 applied and the BGP speaker's problem", gen, problems)
	}
	if n := testutil.ToFloat64(d.subFailures.WithLabelValues("bgp")); n != 1 {
		t.Fatalf("bgp subscriber failures %v, want 1", n)
	}
	if n := testutil.ToFloat64(d.subFailures.WithLabelValues("shield")); n != 0 {
		t.Fatalf("shield subscriber failures %v, want 0", n)
	}
	if sp, _ := d.bgp.get(); sp != nil {
		t.Fatal("the speaker started without its password")
	}
	if r := d.BGPReport(context.Background()); !strings.Contains(r.Error, pass) {
		t.Fatalf("bgp list error %q, want the password file's", r.Error)
	}
	if err := os.WriteFile(pass, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.bgp.tick(context.Background(), time.Now())
	if sp, _ := d.bgp.get(); sp == nil {
		t.Fatalf("the password file reads now and the speaker did not start: %s", d.BGPReport(context.Background()).Error)
	}
	if r := d.BGPReport(context.Background()); r.Error != "" {
		t.Fatalf("bgp list error %q after the speaker started", r.Error)
	}
}
