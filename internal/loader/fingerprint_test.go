package loader_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

func (td *testDatapath) setFingerprint(f maps.Fingerprint) {
	td.tb.Helper()
	if err := td.m.Fingerprints.Set(f); err != nil {
		td.tb.Fatalf("set fingerprint %d: %v", f.ID, err)
	}
}

func (td *testDatapath) fingerprint(id uint32) maps.FingerprintState {
	td.tb.Helper()
	list, err := td.m.Fingerprints.All()
	if err != nil {
		td.tb.Fatal(err)
	}
	for _, f := range list {
		if f.ID == id {
			return f
		}
	}
	td.tb.Fatalf("fingerprint %d not listed: %+v", id, list)
	return maps.FingerprintState{}
}

func udpLen(src string, dport uint16, payload int) []byte {
	return packet.UDP4(src, 5000, dport, payload)
}

// TestFingerprintMatchDropsAndCounts: a fingerprint on UDP to one port with
// one IP length holds exactly those packets to its budget (reason
// fingerprint, no bucket of the rule charged), leaves other ports and
// lengths alone, counts, and stops at its expiry.
func TestFingerprintMatchDropsAndCounts(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	g := generation(policy.CompiledRule{ID: 0, PerASN: pkts(1000, 1000)})
	td.apply(withPrefixes(g, fact("198.18.0.0/16", 0, 64500)))
	td.setFingerprint(maps.Fingerprint{ID: 7, Mask: maps.FieldProto | maps.FieldDPort | maps.FieldLen, Proto: 17, DPort: 9999,
		Len: 20 + 8 + 64, Budget: rate(1, 3), Expires: time.Now().Add(10 * time.Second), Origin: maps.OriginShield})

	before := td.counters()
	if got := td.burst2(udpLen("198.18.1.1", 9999, 64), 20); got != 3 {
		t.Fatalf("matching flood: %d of 20 passed, want the fingerprint's burst of 3", got)
	}
	if got := td.burst2(udpLen("198.18.1.2", 9998, 64), 20); got != 20 {
		t.Fatalf("other port: %d of 20 passed", got)
	}
	if got := td.burst2(udpLen("198.18.1.3", 9999, 65), 20); got != 20 {
		t.Fatalf("other length: %d of 20 passed", got)
	}
	after := td.counters()
	if d := after.Get(maps.ActDrop, maps.ReasonFingerprint).Packets - before.Get(maps.ActDrop, maps.ReasonFingerprint).Packets; d != 17 {
		t.Fatalf("drops with reason fingerprint: %d, want 17", d)
	}
	st := td.fingerprint(7)
	if st.Matched.Packets != 20 || st.Dropped.Packets != 17 || st.Spared.Packets != 0 || st.Budget.Burst != 3 || st.Origin != maps.OriginShield {
		t.Fatalf("fingerprint state %+v", st)
	}
	// The ASN aggregate was charged by the 43 passed packets only.
	if got := td.burst("198.18.2.1", 1000); got != 1000-43 {
		t.Fatalf("ASN aggregate after the flood: %d passed, want %d", got, 1000-43)
	}
	td.setClock(ovrStart + 11*time.Second)
	if got := td.burst2(udpLen("198.18.1.1", 9999, 64), 20); got != 20 {
		t.Fatalf("after the expiry: %d of 20 passed", got)
	}
	if n, err := td.m.Fingerprints.Prune(); err != nil || n != 1 {
		t.Fatalf("prune: %d, %v", n, err)
	}
	if list, err := td.m.Fingerprints.All(); err != nil || len(list) != 0 {
		t.Fatalf("after pruning: %v %v", list, err)
	}
}

// TestFingerprintDryRunAndValidated: a dry-run fingerprint counts its
// would-drops and drops nothing; an enforcing one never drops a validated
// source (counted as spared) but does drop established and new ones.
func TestFingerprintDryRunAndValidated(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	g := generation(policy.CompiledRule{ID: 0})
	g.Standing = policy.Standing{EstablishedAfter: 30 * time.Second, Penalty: time.Hour}
	td.apply(g)
	exp := time.Now().Add(time.Hour)
	td.setFingerprint(maps.Fingerprint{ID: 1, Mask: maps.FieldDPort, DPort: 7000, DryRun: true, Expires: exp})
	if got := td.burst2(udpLen("198.18.1.1", 7000, 10), 10); got != 10 {
		t.Fatalf("dry run: %d of 10 passed", got)
	}
	if st := td.fingerprint(1); st.Matched.Packets != 10 || st.Dropped.Packets != 10 {
		t.Fatalf("dry run counters %+v", st)
	}
	must(t, td.m.Standing.Set(netip.MustParseAddr("198.18.1.7"), maps.StandingValidated))
	must(t, td.m.Standing.Set(netip.MustParseAddr("198.18.1.8"), maps.StandingEstablished))
	// Budget zero, enforcing: every match refused.
	td.setFingerprint(maps.Fingerprint{ID: 2, Mask: maps.FieldSrc | maps.FieldDPort, Src: netip.MustParsePrefix("198.18.1.0/24"),
		DPort: 7001, Expires: exp})
	if got := td.burst2(udpLen("198.18.1.7", 7001, 10), 10); got != 10 {
		t.Fatalf("validated source: %d of 10 passed, want all", got)
	}
	if got := td.burst2(udpLen("198.18.1.8", 7001, 10), 10); got != 0 {
		t.Fatalf("established source: %d of 10 passed, want 0", got)
	}
	if got := td.burst2(udpLen("198.18.2.8", 7001, 10), 10); got != 10 {
		t.Fatalf("outside the fingerprint's prefix: %d of 10 passed", got)
	}
	if st := td.fingerprint(2); st.Matched.Packets != 20 || st.Spared.Packets != 10 || st.Dropped.Packets != 10 {
		t.Fatalf("counters %+v", st)
	}
}

// TestFingerprintMasks: up to MaxFingerprintMasks distinct masks, each
// matching its own packets; one more is refused; deleting frees a mask.
func TestFingerprintMasks(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	td.apply(generation(policy.CompiledRule{ID: 0}))
	exp := time.Now().Add(time.Hour)
	masks := []maps.FieldMask{maps.FieldDPort, maps.FieldSPort, maps.FieldLen, maps.FieldTTL, maps.FieldProto | maps.FieldTCPFlags,
		maps.FieldProto | maps.FieldDPort, maps.FieldSrc, maps.FieldSrc | maps.FieldLen}
	for i, mk := range masks {
		f := maps.Fingerprint{ID: uint32(100 + i), Mask: mk, Proto: 6, DPort: 8000, SPort: 8001, Len: 1000, TTL: 3, TCPFlags: 0x12,
			Src: netip.MustParsePrefix("203.0.113.0/24"), Expires: exp}
		if mk == maps.FieldSrc|maps.FieldLen {
			f.Src = netip.MustParsePrefix("203.0.113.0/25")
		}
		td.setFingerprint(f)
	}
	err := td.m.Fingerprints.Set(maps.Fingerprint{ID: 200, Mask: maps.FieldDPort | maps.FieldSPort, DPort: 1, SPort: 2, Expires: exp})
	if !errors.Is(err, maps.ErrFingerprintMasks) {
		t.Fatalf("a ninth mask: %v, want ErrFingerprintMasks", err)
	}
	// TTL 3 only (mask 3).
	ttl := packet.UDP4("198.18.1.1", 5000, 53, 10)
	ttl[14+8] = 3
	if td.run(ttl) != xdpDrop {
		t.Fatal("TTL 3: passed")
	}
	if td.run(packet.Frame{Src: netip.MustParseAddr("198.18.1.1"), Proto: packet.ProtoTCP, SrcPort: 1, DstPort: 2, TCPFlags: 0x12}.Build()) != xdpDrop {
		t.Fatal("SYN-ACK: passed")
	}
	if td.run(packet.UDP4("203.0.113.200", 5000, 53, 10)) != xdpDrop {
		t.Fatal("203.0.113.0/24: passed")
	}
	if td.run(packet.UDP4("198.18.1.1", 5000, 53, 10)) != xdpPass {
		t.Fatal("a packet no fingerprint matches: dropped")
	}
	must(t, td.m.Fingerprints.Delete(103))
	if td.run(ttl) != xdpPass {
		t.Fatal("TTL 3 after deleting its fingerprint: dropped")
	}
	must(t, td.m.Fingerprints.Set(maps.Fingerprint{ID: 200, Mask: maps.FieldDPort | maps.FieldSPort, DPort: 1, SPort: 2, Expires: exp}))
	for name, f := range map[string]maps.Fingerprint{
		"no mask":    {ID: 1, Expires: exp},
		"bad bits":   {ID: 1, Mask: 1 << 9, Expires: exp},
		"no expiry":  {ID: 1, Mask: maps.FieldDPort},
		"past":       {ID: 1, Mask: maps.FieldDPort, Expires: time.Now().Add(-time.Second)},
		"src no pfx": {ID: 1, Mask: maps.FieldSrc, Expires: exp},
	} {
		if err := td.m.Fingerprints.Set(f); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func (td *testDatapath) burst2(frame []byte, n int) (passed int) {
	td.tb.Helper()
	for i := 0; i < n; i++ {
		if td.run(frame) == xdpPass {
			passed++
		}
	}
	return passed
}
