package daemon

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/metrics"
)

// xdpCollector is the data plane's collector, reading through the
// daemon (which knows interface and rule names).
func (d *Daemon) xdpCollector() prometheus.Collector {
	return metrics.NewXDPCollector(xdpSource{d}, d.log)
}

// xdpSource implements metrics.XDPSource over the daemon's maps.
type xdpSource struct{ d *Daemon }

func (s xdpSource) IfaceCounters() (map[string]maps.Counters, error) {
	slots, err := s.d.m.Counters.BySlot()
	if err != nil {
		return nil, err
	}
	s.d.mu.Lock()
	names := map[uint32]string{}
	for name, a := range s.d.atts {
		if a.Slot != 0 {
			names[a.Slot] = name
		}
	}
	s.d.mu.Unlock()
	out := map[string]maps.Counters{}
	for slot, c := range slots {
		name, ok := names[uint32(slot)]
		if !ok {
			// Slot 0, and slots of interfaces no longer attached.
			name = "other"
		}
		prev := out[name]
		for a := range c {
			for r := range c[a] {
				prev[a][r].Packets += c[a][r].Packets
				prev[a][r].Bytes += c[a][r].Bytes
			}
		}
		out[name] = prev
	}
	return out, nil
}

func (s xdpSource) RuleCounters() (map[string]maps.RuleCounters, error) {
	names := s.d.ruleNames()
	ids := make([]uint32, 0, len(names))
	for id := range names {
		ids = append(ids, id)
	}
	byID, err := s.d.m.Counters.Rules(ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]maps.RuleCounters, len(byID))
	for id, c := range byID {
		out[names[id]] = c
	}
	return out, nil
}

func (s xdpSource) Tables() (map[string]maps.Occupancy, error) { return s.d.m.Counters.Tables() }

func (s xdpSource) PolicyStatus() metrics.PolicyStatus {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return metrics.PolicyStatus{
		Generation:        s.d.generation,
		LastReloadSuccess: s.d.lastReload.OK,
		LastReloadTime:    s.d.lastReload.Time,
		Reloads:           s.d.reloads,
		ReloadFailures:    s.d.failures,
	}
}

func (s xdpSource) ClassCounters() (maps.ClassCounters, error)   { return s.d.m.Standing.ClassCounters() }
func (s xdpSource) StandingCounts() (maps.StandingCounts, error) { return s.d.m.Standing.Counts() }

func (s xdpSource) Congested() map[string]bool {
	out := map[string]bool{}
	for _, c := range s.d.standing.status(time.Now()) {
		out[c.Aggregate] = c.Congested
	}
	return out
}

func (s xdpSource) CongestedInstances() map[string]int {
	s.d.standing.mu.Lock()
	defer s.d.standing.mu.Unlock()
	return s.d.standing.inst.congestedByKind()
}
