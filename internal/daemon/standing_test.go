package daemon

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// TestCongestionEvents: an aggregate kind that refuses new sources is
// congested from that reading on, logged once; it leaves after
// congestionCalm without a refusal, logged with the shares per class.
func TestCongestionEvents(t *testing.T) {
	var buf bytes.Buffer
	d := newDaemon(Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	w := d.standing
	t0 := time.Unix(1_000_000, 0)
	var c maps.ClassCounters
	w.observe(c, t0)
	if st := w.status(t0); len(st) != 3 || st[0].Congested || st[1].Congested || st[2].Congested {
		t.Fatalf("first reading: %+v", st)
	}
	asn := maps.ClassAggASN
	c[0][asn][maps.ClassNew][maps.OutcomeRefusedReserve].Packets = 500
	w.observe(c, t0.Add(time.Second))
	c[0][asn][maps.ClassNew][maps.OutcomeRefusedReserve].Packets = 900
	c[0][asn][maps.ClassEstablished][maps.OutcomeAdmittedReserve].Packets = 300
	c[0][asn][maps.ClassNew][maps.OutcomeAdmitted].Packets = 100
	w.observe(c, t0.Add(2*time.Second))
	st := w.status(t0.Add(2 * time.Second))
	if !st[asn].Congested || st[maps.ClassAggPrefix].Congested || !st[asn].Since.Equal(t0.Add(time.Second)) ||
		st[asn].AdmittedByClass["established"] != 300 || st[asn].AdmittedByClass["new"] != 100 {
		t.Fatalf("during: %+v", st)
	}
	if n := strings.Count(buf.String(), "aggregate congested"); n != 1 {
		t.Fatalf("%d congestion events logged, want 1:\n%s", n, buf.String())
	}
	// Quiet for less than congestionCalm: still congested.
	w.observe(c, t0.Add(5*time.Second))
	if st := w.status(t0.Add(5 * time.Second)); !st[asn].Congested {
		t.Fatal("left congestion before congestionCalm")
	}
	w.observe(c, t0.Add(2*time.Second+congestionCalm))
	if st := w.status(t0.Add(8 * time.Second)); st[asn].Congested {
		t.Fatal("still congested after congestionCalm without a refusal")
	}
	log := buf.String()
	if !strings.Contains(log, "aggregate left congestion") || !strings.Contains(log, "aggregate=asn") ||
		!strings.Contains(log, "established:300") {
		t.Fatalf("leave event: %s", log)
	}
}

// TestStandingSweep: the daemon's sweep penalises deny-listed sources and
// removes entries that carry nothing; the policy's standing: section
// reaches the data plane.
func TestStandingSweep(t *testing.T) {
	d := loadedDaemon(t, Options{}, `apiVersion: edgeguard/v1
tables: {per_source_entries: 4096, aggregate_entries: 4096, prefix_entries: 4096, list_entries: 1024, max_rules: 16, standing_entries: 1024}
lists:
  deny: [198.51.100.0/24]
standing:
  established_after: 30s
  known_good: [192.0.2.0/24]
metrics: {listen: ""}
`)
	put := func(addr string, st maps.Standing, lastSeen uint64) {
		t.Helper()
		v := loader.LimiterEgStandingVal{Since: 1, CleanSince: 1, LastSeen: lastSeen, Standing: uint8(st), Why: uint8(maps.WhySet)}
		if err := d.dp.Objects.Standing.Put(maps.StandingKey(netip.MustParseAddr(addr)), v); err != nil {
			t.Fatal(err)
		}
	}
	mono, err := maps.MonoNow()
	if err != nil {
		t.Fatal(err)
	}
	put("198.51.100.5", maps.StandingEstablished, mono)           // deny-listed
	put("198.18.0.1", maps.StandingNew, mono-uint64(time.Minute)) // new, idle 1 min > 30 s
	put("198.18.0.2", maps.StandingNew, mono)                     // new, active
	put("198.18.0.3", maps.StandingEstablished, mono-uint64(time.Minute))
	if err := d.standing.sweep(); err != nil {
		t.Fatal(err)
	}
	look := func(addr string) maps.StandingEntry {
		t.Helper()
		e, err := d.m.Standing.Lookup(netip.MustParseAddr(addr))
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	if e := look("198.51.100.5"); e.Standing != maps.StandingPenalised || e.Why != maps.WhyDeny {
		t.Errorf("deny-listed source: %+v", e)
	}
	if e := look("198.18.0.1"); e.Tracked {
		t.Errorf("idle new source kept: %+v", e)
	}
	if e := look("198.18.0.2"); !e.Tracked {
		t.Error("active new source removed")
	}
	if e := look("198.18.0.3"); e.Standing != maps.StandingEstablished {
		t.Errorf("established source: %+v", e)
	}
	if e := look("192.0.2.77"); e.Standing != maps.StandingEstablished || !e.KnownGood {
		t.Errorf("known_good from the policy: %+v", e)
	}
	if st := d.Status(); len(st.Congestion) != 3 {
		t.Errorf("status congestion: %+v", st.Congestion)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(d.xdpCollector())
	for name, want := range map[string]int{
		"edgeguard_xdp_class_packets_total": 2 * 3 * 6 * 4, "edgeguard_standing_events_total": 6, "edgeguard_aggregate_congested": 3,
		"edgeguard_aggregate_congested_instances": 3,
	} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != want {
			t.Errorf("%s: %d series (%v), want %d", name, n, err, want)
		}
	}
	stats, err := d.Stats()
	if err != nil || stats.Standing == nil || stats.Tables["standing"].Capacity != 1024 {
		t.Errorf("stats standing: %+v, tables %+v, %v", stats.Standing, stats.Tables, err)
	}
}
