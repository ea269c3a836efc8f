package rls

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// DiffL7 is the l7: part of the policy's diff (policy.DiffSections'
// L7Differ, which internal/policy cannot be itself: it cannot import
// internal/l7): the two l7: sections (nil: none) decoded and compared from
// the l7 field tables, field by field, routes, limits and rls rules by
// name, labelled as the policy's sections are ("~ l7 timeouts.body 1m ->
// 2m", "+ l7 route api ...", "~ l7 rls.listen ...").
func DiffL7(from, to *yaml.Node) []policy.Change {
	var out []policy.Change
	emit := func(op byte, text string) { out = append(out, policy.Change{Op: op, Text: text}) }
	a, ra, err := decodeForDiff(from)
	if err == nil {
		var b *proxy.Config
		var rb *Config
		if b, rb, err = decodeForDiff(to); err == nil {
			proxy.Diff(a, b, emit)
			if ra != nil && rb != nil {
				rlsTable(nil).DiffWith("l7 rls.", ra, rb, emit)
			}
			return out
		}
	}
	// The callers diff validated policies; say so if one was not.
	return []policy.Change{{Op: '~', Text: "l7 section: " + err.Error()}}
}

func decodeForDiff(n *yaml.Node) (*proxy.Config, *Config, error) {
	if n == nil {
		return nil, nil, nil
	}
	cfg, problems := proxy.Decode(n, "")
	if len(problems) == 0 {
		var rc *Config
		if rc, problems = Decode(cfg, ""); len(problems) == 0 {
			return cfg, rc, nil
		}
	}
	return nil, nil, fmt.Errorf("cannot be compared: %s", problems[0].Msg)
}

// ruleList is rls.rules, diffed rule by rule (by name).
type ruleList struct{ yamlcheck.Kind[[]Rule] }

// Diff implements yamlcheck.Differ.
func (ruleList) Diff(label string, a, b []Rule, emit func(op byte, text string)) {
	var bad bool
	proxy.DiffNamed(a, b, func(r Rule) string { return r.Name }, func(r Rule) string {
		return ruleTable(nil, &r, &bad, nil).String(&r)
	}, func(prefix string, x, y Rule) {
		ruleTable(nil, &y, &bad, nil).DiffWith(prefix, &x, &y, emit)
	}, label[:len(label)-len("rules")]+"rule ", emit)
}
