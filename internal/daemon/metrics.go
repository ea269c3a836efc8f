package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsListen is where /metrics is served: the flag, else the policy.
func (d *Daemon) metricsListen() string {
	if d.opts.MetricsListen != "" {
		if d.opts.MetricsListen == "off" {
			return ""
		}
		return d.opts.MetricsListen
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cur.pol.Metrics.Listen
}

// newRegistry makes the daemon's one metrics registry: Go runtime, process,
// the data plane's collector, and (registered by it) the L7 stage's.
func (d *Daemon) newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	d.registerXDP(reg)
	reg.MustRegister(newV4DirectCollector(d))
	reg.MustRegister(newSynCollector(d))
	return reg
}

func (d *Daemon) serveMetrics(ctx context.Context) error {
	addr := d.metricsListen()
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{}))
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
