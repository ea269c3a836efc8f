package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsAddr is where /metrics is served for policy next: the flag,
// else the policy's metrics.listen (read at start only).
func (d *Daemon) metricsAddr(next running) string {
	if d.opts.MetricsListen != "" {
		if d.opts.MetricsListen == "off" {
			return ""
		}
		return d.opts.MetricsListen
	}
	return next.pol.Metrics.Listen
}

// newRegistry makes the daemon's one metrics registry: Go runtime, process,
// the data plane's collector, and (registered by it) the L7 stage's.
func (d *Daemon) newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	reg.MustRegister(d.edgeguardCollectors()...)
	return reg
}

// edgeguardCollectors are the daemon's own collectors (the L7 stage
// registers its own on top).
func (d *Daemon) edgeguardCollectors() []prometheus.Collector {
	out := []prometheus.Collector{d.xdpCollector(), newV4DirectCollector(d), d.subFailures}
	out = append(out, d.controlCollectors()...)
	out = append(out, newSynCollector(d), fleetCollector{d})
	out = append(out, newShieldCollector(d)...)
	out = append(out, newSamplerCollector(d.samples), newBGPCollector(d))
	return append(out, d.capture.collectors()...)
}

// controlCollectors are the daemon's own families: which build runs, and
// how many interfaces the policy names go unprotected.
func (d *Daemon) controlCollectors() []prometheus.Collector {
	b := d.opts.Build
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "edgeguard_build_info",
		Help:        "Always 1; the labels say which build runs (commit empty when the build recorded none).",
		ConstLabels: prometheus.Labels{"version": b.Version, "commit": b.Commit, "goversion": b.GoVersion},
	})
	build.Set(1)
	return []prometheus.Collector{build, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "edgeguard_interfaces_unprotected",
		Help: "Interfaces the policy names that do not carry the program now (deleted, or re-created and not yet re-attached).",
	}, func() float64 {
		if d.dp == nil {
			return 0
		}
		return float64(len(d.unprotected()))
	}), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "edgeguard_state_unsaved",
		Help:        "1 while the run-time list entries in force are not those saved in the state directory (a restart would lose the difference); retried every 10 s.",
		ConstLabels: prometheus.Labels{"file": listsFile},
	}, func() float64 {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.lists.unsaved != nil {
			return 1
		}
		return 0
	}), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "edgeguard_state_save_failures_total",
		Help:        "Failed saves of the run-time list entries to the state directory (full, read-only, gone).",
		ConstLabels: prometheus.Labels{"file": listsFile},
	}, func() float64 {
		d.mu.Lock()
		defer d.mu.Unlock()
		return float64(d.lists.saveFailures)
	})}
}

func (d *Daemon) serveMetrics(ctx context.Context) error {
	ln := d.metricsLn
	if ln == nil {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{}))
	// /healthz: the daemon's process serves. /readyz: it also enforces,
	// i.e. every interface it attached to still exists under the same
	// index and carries its program; else 503 and what is wrong.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if problems := d.unprotected(); len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			for _, p := range problems {
				fmt.Fprintln(w, p)
			}
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(shut)
	}()
	d.log.Info("metrics listening", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
