package daemon

import "net/netip"

func netipMust(s string) netip.Addr { return netip.MustParseAddr(s) }
