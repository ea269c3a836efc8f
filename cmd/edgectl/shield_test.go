package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
)

func shieldFixture() control.ShieldReport {
	at := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	return control.ShieldReport{
		Mode: "enforce", Tracked: 42, Capacity: 4096, Surges: 3,
		Aggregates: []control.ShieldAggregate{
			{Aggregate: "rule 0 (default) asn 64501", Baseline: 76.1, BaselineBits: 60800, Rate: 1479.2, Bits: 1.2e6, Factor: 19.4,
				State: "surging", Learned: control.Duration(40 * time.Second), Judged: true, Action: 1},
			{Aggregate: "port udp/9009", Rate: 1479, State: "normal", Learned: control.Duration(5 * time.Second)},
		},
		Actions: []control.ShieldAction{{ID: 1, Kind: "tighten", Aggregate: "rule 0 (default) asn 64501", Budget: 76.1,
			Baseline: 76.1, Rate: 1479.2, Reason: "rule 0 asn 64501 at 1479/s, 19.4x its baseline 76/s for 2s: new sources share 76/s",
			Since: at, Expires: at.Add(15 * time.Second), Enforced: true, Pinned: true, PinnedBy: "alice (uid 0)"}},
		Forbid: []string{"AS64500 (policy)"},
	}
}

func TestShieldGolden(t *testing.T) {
	var out bytes.Buffer
	if err := writeShield(&out, shieldFixture()); err != nil {
		t.Fatal(err)
	}
	golden(t, "shield.golden", out.Bytes())
	var js bytes.Buffer
	if err := printJSON(&js, shieldFixture()); err != nil {
		t.Fatal(err)
	}
	golden(t, "shield.golden.json", js.Bytes())
	line := shieldExplainLine(shieldFixture().Actions[0])
	if want := "#1 tighten: new sources of rule 0 (default) asn 64501 share 76/s; in force until 2026-12-02T01:00:15Z"; line != want {
		t.Errorf("explain line %q, want %q", line, want)
	}
}

// TestShieldExitCodes: mistakes in how shield is called are usage errors.
func TestShieldExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"shield", "relase", "1"}, 2},
		{[]string{"shield", "release", "x"}, 2},
		{[]string{"shield", "release", "0"}, 2},
		{[]string{"shield", "pin"}, 2},
		{[]string{"shield", "-o", "yaml"}, 2},
		{[]string{"shield", "-n", "0"}, 2},
		{[]string{"shield", "forbid"}, 2},
		{[]string{"shield", "list", "--socket", "/nonexistent/edgeguard.sock"}, 1},
	} {
		if got := execute(context.Background(), tc.args); got != tc.want {
			t.Errorf("edgectl %v: exit %d, want %d", tc.args, got, tc.want)
		}
	}
}
