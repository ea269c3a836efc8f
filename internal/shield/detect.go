package shield

import (
	"time"

	"github.com/edgeguard/edgeguard/internal/policy"
)

// SurgeState is where an aggregate is in the surge detector.
type SurgeState uint8

// Surge states.
const (
	Normal  SurgeState = iota
	Pending            // above factor x baseline and min_rate, not yet for sustain
	Surging            // was above for sustain; ends after cooldown under end_factor x baseline
	Cooling            // surging, now under end_factor x baseline, not yet for cooldown
)

var stateNames = [...]string{"normal", "pending", "surging", "cooling"}

func (s SurgeState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// detector is one aggregate's surge state machine. The hysteresis is in
// both the levels (Factor to start, EndFactor to end) and the times
// (Sustain, Cooldown): a rate that flaps around Factor never holds long
// enough, one that dips under Factor during a surge does not end it.
type detector struct {
	State SurgeState
	Since time.Time // when State began
	Start time.Time // when the surge (Pending) began
}

// hot reports whether the aggregate is above its start threshold or in a
// surge: its intervals are not learned into the baseline.
func (d *detector) hot() bool { return d.State != Normal }

// step advances the detector with the current rate and baseline. It
// returns true when a surge ends at this step. The knobs are the policy's
// shield.surge: a surge starts above Factor x baseline and above MinRate,
// held for Sustain; it ends under EndFactor x baseline (or under
// MinRate), held for Cooldown.
func (d *detector) step(now time.Time, rate, baseline float64, c policy.Shield) (ended bool) {
	minRate := c.MinRate.PerSecond()
	above := rate > c.Factor*baseline && rate > minRate
	below := rate < c.EndFactor*baseline || rate < minRate
	switch d.State {
	case Normal:
		if above {
			d.State, d.Since, d.Start = Pending, now, now
		}
	case Pending:
		switch {
		case !above:
			d.State, d.Since = Normal, now
		case now.Sub(d.Since) >= c.Sustain:
			d.State, d.Since = Surging, now
		}
	case Surging:
		if below {
			d.State, d.Since = Cooling, now
			if c.Cooldown <= 0 {
				d.State = Normal
				return true
			}
		}
	case Cooling:
		switch {
		case !below:
			d.State, d.Since = Surging, now
		case now.Sub(d.Since) >= c.Cooldown:
			d.State, d.Since = Normal, now
			return true
		}
	}
	return false
}

// surging reports whether the aggregate is in a confirmed surge.
func (d *detector) surging() bool { return d.State == Surging || d.State == Cooling }
