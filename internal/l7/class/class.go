// Package class ranks the L7 stage's clients (docs/operations.md, "Class
// ranking"): every request is charged as its client's class, from the data
// plane's standing for its address (read through a bounded cache with a
// short TTL) and from what the L7 stage itself keeps of the client: how
// long it has been sending without a refusal, and its usual request rate.
//
// The ranking is the data plane's: history (established, within its usual
// rate) and authentication first; new clients (a completed handshake or a
// validated address is new: it proves an address, not intent) and the part
// of a client's requests above its usual rate next; penalised last.
package class

import (
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7"
)

// Class is what a request is charged as.
type Class uint8

// Classes, best first.
const (
	// Established: the client has history (the data plane's established
	// standing or standing.known_good, or established_after of requests
	// at L7 without a refusal) and is within its usual rate.
	Established Class = iota
	// Authenticated: the data plane's standing was set by an authenticated
	// L7 promotion (standing.l7_promotion), within its usual rate.
	Authenticated
	// New: no history; a handshake or a validated address is new.
	New
	// OverUsual: an established or authenticated client's request above
	// its usual rate (its personal budget).
	OverUsual
	// Penalised: the data plane penalised the address.
	Penalised

	NumClasses = 5
)

var classNames = [NumClasses]string{"established", "authenticated", "new", "over_usual", "penalised"}

// String is the class's metric label and display name.
func (c Class) String() string {
	if int(c) < NumClasses {
		return classNames[c]
	}
	return "invalid"
}

// Priority reports whether the class is in the first rank: it may use the
// capacity reserved from new and over-usual clients.
func (c Class) Priority() bool { return c == Established || c == Authenticated }

// Standing is what the data plane says of an address, as the L7 ranking
// reads it.
type Standing uint8

// Standings.
const (
	// StandingNone: no entry, new, or validated by a handshake.
	StandingNone Standing = iota
	StandingEstablished
	StandingAuthenticated
	StandingPenalised
)

// Standings reads the data plane's standing of an address (the daemon's
// standing table). It is called at most once per client per Config.CacheTTL.
type Standings interface {
	Standing(a netip.Addr) (Standing, error)
}

// Defaults of Config's zero fields (docs/policy.md, l7.classes).
const (
	DefaultEstablishedAfter = 30 * time.Second
	DefaultWindow           = 10 * time.Second
	DefaultHeadroom         = 2
	// DefaultUsualRate is the personal budget, requests per second, of a
	// client with history but no usual rate learned yet (known_good, an
	// established source after a restart): a browser's page loads.
	DefaultUsualRate = 10
	DefaultCacheTTL  = time.Second
	// DefaultClients is how many clients the table keeps.
	DefaultClients = 1 << 16
	// ForgetAfter: a client idle this long starts over.
	ForgetAfter = time.Hour
)

// Config sets the ranking. Zero fields take the defaults.
type Config struct {
	// EstablishedAfter is standing.established_after: the time a client
	// must send without a refused request (and without a gap longer than
	// it) to have history at L7.
	EstablishedAfter time.Duration
	// Window is the period the usual rate is measured over: a client's
	// usual is the decayed peak of its requests per Window.
	Window time.Duration
	// Headroom multiplies the usual: a priority client's requests beyond
	// Headroom × usual in one Window are charged as OverUsual.
	Headroom int64
	// DefaultUsualRate (requests/s) stands for the usual of a client with
	// history whose usual is not learned yet (its first whole Window).
	DefaultUsualRate int64
	// CacheTTL is how long a data plane standing read is used.
	CacheTTL time.Duration
}

func (c Config) withDefaults() Config {
	if c.EstablishedAfter <= 0 {
		c.EstablishedAfter = DefaultEstablishedAfter
	}
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.Headroom <= 0 {
		c.Headroom = DefaultHeadroom
	}
	if c.DefaultUsualRate <= 0 {
		c.DefaultUsualRate = DefaultUsualRate
	}
	if c.CacheTTL <= 0 {
		c.CacheTTL = DefaultCacheTTL
	}
	return c
}

// ways is the table's associativity: a new client takes the least
// valuable of its set's entries (a free one, else the oldest without
// history), never an active client with history.
const ways = 4

type entry struct {
	key        [16]byte
	used       bool
	hasHistory bool // sent EstablishedAfter without refusal, at L7
	// refusedNew: the stage refused it while it ranked new. From then on
	// the data plane's established alone does not rank it until it earns
	// history here: the data plane counts a source's packets as clean
	// history while its requests are being shed (an HTTP flood at a
	// user's rate congests no XDP aggregate), so a bot of the flood would
	// otherwise become established there after established_after.
	refusedNew bool
	learned    bool // usual is measured
	standing   Standing
	haveRead   bool // standing holds a read, made at standingAt
	standingAt int64
	cleanSince int64
	lastSeen   int64
	winStart   int64
	winCount   int64
	usual      int64 // requests per Window
	// The client's clump: the most requests it sent within one second
	// (burstCount since burstStart), peak of the window in winClump,
	// learned in clump.
	burstStart, burstCount int64
	winClump, clump        int64
	windows                int64 // windows measured
}

// set is one set of the table: the entries' hash tags (0: free) share a
// cache line with the lock, so a lookup reads one line before the
// entry it finds.
type set struct {
	mu   sync.Mutex
	tags [ways]uint64
	e    [ways]entry
	_    [24]byte // 512 bytes: a set starts a cache line
}

// Table is the clients the L7 stage knows: fixed size, allocated up front
// (128 bytes per client with its set's lock and tags: 8 MiB for
// DefaultClients),
// kept across reloads.
type Table struct {
	clock l7.Clock
	src   Standings
	seed  maphash.Seed
	cfg   atomic.Pointer[Config]
	sets  []set
	mask  uint64

	admitted, refused [NumClasses]atomic.Uint64
	reads, readErrors atomic.Uint64
	untracked         atomic.Uint64
}

// NewTable returns a table of about clients entries (rounded up to a power of
// two; 0: DefaultClients). src may be nil: every standing is StandingNone.
func NewTable(clients int, src Standings, clock l7.Clock, cfg Config) *Table {
	if clients <= 0 {
		clients = DefaultClients
	}
	n := 1
	for n*ways < clients {
		n <<= 1
	}
	if clock == nil {
		clock = l7.NewSystemClock()
	}
	t := &Table{clock: clock, src: src, seed: maphash.MakeSeed(), sets: make([]set, n), mask: uint64(n - 1)}
	t.Configure(cfg)
	return t
}

// Configure installs cfg (a reload); what the table knows of its clients
// stays.
func (t *Table) Configure(cfg Config) {
	c := cfg.withDefaults()
	t.cfg.Store(&c)
}

// Key is the address a client is kept under: an IPv4 address, an IPv6
// address's /64 (one host owns a /64, as the data plane's standing table
// keys it).
func Key(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.Addr()
	}
	return a
}

// Ticket is a classified request: give it to Done when the request ends.
type Ticket struct {
	set   uint32
	way   int8 // -1: untracked
	key   [16]byte
	Class Class
}

// Classify charges a request of client a (peer: a is the TCP peer, whose
// standing the data plane knows; false for a client named by a trusted
// proxy's forwarding header) and returns its class.
func (t *Table) Classify(a netip.Addr, peer bool) Ticket {
	cfg := t.cfg.Load()
	now := t.clock.Now()
	a = Key(a)
	key := a.As16()
	h := maphash.Comparable(t.seed, key)
	si := h & t.mask
	s := &t.sets[si]
	tag := h | 1
	tk := Ticket{set: uint32(si), way: -1, key: key}

	s.mu.Lock()
	w := s.find(tag, key)
	if w < 0 {
		w = s.alloc(now, int64(cfg.EstablishedAfter))
		if w >= 0 {
			s.tags[w] = tag
			s.e[w] = entry{key: key, used: true, cleanSince: now, lastSeen: now, winStart: now}
		}
	}
	if w < 0 {
		// No room: ranked new, without reading the data plane (a read
		// per request is what the table is for).
		s.mu.Unlock()
		t.untracked.Add(1)
		tk.Class = New
		return tk
	}
	tk.way = int8(w)
	e := &s.e[w]
	gap := now - e.lastSeen
	switch {
	case gap > int64(ForgetAfter):
		*e = entry{key: key, used: true, cleanSince: now, winStart: now}
	case !e.hasHistory && gap > int64(cfg.EstablishedAfter):
		e.cleanSince = now // gone longer than the whole wait: start over
	}
	e.lastSeen = now
	e.roll(now, int64(cfg.Window))
	e.winCount++
	if now-e.burstStart >= int64(time.Second) {
		e.burstStart, e.burstCount = now, 0
	}
	e.burstCount++
	e.winClump = max(e.winClump, e.burstCount)
	if !e.hasHistory && now-e.cleanSince >= int64(cfg.EstablishedAfter) {
		e.hasHistory = true
	}
	st, stale := e.standing, !e.haveRead || now-e.standingAt >= int64(cfg.CacheTTL)
	if !peer {
		st, stale = StandingNone, false
	}
	if !stale {
		tk.Class = e.classify(st, cfg)
		s.mu.Unlock()
		return tk
	}
	s.mu.Unlock()
	st = t.read(a)
	s.mu.Lock()
	if e.used && e.key == key {
		e.standing, e.standingAt, e.haveRead = st, now, true
		tk.Class = e.classify(st, cfg)
	} else {
		tk.Class, tk.way = New, -1 // taken by another client meanwhile
		if st == StandingPenalised {
			tk.Class = Penalised
		}
	}
	s.mu.Unlock()
	return tk
}

func (t *Table) read(a netip.Addr) Standing {
	if t.src == nil {
		return StandingNone
	}
	t.reads.Add(1)
	st, err := t.src.Standing(a)
	if err != nil {
		t.readErrors.Add(1)
		return StandingNone
	}
	return st
}

// classify is the class of e's current request (counted in winCount).
func (e *entry) classify(st Standing, cfg *Config) Class {
	switch {
	case st == StandingPenalised:
		return Penalised
	case st != StandingAuthenticated && !e.hasHistory && (st != StandingEstablished || e.refusedNew):
		return New
	}
	budget := cfg.DefaultUsualRate * int64(cfg.Window) / int64(time.Second)
	if e.learned {
		budget = cfg.Headroom*e.usual + e.clump
	}
	if e.winCount > budget {
		return OverUsual
	}
	if st == StandingAuthenticated {
		return Authenticated
	}
	return Established
}

// roll closes the windows that ended before now. While the client has
// no history, and for its first learnWindows, its usual is the highest
// count of a window (it is learning how the client sends); after that the
// usual follows a window's count up by at most an eighth (plus one) per
// window, so a client that jumps is charged as over usual until it has
// sent at the new rate for many windows, and down by a sixteenth per
// window. The clump (the most requests in one second) is learned the same
// way, and then moves by one per window.
func (e *entry) roll(now, window int64) {
	if now-e.winStart < window {
		return
	}
	n := (now - e.winStart) / window
	count, clump := e.winCount, e.winClump
	for i := int64(0); i < n && i < 64; i++ {
		switch {
		case !e.learned || !e.hasHistory || e.windows < learnWindows:
			e.usual, e.clump, e.learned = max(e.usual, count), max(e.clump, clump), true
		case count > e.usual:
			e.usual += min(count-e.usual, e.usual/8+1)
		default:
			e.usual = max(count, e.usual-e.usual/16)
		}
		if e.hasHistory && e.windows >= learnWindows {
			switch {
			case clump > e.clump:
				e.clump++
			case clump < e.clump:
				e.clump--
			}
		}
		e.windows++
		count, clump = 0, 0 // the windows after the first were empty
	}
	e.winStart += n * window
	e.winCount, e.winClump = 0, 0
}

// learnWindows is how many windows a client's usual and clump are taken
// at their highest.
const learnWindows = 3

func (s *set) find(tag uint64, key [16]byte) int {
	for i, t := range s.tags {
		if t == tag && s.e[i].key == key {
			return i
		}
	}
	return -1
}

// alloc picks the way a new client takes: a free one, one idle past
// ForgetAfter, else the least recently seen client without history; -1
// when every way holds a client with history seen in the last
// established_after (a flood of new addresses cannot push out the
// clients with history).
func (s *set) alloc(now, establishedAfter int64) int {
	best, bestSeen := -1, int64(0)
	for i := range s.e {
		e := &s.e[i]
		switch {
		case !e.used, now-e.lastSeen > int64(ForgetAfter):
			return i
		case e.hasHistory && now-e.lastSeen <= establishedAfter:
			continue
		}
		if best < 0 || e.lastSeen < bestSeen {
			best, bestSeen = i, e.lastSeen
		}
	}
	return best
}

// Done records how a classified request ended: refused (429, 503) or not.
// A refusal restarts the clean history of a client without history (as
// congestion does at the data plane: a new client does not become
// established while it is being refused), and a client refused while it
// ranked new needs history of its own here before the data plane's
// established ranks it (entry.refusedNew).
func (t *Table) Done(tk Ticket, refused bool) {
	if int(tk.Class) >= NumClasses {
		return
	}
	if !refused {
		t.admitted[tk.Class].Add(1)
		return
	}
	t.refused[tk.Class].Add(1)
	t.Settle(tk, true)
}

// Settle is Done without the table's counts (Counts: the L7 stage's
// requests), for a caller that counts its own: the rate-limit service
// (internal/l7/rls) shares the table, so a client's history is one, but
// reports its requests by class in its own metrics.
func (t *Table) Settle(tk Ticket, refused bool) {
	if !refused || int(tk.Class) >= NumClasses || tk.way < 0 {
		return
	}
	s := &t.sets[tk.set]
	now := t.clock.Now()
	s.mu.Lock()
	if e := &s.e[tk.way]; e.used && e.key == tk.key && !e.hasHistory {
		e.cleanSince = now
		e.refusedNew = e.refusedNew || tk.Class == New
	}
	s.mu.Unlock()
}

// Explanation is what the table knows of a client, and the class its
// next request would be charged as (edgectl explain).
type Explanation struct {
	// Tracked: the table holds the client; History: it has L7 history.
	Tracked, History bool
	// Standing is the data plane's, read now (StandingNone for a client
	// that is not the peer).
	Standing Standing
	// Learned: Usual and Clump are measured (else Budget is the default).
	Learned      bool
	Usual, Clump int64
	// InWindow are the client's requests in the current window, Budget
	// the most of them that keep the first rank.
	InWindow, Budget int64
	Window           time.Duration
	// Next is the class of the client's next request, were it now.
	Next Class
}

// Explain reports what the table knows of client a (peer as for
// Classify) without charging anything.
func (t *Table) Explain(a netip.Addr, peer bool) Explanation {
	cfg := t.cfg.Load()
	now := t.clock.Now()
	a = Key(a)
	key := a.As16()
	h := maphash.Comparable(t.seed, key)
	s := &t.sets[h&t.mask]
	s.mu.Lock()
	var e entry
	w := s.find(h|1, key)
	if w >= 0 {
		e = s.e[w]
	}
	s.mu.Unlock()
	x := Explanation{Tracked: w >= 0, Window: cfg.Window}
	if peer {
		x.Standing = t.read(a)
	}
	if w < 0 {
		e = entry{key: key, used: true, cleanSince: now, winStart: now}
	} else if gap := now - e.lastSeen; gap > int64(ForgetAfter) {
		e = entry{key: key, used: true, cleanSince: now, winStart: now}
	} else if !e.hasHistory && gap > int64(cfg.EstablishedAfter) {
		e.cleanSince = now
	}
	e.roll(now, int64(cfg.Window))
	x.InWindow = e.winCount
	e.winCount++
	if !e.hasHistory && now-e.cleanSince >= int64(cfg.EstablishedAfter) {
		e.hasHistory = true
	}
	x.History, x.Learned, x.Usual, x.Clump = e.hasHistory, e.learned, e.usual, e.clump
	x.Budget = cfg.DefaultUsualRate * int64(cfg.Window) / int64(time.Second)
	if e.learned {
		x.Budget = cfg.Headroom*e.usual + e.clump
	}
	x.Next = e.classify(x.Standing, cfg)
	return x
}

// Counts are the requests by class.
type Counts struct {
	Admitted, Refused [NumClasses]uint64
	// StandingReads are the data plane lookups (cache misses), failed
	// ones in StandingReadErrors; Untracked the requests of clients the
	// full table had no room for (classed as new).
	StandingReads, StandingReadErrors, Untracked uint64
}

// Counts returns the counters.
func (t *Table) Counts() Counts {
	var c Counts
	for i := range NumClasses {
		c.Admitted[i] = t.admitted[i].Load()
		c.Refused[i] = t.refused[i].Load()
	}
	c.StandingReads, c.StandingReadErrors, c.Untracked = t.reads.Load(), t.readErrors.Load(), t.untracked.Load()
	return c
}
