// Package yamlcheck decodes YAML by hand, node by node, so that every
// problem in a configuration file is reported at once with its
// file:line:column. The policy file and its l7: section share it.
//
// A section is described once as a Table of Fields (table.go): key, kind
// (kinds.go: bounds, wording, format), where its value lives, doc. One
// walker parses every table, and the same table writes the section's diff
// and its field table in the docs.
package yamlcheck

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Pos is a position in a file (1-based).
type Pos struct {
	Line, Column int
}

// PosOf is a node's position.
func PosOf(n *yaml.Node) Pos { return Pos{Line: n.Line, Column: n.Column} }

// Problem is one thing wrong with a file, at a position.
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

// Checker collects the problems of one file. Decoders embed it.
type Checker struct {
	File     string
	Problems []Problem
	// ReadFileFunc reads the files the checked file names (list files);
	// nil: the file may name none.
	ReadFileFunc func(path string) ([]byte, error)
}

// Errorf reports a problem at n (or, for a nil n, at the file).
func (c *Checker) Errorf(n *yaml.Node, format string, args ...any) {
	var pos Pos
	if n != nil {
		pos = PosOf(n)
	}
	c.Problems = append(c.Problems, Problem{File: c.File, Pos: pos, Msg: fmt.Sprintf(format, args...)})
}

// ErrorAt reports a problem in another file (a list file named by this one).
func (c *Checker) ErrorAt(file string, pos Pos, format string, args ...any) {
	c.Problems = append(c.Problems, Problem{File: file, Pos: pos, Msg: fmt.Sprintf(format, args...)})
}

// Resolve follows YAML aliases to the node they name.
func Resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// IsNull reports an empty value ("key:" with nothing after it).
func IsNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// KindName says what a node is, for messages.
func KindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if IsNull(n) {
			return "empty"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// Fields checks n is a mapping with only the allowed keys, each once, and
// returns the value nodes by key. An empty value is an empty mapping (a
// section with everything commented out). It returns nil if n is not a
// mapping.
func (c *Checker) Fields(n *yaml.Node, where string, allowed ...string) map[string]*yaml.Node {
	n = Resolve(n)
	if IsNull(n) {
		return map[string]*yaml.Node{}
	}
	if n.Kind != yaml.MappingNode {
		c.Errorf(n, "%s must be a mapping, got %s", where, KindName(n))
		return nil
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	keyPos := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := Resolve(n.Content[i]), Resolve(n.Content[i+1])
		if !slices.Contains(allowed, k.Value) {
			c.Errorf(k, "unknown field %q in %s; allowed: %s", k.Value, where, strings.Join(allowed, ", "))
			continue
		}
		if prev, dup := keyPos[k.Value]; dup {
			c.Errorf(k, "field %q in %s is already set at line %d", k.Value, where, prev.Line)
			continue
		}
		keyPos[k.Value] = k
		out[k.Value] = v
	}
	return out
}

// Scalar returns a single value.
func (c *Checker) Scalar(n *yaml.Node, where string) (string, bool) {
	n = Resolve(n)
	if n.Kind != yaml.ScalarNode || IsNull(n) {
		c.Errorf(n, "%s must be a single value, got %s", where, KindName(n))
		return "", false
	}
	return n.Value, true
}

// UintIn returns a whole number in [lo, hi].
func (c *Checker) UintIn(n *yaml.Node, where string, lo, hi uint64) (uint64, bool) {
	v, ok := c.Scalar(n, where)
	if !ok {
		return 0, false
	}
	u, err := strconv.ParseUint(v, 10, 64)
	if err != nil || u < lo || u > hi {
		c.Errorf(n, "%s %q must be a whole number from %d to %d", where, v, lo, hi)
		return 0, false
	}
	return u, true
}

// Seq returns the items of a list; a single value is a list of one, and an
// empty value an empty list.
func (c *Checker) Seq(n *yaml.Node, where string) []*yaml.Node {
	n = Resolve(n)
	switch {
	case IsNull(n):
		return nil
	case n.Kind == yaml.SequenceNode:
		out := make([]*yaml.Node, len(n.Content))
		for i, item := range n.Content {
			out[i] = Resolve(item)
		}
		return out
	case n.Kind == yaml.ScalarNode:
		return []*yaml.Node{n}
	}
	c.Errorf(n, "%s must be a list, got %s", where, KindName(n))
	return nil
}

// Lookup is the value of key in the mapping n (nil if n is not a mapping
// or has no key), for checks across fields after a table's walk.
func Lookup(n *yaml.Node, key string) *yaml.Node {
	n = Resolve(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if Resolve(n.Content[i]).Value == key {
			return Resolve(n.Content[i+1])
		}
	}
	return nil
}

// Seq is the items of a list n (a single value: a list of one), without
// reporting anything: for checks after a table's walk.
func Seq(n *yaml.Node) []*yaml.Node {
	var c Checker
	return c.Seq(n, "")
}
