package metrics_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/maps/mapstest"
	"github.com/edgeguard/edgeguard/internal/metrics"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

func requireRoot(tb testing.TB) { testenv.RequireRoot(tb) }

// requirePromtool returns promtool's path; it skips without promtool unless
// CI is set, where a skip would hide a regression.
func requirePromtool(tb testing.TB) string {
	tb.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		tb.Fatal("promtool not on PATH, and CI must run this check (scripts install it)")
	}
	tb.Skip("promtool not on PATH")
	return ""
}

var smallSizes = mapstest.SmallSizes

// mapsSource is the XDPSource the daemon will have, over a real loaded
// datapath: interface slots named as Attach assigned them, rules named by
// id. (It does not call Datapath.Slots at scrape time: that walks the
// whole 65536-entry iface_slots array, over a second per call.)
type mapsSource struct {
	d      *loader.Datapath
	m      *maps.Maps
	slots  map[uint32]string // counter slot -> interface name
	rules  map[string]uint32 // rule name -> rule id
	status metrics.PolicyStatus
}

func (s *mapsSource) IfaceCounters() (map[string]maps.Counters, error) {
	slots, err := s.m.Counters.BySlot()
	if err != nil {
		return nil, err
	}
	out := map[string]maps.Counters{"other": slots[0]}
	for slot, name := range s.slots {
		out[name] = slots[slot]
	}
	return out, nil
}

func (s *mapsSource) RuleCounters() (map[string]maps.RuleCounters, error) {
	ids := make([]uint32, 0, len(s.rules))
	for _, id := range s.rules {
		ids = append(ids, id)
	}
	byID, err := s.m.Counters.Rules(ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]maps.RuleCounters, len(s.rules))
	for name, id := range s.rules {
		out[name] = byID[id]
	}
	return out, nil
}

func (s *mapsSource) Tables() (map[string]maps.Occupancy, error) { return s.m.Counters.Tables() }

func (s *mapsSource) PolicyStatus() metrics.PolicyStatus { return s.status }

// apply applies g for real and records the result as a reload would.
func (s *mapsSource) apply(tb testing.TB, g policy.Compiled, at time.Time) error {
	tb.Helper()
	err := mapstest.StageCommit(s.m, &g)
	s.status.LastReloadTime = at
	s.status.LastReloadSuccess = err == nil
	if err != nil {
		s.status.ReloadFailures++
		return err
	}
	s.status.Generation++
	s.status.Reloads++
	return nil
}

// loadSource loads the limiter with the test clock (not pinned, not
// attached: packets go through BPF_PROG_TEST_RUN).
func loadSource(tb testing.TB) *mapsSource {
	tb.Helper()
	return loadSizedSource(tb, smallSizes)
}

func loadSizedSource(tb testing.TB, sizes loader.Sizes) *mapsSource {
	tb.Helper()
	d, m := mapstest.Load(tb, loader.Options{Sizes: sizes, TestClock: true})
	return &mapsSource{d: d, m: m, slots: map[uint32]string{}, rules: map[string]uint32{}}
}

// run sends one frame through the program and returns the XDP action.
// BPF_PROG_TEST_RUN receives it on the loopback device of the test's
// network namespace.
func (s *mapsSource) run(tb testing.TB, frame []byte) uint32 {
	tb.Helper()
	ret, err := s.d.Objects.XdpLimiter.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		tb.Fatalf("prog test run: %v", err)
	}
	return ret
}

// setSlot gives ifindex a counter slot, as Attach does.
func (s *mapsSource) setSlot(tb testing.TB, ifindex int, slot uint32, name string) {
	tb.Helper()
	if err := s.d.Objects.IfaceSlots.Put(uint32(ifindex), slot); err != nil {
		tb.Fatalf("set interface slot: %v", err)
	}
	s.slots[slot] = name
}

// scrape serves reg with promhttp on a loopback httptest server, GETs it
// and returns the exposition text.
func scrape(tb testing.TB, reg *prometheus.Registry) string {
	tb.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := srv.Client().Do(req)
	if err != nil {
		tb.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("read scrape: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("scrape: %s: %s", resp.Status, body)
	}
	return string(body)
}

// exposition is parsed scrape text.
type exposition map[string]*dto.MetricFamily

func parse(tb testing.TB, text string) exposition {
	tb.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		tb.Fatalf("parse exposition: %v\n%s", err, text)
	}
	return fams
}

// value returns the value of the one series of family name whose labels
// are exactly labels ("k", "v", ...), and whether it exists.
func (e exposition) value(name string, labels ...string) (float64, bool) {
	f := e[name]
	if f == nil {
		return 0, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range f.Metric {
		if len(m.Label) != len(want) {
			continue
		}
		for _, l := range m.Label {
			if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

// sum adds every series of family name whose labels include match.
func (e exposition) sum(name string, match ...string) float64 {
	f := e[name]
	if f == nil {
		return 0
	}
	total := 0.0
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(match); i += 2 {
			found := false
			for _, l := range m.Label {
				if l.GetName() == match[i] && l.GetValue() == match[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		}
	}
	return total
}

// promtoolCheckMetrics lints the exposition text with promtool.
func promtoolCheckMetrics(tb testing.TB, text string) {
	tb.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatal("promtool not on PATH, and CI must run this check (scripts install it)")
		}
		tb.Log("promtool not on PATH: exposition not linted")
		return
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		tb.Fatalf("promtool check metrics: %v\n%s", err, out.String())
	}
}
