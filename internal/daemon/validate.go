package daemon

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/edgeguard/edgeguard/internal/asn"
	"github.com/edgeguard/edgeguard/internal/policy"
)

// Checked is a policy file checked as the daemon would before applying it.
type Checked struct {
	Policy   *policy.Policy
	Compiled *policy.Compiled
	// ASNLoaded says whether the policy's asn_data was loaded and
	// compiled in; ASNEntries is how many ranges it held.
	ASNLoaded  bool
	ASNEntries int
}

// CheckFile validates and compiles a policy file as the daemon would
// before applying it: the XDP side, the l7: section and, when loadASN is
// set and the policy names asn_data, with that data loaded, so warnings
// about ASNs without prefixes are about the real data. It needs no daemon
// and touches nothing.
func CheckFile(ctx context.Context, path string, loadASN bool, progress func(done, total int64)) (Checked, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Checked{}, fmt.Errorf("load policy: %w", err)
	}
	p, err := policy.Parse(path, raw, os.ReadFile)
	if err != nil {
		return Checked{}, withL7Problems(err, raw, path)
	}
	out := Checked{Policy: p}
	var entries []asn.Entry
	if loadASN && p.ASNData.Path != "" {
		t, err := asn.Load(ctx, []string{p.ASNData.Path}, asn.Options{Progress: progress})
		if err != nil {
			return Checked{}, fmt.Errorf("asn data: %w", err)
		}
		entries = slices.Collect(t.All())
		out.ASNLoaded, out.ASNEntries = true, t.Len()
	}
	if out.Compiled, err = policy.Compile(p, entries); err != nil {
		return Checked{}, err
	}
	if _, _, _, err := decodeL7(p, path); err != nil {
		return Checked{}, err
	}
	if err := checkFleet(p); err != nil {
		return Checked{}, err
	}
	return out, nil
}
