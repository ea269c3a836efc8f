package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgeguard/edgeguard/internal/l7/accesslog"
	"github.com/edgeguard/edgeguard/internal/l7/l7test"
	"github.com/edgeguard/edgeguard/internal/testenv"
)

const observeConfig = `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  engine: ENGINE
  exempt_paths: [/healthz]
  routes:
    - name: api
      match: {path_prefix: /api/}
      limits:
        - {name: api-ip, key: ip, rate: 6/h, burst: 6}
    - name: held
      match: {path_prefix: /held/}
      concurrency: {max_in_flight: 1, queue: 0}
`

// TestObservations drives known requests through each engine and checks
// the status classes, decisions, histograms, in-flight gauge and access log
// lines they produce.
func TestObservations(t *testing.T) {
	for _, e := range []Engine{EngineEventLoop, EngineNetHTTP} {
		t.Run(string(e), func(t *testing.T) {
			hold := make(chan struct{})
			entered := make(chan struct{}, 4)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasPrefix(r.URL.Path, "/held/") {
					entered <- struct{}{}
					<-hold
				}
				if code, err := strconv.Atoi(r.URL.Query().Get("status")); err == nil {
					w.WriteHeader(code)
				}
				_, _ = io.WriteString(w, "ok")
			}))
			t.Cleanup(up.Close)
			reg := prometheus.NewRegistry()
			logPath := filepath.Join(t.TempDir(), "access.log")
			alog, err := accesslog.Open(logPath)
			if err != nil {
				t.Fatal(err)
			}
			cfg := decodeYAML(t, strings.ReplaceAll(observeConfig, "ENGINE", string(e)), up.URL)
			p, base := startProxy(t, cfg, Options{Clock: new(l7test.ManualClock), Registerer: reg, AccessLog: alog})
			// api: 6 admitted (200, 200, 404, 302, 500, 200), then 2 limited.
			for _, st := range []int{0, 200, 404, 302, 500, 0, 0, 0} {
				url := base + "/api/x"
				if st != 0 {
					url += "?status=" + strconv.Itoa(st)
				}
				resp := do(t, "GET", url)
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			_ = status(t, "GET", base+"/healthz")
			_ = status(t, "GET", base+"/other")
			// held: one request waits at the upstream; a second is shed.
			done := make(chan int, 1)
			go func() {
				resp, err := testClient.Get(base + "/held/a")
				if err != nil {
					done <- 0
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				done <- resp.StatusCode
			}()
			<-entered
			if got := gauge(t, reg, "edgeguard_l7_in_flight", "held"); got != 1 {
				t.Errorf("in flight on held while one request waits: %v, want 1", got)
			}
			if got := status(t, "GET", base+"/held/b"); got != http.StatusServiceUnavailable {
				t.Errorf("second held request: %d, want 503", got)
			}
			close(hold)
			if got := <-done; got != 200 {
				t.Errorf("held request: %d, want 200", got)
			}
			want := map[string]map[string]float64{
				"api":         {"2xx": 3, "3xx": 1, "4xx": 3, "5xx": 1, "none": 0},
				"held":        {"2xx": 1, "5xx": 1},
				"(exempt)":    {"2xx": 1},
				"(unmatched)": {"2xx": 1},
			}
			// The end of a request is recorded after its response is
			// sent: wait for the last one.
			testenv.WaitFor(t, "held's in-flight back to 0", func() bool {
				return gauge(t, reg, "edgeguard_l7_in_flight", "held") == 0 &&
					counter(t, reg, "edgeguard_l7_responses_total", "held", "2xx") == 1
			})
			for route, classes := range want {
				for code, n := range classes {
					if got := counter(t, reg, "edgeguard_l7_responses_total", route, code); got != n {
						t.Errorf("responses_total{route=%q,code=%q} = %v, want %v", route, code, got, n)
					}
				}
				if got := gauge(t, reg, "edgeguard_l7_in_flight", route); got != 0 {
					t.Errorf("in_flight{route=%q} = %v after the requests, want 0", route, got)
				}
			}
			// Every request is in the total histogram; the upstream one
			// holds only the forwarded ones (api: 6, held: 1).
			for route, n := range map[string]uint64{"api": 8, "held": 2} {
				if got := histCount(t, reg, "edgeguard_l7_request_duration_seconds", route); got != n {
					t.Errorf("request_duration_seconds{route=%q} count %d, want %d", route, got, n)
				}
			}
			for route, n := range map[string]uint64{"api": 6, "held": 1} {
				if got := histCount(t, reg, "edgeguard_l7_upstream_duration_seconds", route); got != n {
					t.Errorf("upstream_duration_seconds{route=%q} count %d, want %d", route, got, n)
				}
			}
			p.Close()
			alog.Close()
			lines := readLog(t, logPath)
			if len(lines) != 12 {
				t.Fatalf("access log: %d lines, want 12", len(lines))
			}
			byDecision := map[string]int{}
			for _, l := range lines {
				byDecision[fmt.Sprint(l["route"], " ", l["decision"], " ", l["status"], " ", l["limit"])]++
				if _, ok := l["duration_ms"].(float64); !ok {
					t.Errorf("line without duration_ms: %v", l)
				}
			}
			for k, n := range map[string]int{
				"api allowed 200 <nil>":      3,
				"api limited 429 api-ip":     2,
				"held shed 503 <nil>":        1,
				"held allowed 200 <nil>":     1,
				"(exempt) allowed 200 <nil>": 1,
			} {
				if byDecision[k] != n {
					t.Errorf("access log: %d lines %q, want %d (all: %v)", byDecision[k], k, n, byDecision)
				}
			}
		})
	}
}

func readLog(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("access log line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// metric finds the series of family name whose label values are labels
// (in the family's label order).
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) *dto.Metric {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for i, lp := range m.GetLabel() {
				// Labels are sorted by name: route < code, route alone.
				if lp.GetValue() != labels[i] && !(len(labels) == 2 && lp.GetValue() == labels[1-i]) {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	if m := metric(t, reg, name, labels...); m != nil {
		return m.GetCounter().GetValue()
	}
	return -1
}

func gauge(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	if m := metric(t, reg, name, labels...); m != nil {
		return m.GetGauge().GetValue()
	}
	return -1
}

func histCount(t *testing.T, reg *prometheus.Registry, name string, labels ...string) uint64 {
	if m := metric(t, reg, name, labels...); m != nil {
		return m.GetHistogram().GetSampleCount()
	}
	return 0
}
