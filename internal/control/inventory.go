package control

import (
	"context"
	"net/http"
	"net/netip"
	"time"
)

// Inventory is everything installed in the data plane that decides
// packets beside the policy's rules, read from its pinned maps: list
// entries, override parts, fingerprints and their mask slots (`edgectl
// show`).
type Inventory struct {
	Read         time.Time               `json:"read"`
	Lists        []InventoryList         `json:"lists"`
	Overrides    []InventoryOverride     `json:"overrides"`
	Fingerprints []InventoryFingerprint  `json:"fingerprints"`
	Masks        []InventoryFingerprintM `json:"fingerprint_masks"`
	BGP          []InventoryBGP          `json:"bgp"`
}

// InventoryBGP is one announcement of the BGP speaker: a blackhole or a
// FlowSpec rule Edgeguard asked the routers to install.
type InventoryBGP struct {
	BGPAnnouncement
	Remove string `json:"remove"`
}

// InventoryList is one part (deny or allow) of a lists-trie entry.
type InventoryList struct {
	List    ListKind     `json:"list"`
	Prefix  netip.Prefix `json:"prefix"`
	Origin  string       `json:"origin"`            // policy, cli, l7, shield, fleet
	Expires *time.Time   `json:"expires,omitempty"` // nil: never
	Remove  string       `json:"remove"`            // the command that removes it
}

// InventoryOverride is one part of an aggregate override.
type InventoryOverride struct {
	Aggregate string     `json:"aggregate"` // "rule 3 asn 64500", "global"
	Rule      string     `json:"rule,omitempty"`
	Part      string     `json:"part"`   // budget (replaces the policy's) or new_source
	Origin    string     `json:"origin"` // shield (tighten), fleet (share), cli
	Expires   *time.Time `json:"expires,omitempty"`
	Limit     string     `json:"limit"`
	// Passed and Dropped count the aggregate's packets since the data
	// plane began counting it (watched aggregates only).
	Passed  *Counter `json:"passed,omitempty"`
	Dropped *Counter `json:"dropped,omitempty"`
	Remove  string   `json:"remove"`
}

// InventoryFingerprint is one fingerprint rule with its counters.
type InventoryFingerprint struct {
	ID      uint32     `json:"id"`
	Match   string     `json:"match"`
	Slot    int        `json:"mask_slot"`
	Origin  string     `json:"origin"`
	Expires *time.Time `json:"expires,omitempty"`
	Limit   string     `json:"limit"` // "" : every match is refused
	DryRun  bool       `json:"dry_run,omitempty"`
	Matched Counter    `json:"matched"`
	Dropped Counter    `json:"dropped"`
	Spared  Counter    `json:"spared"`
	Remove  string     `json:"remove"`
}

// InventoryFingerprintM is a fingerprint mask slot in use.
type InventoryFingerprintM struct {
	Slot         int    `json:"slot"`
	Fields       string `json:"fields"`
	SrcLen       int    `json:"src_len,omitempty"`
	Fingerprints int    `json:"fingerprints"`
}

// Counter is packets and bytes.
type Counter struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// RemoveRequest removes one inventory entry: an override's parts of one
// origin (Aggregate, Origin), a fingerprint (ID) or a BGP announcement
// (Announcement: withdrawn, as edgectl bgp withdraw does).
type RemoveRequest struct {
	Kind      string `json:"kind"` // override, fingerprint or bgp
	Aggregate string `json:"aggregate,omitempty"`
	Origin    string `json:"origin,omitempty"`
	ID        uint32 `json:"id,omitempty"`
	// Announcement is the BGP announcement's id (edgectl bgp list).
	Announcement uint64 `json:"announcement,omitempty"`
	By           string `json:"by,omitempty"`
}

// RemoveResult says what a removal did.
type RemoveResult struct {
	Removed string `json:"removed"`
	Note    string `json:"note,omitempty"`
}

// Inventory reads the data plane's installed entries.
func (c *Client) Inventory(ctx context.Context) (Inventory, error) {
	var inv Inventory
	return inv, c.do(ctx, http.MethodGet, "/v1/dataplane", nil, nil, &inv)
}

// Remove removes one inventory entry.
func (c *Client) Remove(ctx context.Context, req RemoveRequest) (RemoveResult, error) {
	var r RemoveResult
	return r, c.do(ctx, http.MethodPost, "/v1/dataplane/remove", nil, req, &r)
}
