// Package loader loads Edgeguard's XDP program into the kernel, attaches it
// to interfaces through BPF links, and pins links and maps under a bpffs
// directory so that a restarted daemon re-opens them and enforcement never
// stops. It is the only package that holds the compiled objects.
package loader

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// DefaultPinDir is where a daemon pins its maps and links.
const DefaultPinDir = "/sys/fs/bpf/edgeguard"

// Sizes are the table sizes fixed at load time. Zero fields take defaults.
type Sizes struct {
	MaxRules      uint32 // rules per generation: table slots 0..MaxRules-1, one whole aggregate each
	SrcEntries    uint32 // per-source buckets (LRU)
	AggEntries    uint32 // derived-prefix and ASN aggregate buckets (LRU)
	PrefixEntries uint32 // prefix-facts trie entries, per generation
	ListEntries   uint32 // deny/allow list entries
	L4Entries     uint32 // L4 rule entries, per generation
	// V4Chunks is the IPv4 direct table's budget of 16-entry chunks, per
	// generation (128 bytes each, allocated for both generations at
	// load). A policy whose IPv4 facts need more falls back to the trie.
	V4Chunks uint32
	// StandingEntries is the capacity of the standing table (one entry per
	// source address, /32 or /64; a plain hash, never evicted by the data
	// plane, ~100 bytes an entry).
	StandingEntries uint32
}

// DefaultSizes are the sizes of a policy without a tables: section
// (policy.DefaultTables, the one default of each), sized for a busy edge
// host: 1M sources take ~130 MiB; the IPv4 direct table takes 2 × 32 MiB of
// chunks plus 1 MiB of level 1, room for a full routing table's ASN facts
// and 100,000 rule prefixes; 256k standing entries take ~25 MiB.
func DefaultSizes() Sizes {
	return SizesOf(policy.DefaultTables())
}

// SizesOf are the sizes of a policy's tables: section. L4Entries, which
// the policy does not size, is the C header's EG_DEFAULT_L4_ENTRIES.
func SizesOf(t policy.Tables) Sizes {
	return Sizes{
		MaxRules: t.MaxRules, SrcEntries: t.PerSourceEntries, AggEntries: t.AggregateEntries,
		PrefixEntries: t.PrefixEntries, ListEntries: t.ListEntries, V4Chunks: t.IPv4DirectChunks,
		StandingEntries: t.StandingEntries,
		L4Entries:       uint32(LimiterEgTableDefaultsEG_TBL_L4ENTRIES),
	}
}

// V4ChunkEntries is the number of entries in one chunk of the IPv4 direct
// table, and V4L1Entries the number of level-1 entries per generation.
const (
	V4ChunkEntries = uint32(LimiterEgSizesEG_V4CHUNK_ENTRIES)
	V4L1Entries    = uint32(LimiterEgSizesEG_V4L1ENTRIES)
)

// maxV4Chunks keeps 2 × V4Chunks × V4ChunkEntries within a map's 32-bit
// max_entries and chunk indexes within the entry's 32-bit field.
const maxV4Chunks = 1 << 26

// WithDefaults is s with its zero fields set to DefaultSizes': the sizes a
// Load with s creates.
func (s Sizes) WithDefaults() Sizes {
	d := DefaultSizes()
	if s.MaxRules != 0 {
		d.MaxRules = s.MaxRules
	}
	if s.SrcEntries != 0 {
		d.SrcEntries = s.SrcEntries
	}
	if s.AggEntries != 0 {
		d.AggEntries = s.AggEntries
	}
	if s.PrefixEntries != 0 {
		d.PrefixEntries = s.PrefixEntries
	}
	if s.ListEntries != 0 {
		d.ListEntries = s.ListEntries
	}
	if s.L4Entries != 0 {
		d.L4Entries = s.L4Entries
	}
	if s.V4Chunks != 0 {
		d.V4Chunks = s.V4Chunks
	}
	if s.StandingEntries != 0 {
		d.StandingEntries = s.StandingEntries
	}
	return d
}

// SeenFilterWords is the size of the new-source filter for a per-source
// table of srcEntries: the next power of two at or above twice srcEntries,
// at least 1024 words. Each key sets two of a word's 28 bits per epoch, so
// under a flood of random sources a new source is taken for a seen one
// about 2×(2×sources per epoch/(28×words))² of the time: ~0.3% for 1M
// sources per second into the 2^21 words of the default table, ~4% for 4M.
func SeenFilterWords(srcEntries uint32) uint32 {
	n := uint32(1024)
	for uint64(n) < 2*uint64(srcEntries) && n < 1<<26 {
		n <<= 1
	}
	return n
}

// Options configure Load.
type Options struct {
	Sizes Sizes
	// PinDir, if set, is a bpffs directory holding the maps (PinDir/maps)
	// and links (PinDir/links). Existing pins are re-opened, so state and
	// enforcement survive a restart.
	PinDir string
	// TestClock makes the program read time from the test_clock map.
	TestClock bool
	Logger    *slog.Logger
}

// Datapath is a loaded XDP limiter: its program and maps.
type Datapath struct {
	Objects LimiterObjects
	Sizes   Sizes
	pinDir  string
	log     *slog.Logger
	// testClock: the program reads time from the test_clock map.
	testClock bool
	// entry, if set, is the program Attach attaches instead of the
	// limiter: the SYN path's, which tail-calls the limiter (LoadSyn).
	entry *ebpf.Program
}

// Entry is the program Attach attaches: the SYN path's when it is loaded,
// else the limiter.
func (d *Datapath) Entry() *ebpf.Program {
	if d.entry != nil {
		return d.entry
	}
	return d.Objects.XdpLimiter
}

// ErrIncompatiblePins means the pinned maps were made by a different version
// or with different table sizes.
var ErrIncompatiblePins = errors.New("pinned maps are incompatible with this program")

// unpinned makes spec load without pins, for a datapath without a PinDir.
// With one, the maps the C marks LIBBPF_PIN_BY_NAME (bpf/headers/
// edgeguard_maps.h says why each must survive a restart) are pinned.
func unpinned(spec *ebpf.CollectionSpec) {
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
}

// Spec returns the collection spec with sizes and constants applied. Its
// maps are pinned by name as the C declares them (see unpinned).
func Spec(sizes Sizes, testClock bool) (*ebpf.CollectionSpec, error) {
	spec, err := LoadLimiter()
	if err != nil {
		return nil, fmt.Errorf("parse embedded bpf object: %w", err)
	}
	s := sizes.WithDefaults()
	if s.V4Chunks > maxV4Chunks {
		return nil, fmt.Errorf("ipv4 direct table: %d chunks asked, at most %d", s.V4Chunks, maxV4Chunks)
	}
	set := map[string]uint32{
		LimiterMapV4Chunks:     2 * s.V4Chunks * V4ChunkEntries,
		LimiterMapRules:        2 * s.MaxRules,
		LimiterMapRuleStats:    s.MaxRules,
		LimiterMapWholeBuckets: s.MaxRules,
		LimiterMapAggGate:      s.MaxRules,
		LimiterMapSrcBuckets:   s.SrcEntries,
		LimiterMapAggBuckets:   s.AggEntries,
		LimiterMapLists:        s.ListEntries,
		LimiterMapL4Rules:      2 * s.L4Entries,
		LimiterMapStanding:     s.StandingEntries,
	}
	for name, n := range set {
		m, ok := spec.Maps[name]
		if !ok {
			return nil, fmt.Errorf("map %s missing from bpf object", name)
		}
		m.MaxEntries = n
	}
	spec.Maps[LimiterMapPrefixGens].InnerMap.MaxEntries = s.PrefixEntries
	seen := SeenFilterWords(s.SrcEntries)
	spec.Maps[LimiterMapSeenFilter].MaxEntries = seen
	if err := spec.Variables["eg_seen_mask"].Set(seen - 1); err != nil {
		return nil, fmt.Errorf("set eg_seen_mask: %w", err)
	}
	if err := spec.Variables["eg_max_rules"].Set(s.MaxRules); err != nil {
		return nil, fmt.Errorf("set eg_max_rules: %w", err)
	}
	if testClock {
		if err := spec.Variables["eg_test_clock"].Set(uint8(1)); err != nil {
			return nil, fmt.Errorf("set eg_test_clock: %w", err)
		}
	}
	return spec, nil
}

// Load loads the program and its maps. With a PinDir, pinned maps are
// re-opened (keeping all state) or, on first use, created and pinned
// atomically: they are pinned into a temporary directory that is renamed
// into place only once everything loaded.
func Load(opts Options) (_ *Datapath, err error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	spec, err := Spec(opts.Sizes, opts.TestClock)
	if err != nil {
		return nil, err
	}
	d := &Datapath{Sizes: opts.Sizes.WithDefaults(), pinDir: opts.PinDir, log: log, testClock: opts.TestClock}

	var collOpts ebpf.CollectionOptions
	var tmp string
	var migrateWhole bool
	if opts.PinDir != "" {
		if err := ensureBPFFS(filepath.Dir(opts.PinDir)); err != nil {
			return nil, err
		}
		mapDir := filepath.Join(opts.PinDir, "maps")
		if _, statErr := os.Stat(mapDir); statErr == nil {
			collOpts.Maps.PinPath = mapDir
			log.Info("re-opening pinned maps", "dir", mapDir)
			// Pins of a version that kept whole aggregates in
			// agg_buckets: the load creates and pins whole_buckets,
			// then their state is moved over.
			_, err := os.Stat(filepath.Join(mapDir, LimiterMapWholeBuckets))
			migrateWhole = errors.Is(err, fs.ErrNotExist)
			// Counters of a version with fewer drop reasons: they
			// restart (a counter reset, as after a reboot); the rest of
			// the state stays.
			if err := dropResizedPin(mapDir, LimiterMapStats, spec.Maps[LimiterMapStats].MaxEntries, log); err != nil {
				return nil, err
			}
		} else {
			if err := os.MkdirAll(opts.PinDir, 0o700); err != nil {
				return nil, fmt.Errorf("create pin dir: %w", err)
			}
			tmp, err = os.MkdirTemp(opts.PinDir, "maps-new-")
			if err != nil {
				return nil, fmt.Errorf("create temporary pin dir: %w", err)
			}
			defer func() {
				if tmp != "" {
					os.RemoveAll(tmp)
				}
			}()
			collOpts.Maps.PinPath = tmp
		}
	} else {
		unpinned(spec)
	}

	if err := spec.LoadAndAssign(&d.Objects, &collOpts); err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("%w (table sizes or program version changed): %w; "+
				"to start over run 'edgectl detach --unpin', which drops all state", ErrIncompatiblePins, err)
		}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load xdp program: %+v", ve)
		}
		return nil, fmt.Errorf("load xdp program: %w", err)
	}
	defer func() {
		if err != nil {
			d.Objects.Close()
		}
	}()

	if err := d.ensurePrefixTries(spec); err != nil {
		return nil, err
	}
	if migrateWhole {
		// Not fatal: a bucket not moved starts full, once.
		if n, err := d.migrateWholeBuckets(); err != nil {
			log.Warn("whole aggregates not all moved; the others start full", "moved", n, "err", err)
		} else {
			log.Info("moved whole aggregates from agg_buckets to whole_buckets", "rules", n)
		}
	}
	if tmp != "" {
		if err := os.Rename(tmp, filepath.Join(opts.PinDir, "maps")); err != nil {
			return nil, fmt.Errorf("move pinned maps into place: %w", err)
		}
		tmp = ""
		// Pins are inodes: the rename keeps them and the maps behind them.
	}
	return d, nil
}

// ensurePrefixTries fills empty slots of prefix_gens with new, empty tries.
func (d *Datapath) ensurePrefixTries(spec *ebpf.CollectionSpec) error {
	for gen := uint32(0); gen < 2; gen++ {
		var id ebpf.MapID
		if err := d.Objects.PrefixGens.Lookup(gen, &id); err == nil {
			continue
		}
		inner, err := ebpf.NewMap(spec.Maps[LimiterMapPrefixGens].InnerMap)
		if err != nil {
			return fmt.Errorf("create prefix trie for generation %d: %w", gen, err)
		}
		err = d.Objects.PrefixGens.Put(gen, inner)
		inner.Close()
		if err != nil {
			return fmt.Errorf("install prefix trie for generation %d: %w", gen, err)
		}
	}
	return nil
}

// migrateWholeBuckets moves the whole aggregates of the live generation's
// rules from agg_buckets, where earlier versions kept them under the key
// {rule id, prefix, length 0}, to their slots of whole_buckets, and returns
// how many it moved. Charges the old program (still attached until the new
// one replaces it) makes to agg_buckets after the copy are lost: the
// bucket is behind by at most that window's packets.
func (d *Datapath) migrateWholeBuckets() (int, error) {
	var act LimiterEgActive
	if err := d.Objects.Active.Lookup(uint32(0), &act); err != nil {
		return 0, fmt.Errorf("migrate whole aggregates: read active generation: %w", err)
	}
	maxRules := d.Sizes.MaxRules
	moved := 0
	for slot := uint32(0); slot < maxRules; slot++ {
		var r LimiterEgRule
		if err := d.Objects.Rules.Lookup((act.Gen&1)*maxRules+slot, &r); err != nil {
			return moved, fmt.Errorf("migrate whole aggregates: read rule slot %d: %w", slot, err)
		}
		mode := LimiterEgAggMode(r.AggMode)
		if r.Valid == 0 || mode == LimiterEgAggModeEG_AGG_NONE || mode == LimiterEgAggModeEG_AGG_DERIVED {
			continue
		}
		key := LimiterEgAggKey{RuleId: r.Id, Kind: uint8(LimiterEgAggKindEG_AGG_KIND_PREFIX)}
		var b LimiterEgBucket
		if err := d.Objects.AggBuckets.Lookup(key, &b); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		} else if err != nil {
			return moved, fmt.Errorf("migrate whole aggregate of rule %d: %w", r.Id, err)
		}
		if err := d.Objects.WholeBuckets.Put(slot, b); err != nil {
			return moved, fmt.Errorf("migrate whole aggregate of rule %d: %w", r.Id, err)
		}
		// The old entry would only age out of the LRU otherwise.
		if err := d.Objects.AggBuckets.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return moved, fmt.Errorf("migrate whole aggregate of rule %d: delete old entry: %w", r.Id, err)
		}
		moved++
	}
	return moved, nil
}

// NewPrefixTrie makes an empty prefix-facts trie of the loaded size, to be
// filled and then swapped into a generation slot.
func (d *Datapath) NewPrefixTrie() (*ebpf.Map, error) {
	spec, err := Spec(d.Sizes, false)
	if err != nil {
		return nil, err
	}
	m, err := ebpf.NewMap(spec.Maps[LimiterMapPrefixGens].InnerMap)
	if err != nil {
		return nil, fmt.Errorf("create prefix trie: %w", err)
	}
	return m, nil
}

// Logger is the logger the datapath was loaded with (a discarding one if
// none was given), for the packages that write its maps.
func (d *Datapath) Logger() *slog.Logger { return d.log }

// TestClock reports whether the program reads time from the test_clock map.
func (d *Datapath) TestClock() bool { return d.testClock }

// PinDir is where this datapath's maps and links are pinned, or "".
func (d *Datapath) PinDir() string { return d.pinDir }

// Close releases the file descriptors. Pinned maps and links stay in the
// kernel and keep enforcing.
func (d *Datapath) Close() error {
	return d.Objects.Close()
}

// Unpin removes every pin of this datapath (maps and links). Once the last
// file descriptor closes, the program detaches and all state is gone.
func Unpin(pinDir string) error {
	if pinDir == "" {
		return nil
	}
	if err := os.RemoveAll(pinDir); err != nil {
		return fmt.Errorf("remove pins under %s: %w", pinDir, err)
	}
	return nil
}

// dropResizedPin removes our pin of a map whose size this program changed
// (the map itself goes when the old program lets go of it), so that the
// load creates it anew instead of refusing every pin.
func dropResizedPin(dir, name string, want uint32, log *slog.Logger) error {
	path := filepath.Join(dir, name)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned %s: %w", name, err)
	}
	got := m.MaxEntries()
	m.Close()
	if got == want {
		return nil
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove pinned %s of %d entries (this version has %d): %w", name, got, want, err)
	}
	log.Warn("pinned map resized by this version: it starts empty", "map", name, "entries", got, "now", want)
	return nil
}
