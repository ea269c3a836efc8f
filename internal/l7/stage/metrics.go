package stage

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeguard/edgeguard/internal/l7/class"
)

var (
	infoDesc = prometheus.NewDesc("edgeguard_l7_stage_info",
		"The L7 stage serving: 1, labelled with its engine (event-loop or net-http) and bound address; absent when the policy has no l7 section.",
		[]string{"engine", "addr"}, nil)
	startsDesc = prometheus.NewDesc("edgeguard_l7_stage_engine_starts_total",
		"Engine instances the L7 stage started (one at start, one per reload that changes the engine, upstream, loops or address).",
		nil, nil)
	failuresDesc = prometheus.NewDesc("edgeguard_l7_stage_engine_failures_total",
		"Engine instances that ended with an error (they could not serve, or requests were still in flight after the shutdown timeout).",
		nil, nil)
	accessLogDesc = prometheus.NewDesc("edgeguard_l7_access_log_lines_total",
		"Access log lines, by result: written (queued for the file), dropped (the 1 MiB buffer was full: the disk or "+
			"stderr is slower than the requests). Absent without l7.access_log.", []string{"result"}, nil)
	accessLogErrorsDesc = prometheus.NewDesc("edgeguard_l7_access_log_write_errors_total",
		"Writes of the access log buffer that failed (the lines in them are lost).", nil, nil)
	classRequestsDesc = prometheus.NewDesc("edgeguard_l7_class_requests_total",
		"Requests the L7 stage routed (exempt paths aside), by the class they were charged as (established, "+
			"authenticated, new, over_usual, penalised) and result (admitted: passed to the upstream; refused: "+
			"answered 429 or 503). Absent while l7.classes is disabled.", []string{"class", "result"}, nil)
	classReadsDesc = prometheus.NewDesc("edgeguard_l7_class_standing_reads_total",
		"Reads of the data plane's standing table by the L7 class cache (one per client per l7.classes.cache_ttl), "+
			"by result (ok, error: the client was ranked as if new).", []string{"result"}, nil)
	classUntrackedDesc = prometheus.NewDesc("edgeguard_l7_class_untracked_requests_total",
		"Requests of clients the L7 class table had no room for (every entry of their set held an active client "+
			"with history): ranked new, the data plane not asked.", nil, nil)
	accessLogReopensDesc = prometheus.NewDesc("edgeguard_l7_access_log_reopens_total",
		"Times the access log file was reopened (SIGUSR1).", nil, nil)
)

// collector is the stage's series and those of the proxy that serves. It
// describes nothing (an unchecked collector): the proxy behind it changes
// with reloads, and the registry checks what it collects at each scrape.
type collector struct{ s *Stage }

func (collector) Describe(chan<- *prometheus.Desc) {}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	ch <- prometheus.MustNewConstMetric(startsDesc, prometheus.CounterValue, float64(s.started.Load()))
	ch <- prometheus.MustNewConstMetric(failuresDesc, prometheus.CounterValue, float64(s.failed.Load()))
	s.mu.Lock()
	run, alog := s.run, s.alog
	s.mu.Unlock()
	if alog != nil {
		st := alog.Stats()
		ch <- prometheus.MustNewConstMetric(accessLogDesc, prometheus.CounterValue, float64(st.Lines), "written")
		ch <- prometheus.MustNewConstMetric(accessLogDesc, prometheus.CounterValue, float64(st.Dropped), "dropped")
		ch <- prometheus.MustNewConstMetric(accessLogErrorsDesc, prometheus.CounterValue, float64(st.WriteErrors))
		ch <- prometheus.MustNewConstMetric(accessLogReopensDesc, prometheus.CounterValue, float64(st.Reopens))
	}
	if run == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(infoDesc, prometheus.GaugeValue, 1, string(run.engine), run.sock.ln.Addr().String())
	if c, ok := s.ClassCounts(); ok {
		for i := range class.NumClasses {
			name := class.Class(i).String()
			ch <- prometheus.MustNewConstMetric(classRequestsDesc, prometheus.CounterValue, float64(c.Admitted[i]), name, "admitted")
			ch <- prometheus.MustNewConstMetric(classRequestsDesc, prometheus.CounterValue, float64(c.Refused[i]), name, "refused")
		}
		ch <- prometheus.MustNewConstMetric(classReadsDesc, prometheus.CounterValue, float64(c.StandingReads-c.StandingReadErrors), "ok")
		ch <- prometheus.MustNewConstMetric(classReadsDesc, prometheus.CounterValue, float64(c.StandingReadErrors), "error")
		ch <- prometheus.MustNewConstMetric(classUntrackedDesc, prometheus.CounterValue, float64(c.Untracked))
	}
	run.cur.Load().Collect(ch)
}
