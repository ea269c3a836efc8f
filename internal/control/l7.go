package control

// L7Status is the L7 stage in `edgectl status`: absent when the policy has
// no l7: section.
type L7Status struct {
	Engine   string   `json:"engine"` // event-loop or net-http, as serving
	Listen   string   `json:"listen"` // the bound address
	Upstream string   `json:"upstream"`
	Routes   []string `json:"routes"` // in match order
}
