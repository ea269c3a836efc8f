package proxy

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/policy"
)

func decodeProblems(t *testing.T, src string) []string {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	cfg, probs := Decode(l7Node(&doc), "p.yaml")
	if len(probs) > 0 && cfg != nil {
		t.Fatalf("Decode returned a Config with problems")
	}
	out := make([]string, len(probs))
	for i, p := range probs {
		out[i] = p.String()
	}
	return out
}

const validHead = `l7:
  listen: 127.0.0.1:8080
  upstream: http://127.0.0.1:9000
`

func TestDecodeProblems(t *testing.T) {
	cases := []struct {
		name string
		src  string
		want []string // every problem, in order, as file:line:column: message (substring)
	}{
		{"unknown top-level field", validHead + "  listn: x\n",
			[]string{`p.yaml:4:3: unknown field "listn" in l7; allowed: listen, upstream,`}},
		{"request rules (issue 29)", validHead + `  paths: {normalize: loose, forward: raw}
  identity_fields: [X-Forwarded-For, "bad name", X-Real-IP]
  timeouts: {body: 0s, min_rate: -1}
  exempt_paths: [/health//x]
  routes:
    - name: api
      match: {path_prefix: /a/./b, path_case: lower}
`, []string{`p.yaml:4:22: l7 paths normalize "loose": want one of standard, strict`,
			`p.yaml:4:38: l7 paths forward "raw": want one of normalized, as-sent`,
			`p.yaml:5:21: l7 identity_fields: X-Forwarded-For is always rewritten`,
			`p.yaml:5:38: l7 identity_fields "bad name" is not a valid header name`,
			`p.yaml:6:20: l7 timeouts body "0s": want a positive duration`,
			`p.yaml:6:34: l7 timeouts min_rate (bytes per second)`,
			`p.yaml:7:18: l7 exempt_paths "/health//x": requests are matched by their normal path; write it as "/health/x"`,
			`p.yaml:10:28: match path_prefix "/a/./b": requests are matched by their normal path; write it as "/a/b"`,
			`p.yaml:10:47: match path_case "lower": want one of sensitive, insensitive`}},
		{"missing listen and upstream", "l7:\n  routes: []\n",
			[]string{"p.yaml:2:3: l7: listen is required", "p.yaml:2:3: l7: upstream is required"}},
		{"bad listen and upstream", "l7:\n  listen: localhost\n  upstream: ftp://x\n",
			[]string{`p.yaml:2:11: l7 listen "localhost": want host:port`, `p.yaml:3:13: l7 upstream "ftp://x": want http://host:port`}},
		{"bad CIDRs", validHead + "  trusted_proxies: [10.0.0.0/33, 10.0.0.1/8, nonsense]\n",
			[]string{`p.yaml:4:21: trusted proxy "10.0.0.0/33": want an address or CIDR prefix`,
				`p.yaml:4:34: trusted proxy "10.0.0.1/8" has host bits set; did you mean 10.0.0.0/8?`,
				`p.yaml:4:46: trusted proxy "nonsense"`}},
		{"bad rate, unit, algorithm, duration", validHead + `  concurrency: {max_in_flight: 10, queue_timeout: 5}
  routes:
    - name: api
      limits:
        - {name: a, key: ip, rate: 100/fortnight}
        - {name: b, key: ip, rate: 10Mbit/s}
        - {name: c, key: ip, rate: 10/s, algorithm: leaky}
`, []string{`p.yaml:4:51: queue_timeout "5": want a positive duration`,
			`p.yaml:8:36: limit "a": rate "100/fortnight": unknown unit`,
			`p.yaml:9:36: limit "b": rate "10Mbit/s" counts bytes; an L7 rate counts requests`,
			`p.yaml:10:53: limit algorithm "leaky": want one of gcra, sliding-window, token-bucket, fixed-window, leaky_bucket, sliding_log`}},
		{"unsupported algorithm combinations", validHead + `  redis: {addr: "127.0.0.1:6379"}
  routes:
    - name: api
      limits:
        - {name: a, key: ip, rate: 10/s, algorithm: gcra, shape: true}
        - {name: b, key: ip, rate: 10/s, algorithm: leaky_bucket, shape: true, shadow: true}
        - {name: c, key: ip, rate: 10/s, algorithm: leaky_bucket, shape: true, backend: redis}
        - {name: d, key: ip, rate: 10/s, algorithm: sliding_log, backend: redis}
        - {name: e, key: ip, rate: 10/s, algorithm: token-bucket, backend: redis}
        - {name: f, key: ip, rate: 6000/min, algorithm: sliding_log}
        - {name: g, key: ip, rate: 10/s, algorithm: sliding-log, burst: 20}
`, []string{`p.yaml:8:66: limit "a": shape: true applies to algorithm leaky_bucket, not gcra`,
			`p.yaml:9:74: limit "b": shape: true with shadow: true is not supported`,
			`p.yaml:10:74: limit "c": shape: true with backend redis is not supported (the release slot is decided from local state)`,
			`p.yaml:11:75: limit "d": algorithm sliding_log with backend redis is not supported`,
			`p.yaml:12:53: limit "e": backend redis supports gcra, sliding-window and leaky_bucket, not token-bucket`,
			`p.yaml:13:36: limit "f": sliding_log keeps one 8-byte timestamp per admitted request and key: rate count 6000 times capacity 65536 keys is 3000 MiB, above 64 MiB`,
			`p.yaml:14:73: limit "g": burst applies to gcra, token-bucket and leaky_bucket, not sliding_log`}},
		{"bad keys and duplicate names", validHead + `  routes:
    - name: api
      limits:
        - {name: a, key: ip+cookie, rate: 1/s}
        - {name: a, key: "header:", rate: 1/s}
    - name: api
`, []string{`p.yaml:7:26: limit key "ip+cookie": unknown part "cookie"`,
			`p.yaml:8:18: limit name "a" is already used at line 7`,
			`p.yaml:8:26: limit key "header:": header name "" is not valid`,
			`p.yaml:9:7: route "api" is already defined at line 5`}},
		{"match problems", validHead + `  routes:
    - name: api
      match: {host: "api.example.com:80", methods: [get], path_prefix: api, path_pattern: "([", colour: red}
`, []string{`p.yaml:6:21: match host "api.example.com:80": want a host name without port`,
			`p.yaml:6:53: match method "get": want an upper-case HTTP method`,
			`p.yaml:6:72: match path_prefix "api" must start with /`,
			`p.yaml:6:91: route "api" match: set path_prefix or path_pattern, not both`,
			"p.yaml:6:91: match path_pattern \"([\": error parsing regexp",
			`p.yaml:6:97: unknown field "colour" in route "api" match`}},
		{"redis needs a section; tiers default", validHead + `  routes:
    - name: api
      limits: [{name: r, key: ip, rate: 1/s, backend: redis}]
      tiers: {header: X-Plan, default: gold, levels: {free: [{name: f, key: ip, rate: 1/s}]}}
`, []string{`p.yaml:6:55: limit "r": backend redis needs an l7 redis: section`,
			`p.yaml:7:40: tiers default "gold" is not one of the levels`}},
		{"redis limits in tiers without a redis section", validHead + `  routes:
    - name: api
      tiers:
        header: X-Plan
        levels:
          free: [{name: f, key: ip, rate: 1/s, backend: redis}]
`, []string{`p.yaml:9:57: limit "f": backend redis needs an l7 redis: section`}},
		{"hybrid backend problems", validHead + `  redis: {addr: 127.0.0.1:6379, hosts: 0, sync_interval: 0s, failure: nearby}
  routes:
    - name: api
      limits:
        - {name: a, key: ip, rate: 100/min, backend: hybrid}
        - {name: b, key: ip, rate: 100/min, algorithm: gcra, backend: hybrid}
        - {name: c, key: ip, rate: 100/min, backend: redis, lease: 5}
        - {name: d, key: ip, rate: 100/min, failure: local}
        - {name: e, key: ip, rate: 100/min, algorithm: sliding-window, backend: hybrid, lease: 0, reserve: 10%}
`, []string{`p.yaml:4:40: redis hosts "0" must be a whole number from 1 to 65536`,
			`p.yaml:4:58: redis sync_interval "0s": want a positive duration`,
			`p.yaml:4:71: redis failure "nearby": want one of fail-open, fail-closed, local`,
			`p.yaml:8:54: limit "a": backend hybrid needs algorithm: sliding-window (its leases share a sliding window counter), not gcra`,
			`p.yaml:9:56: limit "b": backend hybrid needs algorithm: sliding-window`,
			`p.yaml:10:68: limit "c": lease applies only to backend hybrid`,
			`p.yaml:11:54: limit "d": failure applies only to backend redis and hybrid`,
			`p.yaml:12:96: limit lease "0" must be a whole number from 1`,
			`p.yaml:12:108: limit "e": reserve applies to backend local`}},
		{"redis limits in tiers", validHead + `  redis: {addr: 127.0.0.1:6379}
  routes:
    - name: api
      tiers:
        header: X-Plan
        levels:
          free: [{name: f, key: ip, rate: 1/s, backend: redis}]
          pro: [{name: p, key: ip, rate: 1/s, backend: redis, algorithm: token-bucket}]
`, []string{`p.yaml:11:74: limit "p": backend redis supports gcra, sliding-window and leaky_bucket, not token-bucket`}},
		{"escalation and headers", validHead + `  headers: {draft: 9}
  escalation: {enabled: yes, rejections: 0, ttl: -1m, prefix_v4: 33}
`, []string{`p.yaml:4:20: headers draft "9": want one of 10, none`,
			`p.yaml:5:25: escalation enabled "yes": want true or false`,
			`p.yaml:5:42: escalation rejections "0" must be a whole number from 1 to 1073741824`,
			`p.yaml:5:50: escalation ttl "-1m": want a positive duration`,
			`p.yaml:5:66: escalation prefix_v4 "33" must be a whole number from 8 to 32`}},
		{"rate below 1ns per request", validHead + `  routes:
    - name: api
      limits: [{name: fast, key: global, rate: 2000000000/s}]
`, []string{`p.yaml:6:48: limit "fast": gcra: limit 2000000000 per 1s: emission interval below 1ns`}},
		{"too many local limits", validHead + `  routes:
    - name: api
      limits: [{name: a1, key: ip, rate: 1/s}, {name: a2, key: ip, rate: 1/s}, {name: a3, key: ip, rate: 1/s}, {name: a4, key: ip, rate: 1/s}, {name: a5, key: ip, rate: 1/s}]
      tiers: {header: X-Plan, levels: {t: [{name: b1, key: ip, rate: 1/s}, {name: b2, key: ip, rate: 1/s}, {name: b3, key: ip, rate: 1/s}, {name: b4, key: ip, rate: 1/s}]}}
`, []string{`p.yaml:5:7: route "api": 9 local limits apply to one request (route plus largest tier); at most 8`}},
		{"unknown engine", validHead + "  engine: epoll\n",
			[]string{`p.yaml:4:11: l7 engine "epoll": want auto, event-loop or net-http`}},
		{"engine not a scalar", validHead + "  engine: [event-loop]\n",
			[]string{`p.yaml:4:11: l7 engine must be a single value, got a list`}},
		{"event loop with an https upstream", "l7:\n  listen: 127.0.0.1:8080\n  upstream: https://127.0.0.1:9443\n  engine: event-loop\n",
			[]string{`p.yaml:4:11: l7 engine event-loop: the upstream is https and the event loop speaks plain http`}},
		{"loops out of range", validHead + "  loops: 0\n",
			[]string{`p.yaml:4:10: l7 loops "0" must be a whole number from 1 to 1024`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := decodeProblems(t, c.src)
			if len(got) != len(c.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(c.want), strings.Join(got, "\n"))
			}
			for i := range got {
				if !strings.HasPrefix(got[i], c.want[i]) {
					t.Errorf("problem %d:\n got  %s\n want %s...", i, got[i], c.want[i])
				}
			}
		})
	}
}

func TestDecodeDefaultsAndFullConfig(t *testing.T) {
	src := validHead + `  trusted_proxies: [10.0.0.0/8, 192.0.2.1]
  redis: {addr: "127.0.0.1:6379"}
  escalation: {enabled: true}
  routes:
    - name: api
      match: {host: api.example.com, methods: [GET], path_prefix: /v1/, header: {x-env: prod}}
      limits:
        - {name: per-key, key: "header:x-api-key+endpoint", rate: 1.5/s, burst: 20}
        - {name: shared, key: tenant+ip, rate: 6000/h, backend: redis}
`
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	cfg, probs := Decode(l7Node(&doc), "p.yaml")
	if len(probs) > 0 {
		t.Fatalf("problems: %v", probs)
	}
	if got := cfg.TrustedProxies[1].String(); got != "192.0.2.1/32" {
		t.Errorf("single address: %s", got)
	}
	if cfg.Headers.Draft != 10 || cfg.ClientPrefixV6 != 64 || cfg.Escalation.Rejections != DefaultEscalationRejection ||
		cfg.Escalation.TTL != DefaultEscalationTTL || cfg.Escalation.PrefixV6 != 64 {
		t.Errorf("defaults: %+v %+v", cfg.Headers, cfg.Escalation)
	}
	l := cfg.Routes[0].Limits[0]
	if l.Count != 3 || l.Per != 2*time.Second || l.Burst != 20 || l.Algorithm != AlgGCRA || l.Key.String() != "header:X-Api-Key+endpoint" {
		t.Errorf("limit %+v key %s", l, l.Key)
	}
	if r := cfg.Routes[0].Limits[1]; r.Backend != BackendRedis || r.Failure != FailureOpen || r.Key.String() != "tenant+ip" {
		t.Errorf("redis limit %+v", r)
	}
	if cfg.Routes[0].Match.Header["X-Env"] != "prod" {
		t.Errorf("header match %v", cfg.Routes[0].Match.Header)
	}
}

// engine: auto, event-loop and net-http decode; ServingEngine resolves auto
// (and an unset engine) to the event loop for an http upstream and to
// net/http for an https one.
func TestDecodeEngine(t *testing.T) {
	cases := []struct {
		upstream, engine string // engine "": no engine field
		want, serving    Engine
	}{
		{"http://127.0.0.1:9000", "", "", EngineEventLoop},
		{"http://127.0.0.1:9000", "auto", "", EngineEventLoop},
		{"http://127.0.0.1:9000", "event-loop", EngineEventLoop, EngineEventLoop},
		{"http://127.0.0.1:9000", "net-http", EngineNetHTTP, EngineNetHTTP},
		{"https://127.0.0.1:9443", "", "", EngineNetHTTP},
		{"https://127.0.0.1:9443", "auto", "", EngineNetHTTP},
		{"https://127.0.0.1:9443", "net-http", EngineNetHTTP, EngineNetHTTP},
	}
	for _, c := range cases {
		src := "l7:\n  listen: 127.0.0.1:8080\n  upstream: " + c.upstream + "\n"
		if c.engine != "" {
			src += "  engine: " + c.engine + "\n"
		}
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
			t.Fatal(err)
		}
		cfg, probs := Decode(l7Node(&doc), "p.yaml")
		if len(probs) > 0 {
			t.Errorf("upstream %s engine %q: problems %v", c.upstream, c.engine, probs)
			continue
		}
		if cfg.Engine != c.want || cfg.ServingEngine() != c.serving {
			t.Errorf("upstream %s engine %q: Engine %q, ServingEngine %q; want %q, %q",
				c.upstream, c.engine, cfg.Engine, cfg.ServingEngine(), c.want, c.serving)
		}
	}
	if got := (&Config{}).ServingEngine(); got != EngineEventLoop {
		t.Errorf("a Config without upstream or engine serves %q, want the event loop", got)
	}
}

// The example policy validates, and its commented-out l7: section (commented
// so that the built-in default runs no proxy) decodes without problems and
// builds.
func TestExamplePolicy(t *testing.T) {
	const path = "../../../examples/edgeguard.yaml"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Parse(path, data, os.ReadFile); err != nil {
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
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(b.String()), &doc); err != nil {
		t.Fatalf("uncommented l7 section: %v", err)
	}
	cfg, probs := Decode(l7Node(&doc), "examples/edgeguard.yaml")
	if len(probs) > 0 {
		t.Fatalf("problems: %v", probs)
	}
	if len(cfg.Routes) != 2 || cfg.Routes[1].Tiers == nil {
		t.Fatalf("routes %+v", cfg.Routes)
	}
	px, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	px.Close()
}

// An adaptive concurrency limit starts its update loop in New and stops it
// in Close.
func TestAdaptiveConcurrencyLifecycle(t *testing.T) {
	up := startUpstream(t)
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: UPSTREAM
  routes:
    - name: api
      concurrency: {max_in_flight: 4, adaptive: true, adaptive_max: 16}
`, up.srv.URL)
	if c := cfg.Routes[0].Concurrency; !c.Adaptive || c.AdaptiveMax != 16 || c.MaxInFlight != 4 {
		t.Fatalf("concurrency %+v", c)
	}
	_, base := startProxy(t, cfg, Options{})
	if s := status(t, "GET", base+"/"); s != 200 {
		t.Fatalf("status %d", s)
	}
	// startProxy's cleanup cancels Serve, which Closes the proxy: it waits
	// for the adaptive loop, so a leak would hang the cleanup.
}

// Close unregisters a Proxy's metrics, and a New that fails leaves nothing
// registered, so a reload can build the next Proxy on the same registry.
func TestMetricsRegistrationAcrossReloads(t *testing.T) {
	cfg := decodeYAML(t, `
l7:
  listen: 127.0.0.1:0
  upstream: http://127.0.0.1:1
  redis: {addr: "127.0.0.1:1"}
  concurrency: {max_in_flight: 10}
  routes:
    - name: api
      limits:
        - {name: local, key: ip, rate: 10/s}
        - {name: shared, key: ip, rate: 10/s, backend: redis}
`, "")
	reg := prometheus.NewRegistry()
	a, err := New(cfg, Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg, Options{Registerer: reg}); err == nil {
		t.Fatal("second Proxy registered the same metrics while the first is open")
	}
	a.Close()
	if n := len(gatherNames(t, reg)); n != 0 {
		t.Fatalf("%d metric families left after Close and a failed New: %v", n, gatherNames(t, reg))
	}
	b, err := New(cfg, Options{Registerer: reg})
	if err != nil {
		t.Fatalf("New after Close: %v", err)
	}
	defer b.Close()
	if got := gatherNames(t, reg); !slices.Contains(got, "edgeguard_l7_shed_in_flight") || !slices.Contains(got, "edgeguard_l7_redis_breaker_state") {
		t.Fatalf("families %v", got)
	}
}

func gatherNames(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		out = append(out, mf.GetName())
	}
	return out
}

func TestDecodeNotAMapping(t *testing.T) {
	if got := decodeProblems(t, "l7: 5\n"); len(got) != 1 || got[0] != `p.yaml:1:5: l7 must be a mapping, got "5"` {
		t.Fatalf("got %q", got)
	}
	if _, probs := Decode(nil, "p.yaml"); len(probs) != 1 || probs[0].String() != "p.yaml: l7: section missing" {
		t.Fatalf("nil node: %v", probs)
	}
}

// FuzzDecode: any YAML decodes to a Config or to problems, never a panic,
// and a Config always builds.
func FuzzDecode(f *testing.F) {
	f.Add(validHead + "  routes: [{name: a, limits: [{name: x, key: ip, rate: 1/s}]}]\n")
	f.Add(validHead + "  routes: [{name: a, match: {path_pattern: '^/x'}, tiers: {header: X, levels: {t: [{name: y, key: user, rate: 5/min}]}}}]\n")
	f.Add("l7: {listen: ':1', upstream: 'http://h', escalation: {enabled: true}, concurrency: {max_in_flight: 1}}\n")
	f.Add("l7: &a {listen: *a}\n")
	f.Fuzz(func(t *testing.T, src string) {
		var doc yaml.Node
		if yaml.Unmarshal([]byte(src), &doc) != nil {
			return
		}
		cfg, probs := Decode(l7Node(&doc), "f.yaml")
		if (cfg == nil) == (len(probs) == 0) {
			t.Fatalf("cfg %v with %d problems", cfg != nil, len(probs))
		}
		if cfg != nil {
			p, err := New(cfg, Options{})
			if err != nil {
				t.Fatalf("a decoded Config does not build: %v", err)
			}
			p.Close()
		}
	})
}

// loops decodes into Config.Loops; absent, it is 0 (the engine's default).
func TestDecodeLoops(t *testing.T) {
	for src, want := range map[string]int{
		"l7:\n  listen: 127.0.0.1:8080\n  upstream: http://127.0.0.1:9000\n":             0,
		"l7:\n  listen: 127.0.0.1:8080\n  upstream: http://127.0.0.1:9000\n  loops: 3\n": 3,
	} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
			t.Fatal(err)
		}
		cfg, probs := Decode(l7Node(&doc), "p.yaml")
		if len(probs) > 0 || cfg == nil {
			t.Fatalf("%q: problems %v", src, probs)
		}
		if cfg.Loops != want {
			t.Errorf("%q: Loops %d, want %d", src, cfg.Loops, want)
		}
	}
}
