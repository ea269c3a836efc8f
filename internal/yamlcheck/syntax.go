package yamlcheck

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

var syntaxLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// maxSyntaxScan bounds how many prefixes SyntaxErrors parses after the
// reported line (each parse is linear in the prefix): past it the
// library's line is kept.
const maxSyntaxScan = 2000

// SyntaxError is one YAML syntax error with its position.
type SyntaxError struct {
	Pos     Pos // Line 0: unknown
	Message string
}

// SyntaxErrors turns a yaml.Unmarshal error of data into positioned
// errors. The YAML library reports the line where the enclosing construct
// starts (a bad indent at line 28 of a mapping opened at line 2 reads
// "line 2") and no column. The line is found by parsing growing prefixes
// of data from the reported line on: the first prefix that fails with the
// same message (else the first that fails at all) ends at the line that
// breaks the document. The column is that line's first non-blank
// character: exact for indentation errors, the start of the line for
// others.
func SyntaxErrors(data []byte, err error) []SyntaxError {
	var out []SyntaxError
	for _, line := range strings.Split(err.Error(), "\n") {
		m := syntaxLineRE.FindStringSubmatch(line)
		if m == nil {
			out = append(out, SyntaxError{Message: strings.TrimSpace(strings.TrimPrefix(line, "yaml: "))})
			continue
		}
		n, _ := strconv.Atoi(m[1])
		out = append(out, SyntaxError{Pos: locate(data, n, m[2]), Message: m[2]})
	}
	return out
}

func locate(data []byte, reported int, msg string) Pos {
	lines := bytes.SplitAfter(data, []byte("\n"))
	first := 0
	for n := max(reported, 1); n <= len(lines) && n < max(reported, 1)+maxSyntaxScan; n++ {
		var doc yaml.Node
		err := yaml.Unmarshal(bytes.Join(lines[:n], nil), &doc)
		if err == nil {
			continue
		}
		if first == 0 {
			first = n
		}
		if m := syntaxLineRE.FindStringSubmatch(err.Error()); m != nil && m[2] == msg {
			return Pos{Line: n, Column: firstNonBlank(lines[n-1])}
		}
	}
	if first != 0 {
		return Pos{Line: first, Column: firstNonBlank(lines[first-1])}
	}
	return Pos{Line: reported}
}

func firstNonBlank(line []byte) int {
	for i, c := range line {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return i + 1
		}
	}
	return 1
}
