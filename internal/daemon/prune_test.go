package daemon

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/testbed"
)

// TestShieldTickPrunesExpiredFingerprints: fingerprints left behind past
// their expiry (as after a crash) hold their mask slots until the shield's
// prune (every 10 s of its loop) deletes them; then the slots are free for
// new masks.
func TestShieldTickPrunesExpiredFingerprints(t *testing.T) {
	dir := t.TempDir()
	asnPath := filepath.Join(dir, "ip2asn.tsv")
	if err := os.WriteFile(asnPath, []byte(testbed.LabASNData), 0o644); err != nil {
		t.Fatal(err)
	}
	d := loadedDaemon(t, Options{StateDir: dir}, shieldTestPolicy(asnPath))
	masks := []maps.FieldMask{maps.FieldDPort, maps.FieldSPort, maps.FieldLen, maps.FieldTTL, maps.FieldProto | maps.FieldTCPFlags,
		maps.FieldProto | maps.FieldDPort, maps.FieldSrc, maps.FieldSrc | maps.FieldLen}
	// Expiring soon, yet far enough for a loaded machine to write all
	// eight before the first one expires.
	exp := time.Now().Add(3 * time.Second)
	for i, mk := range masks {
		f := maps.Fingerprint{ID: uint32(100 + i), Mask: mk, Proto: 6, DPort: 8000, SPort: 8001, Len: 1000, TTL: 3,
			TCPFlags: 0x12, Src: netip.MustParsePrefix("198.18.200.0/24"), Expires: exp, Origin: maps.OriginShield,
			Budget: maps.Rate{Count: 1, Per: time.Second, Burst: 1}}
		if mk == maps.FieldSrc|maps.FieldLen {
			f.Src = netip.MustParsePrefix("198.18.200.0/25")
		}
		if err := d.m.Fingerprints.Set(f); err != nil {
			t.Fatalf("fingerprint %d: %v", f.ID, err)
		}
	}
	usedMasks := func() uint32 {
		t.Helper()
		var fm loader.LimiterEgFpMasks
		if err := d.dp.Objects.FpMasks.Lookup(uint32(0), &fm); err != nil {
			t.Fatal(err)
		}
		return fm.N
	}
	if n := usedMasks(); n != uint32(len(masks)) {
		t.Fatalf("%d masks in use after writing %d", n, len(masks))
	}
	time.Sleep(time.Until(exp) + 100*time.Millisecond)
	ninth := maps.Fingerprint{ID: 200, Mask: maps.FieldDPort | maps.FieldSPort, DPort: 1, SPort: 2,
		Expires: time.Now().Add(time.Hour), Budget: maps.Rate{Count: 1, Per: time.Second, Burst: 1}, Origin: maps.OriginShield}
	if n := usedMasks(); n != uint32(len(masks)) {
		t.Fatalf("expired, not yet pruned: %d masks in use, want %d (still held)", n, len(masks))
	}
	// The shield's loop, its first tick: the prune block runs.
	d.shield.tick(time.Now())
	if n := usedMasks(); n != 0 {
		t.Fatalf("after the shield's prune: %d masks in use, want 0", n)
	}
	if err := d.m.Fingerprints.Set(ninth); err != nil {
		if errors.Is(err, maps.ErrFingerprintMasks) {
			t.Fatalf("a new mask after the prune: %v (the expired ones' slots were not freed)", err)
		}
		t.Fatal(err)
	}
}
