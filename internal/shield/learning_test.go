package shield

import (
	"net/netip"
	"testing"
	"time"
)

// TestSurgeWhileLearningIsNotLearned (issue 25): with learn_for 5s, a
// /24 that surges to 200/s 3 s after the start does not learn the surge
// as its baseline: intervals far above what it learned so far are not
// learned, and it is not judged (Judged false: still learning) while the
// surge lasts; the shield acts on nothing meanwhile, global included.
// Once the surge ends it learns on.
func TestSurgeWhileLearningIsNotLearned(t *testing.T) {
	c := testConfig()
	c.LearnFor = 5 * time.Second
	s := newSim(t, c)
	u := users(6) // ~300/s per /24, bursty
	quiet := flow{constant(10), udpFrom(64509, "198.18.9.0/24", 443)}
	s.run(3, append(u, quiet)...)
	surge := flow{constant(200), udpFrom(64509, "198.18.9.0/24", 443)}
	s.run(9, append(u, surge)...)
	k := Key{Kind: KindPrefix, Prefix: netip.MustParsePrefix("198.18.9.0/24")}
	r := s.row(k)
	t.Logf("after 12 s: %s baseline %.0f/s, learned %s, judged %v; changes %d", k, r.Baseline, r.Learned, r.Judged, len(s.changes))
	if r.Baseline > 3*12 {
		t.Errorf("the /24 learned the surge: baseline %.0f/s (it sent 10/s before the surge)", r.Baseline)
	}
	if r.Judged || !r.LearningPaused {
		t.Errorf("the surging /24: judged %v, learning paused %v after %s learned; want still learning, paused", r.Judged, r.LearningPaused, r.Learned)
	}
	for _, ch := range s.changes {
		t.Errorf("a change while learning: %+v", ch)
	}
	s.changes = nil
	s.run(10, append(u, quiet)...)
	if r := s.row(k); !r.Judged || r.Baseline > 3*12 {
		t.Errorf("after the surge: %+v, want judged with the quiet baseline", r)
	}
}
