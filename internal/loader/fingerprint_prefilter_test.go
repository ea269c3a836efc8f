package loader_test

import (
	"errors"
	"fmt"
	"iter"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/packet"
	"github.com/edgeguard/edgeguard/internal/policy"
)

const fpAllFields = maps.FieldProto | maps.FieldDPort | maps.FieldSPort | maps.FieldLen | maps.FieldTTL | maps.FieldTCPFlags | maps.FieldSrc

// fpPkt is a test packet by the fields a fingerprint looks at.
type fpPkt struct {
	src     netip.Addr
	proto   uint8 // ICMP: the packet's family's
	sport   uint16
	dport   uint16 // ICMP: the type
	payload int
	ttl     uint8
	flags   uint8 // TCP only
}

func (p fpPkt) frame() []byte {
	f := packet.Frame{Src: p.src, Proto: p.proto, SrcPort: p.sport, DstPort: p.dport, Payload: p.payload, TCPFlags: p.flags}
	if p.src.Is6() {
		f.Dst = netip.MustParseAddr("fd00::1")
	}
	b := f.Build()
	if p.src.Is4() {
		b[14+8] = p.ttl
	} else {
		b[14+7] = p.ttl
	}
	return b
}

// l4 is the fields as the data plane reads them: no source port for ICMP
// and a one-byte type, no flags but for TCP, the IP total length (IPv6: 40
// + payload length).
func (p fpPkt) l4() (dport, sport uint16, flags uint8, ipLen uint16) {
	hdr := 8
	dport = p.dport
	switch p.proto {
	case packet.ProtoICMP, packet.ProtoICMPv6:
		dport &= 0xff
	case packet.ProtoTCP:
		hdr, sport, flags = 20, p.sport, p.flags
	case packet.ProtoUDP:
		sport = p.sport
	}
	ip := 20
	if p.src.Is6() {
		ip = 40
	}
	return dport, sport, flags, uint16(ip + hdr + p.payload)
}

// fpMatches is the reference matcher: every field of the mask equal, the
// source in the prefix in the data plane's 128-bit space (IPv4 mapped).
func fpMatches(f maps.Fingerprint, p fpPkt) bool {
	dport, sport, flags, ipLen := p.l4()
	m := f.Mask
	switch {
	case m&maps.FieldProto != 0 && f.Proto != p.proto,
		m&maps.FieldDPort != 0 && f.DPort != dport,
		m&maps.FieldSPort != 0 && f.SPort != sport,
		m&maps.FieldLen != 0 && f.Len != ipLen,
		m&maps.FieldTTL != 0 && f.TTL != p.ttl,
		m&maps.FieldTCPFlags != 0 && f.TCPFlags != flags:
		return false
	}
	if m&maps.FieldSrc != 0 {
		bits := f.Src.Bits()
		if f.Src.Addr().Is4() {
			bits += 96
		}
		p16 := netip.PrefixFrom(netip.AddrFrom16(maps.Addr16(f.Src.Addr())), bits)
		return p16.Contains(netip.AddrFrom16(maps.Addr16(p.src)))
	}
	return true
}

// fpFor is a fingerprint (zero budget: every match dropped) of p's values
// under mask m, src of length bits.
func fpFor(id uint32, m maps.FieldMask, p fpPkt, bits int) maps.Fingerprint {
	dport, sport, flags, ipLen := p.l4()
	return maps.Fingerprint{ID: id, Mask: m, Proto: p.proto, DPort: dport, SPort: sport, Len: ipLen, TTL: p.ttl,
		TCPFlags: flags, Src: netip.PrefixFrom(p.src, bits).Masked(), Expires: time.Now().Add(time.Hour)}
}

// TestFingerprintPrefilterFields: with the prefilter in front, a
// fingerprint of every single field and of the combinations the other
// tests and the shield use still matches its packet, IPv4 and IPv6, ICMP
// (dport: the type) included; a packet off by one field of the mask
// passes, one off by a field outside the mask does not; deleted, it
// matches nothing. Masks come and go through the same slots.
func TestFingerprintPrefilterFields(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	td.apply(generation(policy.CompiledRule{ID: 0}))
	all := []maps.FieldMask{maps.FieldProto, maps.FieldDPort, maps.FieldSPort, maps.FieldLen, maps.FieldTTL, maps.FieldTCPFlags}
	var masks []maps.FieldMask
	masks = append(masks, all...)
	masks = append(masks, maps.FieldSrc,
		maps.FieldProto|maps.FieldDPort|maps.FieldLen, maps.FieldProto|maps.FieldDPort, maps.FieldDPort|maps.FieldTTL,
		maps.FieldLen|maps.FieldTTL, maps.FieldProto|maps.FieldTCPFlags, maps.FieldSrc|maps.FieldDPort, maps.FieldSrc|maps.FieldLen,
		maps.FieldProto|maps.FieldSPort|maps.FieldLen, maps.FieldProto|maps.FieldDPort|maps.FieldLen|maps.FieldTCPFlags,
		maps.FieldProto|maps.FieldSrc, maps.FieldProto|maps.FieldLen|maps.FieldTTL, fpAllFields)
	bases := []struct {
		name string
		p    fpPkt
		bits []int // source prefix lengths to try
	}{
		{"tcp4", fpPkt{src: netip.MustParseAddr("198.18.7.9"), proto: packet.ProtoTCP, sport: 40000, dport: 443, payload: 12, ttl: 9, flags: 0x02}, []int{32, 24, 16, 12, 0}},
		{"udp4", fpPkt{src: netip.MustParseAddr("198.19.200.1"), proto: packet.ProtoUDP, sport: 53, dport: 1900, payload: 100, ttl: 250}, []int{24}},
		{"icmp4", fpPkt{src: netip.MustParseAddr("198.18.0.77"), proto: packet.ProtoICMP, dport: 8, payload: 56, ttl: 64}, []int{24}},
		{"tcp6", fpPkt{src: netip.MustParseAddr("fd00:12:34::5"), proto: packet.ProtoTCP, sport: 1234, dport: 80, payload: 0, ttl: 1, flags: 0x12}, []int{128, 48, 32, 16, 4}},
		{"udp6", fpPkt{src: netip.MustParseAddr("fdff:ffff:1::2"), proto: packet.ProtoUDP, sport: 65535, dport: 0, payload: 7, ttl: 64}, []int{48}},
		{"icmp6", fpPkt{src: netip.MustParseAddr("fd00:abcd::9"), proto: packet.ProtoICMPv6, dport: 128, payload: 16, ttl: 255}, []int{64}},
	}
	// off returns p with field f changed.
	off := func(p fpPkt, f maps.FieldMask) fpPkt {
		switch f {
		case maps.FieldProto:
			// TCP <-> UDP keeps the ports; ICMP becomes UDP to the type.
			if p.proto == packet.ProtoUDP {
				p.proto = packet.ProtoTCP
			} else {
				p.proto = packet.ProtoUDP
			}
		case maps.FieldDPort:
			p.dport++
		case maps.FieldSPort:
			p.sport++
		case maps.FieldLen:
			p.payload++
		case maps.FieldTTL:
			p.ttl--
		case maps.FieldTCPFlags:
			p.flags ^= 0x01
		case maps.FieldSrc:
			a := p.src.As16()
			a[0] ^= 0x80 // outside any prefix of length 1 or more
			if p.src.Is4() {
				a4 := p.src.As4()
				a4[0] ^= 0x80
				p.src = netip.AddrFrom4(a4)
			} else {
				p.src = netip.AddrFrom16(a)
			}
		}
		return p
	}
	id := uint32(1)
	for _, base := range bases {
		for _, m := range masks {
			for _, bits := range base.bits {
				if m&maps.FieldSrc == 0 && bits != base.bits[0] {
					continue
				}
				name := fmt.Sprintf("%s/%#x/%d", base.name, uint32(m), bits)
				f := fpFor(id, m, base.p, bits)
				id++
				td.setFingerprint(f)
				if got := td.run(base.p.frame()); got != xdpDrop {
					t.Fatalf("%s: its packet: verdict %d, want drop", name, got)
				}
				for _, field := range append(all, maps.FieldSrc) {
					q := off(base.p, field)
					if field == maps.FieldTCPFlags && q.proto != packet.ProtoTCP {
						continue // no flags to change
					}
					if field == maps.FieldSrc && bits == 0 {
						continue // /0 holds every source
					}
					want := uint32(xdpDrop)
					if !fpMatches(f, q) {
						want = xdpPass
					}
					// The reference agrees with the intent (else the
					// test is wrong): a field of the mask changed
					// passes, another is still dropped. A protocol
					// change also changes the length and the fields
					// read; ICMP has no source port.
					icmpSport := field == maps.FieldSPort && base.p.proto != packet.ProtoTCP && base.p.proto != packet.ProtoUDP
					if field != maps.FieldProto && !icmpSport && (m&field != 0) != (want == xdpPass) {
						t.Fatalf("%s: off by %#x: the reference says %d", name, uint32(field), want)
					}
					if got := td.run(q.frame()); got != want {
						t.Fatalf("%s: off by field %#x (%+v): verdict %d, want %d", name, uint32(field), q, got, want)
					}
				}
				must(t, td.m.Fingerprints.Delete(f.ID))
				if got := td.run(base.p.frame()); got != xdpPass {
					t.Fatalf("%s: deleted, its packet: verdict %d, want pass", name, got)
				}
			}
		}
	}
}

func mapsKeys[K comparable, V any](m map[K]V) iter.Seq[K] {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// fpKeyOf is what makes two fingerprints one rule: the mask and the
// values under it.
func fpKeyOf(f maps.Fingerprint) maps.Fingerprint {
	k := maps.Fingerprint{Mask: f.Mask}
	if f.Mask&maps.FieldProto != 0 {
		k.Proto = f.Proto
	}
	if f.Mask&maps.FieldDPort != 0 {
		k.DPort = f.DPort
	}
	if f.Mask&maps.FieldSPort != 0 {
		k.SPort = f.SPort
	}
	if f.Mask&maps.FieldLen != 0 {
		k.Len = f.Len
	}
	if f.Mask&maps.FieldTTL != 0 {
		k.TTL = f.TTL
	}
	if f.Mask&maps.FieldTCPFlags != 0 {
		k.TCPFlags = f.TCPFlags
	}
	if f.Mask&maps.FieldSrc != 0 {
		k.Src = f.Src
	}
	return k
}

// TestFingerprintPrefilterSharedPort: two fingerprints share a port (one
// mask, then two masks); deleting one keeps the other matching and stops
// the deleted one's packets being dropped. A fingerprint replaced under
// another mask, with all 8 slots taken, moves into its own old slot.
func TestFingerprintPrefilterSharedPort(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	td.apply(generation(policy.CompiledRule{ID: 0}))
	a := fpPkt{src: netip.MustParseAddr("198.18.3.3"), proto: packet.ProtoUDP, sport: 5000, dport: 7000, payload: 10, ttl: 64}
	b := a
	b.payload = 20
	c := a
	c.ttl, c.payload = 7, 30
	for _, second := range []maps.FieldMask{maps.FieldProto | maps.FieldDPort | maps.FieldLen, maps.FieldProto | maps.FieldDPort | maps.FieldTTL} {
		other := b
		if second&maps.FieldTTL != 0 {
			other = c
		}
		td.setFingerprint(fpFor(1, maps.FieldProto|maps.FieldDPort|maps.FieldLen, a, 32))
		td.setFingerprint(fpFor(2, second, other, 32))
		if td.run(a.frame()) != xdpDrop || td.run(other.frame()) != xdpDrop {
			t.Fatalf("mask %#x: both installed: a packet of one passed", uint32(second))
		}
		must(t, td.m.Fingerprints.Delete(1))
		if td.run(other.frame()) != xdpDrop {
			t.Fatalf("mask %#x: the one left on the shared port no longer matches", uint32(second))
		}
		if td.run(a.frame()) != xdpPass {
			t.Fatalf("mask %#x: the deleted one still drops", uint32(second))
		}
		td.setFingerprint(fpFor(1, maps.FieldProto|maps.FieldDPort|maps.FieldLen, a, 32))
		must(t, td.m.Fingerprints.Delete(2))
		if td.run(a.frame()) != xdpDrop || td.run(other.frame()) != xdpPass {
			t.Fatalf("mask %#x: after deleting the other one", uint32(second))
		}
		must(t, td.m.Fingerprints.Delete(1))
	}

	// 8 masks, then fingerprint 8 (alone in its mask) replaced under a
	// ninth mask: it takes its own old slot.
	masks := []maps.FieldMask{maps.FieldDPort, maps.FieldSPort, maps.FieldLen, maps.FieldTTL, maps.FieldProto | maps.FieldTCPFlags,
		maps.FieldProto | maps.FieldDPort, maps.FieldSrc, maps.FieldProto | maps.FieldLen}
	for i, m := range masks {
		p := a
		p.dport, p.sport, p.payload, p.ttl = uint16(100+i), uint16(200+i), 300+i, uint8(10+i)
		p.src = netip.AddrFrom4([4]byte{198, 18, 100, byte(i)})
		if m&maps.FieldTCPFlags != 0 {
			p.proto, p.flags = packet.ProtoTCP, 0x02
		}
		td.setFingerprint(fpFor(uint32(10+i), m, p, 32))
		if td.run(p.frame()) != xdpDrop {
			t.Fatalf("mask %d of 8: its packet passed", i)
		}
	}
	ninth := a
	ninth.dport, ninth.sport = 9999, 9998
	if err := td.m.Fingerprints.Set(fpFor(99, maps.FieldDPort|maps.FieldSPort, ninth, 32)); !errors.Is(err, maps.ErrFingerprintMasks) {
		t.Fatalf("a ninth mask: %v", err)
	}
	if td.run(ninth.frame()) != xdpPass {
		t.Fatal("the refused ninth mask matches")
	}
	td.setFingerprint(fpFor(17, maps.FieldDPort|maps.FieldSPort, ninth, 32))
	if td.run(ninth.frame()) != xdpDrop {
		t.Fatal("fingerprint 17 under its new mask: its packet passed")
	}
	old := a
	old.payload = 307
	old.src = netip.AddrFrom4([4]byte{198, 18, 100, 7})
	if td.run(old.frame()) != xdpPass {
		t.Fatal("fingerprint 17's old form still matches")
	}
	for i := range 7 {
		p := a
		p.dport, p.sport, p.payload, p.ttl = uint16(100+i), uint16(200+i), 300+i, uint8(10+i)
		p.src = netip.AddrFrom4([4]byte{198, 18, 100, byte(i)})
		if masks[i]&maps.FieldTCPFlags != 0 {
			p.proto, p.flags = packet.ProtoTCP, 0x02
		}
		if td.run(p.frame()) != xdpDrop {
			t.Fatalf("mask %d after the replacement: its packet passed", i)
		}
	}
}

// TestFingerprintPrefilterRebuilt: fingerprints pinned by a version
// without the prefilter (an empty prefilter) are matched again from the
// next fingerprint change.
func TestFingerprintPrefilterRebuilt(t *testing.T) {
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	td.apply(generation(policy.CompiledRule{ID: 0}))
	p := fpPkt{src: netip.MustParseAddr("fd00:5::1"), proto: packet.ProtoUDP, sport: 5000, dport: 7000, payload: 10, ttl: 64}
	td.setFingerprint(fpFor(1, maps.FieldProto|maps.FieldDPort|maps.FieldSrc, p, 48))
	must(t, td.d.Objects.FpPreWords.Put(uint32(0), new(loader.LimiterEgFpPre)))
	if td.run(p.frame()) != xdpPass {
		t.Fatal("emptied prefilter: still matched (the test would prove nothing)")
	}
	must(t, td.m.Fingerprints.Delete(42))
	if td.run(p.frame()) != xdpDrop {
		t.Fatal("after a fingerprint change: not matched again")
	}
}

// TestFingerprintPrefilterRandom installs and removes random fingerprints
// (values drawn from small sets so that they share ports, lengths and
// prefixes, and masks up to the 8 allowed) and checks the data plane's
// verdict on random packets against fpMatches. FP_SEED=n replays a seed.
func TestFingerprintPrefilterRandom(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FP_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("FP_SEED: %v", err)
		}
	}
	t.Logf("seed %d (replay: FP_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	td := newTestDatapath(t, smallSizes)
	td.setClock(ovrStart)
	td.apply(generation(policy.CompiledRule{ID: 0}))

	srcs := []netip.Addr{
		netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.1.7"), netip.MustParseAddr("198.19.5.9"),
		netip.MustParseAddr("198.18.200.1"), netip.MustParseAddr("fd00:1::1"), netip.MustParseAddr("fd00:1:2::3"),
		netip.MustParseAddr("fd01::7"), netip.MustParseAddr("fd00:ffff::1"), netip.MustParseAddr("::5"),
	}
	bitsV4 := []int{32, 24, 16, 15, 8}
	bitsV6 := []int{128, 48, 32, 16, 8}
	protos := []uint8{packet.ProtoTCP, packet.ProtoUDP, packet.ProtoICMP}
	dports := []uint16{53, 80, 8, 443}
	sports := []uint16{0, 53, 40000}
	payloads := []int{0, 10, 22}
	ttls := []uint8{1, 64}
	flags := []uint8{0x02, 0x12}
	pick := func() fpPkt {
		p := fpPkt{src: srcs[rng.IntN(len(srcs))], proto: protos[rng.IntN(len(protos))], dport: dports[rng.IntN(len(dports))],
			sport: sports[rng.IntN(len(sports))], payload: payloads[rng.IntN(len(payloads))], ttl: ttls[rng.IntN(len(ttls))],
			flags: flags[rng.IntN(len(flags))]}
		if p.proto == packet.ProtoICMP && p.src.Is6() {
			p.proto = packet.ProtoICMPv6
		}
		return p
	}
	type maskKey struct {
		m    maps.FieldMask
		bits int
	}
	keyOf := func(f maps.Fingerprint) maskKey {
		if f.Mask&maps.FieldSrc == 0 {
			return maskKey{f.Mask, -1}
		}
		b := f.Src.Bits()
		if f.Src.Addr().Is4() {
			b += 96
		}
		return maskKey{f.Mask, b}
	}
	// A pool of masks (more than 8, so the limit is hit), of two fields
	// or more (TestFingerprintPrefilterFields has the single ones: here
	// they would match nearly every packet).
	var pool []maskKey
	for len(pool) < 14 {
		m := maps.FieldMask(1 + rng.IntN(int(fpAllFields)))
		if bits.OnesCount32(uint32(m)) >= 2 {
			pool = append(pool, maskKey{m, 0})
		}
	}
	installed := map[uint32]maps.Fingerprint{}
	checked, drops, refusals := 0, 0, 0
	for round := 0; round < 60; round++ {
		for op := 0; op < 1+rng.IntN(8); op++ {
			id := uint32(1 + rng.IntN(40))
			if _, ok := installed[id]; ok && rng.IntN(3) == 0 {
				must(t, td.m.Fingerprints.Delete(id))
				delete(installed, id)
				continue
			}
			p := pick()
			mk := pool[rng.IntN(len(pool))]
			bits := bitsV4[rng.IntN(len(bitsV4))]
			if p.src.Is6() {
				bits = bitsV6[rng.IntN(len(bitsV6))]
			}
			f := fpFor(id, mk.m, p, bits)
			want := map[maskKey]bool{keyOf(f): true}
			for oid, o := range installed {
				if oid != id {
					want[keyOf(o)] = true
				}
			}
			err := td.m.Fingerprints.Set(f)
			switch {
			case len(want) > maps.MaxFingerprintMasks:
				if !errors.Is(err, maps.ErrFingerprintMasks) {
					t.Fatalf("round %d: %d masks: %v, want ErrFingerprintMasks", round, len(want), err)
				}
				refusals++
			case err != nil:
				t.Fatalf("round %d: set %+v: %v", round, f, err)
			default:
				// One rule per key: another id with the same key
				// is replaced (maps.SetFingerprint).
				for oid, o := range installed {
					if fpKeyOf(o) == fpKeyOf(f) {
						delete(installed, oid)
					}
				}
				installed[id] = f
			}
		}
		for range 40 {
			p := pick()
			if len(installed) > 0 && rng.IntN(2) == 0 {
				// Near an installed fingerprint: its packet with one
				// field perhaps changed.
				ids := slices.Sorted(mapsKeys(installed))
				f := installed[ids[rng.IntN(len(ids))]]
				q := fpPkt{src: p.src, proto: f.Proto, sport: f.SPort, dport: f.DPort, ttl: f.TTL, flags: f.TCPFlags, payload: p.payload}
				if f.Mask&maps.FieldSrc != 0 {
					q.src = f.Src.Addr()
					if rng.IntN(2) == 0 {
						q.src = p.src
					}
				}
				if q.proto == packet.ProtoICMP || q.proto == packet.ProtoICMPv6 {
					q.proto = packet.ProtoICMP
					if q.src.Is6() {
						q.proto = packet.ProtoICMPv6
					}
				}
				// The length: the fingerprint's if the header allows.
				_, _, _, l := q.l4()
				if d := int(f.Len) - int(l); d >= 0 && d < 200 && rng.IntN(4) != 0 {
					q.payload += d
				}
				p = q
			}
			want := uint32(xdpPass)
			var matching []maps.Fingerprint
			for _, f := range installed {
				if fpMatches(f, p) {
					want = xdpDrop
					matching = append(matching, f)
				}
			}
			if got := td.run(p.frame()); got != want {
				t.Fatalf("round %d (seed %d): packet %+v (src %v): verdict %d, reference %d; matching: %+v; %d installed",
					round, seed, p, p.src, got, want, matching, len(installed))
			}
			checked++
			if want == xdpDrop {
				drops++
			}
		}
	}
	t.Logf("%d packets checked, %d matched (dropped), %d ninth masks refused", checked, drops, refusals)
	if drops < checked/50 || drops > checked-checked/50 {
		t.Fatalf("%d of %d packets matched: the test does not exercise both verdicts", drops, checked)
	}
}
