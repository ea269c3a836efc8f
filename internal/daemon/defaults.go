package daemon

import (
	"time"

	"github.com/edgeguard/edgeguard/internal/maps"
)

// Rule ids of the built-in default policy.
const (
	DefaultRuleID    = 0
	ReflectionRuleID = 1
)

// ReflectionPorts are UDP source ports of the amplification protocols most
// used in reflection floods: DNS, NTP, SSDP, memcached.
var ReflectionPorts = []uint16{53, 123, 1900, 11211}

func pps(n, burst uint64) maps.Rate { return maps.Rate{Count: n, Per: time.Second, Burst: burst} }

// DefaultGeneration is the policy `edgectl run` enforces when no policy file
// is given. The numbers are documented in the README; they are meant for an
// API edge host where one client rarely needs more than a few thousand
// packets per second:
//
//   - every source (IPv4 /32, IPv6 /64): 2,000 packets/s, burst 4,000;
//   - every IPv4 /24 and IPv6 /48 together: 20,000 packets/s, burst 40,000;
//   - every ASN together (once ASN data is loaded): 200,000 packets/s;
//   - UDP from source ports 53, 123, 1900, 11211 (reflection): 100 packets/s
//     per source and 10,000 packets/s for all of it together;
//   - no global limit (it depends on the host's capacity);
//   - malformed packets pass (the kernel drops them anyway); 1,000 drop
//     samples per second for top-talker reports.
func DefaultGeneration() maps.Generation {
	return maps.Generation{
		Settings: maps.Settings{
			Mode:      maps.ModeEnforce,
			Malformed: maps.ActPass,
			Samples:   pps(1000, 100),
		},
		Rules: []maps.Rule{
			{
				ID:      DefaultRuleID,
				Src:     maps.Bucket{Packets: pps(2000, 4000)},
				SrcLen4: 32, SrcLen6: 64,
				Agg:     maps.Bucket{Packets: pps(20000, 40000)},
				AggMode: maps.AggDerived, AggLen4: 24, AggLen6: 48,
				ASN:  maps.Bucket{Packets: pps(200000, 400000)},
				Mode: maps.ModeInherit,
			},
			{
				ID:      ReflectionRuleID,
				Src:     maps.Bucket{Packets: pps(100, 200)},
				SrcLen4: 32, SrcLen6: 64,
				Agg:     maps.Bucket{Packets: pps(10000, 20000)},
				AggMode: maps.AggWhole,
				Mode:    maps.ModeInherit,
			},
		},
		L4: reflectionMatches(),
	}
}

func reflectionMatches() []maps.L4Match {
	var out []maps.L4Match
	for _, p := range ReflectionPorts {
		out = append(out, maps.L4Match{Proto: 17, Dir: maps.L4Src, Port: p, RuleID: ReflectionRuleID})
	}
	return out
}
