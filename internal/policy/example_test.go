package policy_test

import (
	"fmt"

	"github.com/edgeguard/edgeguard/internal/policy"
)

func ExampleParseRate() {
	for _, s := range []string{"100/s", "3/min", "1.5/s", "1Gbps", "64KiB/s", "10MBps"} {
		r, unit, err := policy.ParseRate(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("%s = %d %s per %v (%s)\n", s, r.Count, unit, r.Per, policy.FormatRate(r, unit))
	}
	// Output:
	// 100/s = 100 packets per 1s (100/s)
	// 3/min = 3 packets per 1m0s (3/min)
	// 1.5/s = 3 packets per 2s (3/2s)
	// 1Gbps = 125000000 bytes per 1s (1Gbit/s)
	// 64KiB/s = 65536 bytes per 1s (64KiB/s)
	// rate "10MBps": "MBps" is easily confused with "Mbps"; write MB/s for bytes or Mbit/s for bits
}
