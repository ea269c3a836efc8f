package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
)

// progressBar returns a progress callback that draws a bar on w when w is a
// terminal, and nil otherwise (logs and pipes get no bar).
func progressBar(w io.Writer, what string) func(done, total int64) {
	if !isTerminal(w) {
		return nil
	}
	var mu sync.Mutex
	last := -1
	return func(done, total int64) {
		mu.Lock()
		defer mu.Unlock()
		if total <= 0 {
			return
		}
		pct := int(done * 100 / total)
		if pct == last {
			return
		}
		last = pct
		const width = 40
		fill := pct * width / 100
		fmt.Fprintf(w, "\r%s [%s%s] %3d%%", what, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), pct)
		if done >= total {
			fmt.Fprintln(w)
		}
	}
}
