package daemon

import (
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/fleet"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

func remote(op fleet.Op, list, p string) fleet.ListEntry {
	return fleet.ListEntry{Op: op, List: list, Prefix: netip.MustParsePrefix(p), Origin: "cli", Host: "a", Reason: "r",
		Expires: time.Now().Add(time.Hour), At: time.Now()}
}

// TestFleetApplyRemote: other hosts' entries go through the CLI's checks
// (width, lists.protected) into the real lists map, a snapshot replaces
// the fleet entries but never this host's own, a live change or removal
// wins over a local entry, and Local lists only this host's own.
func TestFleetApplyRemote(t *testing.T) {
	d := loadedDaemon(t, Options{}, protectedPolicy)
	s := fleetLists{d}
	n, refused, err := s.ApplyRemote([]fleet.ListEntry{
		remote(fleet.OpAdd, "deny", "203.0.113.0/24"),
		remote(fleet.OpAdd, "deny", "10.0.0.0/8"),        // wider than a /16
		remote(fleet.OpAdd, "allow", "2001:db8::/31"),    // wider than a /32
		remote(fleet.OpAdd, "deny", "198.51.100.7/32"),   // protected
		remote(fleet.OpAdd, "deny", "2001:db8:1:5::/64"), // protected
		remote(fleet.OpAdd, "allow", "198.51.100.7/32"),  // an allow may cover a protected prefix
		remote(fleet.OpAdd, "shadow", "192.0.2.0/24"),
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || len(refused) != 5 {
		t.Fatalf("remote %d, refused %v", n, refused)
	}
	for _, r := range refused[:4] {
		if !strings.Contains(r.Err.Error(), "needs --force") {
			t.Errorf("refused %s: %v", r.Entry.Prefix, r.Err)
		}
	}
	inMap := func(p string) bool {
		es, err := d.m.Lists.All()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if e.Prefix == netip.MustParsePrefix(p) && (e.DenyUntil != 0 || e.AllowUntil != 0) {
				return true
			}
		}
		return false
	}
	if !inMap("203.0.113.0/24") || inMap("10.0.0.0/8") || inMap("198.51.100.7/32") == false {
		t.Errorf("lists map: 203.0.113.0/24 %v, 10.0.0.0/8 %v, 198.51.100.7/32 (allow) %v",
			inMap("203.0.113.0/24"), inMap("10.0.0.0/8"), inMap("198.51.100.7/32"))
	}
	var got control.ListEntry
	for _, e := range d.ListEntries(control.Deny) {
		if e.Prefix == netip.MustParsePrefix("203.0.113.0/24") {
			got = e
		}
	}
	if got.Origin != "fleet" || got.Host != "a" || got.Reason != "cli: r" || got.Expires == nil {
		t.Errorf("deny list shows %+v", got)
	}
	// A local entry: the snapshot does not overwrite it, a live removal does.
	if _, err := d.AddToList(control.Deny, control.ListChange{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Reason: "mine"}); err != nil {
		t.Fatal(err)
	}
	n, _, err = s.ApplyRemote([]fleet.ListEntry{remote(fleet.OpAdd, "deny", "192.0.2.0/24")}, true)
	if err != nil || n != 0 {
		t.Fatalf("snapshot: %d remote entries (want 0: the local one stays local), %v", n, err)
	}
	if inMap("203.0.113.0/24") {
		t.Error("a snapshot without 203.0.113.0/24 left it in force")
	}
	local := s.Local()
	if len(local) != 1 || local[0].Prefix != netip.MustParsePrefix("192.0.2.0/24") || local[0].Origin != "cli" || local[0].Reason != "mine" {
		t.Errorf("local = %+v", local)
	}
	if _, _, err := s.ApplyRemote([]fleet.ListEntry{remote(fleet.OpDel, "deny", "192.0.2.0/24")}, false); err != nil {
		t.Fatal(err)
	}
	if inMap("192.0.2.0/24") || len(s.Local()) != 0 {
		t.Error("a removal from the fleet left the local entry")
	}
}

func TestFleetBudgets(t *testing.T) {
	p, err := policy.Parse("p.yaml", []byte(`apiVersion: edgeguard/v1
fleet: {name: f, redis: {addrs: ["127.0.0.1:6379"]}}
rules:
  - {name: whole, match: {prefixes: [198.18.0.0/24]}, scope: fleet, per_prefix: {group: whole, packets: {rate: 600/min, burst: 30}}}
  - {name: derived, match: {prefixes: [198.18.1.0/24]}, scope: fleet, per_prefix: {group: {ipv4: 28, ipv6: 64}, packets: 100/s}}
  - {name: local, match: {prefixes: [198.18.2.0/24]}, per_prefix: {group: whole, packets: 100/s}}
  - {name: both, match: {prefixes: [198.18.3.0/24]}, scope: fleet, per_asn: {packets: 1000/s, bytes: {rate: 1MB/s, burst: 100kB}}}
  - {name: bytesonly, match: {prefixes: [198.18.4.0/24]}, scope: fleet, per_asn: {bytes: {rate: 8kB/s, burst: 4kB}}}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := fleetBudgets(p)
	if len(b) != 4 {
		t.Fatalf("budgets %+v", b)
	}
	w := b[watchKey{policy.RuleID("whole"), maps.AggKindWhole}]
	if pk, by := w.scaled(0.25, 0.25); perSecond(w.rate) != 10 || pk != (maps.Rate{Count: 150, Per: time.Minute, Burst: 8}) || by.Limited() {
		t.Errorf("whole: %v/s, a quarter %+v, bytes %+v (none in the policy)", perSecond(w.rate), pk, by)
	}
	if r, _ := w.scaled(0, 0); r.Count != 1 || r.Burst != 1 {
		t.Errorf("a zero share still admits a packet of rate and burst: %+v", r)
	}
	if r, _ := w.scaled(7, 7); r.Count != 600 || r.Burst != 30 {
		t.Errorf("a share is never above the budget: %+v", r)
	}
	if _, ok := b[watchKey{policy.RuleID("derived"), maps.AggKindPrefix}]; !ok {
		t.Errorf("derived prefix budget missing: %+v", b)
	}
	// Both dimensions, each scaled by its own share.
	both := b[watchKey{policy.RuleID("both"), maps.AggKindASN}]
	pk, by := both.scaled(0.5, 0.1)
	if perSecond(both.bytes) != 1e6 || pk != (maps.Rate{Count: 500, Per: time.Second, Burst: 500}) ||
		by != (maps.Rate{Count: 100_000, Per: time.Second, Burst: 10_000}) {
		t.Errorf("both: %v bytes/s; half the packets %+v, a tenth of the bytes %+v", perSecond(both.bytes), pk, by)
	}
	// A tiny byte share keeps one full-size packet of burst.
	if _, by := both.scaled(0, 0); by.Count != 1 || by.Burst != 1500 {
		t.Errorf("a zero byte share: %+v, want 1 byte/s and a 1500-byte burst", by)
	}
	bo := b[watchKey{policy.RuleID("bytesonly"), maps.AggKindASN}]
	if pk, by := bo.scaled(0.5, 0.5); pk.Limited() || by != (maps.Rate{Count: 4000, Per: time.Second, Burst: 2000}) {
		t.Errorf("bytes only: packets %+v (want none), bytes %+v", pk, by)
	}
	if _, by := bo.scaled(0, 0); by.Burst != 1500 {
		t.Errorf("bytes only, zero share: burst %d, want 1500", by.Burst)
	}
	// At the bounds: the largest counts the policy takes scale to at most
	// themselves; a share above 1 or below 0 (never computed, but a bug
	// must not widen a budget) is clamped.
	huge := fleetBudget{rate: maps.Rate{Count: math.MaxUint64, Per: time.Second, Burst: math.MaxUint64},
		bytes: maps.Rate{Count: math.MaxUint64, Per: time.Second, Burst: math.MaxUint64}}
	for _, f := range []float64{1, 0.999999, 0.5, 2, math.Inf(1)} {
		pk, by := huge.scaled(f, f)
		if pk.Count > math.MaxUint64 || pk.Count < math.MaxUint64/3 || by.Burst < math.MaxUint64/3 || (f >= 1 && (pk.Count != math.MaxUint64 || by.Burst != math.MaxUint64)) {
			t.Errorf("huge budget times %v: packets %+v, bytes %+v", f, pk, by)
		}
	}
	for _, f := range []float64{-1, math.Inf(-1)} {
		if pk, by := both.scaled(f, f); pk.Count != 1 || by.Count != 1 {
			t.Errorf("share %v: packets %+v, bytes %+v, want the minimum", f, pk, by)
		}
	}
	if pk, by := both.scaled(math.NaN(), math.NaN()); pk.Count != 1000 || by.Count != 1_000_000 {
		t.Errorf("a NaN share: packets %+v, bytes %+v, want the policy's budget", pk, by)
	}
	if pk, by := huge.scaled(math.NaN(), math.NaN()); pk.Count != math.MaxUint64 || by.Count != math.MaxUint64 {
		t.Errorf("a NaN share is the policy's budget: packets %+v, bytes %+v", pk, by)
	}
}

// TestCheckFleet: a fleet whose password or CA file cannot be read is
// refused before anything changes (nothing is dialled).
func TestCheckFleet(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ redis, want string }{
		{`{addrs: ["127.0.0.1:1"]}`, ""},
		{`{addrs: ["127.0.0.1:1"], password_file: missing.pass}`, "password_file"},
		{`{addrs: ["127.0.0.1:1"], tls: {ca_file: missing.pem}}`, "ca_file"},
	} {
		p, err := policy.Parse(dir+"/p.yaml", []byte("apiVersion: edgeguard/v1\nfleet: {name: f, redis: "+c.redis+"}\n"), nil)
		if err != nil {
			t.Fatal(err)
		}
		err = checkFleet(p)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.redis, err, c.want)
		}
	}
}
