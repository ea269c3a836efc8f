package l7

import (
	"encoding/json"
	"testing"
)

// FuzzProblemJSON: AppendJSON writes exactly what json.Marshal writes, for
// any strings (quotes, controls, HTML characters, U+2028, invalid UTF-8).
func FuzzProblemJSON(f *testing.F) {
	f.Add("about:blank", "Too Many Requests", 429, "", "per-ip", "")
	f.Add(ProblemTypeQuotaExceeded, "t\"<>&\\", 503, "line\nbreak\t\x01\x1f", "a\u2028b", "\xff\xfe\u2029")
	f.Add("", "", 0, "é漢字🙂", "", "x")
	f.Fuzz(func(t *testing.T, typ, title string, status int, detail, v1, v2 string) {
		p := Problem{Type: typ, Title: title, Status: status, Detail: detail}
		if v1 != "" || v2 != "" {
			p.ViolatedPolicies = []string{v1, v2}
		}
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.AppendJSON(nil); string(got) != string(want) {
			t.Errorf("AppendJSON(%+v)\n got %s\nwant %s", p, got, want)
		}
	})
}
