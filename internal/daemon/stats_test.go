package daemon

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestStatsJSONGolden pins the JSON of `edgectl stats --json`: field names,
// which counters appear, and the rate arithmetic over a 5-second window.
func TestStatsJSONGolden(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	old := snapshot{at: t0, rules: map[uint32]maps.RuleCounters{}}
	cur := snapshot{at: t0.Add(5 * time.Second), rules: map[uint32]maps.RuleCounters{}}
	set := func(s *snapshot, a maps.Action, r maps.Reason, pkts, bytes uint64) {
		s.total[a][r] = maps.Counter{Packets: pkts, Bytes: bytes}
	}
	set(&old, maps.ActPass, maps.ReasonOK, 1000, 64000)
	set(&cur, maps.ActPass, maps.ReasonOK, 6000, 384000)
	set(&old, maps.ActDrop, maps.ReasonSrcLimit, 0, 0)
	set(&cur, maps.ActDrop, maps.ReasonSrcLimit, 2500, 160000)
	set(&cur, maps.ActDrop, maps.ReasonDeny, 10, 600)
	set(&cur, maps.ActWouldDrop, maps.ReasonPrefixLimit, 50, 3200)
	old.rules[0] = maps.RuleCounters{maps.ActPass: {Packets: 1000}}
	cur.rules[0] = maps.RuleCounters{maps.ActPass: {Packets: 6000}, maps.ActDrop: {Packets: 2500}}
	cur.rules[4000781694] = maps.RuleCounters{maps.ActWouldDrop: {Packets: 50}}
	names := map[uint32]string{0: "default", 4000781694: "udp-reflection"}
	tables := map[string]control.Fill{"sources": {Entries: 12, Capacity: 1048576}}

	var got bytes.Buffer
	enc := json.NewEncoder(&got)
	enc.SetIndent("", "  ")
	if err := enc.Encode(buildStats(old, cur, names, tables)); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "stats.golden.json")
	if *update {
		if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("stats JSON differs from %s (run with -update if intended):\n%s", golden, got.String())
	}
}

func TestTopTalkers(t *testing.T) {
	tt := newTopTalkers(time.Minute)
	t0 := time.Unix(1_800_000_000, 0)
	for i := 0; i < 30; i++ {
		tt.add(t0, maps.Sample{Source: netipMust("198.18.5.1"), ASN: 64500})
	}
	for i := 0; i < 10; i++ {
		tt.add(t0.Add(time.Second), maps.Sample{Source: netipMust("198.18.5.2"), ASN: 64500})
	}
	tt.add(t0.Add(2*time.Second), maps.Sample{Source: netipMust("fd00::1")})
	noName := func(uint32) string { return "" }
	// An old second outside the window is not counted.
	top := tt.report(t0.Add(2*time.Second), 2*time.Second, 10, noName)
	if top.Samples != 11 {
		t.Fatalf("samples in a 2s window = %d, want 11", top.Samples)
	}
	if top.Sources[0].Key != "198.18.5.2" || top.Sources[0].Samples != 10 {
		t.Errorf("top source = %+v", top.Sources[0])
	}
	top = tt.report(t0.Add(2*time.Second), time.Minute, 1, noName)
	if len(top.Prefixes) != 1 || top.Prefixes[0].Key != "198.18.5.0/24" || top.Prefixes[0].Samples != 40 {
		t.Errorf("top prefix = %+v", top.Prefixes)
	}
	if len(top.ASNs) != 1 || top.ASNs[0].Key != "AS64500" || top.ASNs[0].Share != 40.0/41 {
		t.Errorf("top asn = %+v", top.ASNs)
	}
}

// TestTopSplitsByAction: a dry-run rule's would-drops are rows of their
// own, never counted as drops; reasons and rules are tables of their own.
func TestTopSplitsByAction(t *testing.T) {
	tt := newTopTalkers(time.Minute)
	t0 := time.Unix(1_800_000_000, 0)
	src := netipMust("198.18.5.1")
	for i := 0; i < 6; i++ {
		tt.add(t0, maps.Sample{Source: src, RuleSlot: 3, Action: maps.ActDrop, Reason: maps.ReasonSrcLimit})
	}
	for i := 0; i < 4; i++ {
		tt.add(t0, maps.Sample{Source: src, RuleSlot: 7, Action: maps.ActWouldDrop, Reason: maps.ReasonSrcLimit})
	}
	top := tt.report(t0, time.Minute, 10, func(slot uint32) string { return map[uint32]string{3: "web", 7: "trial"}[slot] })
	want := func(what string, got []control.TopEntry, rows ...control.TopEntry) {
		t.Helper()
		if len(got) != len(rows) {
			t.Errorf("%s: %+v, want %+v", what, got, rows)
			return
		}
		for i := range rows {
			if got[i].Key != rows[i].Key || got[i].Action != rows[i].Action || got[i].Samples != rows[i].Samples {
				t.Errorf("%s row %d: %+v, want %+v", what, i, got[i], rows[i])
			}
		}
	}
	drop, would := maps.ActionName(maps.ActDrop), maps.ActionName(maps.ActWouldDrop)
	reason := maps.ReasonName(maps.ReasonSrcLimit)
	want("sources", top.Sources, control.TopEntry{Key: "198.18.5.1", Action: drop, Samples: 6},
		control.TopEntry{Key: "198.18.5.1", Action: would, Samples: 4})
	want("reasons", top.Reasons, control.TopEntry{Key: reason, Action: drop, Samples: 6},
		control.TopEntry{Key: reason, Action: would, Samples: 4})
	want("rules", top.Rules, control.TopEntry{Key: "web", Action: drop, Samples: 6},
		control.TopEntry{Key: "trial", Action: would, Samples: 4})
}
