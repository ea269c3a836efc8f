// Package control is the daemon's control API: the JSON types exchanged over
// its Unix socket and the client the CLI uses. The socket is root-only.
package control

import (
	"net/netip"
	"time"

	"github.com/edgeguard/edgeguard/internal/version"
)

// DefaultSocket is where the daemon listens.
const DefaultSocket = "/run/edgeguard/edgeguard.sock"

// Error is the body of every non-2xx answer.
type Error struct {
	Error    string   `json:"error"`
	Problems []string `json:"problems,omitempty"` // file:line:column: message
}

// Status describes the running daemon.
type Status struct {
	Version string `json:"version"`
	Policy  string `json:"policy"` // file path or built-in name
	// PolicyOrigin says why that policy runs: the config file, the
	// built-in one, or one applied with 'edgectl policy apply'.
	PolicyOrigin string      `json:"policy_origin,omitempty"`
	Generation   uint64      `json:"generation"`
	DataGen      uint32      `json:"dataplane_generation"` // 0 or 1: the live half
	LastReload   ReloadInfo  `json:"last_reload"`
	Mode         string      `json:"mode"`
	Clock        string      `json:"clock"` // the policy's clock: precise or coarse
	Interfaces   []Interface `json:"interfaces"`
	ProgramID    uint32      `json:"program_id"`
	Maps         []MapInfo   `json:"maps"`
	PinDir       string      `json:"pin_dir"`
	ASNEntries   int         `json:"asn_entries"`
	IPv4Direct   IPv4Direct  `json:"ipv4_direct_table"`
	StateDir     string      `json:"state_dir,omitempty"`
	// Started is when the daemon started; UptimeSeconds is since then.
	Started       time.Time    `json:"started,omitzero"`
	UptimeSeconds int64        `json:"uptime_seconds,omitempty"`
	MetricsAddr   string       `json:"metrics_addr,omitempty"` // "" when metrics are off
	Build         version.Info `json:"build"`
	L7            *L7Status    `json:"l7,omitempty"` // nil: no L7 stage
	// Congestion is each aggregate kind's congestion state.
	Congestion []Congestion `json:"congestion,omitempty"`
	// CongestedInstances are the single aggregates refusing sources now.
	CongestedInstances []CongestedInstance `json:"congested_instances,omitempty"`
	// StateNotSaved, when set, says the run-time list entries in force
	// differ from those saved in the state directory (why, since when): a
	// restart would lose the difference. The daemon retries every 10 s.
	StateNotSaved string `json:"state_not_saved,omitempty"`
}

// IPv4Direct says how the active policy generation looks IPv4 sources up:
// in the IPv4 direct table (a few array loads) or, when the policy has few
// IPv4 prefix facts or its table does not fit the budget, in the prefix
// trie (the same answers, slower per packet with many facts).
type IPv4Direct struct {
	InUse          bool   `json:"in_use"`
	IPv4Facts      int    `json:"ipv4_facts"`       // IPv4 prefix facts of the generation
	Chunks         int    `json:"chunks"`           // chunks the table uses; 0 when not in use
	CapacityChunks int    `json:"capacity_chunks"`  // budget per generation, fixed at load
	OverBudget     bool   `json:"over_budget"`      // a table was wanted but needs more than the budget
	Reason         string `json:"reason,omitempty"` // why the trie is used, when not in use
}

// ReloadInfo is the outcome of the last policy load.
type ReloadInfo struct {
	Time    time.Time `json:"time"`
	OK      bool      `json:"ok"`
	Error   string    `json:"error,omitempty"`
	Trigger string    `json:"trigger"` // start, sighup, file-change, api
	// Problems are the parts (syn, l7, shield, fleet, bgp) that did not
	// follow an applied policy, each with why; the policy applied and
	// each of them kept what it ran.
	Problems []string `json:"problems,omitempty"`
}

// Interface is one attachment.
type Interface struct {
	Name    string `json:"name"`
	Ifindex int    `json:"ifindex"`
	XDPMode string `json:"xdp_mode"`
	// Problem, when set, says why the interface is not protected now
	// (gone, re-created, renamed away, its program removed): the same
	// as /readyz.
	Problem string `json:"problem,omitempty"`
}

// MapInfo is one map's identity and fill.
type MapInfo struct {
	Name     string `json:"name"`
	ID       uint32 `json:"id"`
	Entries  int    `json:"entries,omitempty"`
	Capacity int    `json:"capacity"`
}

// Stats are totals and recent rates.
type Stats struct {
	Window Duration        `json:"window"` // rates are averaged over this
	Totals []CounterStat   `json:"totals"` // by action and reason, non-zero only
	Rules  []RuleStat      `json:"rules"`
	Tables map[string]Fill `json:"tables"`
	// Standing: congestion and class counters (internal/control/standing.go).
	Standing *StandingStats `json:"standing,omitempty"`
	SYN      *SYNStats      `json:"syn,omitempty"` // the SYN path (syn.go); nil before it loads
	L7       []L7RouteStat  `json:"l7,omitempty"`  // nil: no L7 stage
	// L7Classes are the L7 stage's requests by client class (nil: no L7
	// stage, or l7.classes disabled).
	L7Classes []L7ClassStat `json:"l7_classes,omitempty"`
	// Sampler: the 1-in-N sampler (shield.go); nil without a data plane.
	Sampler *SamplerStats `json:"sampler,omitempty"`
}

// Fill is a table's occupancy.
type Fill struct {
	Entries  int `json:"entries"`
	Capacity int `json:"capacity"`
}

// CounterStat is one (action, reason) counter.
type CounterStat struct {
	Action     string  `json:"action"`
	Reason     string  `json:"reason"`
	Packets    uint64  `json:"packets"`
	Bytes      uint64  `json:"bytes"`
	PacketRate float64 `json:"packets_per_second"`
	ByteRate   float64 `json:"bytes_per_second"`
}

// RuleStat is one rule's counters.
type RuleStat struct {
	Rule          string  `json:"rule"`
	ID            uint32  `json:"id"`
	Passed        uint64  `json:"passed_packets"`
	Dropped       uint64  `json:"dropped_packets"`
	WouldDrop     uint64  `json:"would_drop_packets"`
	PassedRate    float64 `json:"passed_per_second"`
	DroppedRate   float64 `json:"dropped_per_second"`
	WouldDropRate float64 `json:"would_drop_per_second"`
}

// Top lists the heaviest sources, prefixes, ASNs, reasons and rules seen
// in the data plane's samples, each row one (key, action): drops and a
// dry-run rule's would-drops apart. Counts are samples, not packets: the
// data plane sends at most its sample budget per second, so shares are
// exact only while drops stay under that budget.
type Top struct {
	Window   Duration   `json:"window"`
	Samples  uint64     `json:"samples"`
	Sources  []TopEntry `json:"sources"`
	Prefixes []TopEntry `json:"prefixes"`
	ASNs     []TopEntry `json:"asns"`
	Reasons  []TopEntry `json:"reasons"` // Key: the verdict's reason (source_limit, deny_list, ...)
	Rules    []TopEntry `json:"rules"`   // Key: the rule's name
}

// TopEntry is one talker.
type TopEntry struct {
	Key string `json:"key"`
	// Action is the verdict the samples recorded: drop, or would_drop for
	// a rule in dry-run mode (never counted as a drop).
	Action  string  `json:"action"`
	Samples uint64  `json:"samples"`
	Share   float64 `json:"share"` // of all samples in the window
}

// ListKind is deny or allow.
type ListKind string

// List kinds.
const (
	Deny  ListKind = "deny"
	Allow ListKind = "allow"
)

// ListEntry is one deny or allow entry as the operator sees it.
type ListEntry struct {
	Prefix  netip.Prefix `json:"prefix"`
	Origin  string       `json:"origin"` // policy, cli, l7, fleet
	Reason  string       `json:"reason,omitempty"`
	Expires *time.Time   `json:"expires,omitempty"`
	// Host is the fleet host that added an entry of origin fleet.
	Host string `json:"host,omitempty"`
	// NotSaved, in the answer to an add or a remove only, says the change
	// is in force in the data plane but could not be saved to the state
	// directory (why): a restart forgets it (an added entry is gone, a
	// removed one back).
	NotSaved string `json:"not_saved,omitempty"`
}

// ListChange adds an entry.
type ListChange struct {
	Prefix netip.Prefix `json:"prefix"`
	TTL    Duration     `json:"ttl,omitempty"` // 0: until removed
	Reason string       `json:"reason,omitempty"`
	Origin string       `json:"origin,omitempty"` // cli (default) or l7
	// Force adds a cli entry wider than the daemon's bound (IPv4 /16,
	// IPv6 /32) or overlapping the policy's lists.protected prefixes.
	Force bool `json:"force,omitempty"`
}

// PolicyDoc is a policy file's text.
type PolicyDoc struct {
	Source     string `json:"source"`
	Generation uint64 `json:"generation"`
	YAML       string `json:"yaml"`
}

// PolicyChange is the answer to a diff or an apply.
type PolicyChange struct {
	Diff       string `json:"diff"`
	Changes    int    `json:"changes"` // lines of Diff; 0: the policy is the running one
	Warning    string `json:"warning,omitempty"`
	Applied    bool   `json:"applied"`
	Generation uint64 `json:"generation"`
}

// ASNInfo answers an ASN lookup.
type ASNInfo struct {
	IP      netip.Addr   `json:"ip"`
	Found   bool         `json:"found"`
	Prefix  netip.Prefix `json:"prefix,omitempty"`
	ASN     uint32       `json:"asn,omitempty"`
	Country string       `json:"country,omitempty"`
	// Rule is empty when a list decides (List: deny or allow) before
	// any rule.
	Rule string `json:"rule"`
	List string `json:"list,omitempty"`
}

// Duration is a time.Duration that reads and writes as "1m30s" in JSON.
type Duration time.Duration

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}
