package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// Forever is the expiry of an entry that never expires (EG_FOREVER, through
// bpf2go: enum eg_expiry).
const Forever = uint64(loader.LimiterEgExpiryEG_EXPIRY_FOREVER)

// Origin says who put a list entry there.
type Origin = loader.LimiterEgOrigin

// Origins of list entries.
const (
	OriginPolicy = loader.LimiterEgOriginEG_ORIGIN_POLICY
	OriginCLI    = loader.LimiterEgOriginEG_ORIGIN_CLI
	OriginL7     = loader.LimiterEgOriginEG_ORIGIN_L7
)

// ListEntry is one entry of the lists trie. DenyUntil and AllowUntil are
// CLOCK_MONOTONIC nanoseconds (0: not set, Forever: no expiry). The entry
// must already carry what it inherits from covering entries: the data plane
// reads only the most specific match.
type ListEntry struct {
	Prefix     netip.Prefix
	DenyUntil  uint64
	AllowUntil uint64
	Origin     Origin
}

// Lists returns every entry of the lists trie.
func (m *ListStore) All() ([]ListEntry, error) {
	var k loader.LimiterEgLpmKey
	var v loader.LimiterEgListVal
	var out []ListEntry
	it := m.o.Lists.Iterate()
	for it.Next(&k, &v) {
		out = append(out, ListEntry{Prefix: PrefixFromKey(k), DenyUntil: v.DenyUntil, AllowUntil: v.AllowUntil, Origin: Origin(v.Origin)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read lists: %w", err)
	}
	return out, nil
}

// SetLists makes the lists trie hold exactly want: new and changed entries
// are written first, entries no longer wanted are deleted last, so a prefix
// that stays listed is never briefly absent.
func (m *ListStore) Set(want []ListEntry) error {
	if uint32(len(want)) > m.o.Lists.MaxEntries() {
		return fmt.Errorf("lists need %d entries, the table holds %d: raise tables.lists", len(want), m.o.Lists.MaxEntries())
	}
	have, err := m.All()
	if err != nil {
		return err
	}
	keep := make(map[netip.Prefix]bool, len(want))
	for _, e := range want {
		p := e.Prefix.Masked()
		if keep[p] {
			return fmt.Errorf("list entry %s given twice", p)
		}
		keep[p] = true
		v := loader.LimiterEgListVal{DenyUntil: e.DenyUntil, AllowUntil: e.AllowUntil, Origin: uint32(e.Origin)}
		if err := m.o.Lists.Put(LPMKey(p), v); err != nil {
			return fmt.Errorf("write list entry %s: %w", p, err)
		}
	}
	for _, e := range have {
		if keep[e.Prefix] {
			continue
		}
		if err := m.o.Lists.Delete(LPMKey(e.Prefix)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete list entry %s: %w", e.Prefix, err)
		}
	}
	return nil
}

// ListEntries turns compiled list records (policy.CompileLists) into
// lists-trie entries: wall-clock expiry times become the CLOCK_MONOTONIC
// nanoseconds the data plane compares with bpf_ktime_get_ns.
func ListEntries(recs []policy.ListRecord) ([]ListEntry, error) {
	mono, err := MonoNow()
	if err != nil {
		return nil, err
	}
	wall := time.Now()
	until := func(l policy.Listing) uint64 {
		if !l.Listed {
			return 0
		}
		if l.Until.IsZero() {
			return Forever
		}
		d := l.Until.Sub(wall)
		if d <= 0 {
			return 1 // already expired: listed, but never in force
		}
		return mono + uint64(d)
	}
	out := make([]ListEntry, 0, len(recs))
	for _, r := range recs {
		out = append(out, ListEntry{Prefix: r.Prefix, DenyUntil: until(r.Deny), AllowUntil: until(r.Allow)})
	}
	return out, nil
}
