package daemon

import "github.com/prometheus/client_golang/prometheus"

// registerXDP registers the data plane's collector. (Filled in once
// internal/metrics lands.)
func (d *Daemon) registerXDP(reg *prometheus.Registry) {}
