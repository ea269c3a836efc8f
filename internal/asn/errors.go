package asn

import (
	"errors"
	"fmt"
	"strings"
)

// ErrRejected is wrapped by every error that reports problems in the data
// itself (as opposed to I/O errors). A rejected load returns no table: the
// caller keeps serving the data it had.
var ErrRejected = errors.New("asn data rejected")

// Problem is one defect found in the input data.
type Problem struct {
	File string // file name as given to Load
	Line int    // 1-based line number; 0 when the problem has no line (MaxMind DB)
	Msg  string // what is wrong and what was expected
}

func (p Problem) Error() string {
	if p.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg)
	}
	return fmt.Sprintf("%s: %s", p.File, p.Msg)
}

// LoadError lists the problems that made a load fail. It holds at most
// Options.MaxProblems problems; More reports that reading stopped early and
// the data may contain further problems.
type LoadError struct {
	Problems []Problem
	More     bool
}

func (e *LoadError) Error() string {
	var b strings.Builder
	b.WriteString(ErrRejected.Error())
	fmt.Fprintf(&b, ": %d problem", len(e.Problems))
	if len(e.Problems) != 1 {
		b.WriteString("s")
	}
	if e.More {
		b.WriteString(" (stopped at the limit, there may be more)")
	}
	for _, p := range e.Problems {
		b.WriteString("; ")
		b.WriteString(p.Error())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrRejected) true.
func (e *LoadError) Unwrap() error { return ErrRejected }
