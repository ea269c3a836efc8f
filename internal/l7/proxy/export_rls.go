package proxy

import (
	"context"
	"log/slog"
	"net/netip"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/redislimit"
	"github.com/edgeguard/edgeguard/internal/policy"
	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// What the rate-limit service (internal/l7/rls) shares with the proxy: the
// same limit decoder, algorithms, Redis rules and escalation, so a limit
// means the same behind either.

// NewAlgorithm builds a local limit's algorithm, as a route's.
func NewAlgorithm(l Limit) (l7.Algorithm, error) { return newAlgorithm(l) }

// ReserveUnits is l's reserve in units of alg's limit, as a route's.
func ReserveUnits(l Limit, alg l7.Algorithm) int64 { return reserveUnits(l, alg) }

// RedisRule builds a redis or hybrid limit's rule, as a route's.
func RedisRule(l Limit, rc *Redis) (redislimit.Rule, error) { return redisRule(l, rc) }

// LimitDecoder decodes limit lists outside the routes (the rls: section)
// with the rules of a route's limits, except that they take no key; limit
// names stay unique across the whole l7: section.
type LimitDecoder struct{ d *decoder }

// NewLimitDecoder returns a decoder for file whose names already include
// cfg's route limits.
func NewLimitDecoder(file string, cfg *Config) *LimitDecoder {
	d := &decoder{Checker: yamlcheck.Checker{File: file}, limitNames: map[string]*yaml.Node{}, keyless: true,
		redis: cfg.Redis != nil}
	add := func(ls []Limit) {
		for _, l := range ls {
			d.limitNames[l.Name] = &yaml.Node{}
		}
	}
	for _, r := range cfg.Routes {
		add(r.Limits)
		if r.Tiers != nil {
			for _, t := range r.Tiers.Tiers {
				add(t.Limits)
			}
		}
	}
	return &LimitDecoder{d: d}
}

// Checker is the decoder's problem list, for the caller's own fields.
func (ld *LimitDecoder) Checker() *yamlcheck.Checker { return &ld.d.Checker }

// Limits decodes a sequence of limits (where names it in problems).
// aggregate: they count an aggregate of clients, so a local limit's
// reserve defaults to DefaultAggregateReserve, as a route limit keyed on
// global, endpoint, prefix or asn; otherwise to 0, as one keyed on a
// client.
func (ld *LimitDecoder) Limits(n *yaml.Node, where string, rc *Redis, aggregate bool) []Limit {
	ld.d.aggregate = aggregate
	defer func() { ld.d.aggregate = false }()
	return ld.d.limits(n, where, rc)
}

// Name decodes a name ([A-Za-z0-9_.-], 1-64).
func (ld *LimitDecoder) Name(n *yaml.Node, where string) (string, bool) {
	return nameKind{}.Parse(&ld.d.Checker, n, where)
}

// Problems are the problems found so far.
func (ld *LimitDecoder) Problems() []policy.Problem { return ld.d.Problems }

// Escalations counts 429s per source prefix and hands the sources that
// cross the l7 escalation threshold to an Escalator, as the proxy does.
type Escalations struct{ e *escalation }

// NewEscalations returns the escalation of cfg (Run it).
func NewEscalations(cfg Escalation, clock l7.Clock, esc Escalator, log *slog.Logger) (*Escalations, error) {
	e, err := newEscalation(cfg, clock, esc, log)
	if err != nil {
		return nil, err
	}
	return &Escalations{e: e}, nil
}

// Run hands the queued sources to the Escalator until ctx ends.
func (e *Escalations) Run(ctx context.Context) { e.e.run(ctx) }

// Note counts one rejection of a; it reports whether a was queued for the
// deny list.
func (e *Escalations) Note(a netip.Addr) bool { return e.e.note(a) }

// Named is a kind whose problems name the field where, as the l7:
// section's messages always have ("rls listen"), not by the walker's
// dotted path.
func Named[V any](where string, k yamlcheck.Kind[V]) yamlcheck.Kind[V] { return as(where, k) }

// ListenAddr is the l7: section's host:port: an empty host (every
// address) and port 0 are allowed.
var ListenAddr = listenAddr

// Section is a kind for a sub-section with a table of its own over S,
// starting from def(); check, when set, does what crosses its fields. Nil
// when the file leaves it out.
func Section[S any](t *yamlcheck.Table[S], def func() S,
	check func(c *yamlcheck.Checker, n *yaml.Node, where string, got map[string]*yaml.Node, s *S)) yamlcheck.Kind[*S] {
	return optional[S]{section[S]{Table: t, Def: def, Check: check}}
}

// Decoded is a kind decoded by parse (a list that needs what the section
// decoded before it); describe is its docs' type.
func Decoded[V any](describe string, parse func(c *yamlcheck.Checker, n *yaml.Node, where string) V) yamlcheck.Kind[V] {
	return decoded[V]{parse: parse, describe: describe}
}

// At is a kind whose problems name the field where()+suffix at parse time
// (an item named by a field decoded before: "rls rule \"r\" domain").
func At[V any](where func() string, suffix string, k yamlcheck.Kind[V]) yamlcheck.Kind[V] {
	return at(where, suffix, k)
}

// Marking sets *bad when k reports a problem (a field that makes its item
// unusable).
func Marking[V any](bad *bool, k yamlcheck.Kind[V]) yamlcheck.Kind[V] { return marking(bad, k) }

// Custom is a kind decoded by parse; describe is its docs' type.
func Custom[V any](describe string, parse func(c *yamlcheck.Checker, n *yaml.Node, where string) (V, bool)) yamlcheck.Kind[V] {
	return custom(describe, parse)
}

// NameKind is a name: 1-64 of [A-Za-z0-9_.-].
var NameKind yamlcheck.Kind[string] = nameKind{}

// CheckTierDefault reports a tiers default (at n) that names none of
// levels.
func CheckTierDefault(c *yamlcheck.Checker, n *yaml.Node, def string, levels []Tier) {
	if def == "" {
		return
	}
	for _, x := range levels {
		if x.Name == def {
			return
		}
	}
	c.Errorf(n, "tiers default %q is not one of the levels", def)
}

// DiffNamed diffs two lists of named items as the l7: section's diff does
// its routes: removed ones ('-' label name), then, in b's order, added ones
// ('+' label name and the item on one line) and changed ones (diff, with
// the prefix "label name ").
func DiffNamed[T any](a, b []T, name func(T) string, format func(T) string, diff func(prefix string, x, y T),
	label string, emit func(op byte, text string)) {
	diffNamed(a, b, name, format, diff, label, emit)
}

// LimitList is k, a kind of a list of limits, diffed limit by limit (by
// name) as a route's are.
func LimitList(k yamlcheck.Kind[[]Limit]) yamlcheck.Kind[[]Limit] { return limitList{k} }

// TierList is k, a kind of a tiers levels list, diffed level by level (by
// name) as a route's are.
func TierList(k yamlcheck.Kind[[]Tier]) yamlcheck.Kind[[]Tier] { return tierList{k} }
