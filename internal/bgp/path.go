package bgp

import (
	"fmt"
	"net/netip"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	bgppkt "github.com/osrg/gobgp/v3/pkg/packet/bgp"
)

// fragments are the fragment component's values (RFC 8955 4.2.2.12).
var fragments = map[string]uint64{
	"dont-fragment":  bgppkt.FRAG_FLAG_DONT,
	"is-fragment":    bgppkt.FRAG_FLAG_IS,
	"first-fragment": bgppkt.FRAG_FLAG_FIRST,
	"last-fragment":  bgppkt.FRAG_FLAG_LAST,
}

// ValidFragment reports whether s is a Match.Fragment value.
func ValidFragment(s string) bool {
	_, ok := fragments[s]
	return ok || s == "" || s == "not-a-fragment"
}

// flowSpecComponents are the rule's components in RFC 8955's order.
func flowSpecComponents(m Match) ([]bgppkt.FlowSpecComponentInterface, error) {
	v6 := m.Dst.Addr().Is6()
	if m.Src.IsValid() && m.Src.Addr().Is6() != v6 {
		return nil, fmt.Errorf("flowspec: source %s and destination %s are of different families", m.Src, m.Dst)
	}
	prefix := func(p netip.Prefix) bgppkt.AddrPrefixInterface {
		if v6 {
			return bgppkt.NewIPv6AddrPrefix(uint8(p.Bits()), p.Addr().String())
		}
		return bgppkt.NewIPAddrPrefix(uint8(p.Bits()), p.Addr().String())
	}
	eq := func(v uint64) []*bgppkt.FlowSpecComponentItem {
		return []*bgppkt.FlowSpecComponentItem{bgppkt.NewFlowSpecComponentItem(bgppkt.DEC_NUM_OP_EQ|bgppkt.DEC_NUM_OP_END, v)}
	}
	var out []bgppkt.FlowSpecComponentInterface
	if v6 {
		out = append(out, bgppkt.NewFlowSpecDestinationPrefix6(prefix(m.Dst), 0))
		if m.Src.IsValid() {
			out = append(out, bgppkt.NewFlowSpecSourcePrefix6(prefix(m.Src), 0))
		}
	} else {
		out = append(out, bgppkt.NewFlowSpecDestinationPrefix(prefix(m.Dst)))
		if m.Src.IsValid() {
			out = append(out, bgppkt.NewFlowSpecSourcePrefix(prefix(m.Src)))
		}
	}
	if m.Proto != 0 {
		// IPv6's component is the next header (RFC 8956 3.3).
		out = append(out, bgppkt.NewFlowSpecComponent(bgppkt.FLOW_SPEC_TYPE_IP_PROTO, eq(uint64(m.Proto))))
	}
	if m.DPort != 0 {
		out = append(out, bgppkt.NewFlowSpecComponent(bgppkt.FLOW_SPEC_TYPE_DST_PORT, eq(uint64(m.DPort))))
	}
	if m.SPort != 0 {
		out = append(out, bgppkt.NewFlowSpecComponent(bgppkt.FLOW_SPEC_TYPE_SRC_PORT, eq(uint64(m.SPort))))
	}
	if m.HasTCPFlags {
		// Exactly these flags: (flags & v) == v, and (flags & ^v) == 0.
		items := []*bgppkt.FlowSpecComponentItem{
			bgppkt.NewFlowSpecComponentItem(bgppkt.BITMASK_FLAG_OP_MATCH, uint64(m.TCPFlags)),
			bgppkt.NewFlowSpecComponentItem(bgppkt.BITMASK_FLAG_OP_AND|bgppkt.BITMASK_FLAG_OP_NOT|bgppkt.BITMASK_FLAG_OP_END,
				uint64(^m.TCPFlags)),
		}
		if m.TCPFlags == 0 {
			items = items[1:]
		}
		if m.TCPFlags == 0xff {
			items = items[:1]
			items[0].Op |= bgppkt.BITMASK_FLAG_OP_END
		}
		out = append(out, bgppkt.NewFlowSpecComponent(bgppkt.FLOW_SPEC_TYPE_TCP_FLAG, items))
	}
	if m.Len != 0 {
		l := uint64(m.Len)
		if v6 {
			if l < 40 {
				return nil, fmt.Errorf("flowspec: IPv6 packet length %d is below the 40-byte header", l)
			}
			l -= 40
		}
		out = append(out, bgppkt.NewFlowSpecComponent(bgppkt.FLOW_SPEC_TYPE_PKT_LEN, eq(l)))
	}
	switch m.Fragment {
	case "":
	case "not-a-fragment":
		// No bit set, with the match bit: (bits & 0) == 0 is always
		// true, so "not a fragment" is NOT(is-fragment).
		out = append(out, bgppkt.NewFlowSpecComponent(bgppkt.FLOW_SPEC_TYPE_FRAGMENT, []*bgppkt.FlowSpecComponentItem{
			bgppkt.NewFlowSpecComponentItem(bgppkt.BITMASK_FLAG_OP_NOT|bgppkt.BITMASK_FLAG_OP_END, bgppkt.FRAG_FLAG_IS)}))
	default:
		v, ok := fragments[m.Fragment]
		if !ok {
			return nil, fmt.Errorf("flowspec: unknown fragment %q", m.Fragment)
		}
		out = append(out, bgppkt.NewFlowSpecComponent(bgppkt.FLOW_SPEC_TYPE_FRAGMENT, []*bgppkt.FlowSpecComponentItem{
			bgppkt.NewFlowSpecComponentItem(bgppkt.BITMASK_FLAG_OP_MATCH|bgppkt.BITMASK_FLAG_OP_END, v)}))
	}
	return out, nil
}

// path is the announcement as a GoBGP path.
func (a Announcement) path(community uint32) (*api.Path, error) {
	origin := bgppkt.NewPathAttributeOrigin(bgppkt.BGP_ORIGIN_ATTR_TYPE_IGP)
	switch a.Kind {
	case Blackhole:
		p := a.Prefix
		comm := bgppkt.NewPathAttributeCommunities([]uint32{community})
		if p.Addr().Is4() {
			// Next hop 0.0.0.0: GoBGP puts the session's own address.
			nlri := bgppkt.NewIPAddrPrefix(uint8(p.Bits()), p.Addr().String())
			return apiutil.NewPath(nlri, false, []bgppkt.PathAttributeInterface{origin,
				bgppkt.NewPathAttributeNextHop("0.0.0.0"), comm}, time.Now())
		}
		nlri := bgppkt.NewIPv6AddrPrefix(uint8(p.Bits()), p.Addr().String())
		return apiutil.NewPath(nlri, false, []bgppkt.PathAttributeInterface{origin,
			bgppkt.NewPathAttributeMpReachNLRI("::", []bgppkt.AddrPrefixInterface{nlri}), comm}, time.Now())
	case FlowSpec:
		if a.Match == nil {
			return nil, fmt.Errorf("flowspec announcement without a match")
		}
		comps, err := flowSpecComponents(*a.Match)
		if err != nil {
			return nil, err
		}
		// traffic-rate-bytes 0 is discard (RFC 8955 7.3); the AS field
		// is informational.
		ext := bgppkt.NewPathAttributeExtendedCommunities([]bgppkt.ExtendedCommunityInterface{
			bgppkt.NewTrafficRateExtended(0, float32(a.RateBytes))})
		var nlri bgppkt.AddrPrefixInterface
		if a.Match.Dst.Addr().Is6() {
			nlri = bgppkt.NewFlowSpecIPv6Unicast(comps)
		} else {
			nlri = bgppkt.NewFlowSpecIPv4Unicast(comps)
		}
		return apiutil.NewPath(nlri, false, []bgppkt.PathAttributeInterface{origin,
			bgppkt.NewPathAttributeMpReachNLRI("0.0.0.0", []bgppkt.AddrPrefixInterface{nlri}), ext}, time.Now())
	}
	return nil, fmt.Errorf("unknown announcement kind %q", a.Kind)
}

// family is the family the announcement travels in.
func (a Announcement) family() Family {
	switch {
	case a.Kind == Blackhole && a.Prefix.Addr().Is4():
		return IPv4Unicast
	case a.Kind == Blackhole:
		return IPv6Unicast
	case a.Match != nil && a.Match.Dst.Addr().Is6():
		return IPv6FlowSpec
	}
	return IPv4FlowSpec
}

func apiFamily(f Family) *api.Family {
	switch f {
	case IPv4Unicast:
		return &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	case IPv6Unicast:
		return &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
	case IPv4FlowSpec:
		return &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_FLOW_SPEC_UNICAST}
	case IPv6FlowSpec:
		return &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_FLOW_SPEC_UNICAST}
	}
	return nil
}
