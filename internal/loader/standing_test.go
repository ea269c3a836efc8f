package loader_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// TestStandingTable: the Go view of the standing table (SetStanding,
// LookupStanding, known_good), at and past its bounds.
func TestStandingTable(t *testing.T) {
	sizes := smallSizes
	sizes.StandingEntries = 4
	td := newTestDatapath(t, sizes)
	td.setClock(10 * time.Second)
	g := defaultGen(policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}})
	g.Standing = policy.Standing{
		EstablishedAfter: 30 * time.Second,
		Penalty:          time.Minute,
		KnownGood:        []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::/32")},
	}
	td.apply(g)

	a := netip.MustParseAddr("198.18.0.1")
	e, err := td.m.Standing.Lookup(a)
	if err != nil || e.Tracked || e.Standing != maps.StandingNew || e.Why != maps.WhyNone {
		t.Fatalf("unknown source: %+v, %v", e, err)
	}
	if err := td.m.Standing.Set(a, maps.StandingValidated); err != nil {
		t.Fatal(err)
	}
	e, err = td.m.Standing.Lookup(netip.MustParseAddr("::ffff:198.18.0.1"))
	if err != nil || !e.Tracked || e.Standing != maps.StandingValidated || e.Why != maps.WhyL7 || e.SinceNS != uint64(10*time.Second) ||
		e.Addr != a {
		t.Fatalf("after SetStanding validated: %+v, %v", e, err)
	}
	// IPv6 is keyed by its /64: another host of the /64 is the same source.
	if err := td.m.Standing.SetWhy(netip.MustParseAddr("fd00:1:2:3::1"), maps.StandingPenalised, maps.WhySet); err != nil {
		t.Fatal(err)
	}
	e, err = td.m.Standing.Lookup(netip.MustParseAddr("fd00:1:2:3:ffff::9"))
	if err != nil || e.Standing != maps.StandingPenalised || e.Addr != netip.MustParseAddr("fd00:1:2:3::") {
		t.Fatalf("ipv6 /64: %+v, %v", e, err)
	}
	// Known good: established without an entry; an entry of its own wins.
	kg := netip.MustParseAddr("198.51.100.77")
	if e, err = td.m.Standing.Lookup(kg); err != nil || e.Standing != maps.StandingEstablished || !e.KnownGood || e.Tracked {
		t.Fatalf("known good: %+v, %v", e, err)
	}
	if err := td.m.Standing.Set(kg, maps.StandingPenalised); err != nil {
		t.Fatal(err)
	}
	if e, err = td.m.Standing.Lookup(kg); err != nil || e.Standing != maps.StandingPenalised || e.KnownGood {
		t.Fatalf("known good with own entry: %+v, %v", e, err)
	}
	if err := td.m.Standing.Set(netip.MustParseAddr("198.18.0.4"), maps.StandingEstablished); err != nil {
		t.Fatal(err)
	}
	// The table holds 4: the fifth is refused, and nobody is evicted.
	err = td.m.Standing.Set(netip.MustParseAddr("198.18.0.5"), maps.StandingEstablished)
	if err == nil || !strings.Contains(err.Error(), "standing table full") {
		t.Fatalf("fifth entry: %v", err)
	}
	all, err := td.m.Standing.All()
	if err != nil || len(all) != 4 {
		t.Fatalf("standings: %d entries, %v", len(all), err)
	}
	if err := td.m.Standing.Set(a, maps.Standing(9)); err == nil {
		t.Error("unknown standing accepted")
	}
	if err := td.m.Standing.Set(netip.Addr{}, maps.StandingNew); err == nil {
		t.Error("invalid address accepted")
	}
	if _, err := td.m.Standing.Lookup(netip.Addr{}); err == nil {
		t.Error("invalid address looked up")
	}
	// A policy without known_good removes the prefixes.
	g.Standing.KnownGood = nil
	td.apply(g)
	if e, err = td.m.Standing.Lookup(netip.MustParseAddr("2001:db8::1")); err != nil || e.Standing != maps.StandingNew {
		t.Fatalf("known good removed: %+v, %v", e, err)
	}
	if err := td.m.Standing.Delete(a); err != nil {
		t.Fatal(err)
	}
	if e, _ = td.m.Standing.Lookup(a); e.Tracked {
		t.Fatal("deleted entry still tracked")
	}
}

// TestStandingSurvivesRestart: the standing table is pinned.
func TestStandingSurvivesRestart(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	pin := "/sys/fs/bpf/eg-knowngood-test-" + strings.ReplaceAll(dir[len(dir)-8:], "/", "")
	t.Cleanup(func() { loader.Unpin(pin) })
	td := openPinnedTestDatapath(t, smallSizes, pin)
	td.apply(defaultGen(policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}}))
	a := netip.MustParseAddr("198.18.3.4")
	if err := td.m.Standing.Set(a, maps.StandingEstablished); err != nil {
		t.Fatal(err)
	}
	td.d.Close()
	td2 := openPinnedTestDatapath(t, smallSizes, pin)
	if e, err := td2.m.Standing.Lookup(a); err != nil || e.Standing != maps.StandingEstablished {
		t.Fatalf("after restart: %+v, %v", e, err)
	}
}

// TestStandingTCPValidation: a source whose TCP connection to this host is
// ESTABLISHED (a real loopback connection, found by bpf_skc_lookup_tcp)
// becomes validated at its next update; a packet of no connection does
// not.
func TestStandingTCPValidation(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	g := defaultGen(policy.CompiledRule{ID: 0, SourceKey: policy.KeyBits{V4: 32, V6: 64}, PerSource: policy.Bucket{Packets: perSecond(1000, 1000)}})
	g.Standing = policy.Standing{EstablishedAfter: 30 * time.Second, Penalty: time.Minute}
	td.apply(g)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	conn, err := net.Dial("tcp4", ln.Addr().String())
	must(t, err)
	t.Cleanup(func() { conn.Close() })
	srv, err := ln.Accept()
	must(t, err)
	t.Cleanup(func() { srv.Close() })
	client := conn.LocalAddr().(*net.TCPAddr)
	server := ln.Addr().(*net.TCPAddr)
	lo := netip.MustParseAddr("127.0.0.1")
	frame := func(sport, dport int) []byte {
		return packet.Frame{Src: lo, Dst: lo, Proto: packet.ProtoTCP, SrcPort: uint16(sport), DstPort: uint16(dport),
			TCPFlags: 0x10, Payload: 10}.Build()
	}
	// A port with no connection: the source stays new.
	td.setClock(time.Hour)
	td.run(frame(client.Port, server.Port+1))
	td.run(frame(client.Port, server.Port+1))
	td.setClock(time.Hour + 2*time.Second)
	td.run(frame(client.Port, server.Port+1))
	e, err := td.m.Standing.Lookup(lo)
	must(t, err)
	if e.Standing != maps.StandingNew {
		t.Fatalf("no connection: %+v", e)
	}
	// Its connection: validated at the next epoch's first packet.
	td.setClock(time.Hour + 4*time.Second)
	td.run(frame(client.Port, server.Port))
	if e, _ = td.m.Standing.Lookup(lo); e.Standing != maps.StandingValidated || e.Why != maps.WhyTCP {
		t.Fatalf("established connection: %+v", e)
	}
	st, err := td.m.Standing.Counts()
	must(t, err)
	if st.Validated != 1 {
		t.Errorf("validated_tcp events: %d, want 1", st.Validated)
	}
}
