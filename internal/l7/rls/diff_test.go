package rls

import (
	"testing"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// TestDiffL7: the l7: part of the policy's diff comes from the l7 field
// tables: layout and spelling do not count, each changed knob is one line
// labelled as the policy's sections are, routes, limits and rls rules by
// name.
func TestDiffL7(t *testing.T) {
	parse := func(l7 string) *policy.Policy {
		t.Helper()
		src := "apiVersion: edgeguard/v1\ninterfaces: [{name: eth0}]\n" + l7
		p, err := policy.Parse("p.yaml", []byte(src), nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	const base = "l7:\n  listen: 127.0.0.1:8080\n  upstream: http://127.0.0.1:8081\n"
	const api = "  routes:\n  - name: api\n    match: {path_prefix: /api}\n    limits:\n    - {name: a, key: ip, rate: 10/s}\n"
	none := parse("")
	a := parse(base)
	// Same content, other layout, a comment and a default written out: no change.
	a2 := parse("l7: {upstream: \"http://127.0.0.1:8081\", listen: 127.0.0.1:8080, timeouts: {body: 60s}}  # same\n")
	b := parse("l7:\n  listen: 127.0.0.1:9090\n  upstream: http://127.0.0.1:8081\n  engine: net-http\n  timeouts: {body: 2m}\n")
	r1 := parse(base + api)
	r2 := parse(base + "  routes:\n  - name: api\n    match: {path_prefix: /v2}\n    limits:\n    - {name: a, key: ip, rate: 20/s, reserve: 10%}\n    - {name: b, key: user, rate: 1/s}\n  - name: web\n")
	s1 := parse(base + "  rls:\n    listen: 127.0.0.1:8083\n    rules:\n    - {name: r, domain: d, descriptor: [generic_key=api], limits: [{name: c, rate: 5/s}]}\n")
	s2 := parse(base + "  rls:\n    listen: 127.0.0.1:8084\n    rules:\n    - {name: r, domain: d, descriptor: [generic_key=api], limits: [{name: c, rate: 6/s}]}\n")
	// A route's tiers and an rls rule's: levels by name, their limits by
	// name.
	tiers := func(route, rule string) *policy.Policy {
		return parse(base + api + "    tiers:\n      header: X-Plan\n      default: free\n      levels:\n        free: [{name: f, key: ip, rate: 1/s}]\n" + route +
			"  rls:\n    listen: 127.0.0.1:8083\n    rules:\n    - name: r\n      domain: d\n      descriptor: [plan]\n      limits: [{name: c, rate: 5/s}]\n" +
			"      tiers: {entry: plan, levels: {free: [{name: rf, rate: 1/s}]" + rule + "}}\n")
	}
	t1 := tiers("        pro: [{name: p, key: ip, rate: 10/s}]\n", ", pro: [{name: rp, rate: 10/s}]")
	t2 := tiers("        pro: [{name: p, key: ip, rate: 20/s}, {name: q, key: user, rate: 2/s}]\n", ", pro: [{name: rp, rate: 20/s}]")
	t3 := tiers("        gold: [{name: g, key: ip, rate: 1k/s}]\n", "")
	for _, tc := range []struct {
		name     string
		from, to *policy.Policy
		want     string
	}{
		{"added", none, a, "+ l7 section\n"},
		{"removed", a, none, "- l7 section\n"},
		{"same", a, a2, ""},
		{"changed", a, b, "~ l7 listen 127.0.0.1:8080 -> 127.0.0.1:9090\n~ l7 engine auto -> net-http\n~ l7 timeouts.body 1m -> 2m\n"},
		{"routes", r1, r2, `~ l7 route api match {host: "", methods: [], path_prefix: /api, path_pattern: "", path_case: sensitive, header: none} -> {host: "", methods: [], path_prefix: /v2, path_pattern: "", path_case: sensitive, header: none}
~ l7 route api limit a rate 10/s -> 20/s
~ l7 route api limit a reserve 0% -> 10%
+ l7 route api limit b {name: b, key: user, rate: 1/s, burst: the rate's count, algorithm: gcra, shape: false, shadow: false, backend: local, failure: l7.redis.failure; hybrid: local, lease: ⌈count ÷ (10 × hosts)⌉; hosts 1: ⌈count ÷ 4⌉, capacity: 65536, reserve: 0%}
+ l7 route web {name: web, match: every request, exempt_paths: [], limits: [], tiers: none, concurrency: none}
`},
		{"routes removed", r2, r1, "- l7 route web\n~ l7 route api match {host: \"\", methods: [], path_prefix: /v2, path_pattern: \"\", path_case: sensitive, header: none} -> {host: \"\", methods: [], path_prefix: /api, path_pattern: \"\", path_case: sensitive, header: none}\n- l7 route api limit b\n~ l7 route api limit a rate 20/s -> 10/s\n~ l7 route api limit a reserve 10% -> 0%\n"},
		{"rls added", a, s1, "~ l7 rls none -> set\n"},
		{"tiers", t1, t2, `~ l7 route api tiers.level pro limit p rate 10/s -> 20/s
+ l7 route api tiers.level pro limit q {name: q, key: user, rate: 2/s, burst: the rate's count, algorithm: gcra, shape: false, shadow: false, backend: local, failure: l7.redis.failure; hybrid: local, lease: ⌈count ÷ (10 × hosts)⌉; hosts 1: ⌈count ÷ 4⌉, capacity: 65536, reserve: 0%}
~ l7 rls.rule r tiers.level pro limit rp rate 10/s -> 20/s
`},
		{"tiers levels", t1, t3, `- l7 route api tiers.level pro
+ l7 route api tiers.level gold limit g {name: g, key: ip, rate: 1k/s, burst: the rate's count, algorithm: gcra, shape: false, shadow: false, backend: local, failure: l7.redis.failure; hybrid: local, lease: ⌈count ÷ (10 × hosts)⌉; hosts 1: ⌈count ÷ 4⌉, capacity: 65536, reserve: 0%}
- l7 rls.rule r tiers.level pro
`},
		{"rls", s1, s2, "~ l7 rls.listen 127.0.0.1:8083 -> 127.0.0.1:8084\n~ l7 rls.rule r limit c rate 5/s -> 6/s\n"},
	} {
		if got := policy.FormatDiff(policy.DiffSections(tc.from, tc.to, DiffL7)); got != tc.want {
			t.Errorf("%s: got\n%s\nwant\n%s", tc.name, got, tc.want)
		}
	}
}
