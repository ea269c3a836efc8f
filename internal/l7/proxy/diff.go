package proxy

import (
	"strings"

	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// Diff reports what changes from a to b, decoded l7: sections (nil: the
// policy has none), as the policy's diff writes its sections: from the
// l7 tables, field by field ("~ l7 timeouts.body 1m -> 2m"), routes and
// their limits by name ("+ l7 route api ...", "~ l7 route api limit a
// rate 10/s -> 20/s"). The rls: section is internal/l7/rls's (rls.Diff).
func Diff(a, b *Config, emit func(op byte, text string)) {
	switch {
	case a == nil && b == nil:
	case a == nil:
		emit('+', "l7 section")
	case b == nil:
		emit('-', "l7 section")
	default:
		(&decoder{}).l7Table().DiffWith("l7 ", a, b, emit)
	}
}

// routeList is l7.routes, diffed route by route (by name).
type routeList struct{ decoded[[]Route] }

// Diff implements yamlcheck.Differ.
func (routeList) Diff(_ string, a, b []Route, emit func(op byte, text string)) {
	diffNamed(a, b, func(r Route) string { return r.Name }, func(r Route) string {
		return (&decoder{}).routeTable(&r, nil).String(&r)
	}, func(prefix string, x, y Route) {
		(&decoder{}).routeTable(&y, nil).DiffWith(prefix, &x, &y, emit)
	}, "l7 route ", emit)
}

// limitList is a route's limits, diffed limit by limit (by name).
type limitList struct{ yamlcheck.Kind[[]Limit] }

// Diff implements yamlcheck.Differ.
func (limitList) Diff(label string, a, b []Limit, emit func(op byte, text string)) {
	spec := func(l Limit) limitSpec { return limitSpec{Limit: l, rate: requestRate{Count: l.Count, Per: l.Per}} }
	var bad bool
	diffNamed(a, b, func(l Limit) string { return l.Name }, formatLimit, func(prefix string, x, y Limit) {
		sx, sy := spec(x), spec(y)
		(&decoder{}).limitTable(&sy, &bad).DiffWith(prefix, &sx, &sy, emit)
	}, strings.TrimSuffix(label, "limits")+"limit ", emit)
}

// tierList is a route's (or an rls rule's) tiers levels, diffed level by
// level (by name) and each level's limits limit by limit.
type tierList struct{ yamlcheck.Kind[[]Tier] }

// Diff implements yamlcheck.Differ.
func (tierList) Diff(label string, a, b []Tier, emit func(op byte, text string)) {
	diffNamed(a, b, func(t Tier) string { return t.Name }, func(t Tier) string {
		parts := make([]string, len(t.Limits))
		for i, l := range t.Limits {
			parts[i] = "limit " + l.Name + " " + formatLimit(l)
		}
		return strings.Join(parts, "; ")
	}, func(prefix string, x, y Tier) {
		limitList{}.Diff(prefix+"limits", x.Limits, y.Limits, emit)
	}, strings.TrimSuffix(label, "levels")+"level ", emit)
}

// formatLimit writes a limit's fields on one line.
func formatLimit(l Limit) string {
	s := limitSpec{Limit: l, rate: requestRate{Count: l.Count, Per: l.Per}}
	var bad bool
	return (&decoder{}).limitTable(&s, &bad).String(&s)
}

// diffNamed diffs two lists of named items: removed ones ('-' label name),
// then, in b's order, added ones ('+' label name and the item on one line)
// and changed ones (diff, with the prefix "label name ").
func diffNamed[T any](a, b []T, name func(T) string, format func(T) string, diff func(prefix string, x, y T),
	label string, emit func(op byte, text string)) {
	old := map[string]T{}
	for _, x := range a {
		old[name(x)] = x
	}
	cur := map[string]bool{}
	for _, y := range b {
		cur[name(y)] = true
	}
	for _, x := range a {
		if !cur[name(x)] {
			emit('-', label+name(x))
		}
	}
	for _, y := range b {
		if x, ok := old[name(y)]; ok {
			diff(label+name(y)+" ", x, y)
		} else {
			emit('+', label+name(y)+" "+format(y))
		}
	}
}

// formatMatch writes a route's match on one line ("every request" when it
// has no conditions).
func formatMatch(m Match) string {
	spec := matchSpec{Match: m}
	if m.PathPattern != nil {
		spec.pattern = strings.TrimPrefix(m.PathPattern.String(), "(?i)")
	}
	if s, none := matchTable.String(&spec), matchTable.String(&matchSpec{}); s != none {
		return s
	}
	return "every request"
}
