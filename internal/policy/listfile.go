package policy

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// ParseCIDRList reads a list file: one CIDR (or bare address) per line,
// blank lines and '#' comments (whole-line or trailing) ignored. It reports
// every bad line at once as a *ValidationError with name:line:column.
func ParseCIDRList(name string, r io.Reader) ([]ListEntry, error) {
	var out []ListEntry
	var problems []Problem
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		field := strings.TrimSpace(text)
		if field == "" {
			continue
		}
		col := strings.Index(text, field) + 1
		if strings.ContainsAny(field, " \t") {
			problems = append(problems, Problem{File: name, Pos: Pos{Line: line, Column: col},
				Msg: fmt.Sprintf("want one CIDR per line, got %q", field)})
			continue
		}
		p, err := ParsePrefix(field)
		if err != nil {
			problems = append(problems, Problem{File: name, Pos: Pos{Line: line, Column: col}, Msg: err.Error()})
			continue
		}
		out = append(out, ListEntry{Prefix: p, Source: fmt.Sprintf("%s:%d:%d", name, line, col)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read list file %s: %w", name, err)
	}
	if len(problems) > 0 {
		return nil, &ValidationError{File: name, Problems: problems}
	}
	return out, nil
}
