package yamlcheck

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestCheckerReportsEveryProblemWithPositions(t *testing.T) {
	var doc yaml.Node
	src := "a: 1\nb: [x, y]\na: 2\nzz: 3\nc: {k: v}\n"
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	c := &Checker{File: "f.yaml"}
	f := c.Fields(doc.Content[0], "the file", "a", "b", "c")
	if _, ok := c.Scalar(f["b"], "b"); ok {
		t.Error("a list is not a single value")
	}
	if got := c.Seq(f["a"], "a"); len(got) != 1 || got[0].Value != "1" {
		t.Errorf("a single value is a list of one: %v", got)
	}
	if n, ok := c.UintIn(f["a"], "a", 2, 9); ok {
		t.Errorf("1 is out of [2, 9], got %d", n)
	}
	c.Fields(f["c"], "c", "j")
	var got []string
	for _, p := range c.Problems {
		got = append(got, p.String())
	}
	want := []string{
		`f.yaml:3:1: field "a" in the file is already set at line 1`,
		`f.yaml:4:1: unknown field "zz" in the file; allowed: a, b, c`,
		`f.yaml:2:4: b must be a single value, got a list`,
		`f.yaml:1:4: a "1" must be a whole number from 2 to 9`,
		`f.yaml:5:5: unknown field "k" in c; allowed: j`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
