package policy

import (
	"fmt"
	"strings"

	"github.com/edgeguard/edgeguard/internal/yamlcheck"
)

// Problem is one thing wrong with a policy, at a position in a file.
type Problem = yamlcheck.Problem

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
