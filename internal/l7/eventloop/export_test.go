package eventloop

import "net/netip"

// SetUpstreamAddrs replaces what the upstream's name resolved to (tests:
// a name with several addresses, without a resolver that has one).
func SetUpstreamAddrs(s *Server, addrs []netip.AddrPort) { s.addrs.Store(&addrs) }
