package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// v4DirectCollector exports how the active policy generation answers IPv4
// sources: through the IPv4 direct table or the prefix trie, the table's
// chunks and its budget. It reads what the last successful apply reported
// (maps.V4Direct), not the maps: the chunk count exists only in the build
// that wrote them, and every generation the data plane runs was made live
// by an apply of this daemon (the first at start, pins or not).
type v4DirectCollector struct {
	d *Daemon

	inUse, overBudget, chunks, capacity *prometheus.Desc
}

func newV4DirectCollector(d *Daemon) *v4DirectCollector {
	return &v4DirectCollector{
		d: d,
		inUse: prometheus.NewDesc("edgeguard_ipv4_direct_table_in_use",
			"1: the active policy generation looks IPv4 sources up in the IPv4 direct table; 0: in the prefix trie.", nil, nil),
		overBudget: prometheus.NewDesc("edgeguard_ipv4_direct_table_over_budget",
			"1: the active policy generation wanted an IPv4 direct table but it needs more chunks than the budget, "+
				"so IPv4 sources use the prefix trie (slower per packet).", nil, nil),
		chunks: prometheus.NewDesc("edgeguard_ipv4_direct_table_chunks",
			"Chunks (16 entries, 128 bytes) the generation's IPv4 direct table uses; 0 without a table.",
			[]string{"generation"}, nil),
		capacity: prometheus.NewDesc("edgeguard_ipv4_direct_table_capacity_chunks",
			"Chunk budget of the IPv4 direct table per policy generation, fixed at load time "+
				"(policy tables.ipv4_direct_chunks or edgectl run --ipv4-direct-chunks).", nil, nil),
	}
}

func (c *v4DirectCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inUse
	ch <- c.overBudget
	ch <- c.chunks
	ch <- c.capacity
}

func (c *v4DirectCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.d.v4DirectStatus()
	if !ok {
		return
	}
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	gauge(c.inUse, b2i(st.InUse))
	gauge(c.overBudget, b2i(st.OverBudget))
	gauge(c.chunks, st.Chunks, "active")
	gauge(c.capacity, st.CapacityChunks)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// v4DirectStatus is how the active generation answers IPv4 sources, as
// the operator sees it; false before the first apply.
func (d *Daemon) v4DirectStatus() (control.IPv4Direct, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil || d.generation == 0 {
		return control.IPv4Direct{}, false
	}
	return ipv4DirectInfo(d.m.Generations.V4Direct()), true
}

// ipv4DirectInfo converts the data plane's report for the control API:
// chunks are those written, so 0 when the trie is used (maps reports a
// table over budget as budget+1 chunks, which were never written).
func ipv4DirectInfo(st maps.V4DirectStatus) control.IPv4Direct {
	out := control.IPv4Direct{
		InUse: st.Used, IPv4Facts: st.Facts, CapacityChunks: st.Capacity,
		OverBudget: !st.Used && st.Chunks > st.Capacity,
	}
	if st.Used {
		out.Chunks = st.Chunks
	} else {
		out.Reason = st.Reason
	}
	return out
}
