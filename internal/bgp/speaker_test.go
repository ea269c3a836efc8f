package bgp

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// testConfig peers with loopback only (nothing answers there: the
// session stays down, which these tests do not need). The real session
// is tested against BIRD in test/netns.
func testConfig() Config {
	return Config{BGP: policy.BGP{LocalAS: 64512, RouterID: netip.MustParseAddr("198.18.250.1"), Community: BlackholeCommunity,
		MaxAnnouncements: 3, DryRun: true, Width4: 32, Width6: 128,
		Neighbors: []policy.BGPNeighbor{{Address: netip.MustParseAddr("127.0.0.1"), AS: 64513,
			Families: []string{string(IPv4Unicast), string(IPv4FlowSpec), string(IPv6FlowSpec)}}}},
		Guards: []policy.BGPGuard{{Prefix: netip.MustParsePrefix("198.18.77.0/24"), Why: "lists.allow"}}}
}

func newTestSpeaker(t *testing.T, cfg Config) (*Speaker, *[]Event) {
	t.Helper()
	var evs []Event
	s := New(Options{Audit: func(e Event) { evs = append(evs, e) }})
	if err := s.Configure(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, &evs
}

func blackhole(p string, exp time.Time) Announcement {
	return Announcement{Kind: Blackhole, Prefix: netip.MustParsePrefix(p), Origin: "cli", Reason: "test", Expires: exp}
}

// TestGuards: every guard refuses at its bound and accepts just inside
// it.
func TestGuards(t *testing.T) {
	now := time.Now()
	exp := now.Add(time.Minute)
	cfg := testConfig()
	cfg.Width4 = 31
	s, evs := newTestSpeaker(t, cfg)
	fs := func(dst, src string) Announcement {
		m := &Match{Dst: netip.MustParsePrefix(dst), Proto: 17}
		if src != "" {
			m.Src = netip.MustParsePrefix(src)
		}
		return Announcement{Kind: FlowSpec, Match: m, Origin: "cli", Expires: exp}
	}
	for _, c := range []struct {
		a    Announcement
		want string // "" accepted
	}{
		{blackhole("198.18.0.0/30", exp), "bgp.widths"},
		{blackhole("198.18.0.0/31", exp), ""},
		{blackhole("198.18.77.128/32", exp), "lists.allow"},
		{blackhole("198.18.76.0/31", exp), ""},
		{blackhole("fd00::1/128", exp), "no neighbor carries ipv6-unicast"},
		{fs("198.18.1.1/32", "198.18.77.0/25"), "lists.allow"}, // a source inside an allowed prefix
		{fs("198.18.1.1/32", "198.18.0.0/15"), "lists.allow"},  // a source around it
		{fs("fd00::1/127", ""), "bgp.widths"},
		{fs("198.18.1.1/32", ""), ""},
		{blackhole("198.18.5.5/32", exp), "max_announcements"}, // the fourth
	} {
		_, err := s.Announce(c.a, now)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want accepted", c.a.Route(), err)
		case c.want != "" && (err == nil || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want refused for %q", c.a.Route(), err, c.want)
		}
	}
	if got := len(s.List()); got != 3 {
		t.Errorf("%d announcements held, want 3", got)
	}
	_, refused := s.Counts()
	if refused["width"] != 2 || refused["forbidden"] != 3 || refused["family"] != 1 || refused["max"] != 1 {
		t.Errorf("refusals by guard %v", refused)
	}
	n := 0
	for _, e := range *evs {
		if e.Op == OpRefuse {
			n++
		}
	}
	if n != 7 {
		t.Errorf("%d refusals audited, want 7", n)
	}
	// The same route again renews: no new announcement, the later expiry.
	a, err := s.Announce(blackhole("198.18.0.0/31", exp.Add(time.Hour)), now)
	if err != nil || !a.Expires.Equal(exp.Add(time.Hour)) || len(s.List()) != 3 {
		t.Errorf("renew: %+v %v (%d held)", a, err, len(s.List()))
	}
}

// TestDryRunExpireSave: dry run holds announcements without announcing;
// they expire at their time; a policy change whose guards refuse one
// withdraws it; saved ones come back unexpired only.
func TestDryRunExpireSave(t *testing.T) {
	now := time.Now()
	s, evs := newTestSpeaker(t, testConfig())
	a, err := s.Announce(blackhole("198.18.0.1/32", now.Add(2*time.Second)), now)
	if err != nil || a.State != StateDryRun || a.ID != 1 {
		t.Fatalf("dry run announce: %+v %v", a, err)
	}
	b, _ := s.Announce(blackhole("198.18.0.2/32", now.Add(time.Hour)), now)
	c, _ := s.Announce(blackhole("198.18.0.3/32", now.Add(time.Hour)), now)
	s.Expire(now.Add(time.Second))
	if len(s.List()) != 3 {
		t.Fatalf("expired early: %+v", s.List())
	}
	s.Expire(now.Add(2 * time.Second))
	if l := s.List(); len(l) != 2 || l[0].ID != b.ID {
		t.Fatalf("after expiry: %+v", l)
	}
	if last := (*evs)[len(*evs)-1]; last.Op != OpWithdraw || last.Announcement.ID != a.ID || !strings.Contains(last.Why, "expired") {
		t.Errorf("expiry event %+v", last)
	}
	data, err := s.Save()
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Guards = append(cfg.Guards, policy.BGPGuard{Prefix: netip.MustParsePrefix("198.18.0.3/32"), Why: "bgp.forbid"})
	if err := s.Configure(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if l := s.List(); len(l) != 1 || l[0].ID != b.ID {
		t.Errorf("after a guard now refuses %d: %+v", c.ID, l)
	}
	// New session settings restart the sessions on the same server
	// (twice: each start sets up the import policy again).
	for _, as := range []uint32{64600, 64601} {
		cfg.LocalAS = as
		if err := s.Configure(context.Background(), cfg); err != nil {
			t.Fatalf("restart the sessions as AS%d: %v", as, err)
		}
	}
	if l := s.List(); len(l) != 1 || l[0].ID != b.ID {
		t.Errorf("after the session restarts: %+v", l)
	}

	r := New(Options{})
	n, err := r.Load(data, now.Add(30*time.Minute))
	if err != nil || n != 2 {
		t.Fatalf("load: %d %v", n, err)
	}
	if n, _ := r.Load(data, now.Add(2*time.Hour)); n != 0 {
		t.Errorf("loaded %d already held or expired", n)
	}
	r2 := New(Options{})
	if n, _ := r2.Load(data, now.Add(2*time.Hour)); n != 0 {
		t.Errorf("loaded %d expired announcements", n)
	}
	if err := r.Configure(context.Background(), testConfig()); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if l := r.List(); len(l) != 2 || l[0].State != StateDryRun {
		t.Errorf("loaded and configured: %+v", l)
	}
	next, _ := r.Announce(blackhole("198.18.0.9/32", now.Add(time.Hour)), now)
	if next.ID <= c.ID {
		t.Errorf("id %d after loading ids up to %d", next.ID, c.ID)
	}
	for _, bad := range []string{`{`, `{"announcements":[{"id":1,"kind":"blackhole","expires":"2999-01-01T00:00:00Z"}]}`,
		`{"announcements":[{"id":1,"kind":"redirect","expires":"2999-01-01T00:00:00Z"}]}`} {
		if _, err := New(Options{}).Load([]byte(bad), now); err == nil {
			t.Errorf("load %s: no error", bad)
		}
	}
}

// TestPathComponents: the FlowSpec NLRI carries each component, IPv6's
// length after the 40-byte header; an IPv6 length under 40 and mixed
// families are errors.
func TestPathComponents(t *testing.T) {
	m := Match{Dst: netip.MustParsePrefix("fd00::1/128"), Src: netip.MustParsePrefix("fd00:1::/48"), Proto: 6, DPort: 443,
		SPort: 1024, Len: 100, TCPFlags: 0x12, HasTCPFlags: true, Fragment: "is-fragment"}
	comps, err := flowSpecComponents(m)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range comps {
		got = append(got, c.String())
	}
	s := strings.Join(got, " ")
	for _, want := range []string{"[destination: fd00::1/128/0]", "[source: fd00:1::/48/0]", "[protocol: ==tcp]",
		"[destination-port: ==443]", "[source-port: ==1024]", "[packet-length: ==60]", "[fragment: =is-fragment]"} {
		if !strings.Contains(s, want) {
			t.Errorf("components %s: no %s", s, want)
		}
	}
	m.Len = 39
	if _, err := flowSpecComponents(m); err == nil {
		t.Error("IPv6 length 39 accepted")
	}
	m.Len, m.Src = 0, netip.MustParsePrefix("198.18.0.0/24")
	if _, err := flowSpecComponents(m); err == nil {
		t.Error("IPv4 source with an IPv6 destination accepted")
	}
	if _, err := (Announcement{Kind: "redirect"}).path(BlackholeCommunity); err == nil {
		t.Error("unknown kind made a path")
	}
}
