package fleet

// HostDemand is one host's demand for one aggregate, as it published it.
type HostDemand struct {
	Host   string
	Demand float64 // offered packets/s: passed + dropped
	Bytes  float64 // the same packets' bytes/s
}

// byteDemands is others with each host's byte demand as its Demand: the
// byte dimension's shares are ShareOf of the byte budget and these.
func byteDemands(others []HostDemand) []HostDemand {
	out := make([]HostDemand, len(others))
	for i, o := range others {
		out[i] = HostDemand{Host: o.Host, Demand: o.Bytes}
	}
	return out
}

// ShareOf is this host's share of a fleet-wide budget (packets/s, or
// bytes/s with byte demands: the byte dimension is split the same way).
//
// Every one of the fleet's members hosts live hosts (heartbeats within a
// few intervals, this one included) is given a floor of floor × budget ÷
// hosts, so a host that suddenly sees traffic is not starved before its
// demand is known; what is left of the budget is split in proportion to
// demand among the hosts that published one (own demand is this host's
// fresh measurement, others' the last they published). With every host
// seeing the same demands the shares sum to exactly the budget; where
// they differ (a demand changed within the last interval) the sum moves by
// at most the change of one interval (docs/fleet.md, "Bounds"). Without
// any demand every host gets budget ÷ hosts.
//
// floor is a fraction in [0, 1); hosts is raised to the number of hosts
// that published a demand (plus this one) when the member list is shorter.
func ShareOf(budget, floor float64, hosts int, self string, own float64, others []HostDemand) float64 {
	if budget <= 0 {
		return 0
	}
	n := 1
	total := max(own, 0)
	for _, o := range others {
		if o.Host == self {
			continue
		}
		n++
		total += max(o.Demand, 0)
	}
	hosts = max(hosts, n)
	floor = min(max(floor, 0), 0.999)
	each := floor * budget / float64(hosts)
	if total <= 0 {
		return budget / float64(hosts)
	}
	rest := budget - each*float64(hosts)
	return each + rest*max(own, 0)/total
}

// StaticShare is the share while Redis cannot be reached: the budget ÷ the
// fleet size last seen (at least one host).
func StaticShare(budget float64, hosts int) float64 {
	return budget / float64(max(hosts, 1))
}
