package daemon

import (
	"strings"
	"testing"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// TestClockSetting follows the policy's clock: from the file into the live
// generation's settings in the data plane and into the status, and across
// a reload that changes it, which takes effect without a restart.
func TestClockSetting(t *testing.T) {
	policy := func(clock string) string {
		p := v4Policy(8, "198.18.0.0/24")
		if clock != "" {
			p = strings.Replace(p, "mode: enforce\n", "mode: enforce\nclock: "+clock+"\n", 1)
		}
		return p
	}
	check := func(d *Daemon, want string, wantBPF loader.LimiterEgClock) {
		t.Helper()
		if got := d.Status().Clock; got != want {
			t.Errorf("status clock = %q, want %q", got, want)
		}
		gen, err := d.m.Generations.Active()
		if err != nil {
			t.Fatal(err)
		}
		var cfg loader.LimiterEgConfig
		if err := d.dp.Objects.Configs.Lookup(gen, &cfg); err != nil {
			t.Fatal(err)
		}
		if loader.LimiterEgClock(cfg.Clock) != wantBPF {
			t.Errorf("live generation's clock = %d, want %d (%s)", cfg.Clock, wantBPF, want)
		}
	}

	d := loadedDaemon(t, Options{}, policy(""))
	check(d, "precise", loader.LimiterEgClockEG_CLOCK_PRECISE)
	if err := d.applyPolicy(t, policy("coarse")); err != nil {
		t.Fatal(err)
	}
	check(d, "coarse", loader.LimiterEgClockEG_CLOCK_COARSE)
	if err := d.applyPolicy(t, policy("precise")); err != nil {
		t.Fatal(err)
	}
	check(d, "precise", loader.LimiterEgClockEG_CLOCK_PRECISE)
}
