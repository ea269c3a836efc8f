package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/shield"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestFlowSpecMatches: a fingerprint's fields become the rule's
// components for each destination; the TTL is left out (and said so), a
// source keeps the rule to its family, an IPv6 destination needs a
// length of at least the header, and a fingerprint left with its
// protocol alone is refused.
func TestFlowSpecMatches(t *testing.T) {
	dsts := []netip.Prefix{netip.MustParsePrefix("198.18.0.1/32"), netip.MustParsePrefix("fd00::1/128")}
	src := netip.MustParsePrefix("198.18.100.0/24")
	for _, c := range []struct {
		name string
		fp   shield.Fingerprint
		want []string // Match.String() per rule
		note string
		err  bool
	}{
		{"port and length", shield.Fingerprint{Mask: shield.FProto | shield.FDPort | shield.FLen, Proto: 17, DPort: 53, Len: 128},
			[]string{"dst 198.18.0.1/32 proto 17 dport 53 len 128", "dst fd00::1/128 proto 17 dport 53 len 128"}, "", false},
		{"ttl left out", shield.Fingerprint{Mask: shield.FProto | shield.FDPort | shield.FTTL, Proto: 17, DPort: 53, TTL: 64},
			[]string{"dst 198.18.0.1/32 proto 17 dport 53", "dst fd00::1/128 proto 17 dport 53"}, "ttl 64 not matched", false},
		{"protocol alone refused", shield.Fingerprint{Mask: shield.FProto | shield.FTTL, Proto: 17, TTL: 64}, nil, "", true},
		{"source keeps its family", shield.Fingerprint{Mask: shield.FProto | shield.FSrc, Proto: 6, Src: src},
			[]string{"dst 198.18.0.1/32 src 198.18.100.0/24 proto 6"}, "", false},
		{"tcp flags and sport", shield.Fingerprint{Mask: shield.FProto | shield.FSPort | shield.FTCPFlags, Proto: 6, SPort: 80, TCPFlags: 0x12},
			[]string{"dst 198.18.0.1/32 proto 6 sport 80 tcp_flags 0x12", "dst fd00::1/128 proto 6 sport 80 tcp_flags 0x12"}, "", false},
		{"too short for IPv6", shield.Fingerprint{Mask: shield.FProto | shield.FLen, Proto: 17, Len: 28},
			[]string{"dst 198.18.0.1/32 proto 17 len 28"}, "", false},
	} {
		ms, note, err := flowSpecMatches(c.fp, dsts)
		if (err != nil) != c.err {
			t.Errorf("%s: err %v", c.name, err)
			continue
		}
		var got []string
		for _, m := range ms {
			got = append(got, m.String())
		}
		if strings.Join(got, "; ") != strings.Join(c.want, "; ") || !strings.Contains(note, c.note) {
			t.Errorf("%s: %q note %q, want %q note %q", c.name, got, note, c.want, c.note)
		}
	}
}

// TestBGPDeployedQueries: every edgeguard_bgp_* series the alerts read is
// one the BGP collector exports (without a bgp: section too).
func TestBGPDeployedQueries(t *testing.T) {
	d := newDaemon(Options{})
	exported := testenv.ExportedNames(t, newBGPCollector(d))
	b, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	read := regexp.MustCompile(`edgeguard_bgp_[a-z_]+`).FindAllString(string(b), -1)
	if len(read) == 0 {
		t.Error("alerts.yml reads no edgeguard_bgp_* series")
	}
	for _, n := range read {
		if !exported[n] {
			t.Errorf("alerts.yml reads %s, which the BGP collector does not export (it exports %v)", n, exported)
		}
	}
}

// TestShowListsAndRemovesBGP: edgectl show's inventory lists the BGP
// speaker's announcements (origin, reason, expiry, state), and `show
// remove bgp ID` withdraws one through the bgp withdraw path (saved, gone
// from show and bgp list); an unknown id is not installed. The speaker is
// in dry run with a neighbor on loopback (nothing listens: no session).
func TestShowListsAndRemovesBGP(t *testing.T) {
	dir := t.TempDir()
	pol := v4Policy(1, "198.18.0.0/16") + `bgp:
  local_as: 64512
  router_id: 198.18.250.1
  destinations: [198.18.0.1/32]
  neighbors: [{address: 127.0.0.1, as: 64513}]
`
	d := loadedDaemon(t, Options{StateDir: dir}, pol)
	t.Cleanup(d.bgp.stop)
	ctx := context.Background()
	d.bgp.tick(ctx, time.Now())
	if sp, _ := d.bgp.get(); sp == nil {
		t.Fatalf("no speaker: %s", d.BGPReport(ctx).Error)
	}
	inv, err := d.Inventory()
	if err != nil || len(inv.BGP) != 0 {
		t.Fatalf("before any announcement: %+v, %v", inv.BGP, err)
	}
	for _, p := range []string{"198.18.0.1", "198.18.0.2/32"} {
		if err := d.BGPDo("blackhole", control.BGPRequest{Prefix: p, TTL: control.Duration(time.Hour), Reason: "test " + p}, "tester"); err != nil {
			t.Fatal(err)
		}
	}
	inv, err = d.Inventory()
	if err != nil || len(inv.BGP) != 2 {
		t.Fatalf("show's bgp rows: %+v, %v", inv.BGP, err)
	}
	a := inv.BGP[0]
	if a.Kind != "blackhole" || a.Route != "198.18.0.1/32" || a.State != "dry-run" || a.Origin != "cli" || a.Reason != "test 198.18.0.1" ||
		time.Until(a.Expires) < 59*time.Minute || a.Action != "community 65535:666" || a.Remove != fmt.Sprintf("edgectl show remove bgp %d", a.ID) {
		t.Errorf("show's bgp row: %+v", a)
	}
	res, err := d.RemoveInstalled(control.RemoveRequest{Kind: "bgp", Announcement: a.ID}, "tester")
	if err != nil || !strings.Contains(res.Removed, "198.18.0.1/32") {
		t.Fatalf("remove bgp %d: %+v, %v", a.ID, res, err)
	}
	inv, _ = d.Inventory()
	if len(inv.BGP) != 1 || inv.BGP[0].Route != "198.18.0.2/32" {
		t.Errorf("after remove: show %+v", inv.BGP)
	}
	if l := d.BGPReport(ctx).Announcements; len(l) != 1 || l[0].ID == a.ID {
		t.Errorf("after remove: bgp list %+v", l)
	}
	saved, err := os.ReadFile(filepath.Join(dir, bgpStateFile))
	if err != nil || strings.Contains(string(saved), "198.18.0.1/32") || !strings.Contains(string(saved), "198.18.0.2/32") {
		t.Errorf("saved state after remove: %s, %v", saved, err)
	}
	for _, id := range []uint64{a.ID, 999} {
		if _, err := d.RemoveInstalled(control.RemoveRequest{Kind: "bgp", Announcement: id}, "tester"); !errors.Is(err, errNotInstalled) {
			t.Errorf("remove bgp %d again: %v, want not installed", id, err)
		}
	}
	if _, err := d.RemoveInstalled(control.RemoveRequest{Kind: "bgp"}, "tester"); err == nil {
		t.Error("remove bgp without an id accepted")
	}
}
