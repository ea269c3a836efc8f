package daemon

import (
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/l7"
	"github.com/edgeguard/edgeguard/internal/l7/class"
	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/l7/rls"
)

// TestRLSExplanationClass: `edgectl l7 explain` names the class of the
// client's next request and each limit's reserve; a limit with only its
// reserve left has room for a first-class client and none for another.
func TestRLSExplanationClass(t *testing.T) {
	req := &rls.Request{Domain: "edge", Descriptors: []rls.Descriptor{
		{Entries: []rls.Entry{{Key: "generic_key", Value: "api"}}},
		{Entries: []rls.Entry{{Key: "remote_address", Value: "198.18.0.7"}}},
	}}
	verdict := func(c class.Class, ranked bool) *rls.Verdict {
		return &rls.Verdict{Ranked: ranked, Class: c, Client: netip.MustParseAddr("198.18.0.7"), Statuses: []rls.Status{
			{Rule: "everyone", Key: "everyone|generic_key=api", Limits: []rls.LimitStatus{{Name: "everyone", Count: 10,
				Per: time.Minute, Backend: proxy.BackendLocal, Reserve: 5, Decision: l7.Decision{Allowed: true, Limit: 10, Remaining: 5}}}},
			{},
		}}
	}
	for _, tc := range []struct {
		c              class.Class
		ranked         bool
		wantClass      string
		wantRoomForOne bool
	}{
		{class.Established, true, "established", true},
		{class.Authenticated, true, "authenticated", true},
		{class.New, true, "new", false},
		{class.OverUsual, true, "over_usual", false},
		{class.Penalised, true, "penalised", false},
		{class.New, false, "", true}, // not ranked: decided as before the ranking
	} {
		e := rlsExplanation(req, verdict(tc.c, tc.ranked))
		if e.Class != tc.wantClass || e.Allowed != tc.wantRoomForOne {
			t.Errorf("%v (ranked %t): class %q allowed %t, want %q %t", tc.c, tc.ranked, e.Class, e.Allowed, tc.wantClass, tc.wantRoomForOne)
		}
		if l := e.Descriptors[0].Limits[0]; l.Reserve != 5 {
			t.Errorf("reserve %d, want 5", l.Reserve)
		}
		if tc.ranked && e.Client != "198.18.0.7" {
			t.Errorf("client %q", e.Client)
		}
	}
}
