// Package bgp is Edgeguard's BGP speaker (docs/bgp.md): it asks the
// upstream routers for help when a flood is larger than the host's
// uplink, with remotely triggered blackhole routes (RTBH, RFC 7999) and
// FlowSpec rules (RFC 8955, IPv6 RFC 8956). The BGP itself is GoBGP's (as
// a library); this package holds the announcements with their origin,
// reason and expiry, the guards (forbidden prefixes, at most N, widths,
// dry run) and the translation into BGP paths.
package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// Family is an address family a session carries.
type Family string

// Families.
const (
	IPv4Unicast  Family = "ipv4-unicast"
	IPv6Unicast  Family = "ipv6-unicast"
	IPv4FlowSpec Family = "ipv4-flowspec"
	IPv6FlowSpec Family = "ipv6-flowspec"
)

// Families are every family, in the order docs list them.
var Families = []Family{IPv4Unicast, IPv6Unicast, IPv4FlowSpec, IPv6FlowSpec}

// BlackholeCommunity is RFC 7999's BLACKHOLE community, 65535:666.
const BlackholeCommunity uint32 = 65535<<16 | 666

// Config is the speaker's configuration: the policy's bgp: section as
// it is (its neighbors' sessions are always opened by us: the speaker
// listens on no port), with what the daemon adds to it: the neighbors'
// secrets, read from their password files, and the guards.
type Config struct {
	policy.BGP
	// Passwords are the neighbors' TCP MD5 (RFC 2385) secrets, by index
	// in Neighbors; "" (or none): no secret.
	Passwords []string
	// Guards are prefixes never announced, nor matched by a FlowSpec
	// rule's source or destination: the operator's forbidden, allowed
	// and protected prefixes (policy.BGPGuarded).
	Guards []policy.BGPGuard
}

// password is neighbor i's secret ("" none).
func (c Config) password(i int) string {
	if i < len(c.Passwords) {
		return c.Passwords[i]
	}
	return ""
}

// SessionEqual reports whether two configurations open the same
// sessions (a change elsewhere needs no new sessions).
func (c Config) SessionEqual(o Config) bool {
	if c.LocalAS != o.LocalAS || c.RouterID != o.RouterID || len(c.Neighbors) != len(o.Neighbors) {
		return false
	}
	for i, n := range c.Neighbors {
		m := o.Neighbors[i]
		if n.Address != m.Address || n.AS != m.AS || c.password(i) != o.password(i) || n.Multihop != m.Multihop ||
			n.LocalAddress != m.LocalAddress || !slices.Equal(n.Families, m.Families) {
			return false
		}
	}
	return true
}

// Kind is what an announcement asks of the routers.
type Kind string

// Kinds.
const (
	Blackhole Kind = "blackhole" // a unicast route with the blackhole community
	FlowSpec  Kind = "flowspec"  // a FlowSpec rule: discard or rate-limit matching traffic
)

// Match are a FlowSpec rule's components. Zero fields match anything;
// Dst is required.
type Match struct {
	Dst   netip.Prefix `json:"dst"`
	Src   netip.Prefix `json:"src,omitzero"`
	Proto uint8        `json:"proto,omitempty"`
	DPort uint16       `json:"dport,omitempty"`
	SPort uint16       `json:"sport,omitempty"`
	// Len is the IP packet's total length (IPv4) as the shield measures
	// it; for IPv6 the rule carries Len-40 (RFC 8956: the length after
	// the fixed IPv6 header).
	Len uint16 `json:"len,omitempty"`
	// TCPFlags, when HasTCPFlags, matches exactly these flags set and
	// every other flag clear.
	TCPFlags    uint8 `json:"tcp_flags,omitempty"`
	HasTCPFlags bool  `json:"has_tcp_flags,omitempty"`
	// Fragment: "" (any), "not-a-fragment", "is-fragment",
	// "first-fragment", "last-fragment", "dont-fragment".
	Fragment string `json:"fragment,omitempty"`
}

func (m Match) String() string {
	parts := []string{"dst " + m.Dst.String()}
	if m.Src.IsValid() {
		parts = append(parts, "src "+m.Src.String())
	}
	if m.Proto != 0 {
		parts = append(parts, "proto "+strconv.Itoa(int(m.Proto)))
	}
	if m.DPort != 0 {
		parts = append(parts, "dport "+strconv.Itoa(int(m.DPort)))
	}
	if m.SPort != 0 {
		parts = append(parts, "sport "+strconv.Itoa(int(m.SPort)))
	}
	if m.Len != 0 {
		parts = append(parts, "len "+strconv.Itoa(int(m.Len)))
	}
	if m.HasTCPFlags {
		parts = append(parts, fmt.Sprintf("tcp_flags 0x%02x", m.TCPFlags))
	}
	if m.Fragment != "" {
		parts = append(parts, "fragment "+m.Fragment)
	}
	return strings.Join(parts, " ")
}

// Announcement is one route the speaker holds: what, why, whose, until
// when.
type Announcement struct {
	ID     uint64       `json:"id"`
	Kind   Kind         `json:"kind"`
	Prefix netip.Prefix `json:"prefix,omitzero"` // blackhole
	Match  *Match       `json:"match,omitempty"` // flowspec
	// RateBytes is a FlowSpec rule's traffic-rate in bytes per second;
	// 0 is discard.
	RateBytes float64 `json:"rate_bytes,omitempty"`
	// Origin is who decided it: "shield", "uplink" (the automatic RTBH)
	// or "cli".
	Origin string `json:"origin"`
	Reason string `json:"reason"`
	By     string `json:"by,omitempty"`
	// Ref ties it to what it follows (a shield action): its withdrawal
	// follows that one's.
	Ref     string    `json:"ref,omitempty"`
	Since   time.Time `json:"since"`
	Expires time.Time `json:"expires"`
	// State: "announced", "dry-run" (logged, not announced) or
	// "failed" (GoBGP refused the path; Error says why).
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}

// Route is the announcement's route as a router shows it.
func (a Announcement) Route() string {
	if a.Kind == Blackhole {
		return a.Prefix.String()
	}
	if a.Match == nil {
		return "flowspec"
	}
	return a.Match.String()
}

// ActionString is what the routers are asked to do.
func (a Announcement) ActionString(community uint32) string {
	if a.Kind == Blackhole {
		return "community " + FormatCommunity(community)
	}
	if a.RateBytes == 0 {
		return "discard"
	}
	return fmt.Sprintf("rate %.0f B/s", a.RateBytes)
}

// key identifies the route: one announcement per route.
func (a Announcement) key() string { return string(a.Kind) + " " + a.Route() }

// Announcement states.
const (
	StateAnnounced = "announced"
	StateDryRun    = "dry-run"
	StateFailed    = "failed"
)

// Errors callers branch on.
var (
	// ErrRefused: a guard refused the announcement.
	ErrRefused = errors.New("refused")
	// ErrNotFound: no such announcement.
	ErrNotFound = errors.New("no such announcement")
)

// FormatCommunity writes "65535:666".
func FormatCommunity(c uint32) string { return fmt.Sprintf("%d:%d", c>>16, c&0xffff) }
