package yamlcheck

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A configuration section is described once, as a Table of Fields: its YAML
// key, its Kind (the parser with its bounds and error wording, the
// formatter, the description), where its value lives in the section's Go
// struct, and a one-line doc. The section's default value is the Go
// struct's default (one set of defaults): the walker starts from it. One
// walker (Table.Parse) whitelists the keys, parses each value at its
// position, and leaves what the file does not set at the default;
// Table.Diff lists the changes between two values of the section, and
// Table.Markdown writes its field table for the docs.

// Kind parses, formats and describes one type of value.
type Kind[V any] interface {
	// Parse reads n (the value of the field at where); on a problem it
	// reports it on c and returns false.
	Parse(c *Checker, n *yaml.Node, where string) (V, bool)
	// Format writes v as the file would say it (the diff and the docs'
	// defaults use it).
	Format(v V) string
	// Describe says what the file may write, for the docs: "duration,
	// 1s to 7d".
	Describe() string
}

// Lister is implemented by kinds of lists: the diff reports their items one
// by one ('+' added, '-' removed) instead of the whole value.
type Lister[V any] interface {
	Items(v V) []string
}

// Differ is implemented by kinds of values with fields or items of their
// own (a sub-section in a struct of its own, a list of named items): the
// diff reports their changes one by one, each label starting with prefix
// ("l7 timeouts."), instead of the whole value on one line.
type Differ[V any] interface {
	Diff(prefix string, a, b V, emit func(op byte, text string))
}

// Wrapper is implemented by kinds that wrap another (to name its problems
// otherwise): the diff looks through them for a Differ or a Lister.
type Wrapper[V any] interface {
	Unwrap() Kind[V]
}

// Field is one row of a Table over the section struct S.
type Field[S any] struct {
	Key string
	// Doc is the one-line description in the docs.
	Doc string
	// Type is the kind's description, for the docs.
	Type     string
	label    string
	required string
	parse    func(c *Checker, n *yaml.Node, where string, s *S)
	format   func(s *S) string
	items    func(s *S) []string
	// A sub-table's: its keys, its field-by-field diff and docs rows, and
	// one of its fields' format.
	keys     func() []string
	diffSub  func(prefix string, a, b *S, emit func(op byte, text string))
	rows     func(b *strings.Builder, prefix string, def *S)
	formatIn func(s *S, key string) (string, bool)
	// whole: the diff writes a sub-table on one line (Switch, Formatted).
	whole bool
	isOff func(s *S) bool
	// fresh, when set, runs before a value the file writes is parsed.
	fresh func(s *S)
}

// Val is a field holding one value of kind k, at *at(s).
func Val[S, V any](key string, k Kind[V], at func(s *S) *V, doc string) Field[S] {
	f := Field[S]{
		Key:  key,
		Doc:  doc,
		Type: k.Describe(),
		parse: func(c *Checker, n *yaml.Node, where string, s *S) {
			if v, ok := k.Parse(c, n, where); ok {
				*at(s) = v
			}
		},
		format: func(s *S) string { return k.Format(*at(s)) },
	}
	inner := Kind[V](k)
	for {
		w, ok := inner.(Wrapper[V])
		if !ok {
			break
		}
		inner = w.Unwrap()
	}
	if l, ok := inner.(Lister[V]); ok {
		f.items = func(s *S) []string { return l.Items(*at(s)) }
	}
	if d, ok := inner.(Differ[V]); ok {
		f.diffSub = func(prefix string, a, b *S, emit func(op byte, text string)) {
			d.Diff(strings.TrimSuffix(prefix, "."), *at(a), *at(b), emit)
		}
	}
	return f
}

// Func is a field parsed and written by hand, for a value spread over
// several struct fields: parse reads n into s (reporting on c), format
// writes the value for the diff and the docs' default, typ describes it.
func Func[S any](key, typ, doc string, parse func(c *Checker, n *yaml.Node, where string, s *S), format func(s *S) string) Field[S] {
	return Field[S]{Key: key, Doc: doc, Type: typ, parse: parse, format: format}
}

// Sub is a field holding a mapping of its own fields, in the same struct
// (a nested table, "shield.surge: {factor: 3}"). The diff lists its fields
// one by one as <key>.<field>; with Switch or Formatted it is one line
// ({key: value, ...}, or the format's).
func Sub[S any](key, doc string, fields ...Field[S]) Field[S] {
	return Nested(key, doc, &Table[S]{Fields: fields}, func(s *S) *S { return s })
}

// Nested is a field holding a mapping described by its own table, in a
// struct of its own at *at(s) ("fleet.redis: {addrs: [...]}"); like Sub
// otherwise.
func Nested[S, T any](key, doc string, t *Table[T], at func(s *S) *T) Field[S] {
	return Field[S]{
		Key:  key,
		Doc:  doc,
		Type: "mapping",
		keys: t.Keys,
		parse: func(c *Checker, n *yaml.Node, where string, s *S) {
			t.parseAt(c, n, where, at(s))
		},
		format: func(s *S) string { return t.String(at(s)) },
		diffSub: func(prefix string, a, b *S, emit func(op byte, text string)) {
			t.DiffWith(prefix, at(a), at(b), emit)
		},
		rows: func(b *strings.Builder, prefix string, def *S) {
			t.markdownRows(b, prefix, at(def))
		},
		formatIn: func(s *S, key string) (string, bool) { return t.Format(at(s), key) },
	}
}

// Switch lets the file write off (or 0) for a sub-table: off sets the
// struct's fields to the section's "off" state, isOff recognises it (the
// diff then says off).
func (f Field[S]) Switch(off func(s *S), isOff func(s *S) bool) Field[S] {
	if f.keys == nil {
		panic("yamlcheck: Switch on a field that is not a sub-table: " + f.Key)
	}
	f.isOff = isOff
	f.whole = true
	f.Type = "off, or a mapping"
	keys := f.keys
	parse := f.parse
	f.parse = func(c *Checker, n *yaml.Node, where string, s *S) {
		n = Resolve(n)
		if n.Kind == yaml.ScalarNode && !IsNull(n) {
			if n.Value == "off" || n.Value == "0" {
				off(s)
				return
			}
			c.Errorf(n, "%s %q: want off or {%s}", where, n.Value, strings.Join(keys(), ", "))
			return
		}
		parse(c, n, where, s)
	}
	format := f.format
	f.format = func(s *S) string {
		if isOff(s) {
			return "off"
		}
		return format(s)
	}
	return f
}

// Fresh makes a value the file writes start from fresh(s) instead of what
// s holds (a default or an inherited base): "a rule's per_source replaces
// the defaults' limits but keeps their key".
func (f Field[S]) Fresh(fresh func(s *S)) Field[S] {
	f.fresh = fresh
	return f
}

// Required makes the field one the file must write: without it, msg is
// reported at the section ("fleet needs a name ...").
func (f Field[S]) Required(msg string) Field[S] {
	f.required = msg
	return f
}

// Label replaces the diff's label ("setting <section>.<key>").
func (f Field[S]) Label(label string) Field[S] {
	f.label = label
	return f
}

// Formatted replaces how the diff (and the docs' default) writes the
// field's value.
func (f Field[S]) Formatted(format func(s *S) string) Field[S] {
	f.format = format
	f.whole = true
	return f
}

// Table is a section's fields, in the order the docs and the diff list them.
type Table[S any] struct {
	// Name is the section's path in the file ("standing"), the prefix of
	// messages and diff labels.
	Name   string
	Fields []Field[S]
}

// NewTable is a section's table.
func NewTable[S any](name string, fields ...Field[S]) *Table[S] {
	t := &Table[S]{Name: name, Fields: fields}
	seen := map[string]bool{}
	for _, f := range fields {
		if seen[f.Key] {
			panic("yamlcheck: field " + f.Key + " twice in table " + name)
		}
		seen[f.Key] = true
	}
	return t
}

// Keys are the table's keys, in order.
func (t *Table[S]) Keys() []string {
	keys := make([]string, len(t.Fields))
	for i, f := range t.Fields {
		keys[i] = f.Key
	}
	return keys
}

// Parse checks n is a mapping of the table's keys and parses each value
// into out, which holds the defaults (or a base) on entry: keys the file
// leaves out keep them. It returns the value nodes by key (nil when n is
// not a mapping), for checks across sections.
func (t *Table[S]) Parse(c *Checker, n *yaml.Node, out *S) map[string]*yaml.Node {
	return t.parseAt(c, n, t.Name, out)
}

// ParseAt is Parse for a mapping that is not at the table's Name (an item
// of a list: "syn service web"); where prefixes its messages.
func (t *Table[S]) ParseAt(c *Checker, n *yaml.Node, where string, out *S) map[string]*yaml.Node {
	return t.parseAt(c, n, where, out)
}

// ParseTop is Parse for a file's top level: its fields are named by their
// keys alone ("mode"), the mapping by the table's Name ("the policy").
func (t *Table[S]) ParseTop(c *Checker, n *yaml.Node, out *S) map[string]*yaml.Node {
	return t.walk(c, n, t.Name, "", out)
}

// ParseItem is Parse for one item of a list, named in messages as name
// and its fields as "name key" ("bgp neighbor as", "syn service web
// mss"; a sub-table's fields as "name key.field").
func (t *Table[S]) ParseItem(c *Checker, n *yaml.Node, name string, out *S) map[string]*yaml.Node {
	return t.walk(c, n, name, name+" ", out)
}

// ParseIn is Parse for a mapping named where in messages whose fields are
// named prefix+key ("a rule", "rule web.").
func (t *Table[S]) ParseIn(c *Checker, n *yaml.Node, where, prefix string, out *S) map[string]*yaml.Node {
	return t.walk(c, n, where, prefix, out)
}

func (t *Table[S]) parseAt(c *Checker, n *yaml.Node, where string, out *S) map[string]*yaml.Node {
	return t.walk(c, n, where, where+".", out)
}

// walk parses the mapping n (called where) into out, its fields named
// prefix+key.
func (t *Table[S]) walk(c *Checker, n *yaml.Node, where, prefix string, out *S) map[string]*yaml.Node {
	fields := c.Fields(n, where, t.Keys()...)
	if fields == nil {
		return nil
	}
	for _, f := range t.Fields {
		if v, ok := fields[f.Key]; ok {
			if f.fresh != nil {
				f.fresh(out)
			}
			f.parse(c, v, prefix+f.Key, out)
		} else if f.required != "" {
			c.Errorf(n, "%s", f.required)
		}
	}
	return fields
}

// String writes every field of s on one line: {key: value, ...}.
func (t *Table[S]) String(s *S) string {
	parts := make([]string, len(t.Fields))
	for i, f := range t.Fields {
		parts[i] = f.Key + ": " + f.format(s)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// Format writes one field's value (key as in the file, "a.b" for a
// sub-table's field).
func (t *Table[S]) Format(s *S, key string) (string, bool) {
	head, rest, nested := strings.Cut(key, ".")
	for _, f := range t.Fields {
		if f.Key != head {
			continue
		}
		if nested {
			if f.formatIn == nil {
				return "", false
			}
			return f.formatIn(s, rest)
		}
		return f.format(s), true
	}
	return "", false
}

// Diff reports what changed from a to b, field by field in table order:
// "~ setting <section>.<key> old -> new", and for lists each item added
// ('+') or removed ('-').
func (t *Table[S]) Diff(a, b *S, emit func(op byte, text string)) {
	t.DiffWith("setting "+t.Name+".", a, b, emit)
}

// DiffWith is Diff with another label prefix than "setting <Name>." (an
// item of a list: "rule web "); a field's Label still replaces it.
func (t *Table[S]) DiffWith(prefix string, a, b *S, emit func(op byte, text string)) {
	for _, f := range t.Fields {
		label := f.label
		if label == "" {
			label = prefix + f.Key
		}
		if f.diffSub != nil && !f.whole {
			f.diffSub(label+".", a, b, emit)
			continue
		}
		if f.items != nil {
			old, cur := f.items(a), f.items(b)
			for _, it := range cur {
				if !slices.Contains(old, it) {
					emit('+', label+" "+it)
				}
			}
			for _, it := range old {
				if !slices.Contains(cur, it) {
					emit('-', label+" "+it)
				}
			}
			continue
		}
		if x, y := f.format(a), f.format(b); x != y {
			emit('~', fmt.Sprintf("%s %s -> %s", label, x, y))
		}
	}
}

// Markdown writes the table's fields as a Markdown table, with the
// defaults from def: key (a sub-table's fields as key.field), what the file
// may write, default, doc.
func (t *Table[S]) Markdown(def *S) string {
	var b strings.Builder
	b.WriteString("| Field | Value | Default | Meaning |\n|---|---|---|---|\n")
	t.markdownRows(&b, "", def)
	return b.String()
}

// code writes a default as code, except the words that say there is none.
func code(s string) string {
	switch s {
	case "required", "none", "see below":
		return s
	}
	return "`" + s + "`"
}

func (t *Table[S]) markdownRows(b *strings.Builder, prefix string, def *S) {
	esc := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for _, f := range t.Fields {
		dflt := f.format(def)
		if f.items != nil && len(f.items(def)) == 0 {
			dflt = "none"
		}
		if f.rows != nil && f.isOff == nil {
			dflt = "see below"
		}
		switch {
		case f.required != "":
			dflt = "required"
		case dflt == "" || dflt == `""`:
			dflt = "none"
		}
		fmt.Fprintf(b, "| `%s%s` | %s | %s | %s |\n", prefix, f.Key, esc(f.Type), esc(code(dflt)), esc(f.Doc))
		if f.rows != nil {
			f.rows(b, prefix+f.Key+".", def)
		}
	}
}
