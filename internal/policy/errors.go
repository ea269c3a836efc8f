package policy

import (
	"fmt"
	"strings"
)

// Problem is one thing wrong with a policy, at a position in a file.
type Problem struct {
	File string
	Pos  Pos
	Msg  string
}

func (p Problem) String() string {
	switch {
	case p.Pos.Line == 0:
		return p.File + ": " + p.Msg
	case p.Pos.Column == 0:
		return fmt.Sprintf("%s:%d: %s", p.File, p.Pos.Line, p.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", p.File, p.Pos.Line, p.Pos.Column, p.Msg)
}

// ValidationError lists every problem found in a policy, in file order.
// Nothing that produced a ValidationError may be applied.
type ValidationError struct {
	File     string
	Problems []Problem
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	if len(e.Problems) == 1 {
		fmt.Fprintf(&b, "invalid policy %s: %s", e.File, e.Problems[0])
		return b.String()
	}
	fmt.Fprintf(&b, "invalid policy %s: %d problems:", e.File, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}
