package daemon

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/policy"
)

const protectedPolicy = `apiVersion: edgeguard/v1
interfaces: [{name: lo}]
lists:
  protected: [198.51.100.0/24, 2001:db8:1::/48]
metrics: {listen: ""}
tables: {ipv4_direct_chunks: 16}
`

// TestAddToListBounds: wide prefixes and the policy's protected prefixes
// need force (L7 escalation cannot force); refreshing an entry keeps its
// reason.
func TestAddToListBounds(t *testing.T) {
	d := loadedDaemon(t, Options{}, protectedPolicy)
	add := func(kind control.ListKind, p string, force bool, origin, reason string) (control.ListEntry, error) {
		return d.AddToList(kind, control.ListChange{Prefix: netip.MustParsePrefix(p), Force: force, Origin: origin,
			Reason: reason, TTL: control.Duration(time.Hour)})
	}
	for _, tc := range []struct {
		kind   control.ListKind
		prefix string
		force  bool
		origin string
		want   string // "" ok, else part of the error
	}{
		{control.Deny, "0.0.0.0/0", false, "", "needs --force"},
		{control.Deny, "10.0.0.0/15", false, "", "wider than a /16"},
		{control.Deny, "10.0.0.0/16", false, "", ""},
		{control.Allow, "0.0.0.0/0", false, "", "needs --force"},
		{control.Deny, "2001:db8::/31", false, "", "wider than a /32"},
		{control.Deny, "2001:db8:2::/48", false, "", ""},
		{control.Deny, "198.51.100.7/32", false, "", "protected prefix 198.51.100.0/24"},
		{control.Deny, "198.51.0.0/16", false, "", "protected prefix 198.51.100.0/24"},
		{control.Deny, "198.51.100.7/32", false, "l7", "protected prefix"},
		{control.Deny, "198.51.100.7/32", true, "l7", "cli entries only"},
		{control.Deny, "2001:db8:1:5::/64", false, "", "protected prefix 2001:db8:1::/48"},
		{control.Allow, "198.51.100.7/32", false, "", ""},
		{control.Deny, "198.51.100.7/32", true, "", ""},
		{control.Deny, "0.0.0.0/0", true, "", ""},
	} {
		_, err := add(tc.kind, tc.prefix, tc.force, tc.origin, "t")
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %s force=%v origin=%q: %v", tc.kind, tc.prefix, tc.force, tc.origin, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %s force=%v origin=%q: %v, want an error with %q", tc.kind, tc.prefix, tc.force, tc.origin, err, tc.want)
		}
	}
	if _, err := add(control.Deny, "203.0.113.9/32", false, "", "credential stuffing"); err != nil {
		t.Fatal(err)
	}
	e, err := add(control.Deny, "203.0.113.9/32", false, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if e.Reason != "credential stuffing" {
		t.Errorf("refreshed entry's reason %q, want the original kept", e.Reason)
	}
	for _, le := range d.ListEntries(control.Deny) {
		if le.Prefix == netip.MustParsePrefix("203.0.113.9/32") && le.Reason != "credential stuffing" {
			t.Errorf("listed reason %q", le.Reason)
		}
	}
}

// TestTableSizeRefusalNamesFields: a policy whose tables differ from the
// loaded maps is refused naming the policy fields, not a Go struct.
func TestTableSizeRefusalNamesFields(t *testing.T) {
	d := newDaemon(Options{})
	d.dp = &loader.Datapath{Sizes: loader.DefaultSizes()}
	err := d.checkSizes(policy.Tables{MaxRules: 7, PerSourceEntries: loader.DefaultSizes().SrcEntries})
	if err == nil || !strings.Contains(err.Error(), "tables.max_rules 7 (loaded: ") || strings.Contains(err.Error(), "{") {
		t.Errorf("refusal: %v", err)
	}
}
