package policy

import (
	"net/netip"
	"slices"
)

// trieEntry is one longest-prefix-match entry with a comparable value.
type trieEntry[V comparable] struct {
	prefix netip.Prefix
	value  V
}

// compact returns the smallest set of entries this pass can find that gives
// every address the same longest-prefix-match result as es (no match = the
// zero V), with IPv4 looked up as IPv4-mapped IPv6 as the data plane does:
//
//   - two sibling entries with equal values become one entry at their parent;
//   - an entry whose two halves are both entries is never the longest match
//     and is dropped;
//   - an entry equal to its nearest covering entry (or to the zero V at the
//     top) is dropped.
//
// The IPv4 range (0.0.0.0/0) is never merged with its IPv6 sibling, so IPv4
// and IPv6 entries stay in their families. Output order: IPv4 first, then by
// address, then by length.
func compact[V comparable](es []trieEntry[V]) []trieEntry[V] {
	if len(es) == 0 {
		return nil
	}
	type node struct {
		k    sortKey
		v    V
		dead bool
	}
	// One address-sorted slice per prefix length: the two halves of a
	// parent are neighbours in their level, so merging needs no map.
	var levels [129][]node
	var count [129]int
	for _, e := range es {
		count[unify(e.prefix).Bits()]++
	}
	for b, n := range count {
		if n > 0 {
			levels[b] = make([]node, 0, n)
		}
	}
	for _, e := range es {
		k := keyOf(unify(e.prefix))
		levels[k.bits] = append(levels[k.bits], node{k: k, v: e.value})
	}
	byAddr := func(a, b node) int { return compareKey(a.k, b.k) }
	for b := range levels {
		slices.SortFunc(levels[b], byAddr)
	}
	v4root := keyOf(ipv4Range())
	for b := 128; b >= 1; b-- {
		lv := levels[b]
		var promote []node // parents that take their equal halves' value
		var kill []sortKey // parents whose halves differ: never matched
		for i := 0; i+1 < len(lv); i++ {
			x, y := &lv[i], &lv[i+1]
			px, py := parentKey(x.k), parentKey(y.k)
			if px != py || x.k == v4root || y.k == v4root {
				continue
			}
			if x.v == y.v {
				x.dead, y.dead = true, true
				promote = append(promote, node{k: px, v: x.v})
			} else {
				kill = append(kill, px)
			}
			i++
		}
		if len(promote) == 0 && len(kill) == 0 {
			continue
		}
		// Merge the (sorted, disjoint) changes into the parent level.
		up := levels[b-1]
		merged := make([]node, 0, len(up)+len(promote))
		i, j, k := 0, 0, 0
		for i < len(up) || j < len(promote) {
			switch {
			case j == len(promote) || (i < len(up) && compareKey(up[i].k, promote[j].k) < 0):
				for k < len(kill) && compareKey(kill[k], up[i].k) < 0 {
					k++
				}
				if k < len(kill) && kill[k] == up[i].k {
					k++ // both halves are entries: this one never matches
				} else {
					merged = append(merged, up[i])
				}
				i++
			case i < len(up) && up[i].k == promote[j].k:
				merged = append(merged, promote[j]) // it was shadowed by its halves
				i++
				j++
			default:
				merged = append(merged, promote[j])
				j++
			}
		}
		levels[b-1] = merged
	}
	all := make([]node, 0, len(es))
	for b := range levels {
		for _, n := range levels[b] {
			if !n.dead {
				all = append(all, n)
			}
		}
	}
	slices.SortFunc(all, byAddr)
	prefixes := make([]netip.Prefix, len(all))
	for i, n := range all {
		prefixes[i] = prefixOfKey(n.k)
	}
	eff := make([]V, len(all))
	out := make([]trieEntry[V], 0, len(all))
	walkNested(prefixes, func(i, parent int) {
		var inherited V
		if parent >= 0 {
			inherited = eff[parent]
		}
		eff[i] = all[i].v
		if eff[i] != inherited {
			out = append(out, trieEntry[V]{prefix: ununify(prefixes[i]), value: eff[i]})
		}
	})
	v4First(out, func(e trieEntry[V]) bool { return e.prefix.Addr().Is4() })
	return out
}

// parentKey returns the key of the prefix one bit shorter.
func parentKey(k sortKey) sortKey {
	i := k.bits - 1
	if i < 64 {
		k.hi &^= 1 << (63 - i)
	} else {
		k.lo &^= 1 << (127 - i)
	}
	k.bits--
	return k
}

func prefixOfKey(k sortKey) netip.Prefix {
	var b [16]byte
	for i := 0; i < 8; i++ {
		b[i] = byte(k.hi >> (56 - 8*i))
		b[8+i] = byte(k.lo >> (56 - 8*i))
	}
	return netip.PrefixFrom(netip.AddrFrom16(b), k.bits)
}

// v4First moves the one contiguous run of IPv4 entries of a slice in
// unified address order to the front, keeping both runs' order.
func v4First[T any](s []T, is4 func(T) bool) {
	first := slices.IndexFunc(s, is4)
	if first <= 0 {
		return
	}
	n := first
	for n < len(s) && is4(s[n]) {
		n++
	}
	slices.Reverse(s[:first])
	slices.Reverse(s[first:n])
	slices.Reverse(s[:n])
}
