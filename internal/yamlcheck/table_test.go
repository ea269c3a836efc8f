package yamlcheck

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type toy struct {
	Wait    time.Duration
	Factor  float64
	Size    uint32
	On      bool
	Mode    string
	Addr    string
	Budget  float64
	Burst   uint32
	Tags    []string
	History time.Duration
}

type tagsKind struct{}

func (tagsKind) Parse(c *Checker, n *yaml.Node, where string) ([]string, bool) {
	var out []string
	for _, item := range c.Seq(n, where) {
		if s, ok := c.Scalar(item, where+" entry"); ok {
			out = append(out, s)
		}
	}
	return out, true
}
func (tagsKind) Format(v []string) string  { return strings.Join(v, ",") }
func (tagsKind) Describe() string          { return "list of tags" }
func (tagsKind) Items(v []string) []string { return v }

func toyDefault() toy {
	return toy{Wait: 30 * time.Second, Factor: 4, Size: 1024, Mode: "a", Addr: "127.0.0.1:1", Budget: 2, Burst: 2, History: time.Minute}
}

var toyTable = NewTable("toy",
	Val("wait", Duration{Min: time.Second, Max: time.Hour}, func(s *toy) *time.Duration { return &s.Wait }, "how long"),
	Val("factor", Factor{Min: 1.5, Max: 10}, func(s *toy) *float64 { return &s.Factor }, "how much"),
	Val("size", Uint[uint32]{Min: 1, Max: 1 << 20}, func(s *toy) *uint32 { return &s.Size }, "how many"),
	Val("on", Bool{}, func(s *toy) *bool { return &s.On }, "whether"),
	Val("mode", Enum[string]{Values: []string{"a", "b"}, Removed: map[string]string{"c": "use b"}}, func(s *toy) *string { return &s.Mode }, "which"),
	Val("addr", HostPort{Like: "127.0.0.1:80", Empty: true}, func(s *toy) *string { return &s.Addr }, "where"),
	Val("history", Off[time.Duration]{Duration{Min: 10 * time.Second, Max: time.Hour}}, func(s *toy) *time.Duration { return &s.History }, "memory"),
	Sub("budget", "a budget",
		Val("headroom", Factor{Min: 1, Max: 100}, func(s *toy) *float64 { return &s.Budget }, "times the mean"),
		Val("burst", Uint[uint32]{Min: 1, Max: 60}, func(s *toy) *uint32 { return &s.Burst }, "seconds"),
	).Switch(func(s *toy) { s.Budget = 0 }, func(s *toy) bool { return s.Budget == 0 }),
	Val("tags", tagsKind{}, func(s *toy) *[]string { return &s.Tags }, "labels").Label("toy tag"),
)

func parseToy(t *testing.T, src string) (toy, []string) {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	c := &Checker{File: "f.yaml"}
	out := toyDefault()
	toyTable.Parse(c, doc.Content[0], &out)
	slices.SortStableFunc(c.Problems, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Pos.Line, b.Pos.Line), cmp.Compare(a.Pos.Column, b.Pos.Column))
	})
	var problems []string
	for _, p := range c.Problems {
		problems = append(problems, p.String())
	}
	return out, problems
}

// TestTableParses: set fields are parsed, the rest keep the defaults.
func TestTableParses(t *testing.T) {
	got, problems := parseToy(t, "wait: 1m\nfactor: 2x\nsize: 7\non: true\nmode: b\naddr: \"\"\nhistory: off\nbudget: {burst: 9}\ntags: [x, y]\n")
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	want := toy{Wait: time.Minute, Factor: 2, Size: 7, On: true, Mode: "b", Addr: "", Budget: 2, Burst: 9, Tags: []string{"x", "y"}}
	if got.Wait != want.Wait || got.Factor != want.Factor || got.Size != want.Size || !got.On || got.Mode != "b" ||
		got.Addr != "" || got.History != 0 || got.Budget != 2 || got.Burst != 9 || len(got.Tags) != 2 {
		t.Errorf("got %+v, want %+v", got, want)
	}
	got, problems = parseToy(t, "budget: off\n")
	if len(problems) > 0 || got.Budget != 0 || got.Wait != 30*time.Second {
		t.Errorf("budget: off: %+v %v", got, problems)
	}
	got, problems = parseToy(t, "{}")
	if len(problems) > 0 || got.Wait != toyDefault().Wait || got.Budget != 2 {
		t.Errorf("empty: %+v %v", got, problems)
	}
}

// TestTableReportsEveryProblem: each bad value is reported at its
// line:column with its kind's wording, all at once, and keeps the default.
func TestTableReportsEveryProblem(t *testing.T) {
	src := `wait: 0s
factor: lots
size: 0
on: yes
mode: c
addr: nowhere
history: 5s
budget: on
colour: red
wait: 2s
tags: {a: b}
`
	got, problems := parseToy(t, src)
	want := []string{
		`f.yaml:1:7: toy.wait 0s: must be between 1s and 1h`,
		`f.yaml:2:9: toy.factor "lots": want a number like 3 or 1.5`,
		`f.yaml:3:7: toy.size "0" must be a whole number from 1 to 1048576`,
		`f.yaml:4:5: toy.on "yes": want true or false`,
		`f.yaml:5:7: toy.mode c was removed: use b`,
		`f.yaml:6:7: toy.addr "nowhere": want host:port like 127.0.0.1:80`,
		`f.yaml:7:10: toy.history 5s: must be between 10s and 1h`,
		`f.yaml:8:9: toy.budget "on": want off or {headroom, burst}`,
		`f.yaml:9:1: unknown field "colour" in toy; allowed: wait, factor, size, on, mode, addr, history, budget, tags`,
		`f.yaml:10:1: field "wait" in toy is already set at line 1`,
		`f.yaml:11:7: toy.tags must be a list, got a mapping`,
	}
	if strings.Join(problems, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(problems, "\n"), strings.Join(want, "\n"))
	}
	if d := toyDefault(); got.Wait != d.Wait || got.Factor != d.Factor || got.Size != d.Size || got.Mode != d.Mode || got.Budget != d.Budget {
		t.Errorf("bad values must keep the defaults: %+v", got)
	}
	_, problems = parseToy(t, "mode: z\n")
	if len(problems) != 1 || !strings.HasSuffix(problems[0], `toy.mode "z" is not allowed; allowed: a, b`) {
		t.Errorf("enum: %v", problems)
	}
	_, problems = parseToy(t, "budget: {headroom: 0.5, burst: 61}\n")
	if len(problems) != 2 || !strings.Contains(problems[0], "toy.budget.headroom 0.5: must be between 1 and 100") ||
		!strings.Contains(problems[1], `toy.budget.burst "61" must be a whole number from 1 to 60`) {
		t.Errorf("sub-table: %v", problems)
	}
}

// TestTableDiff: one line per changed field in table order, a sub-table on
// one line (off when switched off), lists item by item.
func TestTableDiff(t *testing.T) {
	a, b := toyDefault(), toyDefault()
	a.Tags = []string{"x", "y"}
	b.Wait, b.History, b.Budget, b.Tags = time.Minute, 0, 0, []string{"y", "z"}
	var got []string
	toyTable.Diff(&a, &b, func(op byte, text string) { got = append(got, string(op)+" "+text) })
	want := []string{
		"~ setting toy.wait 30s -> 1m0s",
		"~ setting toy.history 1m0s -> off",
		"~ setting toy.budget {headroom: 2, burst: 2} -> off",
		"+ toy tag z",
		"- toy tag x",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("diff:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	got = nil
	toyTable.Diff(&a, &a, func(op byte, text string) { got = append(got, text) })
	if len(got) != 0 {
		t.Errorf("no change, diff %v", got)
	}
	got = nil
	toyTable.DiffWith("item 3 ", &a, &b, func(op byte, text string) { got = append(got, text) })
	if len(got) != 5 || got[0] != "item 3 wait 30s -> 1m0s" || got[3] != "toy tag z" {
		t.Errorf("DiffWith: %q", got)
	}
	if s, ok := toyTable.Format(&a, "budget.burst"); !ok || s != "2" {
		t.Errorf("Format budget.burst: %q %v", s, ok)
	}
}

// TestTableMarkdown: a row per field, sub-tables' fields as key.field, with
// the defaults' formatting.
func TestTableMarkdown(t *testing.T) {
	d := toyDefault()
	md := toyTable.Markdown(&d)
	for _, row := range []string{
		"| `wait` | duration, 1s to 1h | `30s` | how long |",
		"| `history` | duration, 10s to 1h; 0 or off: off | `1m0s` | memory |",
		"| `budget` | off, or a mapping | `{headroom: 2, burst: 2}` | a budget |",
		"| `budget.burst` | whole number, 1 to 60 | `2` | seconds |",
		"| `tags` | list of tags | none | labels |",
	} {
		if !strings.Contains(md, row+"\n") {
			t.Errorf("markdown lacks %q:\n%s", row, md)
		}
	}
}

type outer struct {
	Name  string
	Share float64
	Inner inner
}

type inner struct {
	Addrs []string
	Sub   toy
}

var innerTable = NewTable("outer.inner",
	Val("addrs", List[string]{Of: HostPort{Like: "127.0.0.1:80"}, Min: 1, Max: 2}, func(s *inner) *[]string { return &s.Addrs }, "where").
		Required("outer.inner needs addrs"),
)

var outerTable = NewTable("outer",
	Val("name", Pattern{RE: regexp.MustCompile(`^[a-z]+$`), Want: "use lower-case letters"}, func(s *outer) *string { return &s.Name }, "name").
		Required("outer needs a name"),
	Val("share", Percent{Min: 0.5, Max: 1}, func(s *outer) *float64 { return &s.Share }, "share"),
	Nested("inner", "the inner part", innerTable, func(s *outer) *inner { return &s.Inner }),
)

// TestNestedRequiredListPattern: a nested struct's table, required keys,
// lists with bounds, patterns and percentages; the diff of a nested table is
// field by field.
func TestNestedRequiredListPattern(t *testing.T) {
	parse := func(src string) (outer, []string) {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
			t.Fatal(err)
		}
		c := &Checker{File: "f.yaml"}
		out := outer{Share: 0.9}
		outerTable.Parse(c, doc.Content[0], &out)
		var problems []string
		for _, p := range c.Problems {
			problems = append(problems, p.String())
		}
		return out, problems
	}
	got, problems := parse("name: ab\nshare: 75%\ninner: {addrs: [\"127.0.0.1:1\", \"[::1]:2\"]}\n")
	if len(problems) > 0 || got.Name != "ab" || got.Share != 0.75 || len(got.Inner.Addrs) != 2 {
		t.Fatalf("%+v %v", got, problems)
	}
	_, problems = parse("share: 0.4\ninner: {}\n")
	want := []string{"f.yaml:1:1: outer needs a name", "f.yaml:1:8: outer.share 0.4: must be between 50% and 100%", "f.yaml:2:8: outer.inner needs addrs"}
	if strings.Join(problems, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(problems, "\n"), strings.Join(want, "\n"))
	}
	_, problems = parse("name: A\ninner: {addrs: []}\n")
	if len(problems) != 2 || !strings.Contains(problems[0], `outer.name "A": use lower-case letters`) || !strings.Contains(problems[1], "outer.inner.addrs is empty") {
		t.Errorf("%v", problems)
	}
	_, problems = parse("name: a\ninner: {addrs: [\"127.0.0.1:1\", \"127.0.0.1:2\", \"127.0.0.1:3\"]}\n")
	if len(problems) != 1 || !strings.Contains(problems[0], "outer.inner.addrs: 3 items, at most 2") {
		t.Errorf("%v", problems)
	}
	a := outer{Name: "a", Share: 0.5, Inner: inner{Addrs: []string{"127.0.0.1:1"}}}
	b := outer{Name: "a", Share: 0.6, Inner: inner{Addrs: []string{"127.0.0.1:2"}}}
	var diff []string
	outerTable.Diff(&a, &b, func(op byte, text string) { diff = append(diff, string(op)+" "+text) })
	wantDiff := []string{"~ setting outer.share 50% -> 60%", "+ setting outer.inner.addrs 127.0.0.1:2", "- setting outer.inner.addrs 127.0.0.1:1"}
	if strings.Join(diff, "\n") != strings.Join(wantDiff, "\n") {
		t.Errorf("diff:\n%s\nwant:\n%s", strings.Join(diff, "\n"), strings.Join(wantDiff, "\n"))
	}
	if s := outerTable.String(&a); s != "{name: a, share: 50%, inner: {addrs: [127.0.0.1:1]}}" {
		t.Errorf("String: %s", s)
	}
}

// TestParsed: a value with a parser of its own reports its error as
// "where: err" at the value.
func TestParsed(t *testing.T) {
	k := Parsed[int]{Func: func(s string) (int, error) {
		if s != "one" {
			return 0, fmt.Errorf("%q: want one", s)
		}
		return 1, nil
	}, Fmt: func(v int) string { return fmt.Sprint(v) }, Desc: "one"}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("a: one\nb: two\n"), &doc); err != nil {
		t.Fatal(err)
	}
	c := &Checker{File: "f.yaml"}
	if v, ok := k.Parse(c, Lookup(doc.Content[0], "a"), "a"); !ok || v != 1 {
		t.Errorf("a: %v %v", v, ok)
	}
	if _, ok := k.Parse(c, Lookup(doc.Content[0], "b"), "b"); ok || len(c.Problems) != 1 || c.Problems[0].String() != `f.yaml:2:4: b: "two": want one` {
		t.Errorf("b: %v", c.Problems)
	}
}

// TestFreshAndParseIn: a Fresh field written by the file starts from its
// fresh value, not the inherited one (a field it leaves out keeps it);
// ParseIn names the mapping and its fields as told.
func TestFreshAndParseIn(t *testing.T) {
	tbl := NewTable("inherit",
		Sub("budget", "a budget",
			Val("headroom", Factor{Min: 1, Max: 100}, func(s *toy) *float64 { return &s.Budget }, "times the mean"),
			Val("burst", Uint[uint32]{Min: 1, Max: 60}, func(s *toy) *uint32 { return &s.Burst }, "seconds"),
		).Fresh(func(s *toy) { s.Budget = 0 }),
		Val("size", Uint[uint32]{Min: 1, Max: 1 << 20}, func(s *toy) *uint32 { return &s.Size }, "how many"),
	)
	for _, tc := range []struct {
		src         string
		budget      float64
		burst, size uint32
		wantProblem string
	}{
		{src: "size: 7", budget: 2, burst: 2, size: 7},
		{src: "budget: {burst: 9}", budget: 0, burst: 9, size: 1024},
		{src: "budget: {headroom: 3}", budget: 3, burst: 2, size: 1024},
		{src: "budget: {x: 1}\nsize: 0", budget: 0, burst: 2, size: 1024,
			wantProblem: `f.yaml:1:10: unknown field "x" in item 1.budget; allowed: headroom, burst|f.yaml:2:7: item 1.size "0" must be a whole number from 1 to 1048576`},
		{src: "[1]", budget: 2, burst: 2, size: 1024, wantProblem: "f.yaml:1:1: an item must be a mapping, got a list"},
	} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(tc.src), &doc); err != nil {
			t.Fatal(err)
		}
		c := &Checker{File: "f.yaml"}
		out := toyDefault()
		tbl.ParseIn(c, doc.Content[0], "an item", "item 1.", &out)
		var problems []string
		for _, p := range c.Problems {
			problems = append(problems, p.String())
		}
		if got := strings.Join(problems, "|"); got != tc.wantProblem {
			t.Errorf("%q: problems %q, want %q", tc.src, got, tc.wantProblem)
		}
		if out.Budget != tc.budget || out.Burst != tc.burst || out.Size != tc.size {
			t.Errorf("%q: budget %v burst %d size %d, want %v %d %d", tc.src, out.Budget, out.Burst, out.Size, tc.budget, tc.burst, tc.size)
		}
	}
}

// renamed wraps a kind to name its problems otherwise (as the l7: section's
// kinds do).
type renamed[V any] struct {
	Kind[V]
	name string
}

func (k renamed[V]) Parse(c *Checker, n *yaml.Node, _ string) (V, bool) {
	return k.Kind.Parse(c, n, k.name)
}
func (k renamed[V]) Unwrap() Kind[V] { return k.Kind }

// pairKind is a value with fields of its own: the diff lists them one by
// one.
type pairKind struct{ tagsKind }

func (pairKind) Diff(label string, a, b []string, emit func(op byte, text string)) {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			emit('~', fmt.Sprintf("%s.%d %s -> %s", label, i, a[i], b[i]))
		}
	}
}

// TestDifferAndWrapper: a kind that is a Differ writes its own diff lines,
// a Lister its items, also through kinds that wrap them.
func TestDifferAndWrapper(t *testing.T) {
	type two struct{ A, B []string }
	tbl := NewTable("two",
		Val[two, []string]("a", renamed[[]string]{pairKind{}, "the a"}, func(s *two) *[]string { return &s.A }, "pairs"),
		Val[two, []string]("b", renamed[[]string]{tagsKind{}, "the b"}, func(s *two) *[]string { return &s.B }, "tags"),
	)
	var got []string
	tbl.Diff(&two{A: []string{"x", "y"}, B: []string{"p"}}, &two{A: []string{"x", "z"}, B: []string{"q"}},
		func(op byte, text string) { got = append(got, string(op)+" "+text) })
	want := []string{"~ setting two.a.1 y -> z", "+ setting two.b q", "- setting two.b p"}
	if !slices.Equal(got, want) {
		t.Errorf("diff = %q, want %q", got, want)
	}
}
