package l7

import (
	"github.com/edgeguard/edgeguard/internal/l7/l7test"

	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestPendingRefundGivesBackEveryLocalCharge: a request the local rules
// admit and another backend refuses leaves every local rule as if it had
// never come, and its 429 reports both backends' limits.
func TestPendingRefundGivesBackEveryLocalCharge(t *testing.T) {
	k := newKeys(t, KeyConfig{})
	clock := new(l7test.ManualClock)
	clock.Set(int64(1000 * time.Second))
	mw, err := NewMiddleware(Config{Clock: clock, LegacyHeaders: true, Rules: []Rule{
		perIPRule(t, k, "per-ip", mustAlg(NewGCRA(2, time.Minute, 0))),
		{Name: "per-user", Key: k.User(), Algorithm: mustAlg(NewSlidingWindow(3, time.Minute)), Store: StoreConfig{Capacity: 64}},
		{Name: "per-user-tb", Key: k.User(), Algorithm: mustAlg(NewTokenBucket(2, time.Minute, 0)), Store: StoreConfig{Capacity: 64}},
		{Name: "per-user-fw", Key: k.User(), Algorithm: mustAlg(NewFixedWindow(2, time.Minute)), Store: StoreConfig{Capacity: 64}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "198.18.0.9:1234"
	req.Header.Set("X-User-Id", "alice")
	remote := ExternalDecision{Name: "r-user", Policy: PolicyItem("r-user", 10, time.Minute),
		Decision: Decision{Limit: 10, Window: time.Minute, RetryAfter: 7*time.Second + 1}}
	for i := range 5 {
		var p Pending
		mw.Decide(req, &p)
		if !p.Allowed() {
			t.Fatalf("refused request %d was charged locally: %+v", i, p.out[:p.n])
		}
		clock.Advance(time.Millisecond)
		p.Refund()
		rec := httptest.NewRecorder()
		if mw.Respond(rec, &p, []ExternalDecision{remote}) {
			t.Fatalf("request %d: Respond let a remotely refused request through", i)
		}
		resp := rec.Result()
		if resp.StatusCode != 429 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		wantHeader(t, resp, "Retry-After", "8")
		wantHeader(t, resp, "RateLimit-Policy", `"per-ip";q=2;w=60, "per-user";q=3;w=60, "per-user-tb";q=2;w=60, "per-user-fw";q=2;w=60, "r-user";q=10;w=60`)
		wantHeader(t, resp, "RateLimit", `"per-ip";r=2;t=0, "per-user";r=3;t=0, "per-user-tb";r=2;t=0, "per-user-fw";r=2;t=0, "r-user";r=0;t=8`)
		wantHeader(t, resp, "X-RateLimit-Limit", "10")
	}
	// The full local quota is still there: two requests (per-ip, per-user-tb
	// and per-user-fw allow two) pass, the third does not.
	for i := range 3 {
		var p Pending
		mw.Decide(req, &p)
		p.Commit()
		if p.Allowed() != (i < 2) {
			t.Fatalf("after the refunds, request %d allowed=%v", i, p.Allowed())
		}
	}
	for _, st := range mw.Stats() {
		if st.Rule == "per-ip" && (st.Allowed != 2 || st.Rejected != 1) {
			t.Fatalf("per-ip stats %+v: refunded requests are neither allowed nor rejected", st)
		}
	}
}
