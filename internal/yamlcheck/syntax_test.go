package yamlcheck

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestSyntaxErrorsPosition(t *testing.T) {
	var long strings.Builder
	long.WriteString("a: 1\nb:\n")
	for i := 0; i < 25; i++ {
		long.WriteString("  k" + strings.Repeat("x", i%3) + string(rune('a'+i)) + ": 1\n")
	}
	long.WriteString("   bad: 2\n") // line 28: one space too deep
	long.WriteString("  more: 3\n")
	for _, tc := range []struct {
		name string
		doc  string
		want Pos
	}{
		{"bad indent at line 28", long.String(), Pos{Line: 28, Column: 4}},
		{"unclosed flow sequence", "apiVersion: edgeguard/v1\nbogus: [\n", Pos{Line: 2, Column: 1}},
		{"mapping value in a scalar", "apiVersion: edgeguard/v1\nmode: enforce\n  clock: precise\n", Pos{Line: 3, Column: 3}},
		{"tab indent", "a:\n\tb: 1\n", Pos{Line: 2, Column: 2}},
	} {
		var n yaml.Node
		err := yaml.Unmarshal([]byte(tc.doc), &n)
		if err == nil {
			t.Fatalf("%s: parses", tc.name)
		}
		got := SyntaxErrors([]byte(tc.doc), err)
		if len(got) != 1 || got[0].Pos != tc.want {
			t.Errorf("%s: %+v, want position %+v (library: %v)", tc.name, got, tc.want, err)
		}
	}
}
