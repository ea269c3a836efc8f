package control

import (
	"context"
	"net/url"
)

// L7Status is the L7 stage in `edgectl status`: absent when the policy has
// no l7: section.
type L7Status struct {
	Engine   string   `json:"engine"` // event-loop or net-http, as serving
	Listen   string   `json:"listen"` // the bound address
	Upstream string   `json:"upstream"`
	Routes   []string `json:"routes"` // in match order
	// RLS are the rate-limit service's bound addresses by kind (grpc,
	// grpc+tls, unix, http); empty when it is off.
	RLS map[string]string `json:"rls,omitempty"`
	// AccessLogReopenFailed says when and why the last reopen of the
	// access log (SIGUSR1) failed: lines still go to the old file. ""
	// when it succeeded or none was asked for.
	AccessLogReopenFailed string `json:"access_log_reopen_failed,omitempty"`
	// Classes are the requests by client class since the daemon started
	// (docs/operations.md, "Class ranking at L7"); nil while l7.classes is
	// disabled.
	Classes []L7ClassStat `json:"classes,omitempty"`
}

// L7ClassStat is one client class's requests: admitted (passed to the
// upstream) and refused (429, 503).
type L7ClassStat struct {
	Class    string `json:"class"`
	Admitted uint64 `json:"admitted"`
	Refused  uint64 `json:"refused"`
}

// L7RouteStat is one route's request counts by decision in `edgectl stats`,
// since the L7 stage's last reload (a change of the l7: section starts them
// at zero). Route is a route name, "(unmatched)" or "(exempt)".
type L7RouteStat struct {
	Route     string `json:"route"`
	Allowed   int64  `json:"allowed"`
	Limited   int64  `json:"limited"`
	Shed      int64  `json:"shed"`
	Escalated int64  `json:"escalated"`
}

// RLSExplanation is `edgectl l7 explain`: what the rate-limit service
// would answer now for a domain and descriptors, charging nothing.
type RLSExplanation struct {
	Domain  string `json:"domain"`
	Allowed bool   `json:"allowed"` // every local limit has room (redis limits are not read)
	// Class is the class the client's next request would be charged as
	// (its first remote_address; "" when the request is not ranked:
	// l7.classes off, no remote_address or no rule matched). Outside the
	// first class (established, authenticated) a limit's reserve is not
	// the request's.
	Class       string                 `json:"class,omitempty"`
	Client      string                 `json:"client,omitempty"`
	Descriptors []RLSDescriptorExplain `json:"descriptors"`
}

// RLSDescriptorExplain is one descriptor's rule, tier, key and limits.
type RLSDescriptorExplain struct {
	Entries string            `json:"entries"` // k=v, k=v
	Rule    string            `json:"rule"`    // "" when no rule matches (not limited)
	Tier    string            `json:"tier,omitempty"`
	Key     string            `json:"key,omitempty"`
	Limits  []RLSLimitExplain `json:"limits,omitempty"`
}

// RLSLimitExplain is one limit's state for a descriptor.
type RLSLimitExplain struct {
	Name      string   `json:"name"`
	Rate      string   `json:"rate"` // count/window
	Backend   string   `json:"backend"`
	Shadow    bool     `json:"shadow,omitempty"`
	Read      bool     `json:"read"` // false: kept in Redis, not read by explain
	Allowed   bool     `json:"allowed"`
	Remaining int64    `json:"remaining"`
	Reserve   int64    `json:"reserve,omitempty"` // units only the first class may use
	Reset     Duration `json:"reset"`
	Retry     Duration `json:"retry_after,omitempty"`
}

// ExplainRLS asks the daemon what the rate-limit service would answer for
// domain and descriptors (each "k=v,k=v").
func (c *Client) ExplainRLS(ctx context.Context, domain string, descriptors []string) (RLSExplanation, error) {
	var e RLSExplanation
	v := url.Values{"domain": {domain}, "descriptor": descriptors}
	return e, c.do(ctx, "GET", "/v1/l7/rls/explain", v, nil, &e)
}
