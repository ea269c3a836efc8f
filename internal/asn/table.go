package asn

import (
	"fmt"
	"iter"
	"net/netip"
	"slices"
)

// Table is an immutable set of disjoint CIDR entries sorted by address, IPv4
// before IPv6. It is safe for concurrent use.
type Table struct {
	entries []Entry
	stats   Stats
}

// Stats describes what a load read and produced.
type Stats struct {
	Files       int   // input files read
	Bytes       int64 // bytes read from disk (compressed size for gzip)
	Lines       int64 // TSV lines read, including skipped ones
	Ranges      int64 // TSV ranges and MaxMind DB networks kept
	NotRouted   int64 // TSV ranges skipped because AS_number is 0
	Entries     int   // CIDR entries in the table after merging
	IPv4Entries int
	IPv6Entries int
}

// NewTable builds a table from entries in any order. Prefixes must be valid,
// masked (no host bits), not IPv4-mapped and must not overlap. The slice is
// copied.
func NewTable(entries []Entry) (*Table, error) {
	es := slices.Clone(entries)
	for _, e := range es {
		if !e.Prefix.IsValid() || e.Prefix != e.Prefix.Masked() || e.Prefix.Addr().Zone() != "" {
			return nil, fmt.Errorf("new asn table: prefix %v is not a valid masked prefix", e.Prefix)
		}
		if e.Prefix.Addr().Is4In6() {
			// Lookup unmaps addresses, so such an entry could never match.
			return nil, fmt.Errorf("new asn table: prefix %v is IPv4-mapped; use the IPv4 form", e.Prefix)
		}
	}
	slices.SortFunc(es, func(a, b Entry) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
	for i := 1; i < len(es); i++ {
		if es[i-1].Prefix.Overlaps(es[i].Prefix) {
			return nil, fmt.Errorf("new asn table: prefix %v overlaps %v", es[i-1].Prefix, es[i].Prefix)
		}
	}
	return newTableSorted(es, Stats{}), nil
}

func newTableSorted(es []Entry, st Stats) *Table {
	st.Entries = len(es)
	st.IPv4Entries = 0
	st.IPv6Entries = 0
	for _, e := range es {
		if e.Prefix.Addr().Is4() {
			st.IPv4Entries++
		} else {
			st.IPv6Entries++
		}
	}
	return &Table{entries: es, stats: st}
}

// Lookup returns the entry whose prefix contains addr. IPv4-mapped IPv6
// addresses (::ffff:a.b.c.d) are looked up as IPv4; a zone is ignored.
// It is a binary search: O(log n), no allocation.
func (t *Table) Lookup(addr netip.Addr) (Entry, bool) {
	if t == nil || !addr.IsValid() {
		return Entry{}, false
	}
	addr = addr.Unmap().WithZone("")
	i, found := slices.BinarySearchFunc(t.entries, addr, func(e Entry, a netip.Addr) int {
		return e.Prefix.Addr().Compare(a)
	})
	if found {
		return t.entries[i], true
	}
	if i == 0 {
		return Entry{}, false
	}
	// Entries are disjoint, so only the last one starting before addr can contain it.
	if e := t.entries[i-1]; e.Prefix.Contains(addr) {
		return e, true
	}
	return Entry{}, false
}

// Len returns the number of CIDR entries.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.entries)
}

// All iterates over the entries in address order, IPv4 first.
func (t *Table) All() iter.Seq[Entry] {
	return func(yield func(Entry) bool) {
		if t == nil {
			return
		}
		for _, e := range t.entries {
			if !yield(e) {
				return
			}
		}
	}
}

// Stats returns what the load that built the table read and produced.
func (t *Table) Stats() Stats {
	if t == nil {
		return Stats{}
	}
	return t.stats
}

// CountryString renders a country code, "" when unknown.
func CountryString(c [2]byte) string {
	if c == ([2]byte{}) {
		return ""
	}
	return string(c[:])
}
