package maps_test

import (
	"testing"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/maps/mapstest"
)

// mapsLab is a loaded limiter whose maps a test writes and reads.
type mapsLab struct {
	d *loader.Datapath
	m *maps.Maps
}

func newMapsLab(t *testing.T) *mapsLab {
	t.Helper()
	d, m := mapstest.Load(t, loader.Options{Sizes: mapstest.SmallSizes})
	return &mapsLab{d: d, m: m}
}

// TestMaxFingerprintID: the largest id among the fingerprints in the real
// map, expired ones included (they keep the id until pruned), and 0 for
// none.
func TestMaxFingerprintID(t *testing.T) {
	l := newMapsLab(t)
	top := func() uint32 {
		t.Helper()
		id, err := l.m.Fingerprints.MaxID()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	if id := top(); id != 0 {
		t.Fatalf("empty map: max id %d", id)
	}
	set := func(id uint32, port uint16, exp time.Time) {
		t.Helper()
		err := l.m.Fingerprints.Set(maps.Fingerprint{ID: id, Mask: maps.FieldProto | maps.FieldDPort, Proto: 17, DPort: port,
			Expires: exp, Budget: maps.Rate{Count: 1, Per: time.Second, Burst: 1}, Origin: maps.OriginShield})
		if err != nil {
			t.Fatalf("fingerprint %d: %v", id, err)
		}
	}
	hour := time.Now().Add(time.Hour)
	set(7, 7001, hour)
	set(41, 7041, time.Now().Add(200*time.Millisecond))
	set(3, 7003, hour)
	if id := top(); id != 41 {
		t.Fatalf("max id %d, want 41", id)
	}
	time.Sleep(300 * time.Millisecond)
	if id := top(); id != 41 {
		t.Fatalf("41 expired, not pruned: max id %d, want 41", id)
	}
	if n, err := l.m.Fingerprints.Prune(); err != nil || n != 1 {
		t.Fatalf("prune: %d, %v", n, err)
	}
	if id := top(); id != 7 {
		t.Fatalf("after the prune: max id %d, want 7", id)
	}
	if err := l.m.Fingerprints.Delete(7); err != nil {
		t.Fatal(err)
	}
	if id := top(); id != 3 {
		t.Fatalf("after deleting 7: max id %d, want 3", id)
	}
}
