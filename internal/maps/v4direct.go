package maps

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// The IPv4 direct table is the prefix facts compiled for IPv4 sources into
// arrays (DIR-16-4-4-4-4, after DPDK's rte_lpm): level 1 has an entry per
// /16; an entry either holds the answer for all its addresses (rule slot
// and ASN of the most specific fact, 0/0 for none) or points to a chunk of
// 16 entries one level down, 4 bits more specific. A lookup is one to five
// dependent array loads, whatever the number of facts, where the trie
// walks about one node per significant bit (~20 with a routing table's
// worth of facts). IPv6 sources always use the trie.
//
// The answers are the trie's by construction: every fact whose trie key
// falls in ::ffff:0:0/96 is an IPv4 prefix, the most specific trie key
// above that range (an IPv6 ::/0, say) is what the table answers where no
// IPv4 fact covers an address, and duplicate keys keep the last fact, as
// the trie's batch update does.

// DefaultV4DirectMinFacts is the number of IPv4 prefix facts from which a
// generation gets a direct table (see SetV4DirectMinFacts). Below it the
// trie is at most about ten nodes deep and, being walked by every packet,
// stays in the cache, while the direct table's 512 KiB level 1 would be
// read at a random line per new source of a spoofed flood.
const DefaultV4DirectMinFacts = 1024

// v4Child marks an entry that points to a chunk (EG_V4_CHILD, through
// bpf2go: enum eg_v4_mark).
const v4Child = uint32(loader.LimiterEgV4MarkEG_V4MARK_CHILD)

// V4DirectStatus says how the live generation answers IPv4 sources.
type V4DirectStatus struct {
	Used     bool   // IPv4 sources are looked up in the direct table
	Facts    int    // IPv4 prefix facts of the generation
	Chunks   int    // chunks the table uses; when over budget, Capacity+1
	Capacity int    // chunk budget per generation (loader Sizes.V4Chunks)
	Reason   string // why the trie is used instead, when not Used
}

// SetV4DirectMinFacts sets how many IPv4 prefix facts a generation needs
// for a direct table; 0 gives every generation one. It takes effect at the
// next Stage.
func (m *Generations) SetV4DirectMinFacts(n int) { m.v4DirectMin = n }

// V4Direct reports how the generation made live by the last Commit of this
// Maps answers IPv4 sources.
func (m *Generations) V4Direct() V4DirectStatus { return m.v4Status }

// v4Fact is an IPv4 prefix fact: the top bits of addr, and its answer.
type v4Fact struct {
	addr uint32
	bits int
	val  loader.LimiterEgV4Entry
}

var v4MappedPrefix = [12]byte{10: 0xff, 11: 0xff}

// v4Facts returns what the trie answers for IPv4 sources: the IPv6 fact
// above ::ffff:0:0/96 that covers them all (zero if none), and the facts
// inside it as IPv4 prefixes. facts carry table slots, not rule ids.
func v4Facts(facts []slotFact) (loader.LimiterEgV4Entry, []v4Fact) {
	byKey := make(map[loader.LimiterEgLpmKey]int, len(facts))
	var background loader.LimiterEgV4Entry
	bgBits := -1
	var out []v4Fact
	for _, f := range facts {
		k := LPMKey(f.Prefix)
		val := loader.LimiterEgV4Entry{RuleSlot: f.Slot, Asn: f.ASN}
		bits := int(k.Prefixlen)
		if bits < 96 {
			if coversV4Mapped(k) && bits >= bgBits {
				background, bgBits = val, bits
			}
			continue
		}
		if [12]byte(k.Addr[:12]) != v4MappedPrefix {
			continue
		}
		if i, dup := byKey[k]; dup {
			out[i].val = val
			continue
		}
		byKey[k] = len(out)
		out = append(out, v4Fact{addr: binary.BigEndian.Uint32(k.Addr[12:]), bits: bits - 96, val: val})
	}
	return background, out
}

// coversV4Mapped is whether a trie key shorter than 96 bits covers
// ::ffff:0:0/96.
func coversV4Mapped(k loader.LimiterEgLpmKey) bool {
	for i := 0; i < int(k.Prefixlen); i++ {
		if (k.Addr[i/8]^v4MappedPrefix[i/8])&(0x80>>(i%8)) != 0 {
			return false
		}
	}
	return true
}

// The table's geometry, from the C header (enum eg_sizes).
const (
	v4L1Bits = int(loader.LimiterEgSizesEG_V4L1BITS)
	v4Stride = int(loader.LimiterEgSizesEG_V4STRIDE)
)

// v4Chunk is one chunk: 1<<v4Stride entries.
type v4Chunk [loader.LimiterEgSizesEG_V4CHUNK_ENTRIES]loader.LimiterEgV4Entry

// v4Table is a direct table before it is written: level 1, and chunks
// numbered from 0 (the generation's offset is added when writing).
type v4Table struct {
	l1     []loader.LimiterEgV4Entry
	chunks []v4Chunk
}

// buildV4Table compiles IPv4 facts into a table of at most budget chunks;
// ok is false when it needs more. Facts go in from the shortest prefix to
// the longest, each overwriting the addresses it covers, so the most
// specific fact wins; a chunk inherits the entry it replaces.
func buildV4Table(background loader.LimiterEgV4Entry, facts []v4Fact, budget int) (_ *v4Table, ok bool) {
	const l1Bits, stride = v4L1Bits, v4Stride
	t := &v4Table{l1: make([]loader.LimiterEgV4Entry, loader.V4L1Entries)}
	for i := range t.l1 {
		t.l1[i] = background
	}
	sorted := slices.Clone(facts)
	slices.SortStableFunc(sorted, func(a, b v4Fact) int { return a.bits - b.bits })
	for _, f := range sorted {
		addr := f.addr
		if f.bits < 32 {
			addr &^= 1<<(32-f.bits) - 1
		}
		if f.bits <= l1Bits {
			start := addr >> (32 - l1Bits)
			fill(t.l1[start:start+1<<(l1Bits-f.bits)], f.val)
			continue
		}
		// entry is the slot being refined: level 1 first, then a chunk's.
		entry := &t.l1[addr>>(32-l1Bits)]
		for depth := l1Bits + stride; ; depth += stride {
			if entry.RuleSlot != v4Child {
				if len(t.chunks) == budget {
					return nil, false
				}
				var c v4Chunk
				fill(c[:], *entry)
				t.chunks = append(t.chunks, c)
				// entry may point into a chunk moved by append: refind
				// it through the path, which the new chunk does not change.
				entry = t.slot(addr, depth-stride)
				*entry = loader.LimiterEgV4Entry{RuleSlot: v4Child, Asn: uint32(len(t.chunks) - 1)}
			}
			c := &t.chunks[entry.Asn]
			nib := addr >> (32 - depth) & (1<<stride - 1)
			if f.bits <= depth {
				fill(c[nib:nib+1<<(depth-f.bits)], f.val)
				break
			}
			entry = &c[nib]
		}
	}
	return t, true
}

// slot returns the entry that covers addr at depth bits (16, 20, ... 28),
// following chunks that exist.
func (t *v4Table) slot(addr uint32, depth int) *loader.LimiterEgV4Entry {
	e := &t.l1[addr>>(32-v4L1Bits)]
	for d := v4L1Bits + v4Stride; d <= depth; d += v4Stride {
		e = &t.chunks[e.Asn][addr>>(32-d)&(1<<v4Stride-1)]
	}
	return e
}

func fill(entries []loader.LimiterEgV4Entry, v loader.LimiterEgV4Entry) {
	for i := range entries {
		entries[i] = v
	}
}

// writeV4Direct builds generation gen's direct table from facts (with
// table slots) and writes it, or decides on the trie. It returns whether
// the generation uses the table; the table is written whole or not at all.
func (m *Generations) writeV4Direct(gen uint32, facts []slotFact) (V4DirectStatus, error) {
	budget := int(m.d.Sizes.V4Chunks)
	background, v4 := v4Facts(facts)
	st := V4DirectStatus{Facts: len(v4), Capacity: budget}
	if len(v4) < m.v4DirectMin {
		st.Reason = fmt.Sprintf("%d IPv4 prefix facts, fewer than %d: the trie is small", len(v4), m.v4DirectMin)
		return st, nil
	}
	t, ok := buildV4Table(background, v4, budget)
	if !ok {
		st.Chunks = budget + 1
		st.Reason = fmt.Sprintf("the IPv4 direct table needs more than %d chunks: raise the policy's "+
			"tables.ipv4_direct_chunks (or edgectl run --ipv4-direct-chunks), which takes 'edgectl detach --unpin'", budget)
		return st, nil
	}
	st.Used, st.Chunks = true, len(t.chunks)

	// The generation's chunks start at base: pointers move by it.
	base := gen * uint32(budget)
	rebase := func(e loader.LimiterEgV4Entry) loader.LimiterEgV4Entry {
		if e.RuleSlot == v4Child {
			e.Asn += base
		}
		return e
	}
	keys := make([]uint32, len(t.l1))
	l1 := make([]loader.LimiterEgV4Entry, len(t.l1))
	for i, e := range t.l1 {
		keys[i] = gen*loader.V4L1Entries + uint32(i)
		l1[i] = rebase(e)
	}
	if err := batchUpdate(m.o.V4L1, keys, l1); err != nil {
		return st, fmt.Errorf("write ipv4 direct table level 1 of generation %d: %w", gen, err)
	}
	n := len(t.chunks) * int(loader.V4ChunkEntries)
	keys = make([]uint32, n)
	vals := make([]loader.LimiterEgV4Entry, 0, n)
	for i := range keys {
		keys[i] = base*loader.V4ChunkEntries + uint32(i)
	}
	for _, c := range t.chunks {
		for _, e := range c {
			vals = append(vals, rebase(e))
		}
	}
	if err := batchUpdate(m.o.V4Chunks, keys, vals); err != nil {
		return st, fmt.Errorf("write ipv4 direct table chunks of generation %d: %w", gen, err)
	}
	return st, nil
}

// logV4Direct says how a generation just made live answers IPv4 sources:
// a warning when a table that was wanted did not fit.
func logV4Direct(log *slog.Logger, gen uint32, st V4DirectStatus) {
	switch {
	case st.Used:
		log.Info("ipv4 direct table in use", "generation", gen, "ipv4_facts", st.Facts,
			"chunks", st.Chunks, "chunk_budget", st.Capacity)
	case st.Chunks > st.Capacity:
		log.Warn("ipv4 direct table does not fit, using the prefix trie for ipv4 (slower per packet)",
			"generation", gen, "ipv4_facts", st.Facts, "chunk_budget", st.Capacity, "reason", st.Reason)
	}
}
