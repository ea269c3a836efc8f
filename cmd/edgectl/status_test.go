package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden files")

// statusFixture is a daemon's status as the control socket returns it,
// with the IPv4 lookup of the active generation set by the caller.
func statusFixture(v4 control.IPv4Direct) control.Status {
	return control.Status{
		Version: "v1.2.3", Policy: "/etc/edgeguard/edgeguard.yaml", Generation: 7, DataGen: 1,
		LastReload: control.ReloadInfo{Time: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), OK: true, Trigger: "sighup"},
		Mode:       "enforce",
		Clock:      "precise",
		Interfaces: []control.Interface{{Name: "eth0", Ifindex: 2, XDPMode: "native"}},
		ProgramID:  42,
		Maps: []control.MapInfo{
			{Name: "src_buckets", ID: 10, Entries: 12, Capacity: 1048576},
			{Name: "lists", ID: 12, Entries: 4, Capacity: 65536},
			{Name: "rules", ID: 13, Capacity: 2048},
		},
		PinDir: "/sys/fs/bpf/edgeguard", ASNEntries: 500000,
		IPv4Direct:   v4,
		PolicyOrigin: "config file", StateDir: "/var/lib/edgeguard", MetricsAddr: "127.0.0.1:9469",
		Started: time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC), UptimeSeconds: 3725,
	}
}

// TestStatusGolden pins `edgectl status` and `edgectl status --json` for
// the three ways the active generation can look IPv4 sources up.
func TestStatusGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		v4   control.IPv4Direct
	}{
		{"direct", control.IPv4Direct{InUse: true, IPv4Facts: 600000, Chunks: 133205, CapacityChunks: 262144}},
		{"over_budget", control.IPv4Direct{IPv4Facts: 600000, CapacityChunks: 65536, OverBudget: true,
			Reason: "the IPv4 direct table needs more than 65536 chunks: raise the policy's tables.ipv4_direct_chunks " +
				"(or edgectl run --ipv4-direct-chunks), which takes 'edgectl detach --unpin'"}},
		{"few_facts", control.IPv4Direct{IPv4Facts: 3, CapacityChunks: 262144,
			Reason: "3 IPv4 prefix facts, fewer than 1024: the trie is small"}},
	} {
		t.Run(tc.name, func(t *testing.T) { goldenStatus(t, tc.name, statusFixture(tc.v4)) })
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (rerun with -update after checking):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// TestStatusCongestedGolden pins how status shows congested aggregate
// instances: by ASN and by prefix, text and JSON.
func TestStatusCongestedGolden(t *testing.T) {
	st := statusFixture(control.IPv4Direct{IPv4Facts: 3, CapacityChunks: 262144})
	since := time.Date(2026, 11, 30, 12, 59, 0, 0, time.UTC)
	st.Congestion = []control.Congestion{
		{Aggregate: "prefix", Congested: true, Since: since, For: control.Duration(time.Minute),
			AdmittedByClass: map[string]uint64{"established": 900, "new": 100}},
		{Aggregate: "asn", Congested: true, Since: since, For: control.Duration(time.Minute),
			AdmittedByClass: map[string]uint64{"established": 1500, "unknown": 500}},
		{Aggregate: "global"},
	}
	st.CongestedInstances = []control.CongestedInstance{
		{Aggregate: "asn", Rule: "isp", ASN: 64500, Since: since, For: control.Duration(time.Minute), LastRefused: since.Add(time.Minute),
			RefusedReserve: 4000, RefusedFull: 20, RefusedByClass: map[string]uint64{"new": 3990, "penalised": 10, "unknown": 20},
			RefusedByReason: map[string]uint64{"shield_tighten": 4000, "asn_limit": 20}, Share: 1},
		{Aggregate: "prefix", Rule: "isp", Prefix: "198.18.4.0/24", Since: since.Add(10 * time.Second), For: control.Duration(50 * time.Second),
			LastRefused: since.Add(time.Minute), RefusedReserve: 30, RefusedByClass: map[string]uint64{"new": 30},
			RefusedByReason: map[string]uint64{"prefix_limit": 30}, Share: 0.75, Overcount: 3},
	}
	goldenStatus(t, "congested", st)
}

// TestStatusNotFollowedGolden pins how status shows the parts that did
// not follow the last applied policy (it applied; each kept what it ran).
func TestStatusNotFollowedGolden(t *testing.T) {
	st := statusFixture(control.IPv4Direct{IPv4Facts: 3, CapacityChunks: 262144})
	st.LastReload.Problems = []string{
		"fleet: fleet not restarted, the running fleet keeps its earlier section: redis: no address",
		"bgp: not reconfigured, the speaker runs its earlier section: bgp neighbor 198.18.0.2 password_file: open /etc/edgeguard/bgp.pass: no such file or directory",
	}
	goldenStatus(t, "not_followed", st)
}

// goldenStatus pins st as `edgectl status` prints it, text and JSON, in
// testdata/status_NAME.golden{,.json}.
func goldenStatus(t *testing.T, name string, st control.Status) {
	t.Helper()
	var text, js bytes.Buffer
	if err := writeStatus(&text, st); err != nil {
		t.Fatal(err)
	}
	if err := printJSON(&js, st); err != nil {
		t.Fatal(err)
	}
	golden(t, "status_"+name+".golden", text.Bytes())
	golden(t, "status_"+name+".golden.json", js.Bytes())
}
