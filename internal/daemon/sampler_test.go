package daemon

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/packet"
)

func samplerPolicy(perSecond string) string {
	return `apiVersion: edgeguard/v1
mode: enforce
tables: {per_source_entries: 4096, aggregate_entries: 4096, prefix_entries: 4096, list_entries: 1024, max_rules: 16}
metrics: {listen: ""}
sampling: {one_in: 1, max_per_second: ` + perSecond + `}
`
}

// scrape reads the daemon's registry through its metrics handler (the
// text exposition) and returns every edgeguard_sampler_* sample by its
// series ("name{labels}").
func scrape(t *testing.T, d *Daemon) map[string]float64 {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range regexp.MustCompile(`(?m)^(edgeguard_sampler_[a-z_]+(?:\{[^}]*\})?) (\S+)$`).FindAllSubmatch(b, -1) {
		v, err := strconv.ParseFloat(string(m[2]), 64)
		if err != nil {
			t.Fatal(err)
		}
		out[string(m[1])] = v
	}
	if !bytes.Contains(b, []byte("# TYPE edgeguard_sampler_chosen_packets_total counter")) {
		t.Fatalf("no counter edgeguard_sampler_chosen_packets_total in the exposition:\n%s", b)
	}
	return out
}

// TestSamplerCounters: the data plane's sampler counters reach /metrics and
// `edgectl stats` exactly. With one_in 1 and no reader, 20,000 packets fill
// the 1 MiB ring buffer (16,383 records of 64 bytes) and the rest are lost; a
// reader then reads every sent sample; at max_per_second 1000 (a burst of
// 100) a burst of 1,000 packets is mostly capped.
func TestSamplerCounters(t *testing.T) {
	d := loadedDaemon(t, Options{}, samplerPolicy("1000000"))
	d.reg = d.newRegistry()
	send := func(n int) {
		t.Helper()
		if _, err := d.dp.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: packet.UDP4("198.18.0.1", 40000, 443, 64), Repeat: uint32(n)}); err != nil {
			t.Fatal(err)
		}
	}
	const (
		sent   = `edgeguard_sampler_chosen_packets_total{outcome="sent"}`
		capped = `edgeguard_sampler_chosen_packets_total{outcome="capped"}`
		lost   = `edgeguard_sampler_chosen_packets_total{outcome="lost"}`
		read   = `edgeguard_sampler_samples_read_total`
	)
	send(20000)
	m := scrape(t, d)
	t.Logf("20,000 packets, no reader: %v", m)
	// one_in 1 chooses all but 1 in 2^32 packets.
	if m[sent]+m[capped]+m[lost] != 20000 || m[capped] != 0 {
		t.Fatalf("20,000 packets under a cap of 1M/s (burst 100k): %v, want sent + lost = 20000, none capped", m)
	}
	// A record is the sample rounded up to 8 bytes plus an 8-byte header.
	rec := (binary.Size(loader.LimiterEgSample{})+7)/8*8 + 8
	if ringCap := float64(1<<20) / float64(rec); m[sent] < ringCap-2 || m[sent] > ringCap || m[lost] == 0 {
		t.Fatalf("a 1 MiB ring buffer holds %.0f records of %d bytes: %v", ringCap, rec, m)
	}
	if m[read] != 0 {
		t.Fatalf("no reader ran, yet %v samples read", m[read])
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.samples.readRates(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(20 * time.Second)
	for d.samples.read.Load() < uint64(m[sent]) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	m2 := scrape(t, d)
	if m2[read] != m[sent] {
		t.Fatalf("the reader read %v samples of %v sent", m2[read], m[sent])
	}

	if err := d.applyPolicy(t, samplerPolicy("1000")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	send(1000)
	el := time.Since(start)
	m3 := scrape(t, d)
	dSent, dCapped := m3[sent]-m2[sent], m3[capped]-m2[capped]
	// At most the burst (100) plus 1000/s of the time the burst took, plus
	// what the bucket saved during the 20k burst before (1M/s: 20 ms).
	maxSent := 100 + 20 + 1000*el.Seconds() + 1
	t.Logf("1,000 packets at max_per_second 1000 in %v: sent %v (at most %.0f), capped %v", el, dSent, maxSent, dCapped)
	if dSent+dCapped+(m3[lost]-m2[lost]) != 1000 || dSent > maxSent || dSent < 100 {
		t.Fatalf("1,000 packets at a cap of 1000/s: sent %v (want 100..%.0f), capped %v, lost %v", dSent, maxSent, dCapped, m3[lost]-m2[lost])
	}

	// The dashboard reads what the collector exports.
	dash, err := os.ReadFile("../../deploy/grafana/edgeguard.json")
	if err != nil {
		t.Fatal(err)
	}
	reads := regexp.MustCompile(`edgeguard_sampler_[a-z_]+`).FindAllString(string(dash), -1)
	if len(reads) == 0 {
		t.Error("the dashboard shows no edgeguard_sampler_* series")
	}
	for _, n := range reads {
		if _, ok := m3[n]; !ok && m3[n+`{outcome="sent"}`] == 0 {
			t.Errorf("the dashboard reads %s, which /metrics does not have (%v)", n, m3)
		}
	}

	st, err := d.Stats()
	if err != nil {
		t.Fatal(err)
	}
	s := st.Sampler
	if s == nil || s.OneIn != 1 || s.MaxPerSecond != 1000 || float64(s.Sent) != m3[sent] || float64(s.Capped) != m3[capped] ||
		float64(s.Lost) != m3[lost] || s.Chosen != s.Sent+s.Capped+s.Lost || s.Chosen != 21000 {
		t.Fatalf("edgectl stats' sampler %+v, metrics %v", s, m3)
	}
	if s.Error != "" {
		t.Fatalf("sampler counters unreadable: %s", s.Error)
	}
}
