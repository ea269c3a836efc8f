package stage

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7/class"
)

// TestClassesAcrossReloads: the class table outlives the proxy: a reload
// keeps its counts (and what it knows of clients), a committed change
// installs the new ranking settings, an aborted one leaves the old, and
// l7.classes.enabled: false takes the ranking out of status and metrics.
func TestClassesAcrossReloads(t *testing.T) {
	up := startUpstream(t)
	tb := class.NewTable(1024, nil, nil, class.Config{})
	s := newStage(t, Options{Classes: tb})
	addr := freeAddr(t)
	body := section(addr, up.srv.URL, "event-loop", "")
	cfg, raw := config(t, body)
	ch, err := s.Prepare(context.Background(), cfg, raw, Standing{EstablishedAfter: 7 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	if _, code := rawGet(t, addr, "/x"); code != 200 {
		t.Fatalf("request: %d", code)
	}
	c, ok := s.ClassCounts()
	if !ok || c.Admitted[class.New] != 1 {
		t.Fatalf("counts %+v (%v), want one new admitted", c, ok)
	}
	if x := tb.Explain(mustAddr("127.0.0.1"), false); !x.Tracked || x.Window != class.DefaultWindow {
		t.Fatalf("explain the client: %+v", x)
	}
	if m := gather(t, s)[`edgeguard_l7_class_requests_total{class=new,result=admitted}`]; m != 1 {
		t.Errorf("metric: %v, want 1", m)
	}

	// An aborted change with another window installs nothing.
	cfg2, raw2 := config(t, body+"classes: {window: 30s}\n")
	ch, err = s.Prepare(context.Background(), cfg2, raw2, Standing{EstablishedAfter: 7 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ch.Abort()
	if x := tb.Explain(mustAddr("127.0.0.1"), false); x.Window != class.DefaultWindow {
		t.Errorf("an aborted change set the window to %v", x.Window)
	}
	// Committed, it does; the counts and the client stay.
	ch, err = s.Prepare(context.Background(), cfg2, raw2, Standing{EstablishedAfter: 7 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	if x := tb.Explain(mustAddr("127.0.0.1"), false); x.Window != 30*time.Second || !x.Tracked {
		t.Errorf("after the reload: %+v, want the 30s window and the client still known", x)
	}
	if c, _ := s.ClassCounts(); c.Admitted[class.New] != 1 {
		t.Errorf("a reload lost the counts: %+v", c)
	}

	// Disabled: no ranking in status or metrics.
	cfg3, raw3 := config(t, body+"classes: {enabled: false}\n")
	ch, err = s.Prepare(context.Background(), cfg3, raw3, Standing{})
	if err != nil {
		t.Fatal(err)
	}
	ch.Commit()
	if _, ok := s.ClassCounts(); ok {
		t.Error("ranking reported while disabled")
	}
	if _, ok := gather(t, s)[`edgeguard_l7_class_requests_total{class=new,result=admitted}`]; ok {
		t.Error("class metrics while disabled")
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
