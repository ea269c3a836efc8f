// Package l7test holds test helpers of the L7 packages: nothing in the
// product imports it.
package l7test

import (
	"sync/atomic"
	"time"
)

// ManualClock is an l7.Clock that moves only when told to. Safe for
// concurrent use.
type ManualClock struct{ ns atomic.Int64 }

// Now returns the clock's current reading.
func (c *ManualClock) Now() int64 { return c.ns.Load() }

// Set moves the clock to ns.
func (c *ManualClock) Set(ns int64) { c.ns.Store(ns) }

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
