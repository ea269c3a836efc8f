package control

import (
	"context"
	"net/http"
	"time"
)

// FleetStatus is `edgectl fleet status` (docs/fleet.md).
type FleetStatus struct {
	// Enabled is false when the policy has no fleet: section.
	Enabled  bool     `json:"enabled"`
	Name     string   `json:"name,omitempty"`
	Host     string   `json:"host,omitempty"`
	Interval Duration `json:"interval,omitzero"`
	// RedisUp says the last sync reached Redis; while it is false the
	// host enforces static shares (Fallback).
	RedisUp  bool      `json:"redis_up"`
	Fallback bool      `json:"fallback"`
	LastSync time.Time `json:"last_sync,omitzero"`
	// Syncs counts this fleet's share syncs (one per interval, ok or
	// failed) since it started: with LastSync, the daemon's own clock of
	// when its shares changed (a poller that misses a sync sees the count
	// jump).
	Syncs     uint64 `json:"syncs"`
	LastError string `json:"last_error,omitempty"`
	// Members are the hosts whose heartbeat is fresh (this one included).
	Members []FleetMember `json:"members,omitempty"`
	// Shares are this host's shares of the busiest scope: fleet
	// aggregates, by fleet demand.
	Shares []FleetShare `json:"shares,omitempty"`
	// ActiveAggregates counts the fleet-scope aggregates this host
	// publishes (Shares shows the top ones).
	ActiveAggregates int       `json:"active_aggregates"`
	Lists            FleetList `json:"lists"`
}

// FleetMember is one host of the fleet.
type FleetMember struct {
	Host     string    `json:"host"`
	LastSeen time.Time `json:"last_seen"`
}

// FleetShare is this host's share of one fleet-wide aggregate budget.
type FleetShare struct {
	Aggregate string `json:"aggregate"` // with the rule's name: "rule bots asn 64500"
	// Key is the aggregate as the fleet shares it in Redis, by rule id:
	// "rule 3524799594 asn 64500".
	Key string `json:"key,omitempty"`
	// Budget is the policy's budget (packets/s); Share is this host's part
	// of it, Fraction = Share / Budget.
	Budget   float64 `json:"budget_pps"`
	Share    float64 `json:"share_pps"`
	Fraction float64 `json:"fraction"`
	// Demand is this host's offered rate (passed + dropped, packets/s),
	// FleetDemand the sum over the hosts that published one.
	Demand      float64 `json:"demand_pps"`
	FleetDemand float64 `json:"fleet_demand_pps"`
	// The byte dimension of a rule with a bytes budget, in bytes/s (the
	// packets' frame lengths, as the buckets count them); absent without.
	ByteBudget      float64 `json:"budget_bytes_per_s,omitempty"`
	ByteShare       float64 `json:"share_bytes_per_s,omitempty"`
	ByteDemand      float64 `json:"demand_bytes_per_s,omitempty"`
	FleetByteDemand float64 `json:"fleet_demand_bytes_per_s,omitempty"`
	Hosts           int     `json:"hosts"`
	// Static: Redis is unreachable and the share is budget ÷ hosts.
	Static bool `json:"static,omitempty"`
}

// FleetList is the shared lists' state.
type FleetList struct {
	Enabled bool `json:"enabled"`
	// Synced: the snapshot was loaded and the stream is being followed.
	Synced     bool      `json:"synced"`
	LastChange time.Time `json:"last_change,omitzero"`
	// Lag is the delay between another host publishing its last change
	// and this host applying it (includes clock skew between the hosts).
	Lag       Duration `json:"lag"`
	Published uint64   `json:"published"`
	Applied   uint64   `json:"applied"`
	Refused   uint64   `json:"refused"`
	Malformed uint64   `json:"malformed"`
	Remote    int      `json:"remote_entries"`
}

// FleetStatus asks for the fleet state.
func (c *Client) FleetStatus(ctx context.Context) (FleetStatus, error) {
	var st FleetStatus
	err := c.do(ctx, http.MethodGet, "/v1/fleet", nil, nil, &st)
	return st, err
}
