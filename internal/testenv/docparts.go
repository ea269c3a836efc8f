package testenv

import (
	"os"
	"strings"
	"testing"
)

// DocPart is one generated part of a document: its name and its text.
type DocPart struct {
	Name, Text string
}

// CheckGeneratedParts holds the generated parts of the document at path
// equal to parts. Each part sits between
//
//	<!-- fields: NAME (generated: REGENERATE) -->
//	<!-- end fields: NAME -->
//
// and the prose around them is left as it is. With update the parts are
// rewritten in place; without, a difference fails the test, saying
// REGENERATE.
func CheckGeneratedParts(tb testing.TB, path, regenerate string, parts []DocPart, update bool) {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	doc := string(data)
	out := doc
	for _, p := range parts {
		begin := "<!-- fields: " + p.Name + " (generated: " + regenerate + ") -->\n"
		end := "<!-- end fields: " + p.Name + " -->\n"
		i, j := strings.Index(out, begin), strings.Index(out, end)
		if i < 0 || j < i {
			tb.Errorf("%s has no generated part %s: add the lines\n%s%s where it belongs, then run %s", path, p.Name, begin, end, regenerate)
			continue
		}
		out = out[:i+len(begin)] + p.Text + out[j:]
	}
	if out == doc {
		return
	}
	if update {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			tb.Fatal(err)
		}
		return
	}
	tb.Errorf("%s's generated parts differ from what the code says: run %s", path, regenerate)
}
