package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
)

func TestWriteFleetStatus(t *testing.T) {
	now := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	if err := writeFleetStatus(&b, control.FleetStatus{}, now); err != nil || !strings.Contains(b.String(), "fleet mode: off") {
		t.Errorf("off: %v %q", err, b.String())
	}
	b.Reset()
	st := control.FleetStatus{
		Enabled: true, Name: "edge", Host: "a", Interval: control.Duration(time.Second), RedisUp: false, Fallback: true,
		LastSync: now.Add(-5 * time.Second), Syncs: 42, LastError: "dial tcp: refused",
		Members: []control.FleetMember{{Host: "a", LastSeen: now.Add(-5 * time.Second)}, {Host: "b", LastSeen: now.Add(-6 * time.Second)}},
		Shares: []control.FleetShare{{Aggregate: "rule 1 asn 64500", Budget: 1000, Share: 500, Fraction: 0.5, Demand: 1800,
			FleetDemand: 2000, Hosts: 2, Static: true},
			{Aggregate: "rule 2 asn 64501", ByteBudget: 1e6, ByteShare: 250e3, ByteDemand: 2e6, FleetByteDemand: 4e6, Hosts: 2}},
		ActiveAggregates: 1,
		Lists:            control.FleetList{Enabled: true, Synced: false, Remote: 3, Published: 2, Applied: 4, Refused: 1},
	}
	if err := writeFleetStatus(&b, st, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"edge, host a, interval 1s", "UNREACHABLE, static shares", "dial tcp: refused",
		"a (this host), heartbeat 5s ago", "NOT SYNCED", "3 entries from other hosts", "2 published, 4 applied, 1 refused",
		"rule 1 asn 64500", "50.0% static", "42 syncs since the fleet started", "rule 2 asn 64501 bytes", "1.0MB", "250.0kB", "25.0%"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
	// A bytes-only rule has no packet row.
	if strings.Contains(b.String(), "rule 2 asn 64501  ") || strings.Count(b.String(), "rule 2 asn 64501") != 1 {
		t.Errorf("a bytes-only share shows a packet row:\n%s", b.String())
	}
}
