package daemon

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/edgeguard/edgeguard/internal/l7/proxy"
	"github.com/edgeguard/edgeguard/internal/maps"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// Promote implements proxy.Promoter: a source whose authenticated request
// passed its L7 route's limits (standing.l7_promotion) is marked validated
// (why l7_promotion), which the L7 class ranking reads as authenticated
// (docs/operations.md, "L7 promotion"). A penalised source stays
// penalised (its penalty decays on its own), and one already validated
// (other than by a TCP handshake, which gives no priority) is not written
// again. The proxy rate-limits the calls
// (standing.l7_promotion.rate); no daemon lock is taken.
func (w *standingWatch) Promote(_ context.Context, src netip.Addr, reason string) error {
	st := w.store()
	if st == nil {
		return fmt.Errorf("promote %s: no data plane loaded", src)
	}
	e, err := st.Lookup(src)
	if err != nil {
		return fmt.Errorf("promote %s: %w", src, err)
	}
	switch {
	case e.Tracked && e.Standing == maps.StandingValidated && e.Why != maps.WhyTCP:
		// A handshake's validation is rank 2 (docs/operations.md, "Class
		// ranking"): promotion still writes over it.
		return nil
	case e.Tracked && e.Standing == maps.StandingPenalised:
		w.log.Debug("l7 promotion of a penalised source skipped", "src", src, "reason", reason)
		return nil
	}
	if err := st.Set(src, maps.StandingValidated); err != nil {
		return fmt.Errorf("promote %s: %w", src, err)
	}
	return nil
}

// promotion is the L7 stage's promotion setting from a compiled policy's
// standing.l7_promotion.
func promotion(c *policy.Compiled) proxy.Promotion {
	lp := c.Standing.L7Promotion
	return proxy.Promotion{Enabled: lp.Enabled, Rate: int64(lp.Rate.Count), Per: lp.Rate.Per}
}
