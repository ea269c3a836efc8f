package shield

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// stateVersion is the state file's format version.
const stateVersion = 1

type savedAgg struct {
	Key Key `json:"key"`
	aggState
}

type savedState struct {
	Version    int        `json:"version"`
	Saved      time.Time  `json:"saved"`
	Aggregates []savedAgg `json:"aggregates"`
	Forbid     []Forbid   `json:"forbid,omitempty"` // the operator's
}

// Save returns the learned baselines and the operator's forbids as JSON
// (the daemon writes it atomically to its state directory). Current
// rates, surges and actions are not saved: actions live in the data
// plane's pinned maps until their TTL.
func (e *Engine) Save(now time.Time) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := savedState{Version: stateVersion, Saved: now, Forbid: e.opForbid}
	for k, a := range e.tracked {
		if a.Learned == 0 {
			continue
		}
		st.Aggregates = append(st.Aggregates, savedAgg{Key: k, aggState: aggState{Packets: a.Packets, Bits: a.Bits, Learned: a.Learned, Seen: a.Seen}})
	}
	slices.SortFunc(st.Aggregates, func(x, y savedAgg) int { return cmp.Compare(y.Learned, x.Learned) })
	return json.Marshal(st)
}

// Load restores what Save wrote. A file from another version, or with any
// value that no Save writes (negative or non-finite weights, keys that do
// not round-trip, a kind out of range), is refused as a whole: the caller
// starts without it. Baselines decay for the time the daemon was down.
// At most MaxAggregates are kept, the longest learned first.
func (e *Engine) Load(data []byte, now time.Time) (int, error) {
	var st savedState
	if err := json.Unmarshal(data, &st); err != nil {
		return 0, fmt.Errorf("decode shield state: %w", err)
	}
	if st.Version != stateVersion {
		return 0, fmt.Errorf("shield state version %d, this daemon reads %d", st.Version, stateVersion)
	}
	seen := map[Key]bool{}
	for _, a := range st.Aggregates {
		if err := checkSaved(a); err != nil {
			return 0, err
		}
		if seen[a.Key] {
			return 0, fmt.Errorf("shield state: aggregate %s twice", a.Key)
		}
		seen[a.Key] = true
	}
	for _, f := range st.Forbid {
		if f.Key == nil && !f.Prefix.IsValid() && f.ASN == 0 {
			return 0, errors.New("shield state: a forbid entry names nothing")
		}
		if f.Key != nil {
			if _, err := ParseKey(f.Key.String()); err != nil {
				return 0, fmt.Errorf("shield state: forbid: %w", err)
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	down := now.Sub(st.Saved)
	var decay float32 = 1
	if down > 0 && e.cfg.HalfLife > 0 {
		decay = float32(math.Exp(-down.Seconds() * math.Ln2 / e.cfg.HalfLife.Seconds()))
	}
	slices.SortFunc(st.Aggregates, func(x, y savedAgg) int { return cmp.Compare(y.Learned, x.Learned) })
	n := 0
	for _, a := range st.Aggregates {
		if len(e.tracked) >= e.cfg.MaxAggregates {
			break
		}
		s := &aggState{Packets: a.Packets, Bits: a.Bits, Learned: a.Learned, Seen: a.Seen, shape: e.shapes[a.Key.Rule]}
		for i := range s.Packets.W {
			s.Packets.W[i] *= decay
			s.Bits.W[i] *= decay
		}
		e.tracked[a.Key] = s
		n++
	}
	for _, f := range st.Forbid {
		dup := false
		for _, o := range e.forbid {
			dup = dup || o.same(f)
		}
		if !dup {
			e.opForbid = append(e.opForbid, f)
			e.forbid = append(e.forbid, f)
		}
	}
	return n, nil
}

func checkSaved(a savedAgg) error {
	k := a.Key
	if k.Kind >= numKinds {
		return fmt.Errorf("shield state: aggregate kind %d", k.Kind)
	}
	back, err := ParseKey(k.String())
	if err != nil || back != k {
		return fmt.Errorf("shield state: aggregate %q does not read back", k)
	}
	if a.Learned < 0 {
		return fmt.Errorf("shield state: %s: learned %s", k, a.Learned)
	}
	for _, h := range []*hist{&a.Packets, &a.Bits} {
		for _, w := range h.W {
			if w < 0 || math.IsNaN(float64(w)) || math.IsInf(float64(w), 0) {
				return fmt.Errorf("shield state: %s: histogram weight %v", k, w)
			}
		}
	}
	return nil
}
