package rls

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7/l7test"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/l7/stage"
)

func decodeProblems(t *testing.T, src string) string {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	node := doc.Content[0].Content[1]
	pc, probs := proxy.Decode(node, "p.yaml")
	if len(probs) == 0 {
		_, probs = Decode(pc, "p.yaml")
	}
	var out []string
	for _, p := range probs {
		out = append(out, p.String())
	}
	return strings.Join(out, "\n")
}

// TestDecode: an l7: section with only the rate-limit service needs no
// proxy; every mistake is reported with its line.
func TestDecode(t *testing.T) {
	ok := `
l7:
  rls:
    listen: 127.0.0.1:8081
    unix: /run/edgeguard/rls.sock
    http_listen: 127.0.0.1:8082
    rules:
      - name: r
        domain: edge
        descriptor: [remote_address]
        limits: [{name: a, rate: 10/s}]
`
	if p := decodeProblems(t, ok); p != "" {
		t.Fatalf("rls-only l7 section: %s", p)
	}
	pc, _ := decodeL7(t, ok)
	if pc.ServesProxy() {
		t.Error("an rls-only l7 section serves a proxy")
	}
	for _, tc := range []struct{ name, src, want string }{
		{"listen without upstream", "l7:\n  listen: 127.0.0.1:1\n  rls: {listen: 127.0.0.1:2}\n", "upstream is required"},
		{"no listener", "l7:\n  rls: {rules: []}\n", "set listen"},
		{"key on a limit", `
l7:
  rls:
    listen: 127.0.0.1:1
    rules: [{name: r, domain: d, descriptor: [a], limits: [{name: a, key: ip, rate: 1/s}]}]
`, "takes no key"},
		{"duplicate descriptor", `
l7:
  rls:
    listen: 127.0.0.1:1
    rules:
      - {name: r1, domain: d, descriptor: [a, b=1], limits: [{name: a, rate: 1/s}]}
      - {name: r2, domain: d, descriptor: [a, b=1], limits: [{name: b, rate: 1/s}]}
`, "already matched by the rule at line 6"},
		{"name used by a route", `
l7:
  listen: 127.0.0.1:1
  upstream: http://127.0.0.1:2
  routes: [{name: x, limits: [{name: a, key: ip, rate: 1/s}]}]
  rls:
    listen: 127.0.0.1:3
    rules: [{name: r, domain: d, descriptor: [a], limits: [{name: a, rate: 1/s}]}]
`, `limit name "a" is already used`},
		{"shape", `
l7:
  rls:
    listen: 127.0.0.1:1
    rules: [{name: r, domain: d, descriptor: [a], limits: [{name: a, rate: 1/s, algorithm: leaky_bucket, shape: true}]}]
`, "shape: true is not supported"},
		{"redis without section", `
l7:
  rls:
    listen: 127.0.0.1:1
    rules: [{name: r, domain: d, descriptor: [a], limits: [{name: a, rate: 1/s, backend: redis}]}]
`, "needs an l7 redis"},
		{"tls without listen", `
l7:
  rls:
    unix: /run/x.sock
    tls: {cert: /a, key: /b}
`, "applies to listen"},
		{"tier entry not in descriptor", `
l7:
  rls:
    listen: 127.0.0.1:1
    rules:
      - name: r
        domain: d
        descriptor: [a]
        tiers: {entry: plan, levels: {pro: [{name: a, rate: 1/s}]}}
`, `tiers entry "plan"`},
		{"empty descriptor", `
l7:
  rls:
    listen: 127.0.0.1:1
    rules: [{name: r, domain: d, descriptor: [], limits: [{name: a, rate: 1/s}]}]
`, "want 1 to 16 entries"},
	} {
		if p := decodeProblems(t, tc.src); !strings.Contains(p, tc.want) {
			t.Errorf("%s: problems %q, want %q", tc.name, p, tc.want)
		}
	}
}

type escalations struct {
	mu  sync.Mutex
	got []netip.Prefix
}

func (e *escalations) Escalate(_ context.Context, src netip.Prefix, _ time.Duration, _ string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, src)
	return nil
}

func (e *escalations) list() []netip.Prefix {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]netip.Prefix(nil), e.got...)
}

// TestTiersAndEscalation: a descriptor entry picks the tier; a source the
// service keeps refusing is handed to the escalator with the l7
// escalation's prefix, as the proxy does.
func TestTiersAndEscalation(t *testing.T) {
	const policy = `
l7:
  escalation: {enabled: true, rejections: 3, window: 1m, ttl: 10m, prefix_v4: 24}
  rls:
    listen: 127.0.0.1:0
    rules:
      - name: plans
        domain: edge
        descriptor: [plan, remote_address]
        limits: [{name: all, rate: 100/min}]
        tiers:
          entry: plan
          default: free
          levels:
            free: [{name: free-2, rate: 2/min, algorithm: fixed-window}]
            pro: [{name: pro-5, rate: 5/min, algorithm: fixed-window}]
`
	esc := &escalations{}
	s, _ := startServer(t, policy, new(l7test.ManualClock), esc)
	svc := s.Service()
	count := func(plan, src string, n int) (ok int, last Verdict) {
		for range n {
			v, err := svc.Decide(context.Background(), &Request{Domain: "edge", Descriptors: []Descriptor{{Entries: []Entry{{"plan", plan}, {"remote_address", src}}}}})
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed {
				ok++
			}
			last = v
		}
		return ok, last
	}
	if ok, v := count("pro", "192.0.2.1", 7); ok != 5 || v.Statuses[0].Tier != "pro" || v.Refused != "pro-5" {
		t.Errorf("pro: %d allowed (want 5), tier %q, refused by %q", ok, v.Statuses[0].Tier, v.Refused)
	}
	if ok, v := count("unknown-plan", "192.0.2.2", 3); ok != 2 || v.Statuses[0].Tier != "free" {
		t.Errorf("unknown plan: %d allowed (want 2, the default tier free), tier %q", ok, v.Statuses[0].Tier)
	}
	// 192.0.2.0/24 was refused 2+1 times; one more crosses the threshold.
	_, v := count("unknown-plan", "192.0.2.2", 1)
	deadline := time.Now().Add(5 * time.Second)
	for len(esc.list()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := esc.list(); len(got) != 1 || got[0] != netip.MustParsePrefix("192.0.2.0/24") || !v.Escalated {
		t.Errorf("escalated %v (verdict escalated=%t), want [192.0.2.0/24]", got, v.Escalated)
	}
}

// TestAccessLogAndMetrics: one access-log line per decision (gRPC and
// subrequest alike), written through the L7 stage's log (one writer per
// file, shared with the proxy), and the per-limit counters.
func TestAccessLogAndMetrics(t *testing.T) {
	logPath := t.TempDir() + "/l7.log"
	policy := `
l7:
  access_log: ` + logPath + `
  rls:
    http_listen: 127.0.0.1:0
    rules:
      - {name: per-ip, domain: edge, descriptor: [remote_address], limits: [{name: ip-1, rate: 1/min}]}
`
	st := stage.New(stage.Options{})
	t.Cleanup(st.Close)
	s := commitWithStage(t, st, NewServer(ServerOptions{}), policy)
	for range 2 {
		check(t, s, "remote_address=192.0.2.44")
	}
	l := s.Service().rules[0].all[0]
	if a, r := l.counts[cAllowed].Load(), l.counts[cRejected].Load(); a != 1 || r != 1 {
		t.Errorf("ip-1 counted %d allowed, %d rejected; want 1 and 1", a, r)
	}
	s.Close()
	st.Close() // flushes the log
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"route":"rls:per-ip","decision":"allowed"`) ||
		!strings.Contains(lines[1], `"decision":"limited","limit":"ip-1","status":429`) ||
		!strings.Contains(lines[1], `"method":"http","host":"edge","path":"remote_address=192.0.2.44","peer":"192.0.2.44"`) {
		t.Errorf("access log:\n%s", b)
	}
}

// TestOneAccessLog: the proxy and the rate-limit service of one l7:
// section write one file through the stage's one log: their lines
// interleave whole; after logrotate's rename, the stage's reopen moves both
// to the new file; a reload that changes the path moves both; a policy
// without access_log stops both.
func TestOneAccessLog(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(up.Close)
	dir := t.TempDir()
	policy := func(path string) string {
		log := ""
		if path != "" {
			log = "  access_log: " + path + "\n"
		}
		return "l7:\n  listen: 127.0.0.1:0\n  upstream: " + up.URL + "\n" + log + `  rls:
    http_listen: 127.0.0.1:0
    rules:
      - {name: per-ip, domain: edge, descriptor: [remote_address], limits: [{name: ip-9, rate: 9/min}]}
`
	}
	st := stage.New(stage.Options{})
	t.Cleanup(st.Close)
	srv := NewServer(ServerOptions{})
	t.Cleanup(srv.Close)
	first := filepath.Join(dir, "l7.log")
	commitWithStage(t, st, srv, policy(first))
	both := func(n int) {
		t.Helper()
		for range n {
			check(t, srv, "remote_address=192.0.2.7")
			res, err := http.Get("http://" + st.Status().Addr + "/p")
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
		}
	}
	// counts is the proxy's and the service's lines in path, once the
	// log's buffer has reached the file.
	counts := func(path string, proxyWant, rlsWant int) {
		t.Helper()
		var proxyLines, rlsLines int
		deadline := time.Now().Add(5 * time.Second)
		for {
			b, _ := os.ReadFile(path)
			proxyLines, rlsLines = 0, 0
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				switch {
				case line == "":
				case !strings.HasPrefix(line, "{") || !strings.HasSuffix(line, "}"):
					t.Fatalf("%s: a line not whole: %q", path, line)
				case strings.Contains(line, `"route":"rls:per-ip"`):
					rlsLines++
				default:
					proxyLines++
				}
			}
			if proxyLines == proxyWant && rlsLines == rlsWant || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if proxyLines != proxyWant || rlsLines != rlsWant {
			t.Fatalf("%s: %d proxy and %d rls lines, want %d and %d", path, proxyLines, rlsLines, proxyWant, rlsWant)
		}
	}
	both(3)
	counts(first, 3, 3)
	// logrotate: rename, then SIGUSR1 (the stage's reopen is the only one).
	rotated := first + ".1"
	if err := os.Rename(first, rotated); err != nil {
		t.Fatal(err)
	}
	if err := st.ReopenAccessLog(); err != nil {
		t.Fatal(err)
	}
	both(2)
	counts(first, 2, 2)
	counts(rotated, 3, 3)
	// A reload to another path moves both writers.
	second := filepath.Join(dir, "other.log")
	commitWithStage(t, st, srv, policy(second))
	both(1)
	counts(second, 1, 1)
	// No access_log: neither writes.
	commitWithStage(t, st, srv, policy(""))
	both(1)
	counts(second, 1, 1)
	counts(first, 2, 2)
}

// commitWithStage applies src to the stage and the service as the daemon
// does: the stage prepares first and owns the access log, the service
// writes through it.
func commitWithStage(t *testing.T, st *stage.Stage, s *Server, src string) *Server {
	t.Helper()
	pc, cfg := decodeL7(t, src)
	raw, err := yaml.Marshal(src)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := st.Prepare(context.Background(), pc, raw, stage.Standing{})
	if err != nil {
		t.Fatalf("stage prepare: %v", err)
	}
	cfg.AccessLog = ch.AccessLog()
	rch, err := s.Prepare(cfg)
	if err != nil {
		ch.Abort()
		t.Fatalf("rls prepare: %v", err)
	}
	ch.Commit()
	rch.Commit()
	return s
}

// check asks the subrequest endpoint once for descriptor.
func check(t *testing.T, s *Server, descriptor string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+s.Addrs()["http"]+"/v1/check/edge", nil)
	req.Header.Set(DescriptorHeader, descriptor)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
}

// TestExamplePolicy: the example policy's commented-out rls: section
// (inside its commented l7:) decodes without problems and serves.
func TestExamplePolicy(t *testing.T) {
	data, err := os.ReadFile("../../../examples/edgeguard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	i := strings.Index(text, "\n# l7:\n")
	if i < 0 {
		t.Fatal("examples/edgeguard.yaml: no commented l7: section")
	}
	var b strings.Builder
	for _, line := range strings.Split(text[i+1:], "\n") {
		b.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "#"), " ") + "\n")
	}
	// Free ports instead of the example's.
	src := strings.NewReplacer("127.0.0.1:8081", "127.0.0.1:0", "127.0.0.1:8082", "127.0.0.1:0",
		"/run/edgeguard/rls.sock", t.TempDir()+"/rls.sock").Replace(b.String())
	pc, cfg := decodeL7(t, src)
	if !pc.ServesProxy() || len(cfg.Rules) != 2 || cfg.Unix == "" || cfg.HTTPListen == "" {
		t.Fatalf("example rls: %+v", cfg)
	}
	s := NewServer(ServerOptions{})
	defer s.Close()
	ch, err := s.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
}

// TestDefaultReserve: a rule's local limits keep half for the first class
// by default when the descriptor counts an aggregate of clients (fixed
// values, generic_key, clusters, masked_remote_address), as a route limit
// keyed on global or prefix; none when it may name a client
// (remote_address, a request header); an explicit reserve wins; redis
// limits have none.
func TestDefaultReserve(t *testing.T) {
	_, cfg := decodeL7(t, `
l7:
  redis: {addr: 127.0.0.1:1}
  rls:
    listen: 127.0.0.1:0
    rules:
      - {name: a, domain: d, descriptor: [generic_key=api], limits: [{name: a, rate: 10/s}]}
      - {name: b, domain: d, descriptor: [generic_key], limits: [{name: b, rate: 10/s}]}
      - {name: c, domain: d, descriptor: [masked_remote_address], limits: [{name: c, rate: 10/s}]}
      - {name: e, domain: d, descriptor: [destination_cluster, header_match=x], limits: [{name: e, rate: 10/s}]}
      - {name: f, domain: d, descriptor: [remote_address], limits: [{name: f, rate: 10/s}]}
      - {name: g, domain: d, descriptor: [generic_key=api, remote_address], limits: [{name: g, rate: 10/s}]}
      - {name: h, domain: d, descriptor: [user_id], limits: [{name: h, rate: 10/s}]}
      - {name: i, domain: d, descriptor: [generic_key=x], limits: [{name: i, rate: 10/s, reserve: 20%}]}
      - {name: j, domain: d2, descriptor: [remote_address], limits: [{name: j, rate: 10/s, reserve: 10%}]}
      - {name: k, domain: d, descriptor: [generic_key=y], limits: [{name: k, rate: 10/s, backend: redis}]}
      - name: l
        domain: d
        descriptor: [generic_key=z, plan]
        tiers: {entry: plan, levels: {gold: [{name: l, rate: 10/s}]}}
      - name: m
        domain: d
        descriptor: [destination_cluster, plan]
        tiers: {entry: plan, levels: {gold: [{name: m, rate: 10/s}]}}
`)
	want := map[string]int{"a": 50, "b": 50, "c": 50, "e": 50, "f": 0, "g": 0, "h": 0, "i": 20, "j": 10, "k": 0, "l": 0, "m": 0}
	for _, r := range cfg.Rules {
		ls := r.Limits
		if r.Tiers != nil {
			ls = r.Tiers.Levels[0].Limits
		}
		if got := ls[0].Reserve; got != want[r.Name] {
			t.Errorf("rule %s [%s]: reserve %d%%, want %d%%", r.Name, entriesString(r.Entries), got, want[r.Name])
		}
	}
}
