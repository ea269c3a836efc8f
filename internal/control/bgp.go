package control

import (
	"context"
	"net/http"
	"time"
)

// BGPReport is the answer of GET /v1/bgp (edgectl bgp list): the BGP
// speaker's sessions and announcements.
type BGPReport struct {
	Enabled          bool     `json:"enabled"` // the policy has a bgp: section
	DryRun           bool     `json:"dry_run"`
	LocalAS          uint32   `json:"local_as,omitempty"`
	RouterID         string   `json:"router_id,omitempty"`
	Community        string   `json:"community,omitempty"`
	MaxAnnouncements int      `json:"max_announcements,omitempty"`
	Destinations     []string `json:"destinations"`
	// OfferedBps is the host's offered rate (every packet the data plane
	// saw, bits per second, over the last second); UplinkBps is the
	// automatic blackhole's threshold (uplink x fraction), 0: none.
	OfferedBps    float64           `json:"offered_bps"`
	UplinkBps     float64           `json:"threshold_bps,omitempty"`
	Peers         []BGPPeer         `json:"peers"`
	Announcements []BGPAnnouncement `json:"announcements"`
	Error         string            `json:"error,omitempty"` // why the configured speaker is not running
}

// BGPPeer is one session.
type BGPPeer struct {
	Address  string    `json:"address"`
	AS       uint32    `json:"as"`
	State    string    `json:"state"`
	Uptime   time.Time `json:"established_since,omitzero"`
	Families []string  `json:"families"`
	// Received are the routes the peer sent; Accepted those kept (0: the
	// speaker uses none).
	Received uint64 `json:"received"`
	Accepted uint64 `json:"accepted"`
}

// BGPAnnouncement is one route the speaker holds.
type BGPAnnouncement struct {
	ID      uint64    `json:"id"`
	Kind    string    `json:"kind"`   // blackhole, flowspec
	Route   string    `json:"route"`  // the prefix, or the FlowSpec components
	Action  string    `json:"action"` // community 65535:666, discard, rate N B/s
	Origin  string    `json:"origin"` // shield, uplink, cli
	Reason  string    `json:"reason"`
	By      string    `json:"by,omitempty"`
	Since   time.Time `json:"since"`
	Expires time.Time `json:"expires"`
	State   string    `json:"state"` // announced, dry-run, failed
	Error   string    `json:"error,omitempty"`
}

// BGPRequest is the body of POST /v1/bgp/{blackhole,flowspec,withdraw}.
type BGPRequest struct {
	Prefix   string       `json:"prefix,omitempty"` // blackhole: an address or prefix
	FlowSpec *BGPFlowSpec `json:"flowspec,omitempty"`
	TTL      Duration     `json:"ttl,omitempty"` // blackhole, flowspec: 0 is bgp.blackhole.ttl
	Reason   string       `json:"reason,omitempty"`
	ID       uint64       `json:"id,omitempty"`  // withdraw
	All      bool         `json:"all,omitempty"` // withdraw every announcement
	By       string       `json:"by,omitempty"`
}

// BGPFlowSpec is an operator's FlowSpec rule: Dst is required, empty
// fields match anything.
type BGPFlowSpec struct {
	Dst      string `json:"dst"`
	Src      string `json:"src,omitempty"`
	Proto    string `json:"proto,omitempty"` // tcp, udp, icmp, icmpv6 or a number
	DPort    uint16 `json:"dport,omitempty"`
	SPort    uint16 `json:"sport,omitempty"`
	Length   uint16 `json:"length,omitempty"`    // IP total length (IPv6: 40 + payload)
	TCPFlags string `json:"tcp_flags,omitempty"` // exact flags, 0x02 or 2
	Fragment string `json:"fragment,omitempty"`
	Rate     string `json:"rate,omitempty"` // traffic-rate (bytes or bits per second); empty: discard
}

// BGP returns the speaker's report.
func (c *Client) BGP(ctx context.Context) (BGPReport, error) {
	var r BGPReport
	return r, c.do(ctx, http.MethodGet, "/v1/bgp", nil, nil, &r)
}

// BGPDo sends a blackhole or withdraw request.
func (c *Client) BGPDo(ctx context.Context, verb string, req BGPRequest) (BGPReport, error) {
	var r BGPReport
	return r, c.do(ctx, http.MethodPost, "/v1/bgp/"+verb, nil, req, &r)
}
