package control

// L7Status is the L7 stage in `edgectl status`: absent when the policy has
// no l7: section.
type L7Status struct {
	Engine   string   `json:"engine"` // event-loop or net-http, as serving
	Listen   string   `json:"listen"` // the bound address
	Upstream string   `json:"upstream"`
	Routes   []string `json:"routes"` // in match order
	// AccessLogReopenFailed says when and why the last reopen of the
	// access log (SIGUSR1) failed: lines still go to the old file. ""
	// when it succeeded or none was asked for.
	AccessLogReopenFailed string `json:"access_log_reopen_failed,omitempty"`
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
