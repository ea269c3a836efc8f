package control

// L7Status is the L7 stage in `edgectl status`: absent when the policy has
// no l7: section.
type L7Status struct {
	Engine   string   `json:"engine"` // event-loop or net-http, as serving
	Listen   string   `json:"listen"` // the bound address
	Upstream string   `json:"upstream"`
	Routes   []string `json:"routes"` // in match order
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
