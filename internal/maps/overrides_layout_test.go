package maps

import (
	"testing"
	"unsafe"

	"github.com/edgeguard/edgeguard/internal/loader"
)

// TestOverrideLayout: struct eg_override holds one expiry per part, and
// stays 8-byte aligned.
func TestOverrideLayout(t *testing.T) {
	var v loader.LimiterEgOverride
	if got := unsafe.Sizeof(v); got != 104 || got%8 != 0 {
		t.Fatalf("sizeof(struct eg_override) = %d, want 104", got)
	}
	if off := unsafe.Offsetof(v.NewExpires); off != 8 {
		t.Fatalf("offsetof(new_expires) = %d, want 8", off)
	}
}

// TestOverridePartsRoundTrip: each part keeps its own expiry and origin
// through compose and partsOf; an expired part goes alone; a part with no
// budget is absent whatever its expiry field says.
func TestOverridePartsRoundTrip(t *testing.T) {
	budget := BucketCfg{PktT: 100, PktTau: 500}
	fresh := BucketCfg{PktT: 1000, PktTau: 3000}
	src := loader.LimiterEgOverride{Budget: budget, NewBudget: fresh, NewBucket: loader.LimiterEgBucket{PktTat: 42}}
	p := ovrParts{budget: ovrPart{origin: OriginFleet, expires: 10}, fresh: ovrPart{origin: OriginShield, expires: 20}}
	v, ok := compose(p, src, src)
	if !ok || v.Expires != 10 || v.NewExpires != 20 || v.Budget != budget || v.NewBudget != fresh || v.NewBucket.PktTat != 42 {
		t.Fatalf("compose both parts: %+v, %v", v, ok)
	}
	if got := partsOf(v); got != p {
		t.Fatalf("partsOf(compose(p)) = %+v, want %+v", got, p)
	}
	for _, tc := range []struct {
		ns          uint64
		expired     bool
		budget, new bool
	}{
		{ns: 9, expired: false, budget: true, new: true},
		{ns: 10, expired: true, budget: false, new: true},
		{ns: 20, expired: true, budget: false, new: false},
	} {
		q := partsOf(v)
		if q.expired(tc.ns) != tc.expired {
			t.Errorf("at %d: expired %v, want %v", tc.ns, !tc.expired, tc.expired)
		}
		q = q.expire(tc.ns)
		w, ok := compose(q, v, v)
		if ok != (tc.budget || tc.new) || (w.Expires != 0) != tc.budget || (w.NewExpires != 0) != tc.new ||
			(w.Budget != BucketCfg{}) != tc.budget || (w.NewBudget != BucketCfg{}) != tc.new {
			t.Errorf("at %d: %+v (%v), want budget part %v, new-source part %v", tc.ns, w, ok, tc.budget, tc.new)
		}
		if tc.new && !tc.budget && (partsOf(w).fresh.origin != OriginShield || w.Origin != uint32(OriginShield)<<8) {
			t.Errorf("at %d: the survivor's origin: %#x", tc.ns, w.Origin)
		}
	}
	// An expiry without a budget is no part.
	if got := partsOf(loader.LimiterEgOverride{Expires: 10, NewExpires: 20, NewBudget: fresh}); got.budget != (ovrPart{}) || got.fresh.expires != 20 {
		t.Fatalf("partsOf without a budget part: %+v", got)
	}
}
