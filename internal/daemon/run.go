// Package daemon runs Edgeguard on a host: it loads (or re-opens) the data
// plane, attaches it to interfaces, applies the policy and reports counters
// until its context ends.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/edgeguard/edgeguard/internal/loader"
	"github.com/edgeguard/edgeguard/internal/maps"
)

// Config is what `edgectl run` was asked to do.
type Config struct {
	Ifaces   []string
	Mode     loader.Mode
	PinDir   string
	Sizes    loader.Sizes
	Keep     bool          // on stop, leave the program attached (pins keep it)
	Interval time.Duration // between counter lines; 0 disables them
	Out      io.Writer     // where counter lines go
	Logger   *slog.Logger
}

// Run enforces the built-in default policy on the configured interfaces
// until ctx ends, then detaches (or, with Keep, leaves the pinned program
// enforcing).
func Run(ctx context.Context, cfg Config) (err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Ifaces) == 0 {
		return errors.New("no interface given: use --iface IFACE (repeatable)")
	}
	d, err := loader.Load(loader.Options{Sizes: cfg.Sizes, PinDir: cfg.PinDir, Logger: log})
	if err != nil {
		return err
	}
	defer d.Close()
	m := maps.New(d)

	if err := m.Apply(DefaultGeneration()); err != nil {
		return fmt.Errorf("apply default policy: %w", err)
	}
	gen, _ := m.ActiveGen()
	log.Info("policy applied", "policy", "built-in default", "generation", gen)

	var atts []*loader.Attachment
	defer func() {
		for _, a := range atts {
			if cfg.Keep {
				a.Release()
				continue
			}
			if derr := a.Detach(); derr != nil {
				log.Error("detach", "iface", a.Iface, "err", derr)
			}
		}
		if !cfg.Keep && cfg.PinDir != "" {
			if uerr := loader.Unpin(cfg.PinDir); uerr != nil {
				log.Error("unpin", "err", uerr)
			}
		}
		if cfg.Keep {
			log.Info("stopped; the program keeps enforcing from its pins", "pins", cfg.PinDir)
		} else {
			log.Info("stopped and detached")
		}
	}()
	for _, iface := range cfg.Ifaces {
		a, err := d.Attach(iface, cfg.Mode)
		if err != nil {
			return err
		}
		atts = append(atts, a)
		log.Info("attached", "iface", iface, "mode", a.Mode)
	}

	if cfg.Interval <= 0 || cfg.Out == nil {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	prev, err := m.Counters()
	if err != nil {
		return err
	}
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			cur, err := m.Counters()
			if err != nil {
				log.Error("read counters", "err", err)
				continue
			}
			occ, _ := m.Tables()
			fmt.Fprintln(cfg.Out, CounterLine(prev, cur, now.Sub(last), occ))
			prev, last = cur, now
		}
	}
}

// CounterLine formats one line of rates between two counter readings.
func CounterLine(prev, cur maps.Counters, dt time.Duration, occ map[string]maps.Occupancy) string {
	rate := func(a maps.Action, r maps.Reason) float64 {
		return float64(cur.Get(a, r).Packets-prev.Get(a, r).Packets) / dt.Seconds()
	}
	total := func(a maps.Action) float64 {
		return float64(cur.Total(a).Packets-prev.Total(a).Packets) / dt.Seconds()
	}
	line := fmt.Sprintf("pass %.0f/s  drop %.0f/s (deny %.0f, source %.0f, prefix %.0f, asn %.0f, global %.0f)  would-drop %.0f/s",
		total(maps.ActPass), total(maps.ActDrop),
		rate(maps.ActDrop, maps.ReasonDeny), rate(maps.ActDrop, maps.ReasonSrcLimit),
		rate(maps.ActDrop, maps.ReasonPrefixLimit), rate(maps.ActDrop, maps.ReasonASNLimit),
		rate(maps.ActDrop, maps.ReasonGlobalLimit), total(maps.ActWouldDrop))
	if o, ok := occ["sources"]; ok {
		line += fmt.Sprintf("  sources %d/%d", o.Entries, o.Capacity)
	}
	return line
}
