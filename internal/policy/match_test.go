package policy

import (
	"errors"
	"strings"
	"testing"
)

// TestMatchItemsCheckedAtOnce: a match walked by its table reports its
// items' own problems with the problems across its fields, all at once.
func TestMatchItemsCheckedAtOnce(t *testing.T) {
	for _, tc := range []struct{ match, cross, item string }{
		{"{prefixes: [bad], asns: [1]}", "has prefixes and asns", `bad CIDR "bad"`},
		{"{protocol: sctp, src_ports: [0]}", `unknown protocol "sctp"`, `match port "0" must be a whole number from 1 to 65535`},
		{"{prefixes: [192.0.2.0/24], src_ports: [0]}", "src_ports needs a protocol", `match port "0"`},
		{"{protocol: tcp, icmp_types: [300]}", "icmp_types apply to icmp and icmpv6, not tcp", `icmp type "300"`},
	} {
		_, err := Parse("p.yaml", []byte("apiVersion: edgeguard/v1\nrules: [{name: a, match: "+tc.match+"}]\n"), nil)
		var ve *ValidationError
		if !errors.As(err, &ve) || len(ve.Problems) != 2 ||
			!strings.Contains(ve.Problems[0].Msg, tc.cross) || !strings.Contains(ve.Problems[1].Msg, tc.item) {
			t.Errorf("%s: %v; want %q then %q", tc.match, err, tc.cross, tc.item)
		}
	}
}
