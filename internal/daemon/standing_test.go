package daemon

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/maps"
)

// TestCongestionEvents: an aggregate kind that refuses new sources is
// congested from that reading on, logged once; it leaves after
// congestionCalm without a refusal, logged with the shares per class.
func TestCongestionEvents(t *testing.T) {
	var buf bytes.Buffer
	d := newDaemon(Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	w := d.standing
	t0 := time.Unix(1_000_000, 0)
	var c maps.ClassCounters
	d.observeCongestion(w, c, t0)
	if st := w.status(t0); len(st) != 3 || st[0].Congested || st[1].Congested || st[2].Congested {
		t.Fatalf("first reading: %+v", st)
	}
	asn := maps.ClassAggASN
	c[0][asn][maps.ClassNew][maps.OutcomeRefusedReserve].Packets = 500
	d.observeCongestion(w, c, t0.Add(time.Second))
	c[0][asn][maps.ClassNew][maps.OutcomeRefusedReserve].Packets = 900
	c[0][asn][maps.ClassEstablished][maps.OutcomeAdmittedReserve].Packets = 300
	c[0][asn][maps.ClassNew][maps.OutcomeAdmitted].Packets = 100
	d.observeCongestion(w, c, t0.Add(2*time.Second))
	st := w.status(t0.Add(2 * time.Second))
	if !st[asn].Congested || st[maps.ClassAggPrefix].Congested || !st[asn].Since.Equal(t0.Add(time.Second)) ||
		st[asn].AdmittedByClass["established"] != 300 || st[asn].AdmittedByClass["new"] != 100 {
		t.Fatalf("during: %+v", st)
	}
	if n := strings.Count(buf.String(), "aggregate congested"); n != 1 {
		t.Fatalf("%d congestion events logged, want 1:\n%s", n, buf.String())
	}
	// Quiet for less than congestionCalm: still congested.
	d.observeCongestion(w, c, t0.Add(5*time.Second))
	if st := w.status(t0.Add(5 * time.Second)); !st[asn].Congested {
		t.Fatal("left congestion before congestionCalm")
	}
	d.observeCongestion(w, c, t0.Add(2*time.Second+congestionCalm))
	if st := w.status(t0.Add(8 * time.Second)); st[asn].Congested {
		t.Fatal("still congested after congestionCalm without a refusal")
	}
	log := buf.String()
	if !strings.Contains(log, "aggregate left congestion") || !strings.Contains(log, "aggregate=asn") ||
		!strings.Contains(log, "established:300") {
		t.Fatalf("leave event: %s", log)
	}
}
