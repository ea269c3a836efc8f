package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
)

// TestWriteBGP: the table names the mode, the sessions with what the
// peer sent, and each announcement with its route, action, state,
// origin and reason.
func TestWriteBGP(t *testing.T) {
	var b bytes.Buffer
	if err := writeBGP(&b, control.BGPReport{}); err != nil || !strings.Contains(b.String(), "bgp: off") {
		t.Errorf("no bgp section: %q %v", b.String(), err)
	}
	b.Reset()
	r := control.BGPReport{Enabled: true, DryRun: true, LocalAS: 64512, RouterID: "198.18.250.1", Community: "65535:666",
		MaxAnnouncements: 16, Destinations: []string{"198.18.0.1/32"}, OfferedBps: 3e6, UplinkBps: 1e6,
		Peers: []control.BGPPeer{{Address: "198.18.250.2", AS: 64513, State: "established", Uptime: time.Now(), Received: 2,
			Families: []string{"ipv4-unicast"}}},
		Announcements: []control.BGPAnnouncement{{ID: 7, Kind: "blackhole", Route: "198.18.0.1/32", Action: "community 65535:666",
			Origin: "uplink", Reason: "offered 3000000 bit/s", State: "dry-run", Expires: time.Now().Add(time.Minute)}}}
	if err := writeBGP(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"AS64512", "dry run: nothing is announced", "blackhole above 1000000 bit/s", "198.18.250.2",
		"established", "2 (0 kept)", "198.18.0.1/32", "community 65535:666", "dry-run", "uplink", "offered 3000000 bit/s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("bgp list output has no %q:\n%s", want, b.String())
		}
	}
}

// TestWriteInventoryBGP: edgectl show lists each announcement with its
// route, action, state (and error), origin, expiry, reason and remover;
// an empty speaker says none.
func TestWriteInventoryBGP(t *testing.T) {
	var b bytes.Buffer
	if err := writeInventory(&b, control.Inventory{}); err != nil || !strings.Contains(b.String(), "bgp announcements, at the routers (0)") {
		t.Errorf("no announcements: %q %v", b.String(), err)
	}
	b.Reset()
	exp := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC)
	inv := control.Inventory{BGP: []control.InventoryBGP{
		{BGPAnnouncement: control.BGPAnnouncement{ID: 3, Kind: "flowspec", Route: "dst 198.18.0.1/32; proto 17; dport 9000",
			Action: "discard", Origin: "shield", Reason: "shield action 7", Expires: exp, State: "announced"}, Remove: "edgectl show remove bgp 3"},
		{BGPAnnouncement: control.BGPAnnouncement{ID: 4, Kind: "blackhole", Route: "198.18.0.2/32", Action: "community 65535:666",
			Origin: "cli", Reason: "operator", Expires: exp, State: "failed", Error: "no session"}, Remove: "edgectl show remove bgp 4"},
	}}
	if err := writeInventory(&b, inv); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"bgp announcements, at the routers (2)", "dst 198.18.0.1/32; proto 17; dport 9000", "discard",
		"announced", "shield action 7", "2026-12-04T20:00:00Z", "edgectl show remove bgp 3", "failed: no session", "community 65535:666"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("show output has no %q:\n%s", want, b.String())
		}
	}
}
