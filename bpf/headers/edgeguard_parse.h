/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Cursor-style packet parsing: each helper bounds-checks, advances the cursor
 * and reports the next protocol (after xdp-tools' parsing_helpers.h).
 */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include "edgeguard_types.h"

/* Two tags: 802.1ad outer + 802.1Q inner (QinQ). A third tag is malformed. */
#define EG_MAX_VLAN_TAGS 2

/* IPv6 extension headers walked before giving up on finding L4. Real
 * traffic carries at most two or three; the bound keeps the verifier happy
 * and stops an attacker from making us walk a long chain. Past it the packet
 * is still limited by source, without L4 fields. */
#define EG_MAX_IPV6_EXT 6

/* pos and end bound what may be read (end is data_end, what the verifier
 * checks against); left is how many bytes of the IP datagram start at pos,
 * from its length field, so that nothing past the datagram (Ethernet
 * padding, a trailer) is read as a header. After an IP parser, pos + left
 * never exceeds end. */
struct cursor {
	void *pos;
	void *end;
	__u32 left;
};

struct vlan_hdr {
	__be16 tci;
	__be16 encap_proto;
};

struct ipv6_ext {
	__u8 nexthdr;
	__u8 hdrlen;
};

struct ipv6_frag {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 id;
};

/* What the decision needs from a packet. */
struct pkt_info {
	__u8 addr[16];
	__u32 len; /* the frame's */
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 has_l4;
	/* For samples and fingerprints: the IP datagram's total length (IPv6:
	 * 40 + payload length), TTL or hop limit, TCP flags (0 for others). */
	__u16 ip_len;
	__u8 ttl;
	__u8 tcp_flags;
};

static __always_inline int is_vlan(__u16 h_proto)
{
	return h_proto == bpf_htons(ETH_P_8021Q) || h_proto == bpf_htons(ETH_P_8021AD);
}

static __always_inline int is_ipv6_ext(__u8 next)
{
	return next == IPPROTO_HOPOPTS || next == IPPROTO_ROUTING || next == IPPROTO_DSTOPTS ||
	       next == IPPROTO_AH || next == IPPROTO_FRAGMENT;
}

static __always_inline int is_v4_mapped_addr(const __u8 *a)
{
	__u64 hi;
	__u32 mid;

	__builtin_memcpy(&hi, a, 8);
	__builtin_memcpy(&mid, a + 8, 4);
	return hi == 0 && mid == bpf_htonl(0x0000ffff);
}

/* parse_eth returns the EtherType after up to two VLAN tags (network order),
 * or a negative eg_reason on malformed input. */
static __always_inline int parse_eth(struct cursor *c, __u16 *proto)
{
	struct ethhdr *eth = c->pos;
	__u16 p;

	if ((void *)(eth + 1) > c->end)
		return -EG_R_BAD_ETHERNET;
	c->pos = eth + 1;
	p = eth->h_proto;

#pragma unroll
	for (int i = 0; i < EG_MAX_VLAN_TAGS; i++) {
		struct vlan_hdr *vh = c->pos;

		if (!is_vlan(p))
			break;
		if ((void *)(vh + 1) > c->end)
			return -EG_R_BAD_VLAN;
		c->pos = vh + 1;
		p = vh->encap_proto;
	}
	if (is_vlan(p))
		return -EG_R_BAD_VLAN;
	*proto = p;
	return 0;
}

/* ipv4_bad is the reason of an IPv4 header parse_ipv4 refused: a bad
 * version, IHL < 5 or a header cut off by the frame before a bad length. */
static __always_inline int ipv4_bad(const struct cursor *c, const struct iphdr *iph, __u32 hlen)
{
	if ((__u8)(*(const __u8 *)iph - 0x45) > 0x0a || c->pos + hlen > c->end)
		return -EG_R_BAD_IPV4;
	return -EG_R_BAD_IP_LENGTH;
}

/* parse_ipv4 fills the v4-mapped source and returns the L4 protocol, or -1
 * for a non-first fragment (no L4 header), or a negative reason. */
static __always_inline int parse_ipv4(struct cursor *c, struct pkt_info *pi)
{
	struct iphdr *iph = c->pos;
	__u32 hlen, tot;

	if ((void *)(iph + 1) > c->end)
		return -EG_R_BAD_IPV4;
	hlen = iph->ihl * 4;
	tot = bpf_ntohs(iph->tot_len);
	/* Version 4 and IHL >= 5 (the first byte is 0x45-0x4f), a total
	 * length of at least IHL*4 (the kernel drops less in ip_rcv_core;
	 * total length 0 is not TSO here, XDP sees frames as they came off
	 * the wire), and a datagram that fits in the frame. All three on one
	 * exit: every early exit costs the pass path register spills, so the
	 * reason is only sorted out on the way out. */
	if ((__u8)(*(__u8 *)iph - 0x45) > 0x0a || tot < hlen || c->pos + tot > c->end)
		return ipv4_bad(c, iph, hlen);
	c->pos += hlen;
	c->left = tot - hlen;

	__builtin_memset(pi->addr, 0, 10);
	pi->addr[10] = 0xff;
	pi->addr[11] = 0xff;
	__builtin_memcpy(&pi->addr[12], &iph->saddr, 4);
	pi->proto = iph->protocol;
	pi->ip_len = tot;
	pi->ttl = iph->ttl;

	/* Non-first fragments have no L4 header; they are still limited by
	 * source, under rules that do not need ports. (ICMPv6 in a first
	 * fragment or a whole packet is refused by parse_l4, off the TCP and
	 * UDP path.) */
	if (iph->frag_off & bpf_htons(0x1fff))
		return iph->protocol == IPPROTO_ICMPV6 ? -EG_R_ICMP_WRONG_FAMILY : -1;
	return iph->protocol;
}

/* ext_skip advances over an extension header of n bytes, within the
 * payload length. */
static __always_inline int ext_skip(struct cursor *c, __u32 n)
{
	if (n > c->left)
		return -EG_R_BAD_IPV6;
	c->pos += n;
	c->left -= n;
	return 0;
}

/* parse_ipv6 fills the source and returns the L4 protocol, or -1 for a
 * non-first fragment or a chain longer than the walk, or a negative reason.
 * A payload length of 0 is taken as it stands (no payload): a jumbogram
 * (RFC 2675) needs a link MTU above 64 KiB, which Ethernet does not have. */
static __always_inline int parse_ipv6(struct cursor *c, struct pkt_info *pi)
{
	struct ipv6hdr *ip6h = c->pos;
	__u32 plen;
	__u8 next;

	if ((void *)(ip6h + 1) > c->end)
		return -EG_R_BAD_IPV6;
	plen = bpf_ntohs(ip6h->payload_len);
	/* One exit for both, as in parse_ipv4: a bad version first. */
	if (ip6h->version != 6 || (void *)(ip6h + 1) + plen > c->end)
		return ip6h->version != 6 ? -EG_R_BAD_IPV6 : -EG_R_BAD_IP_LENGTH;
	c->pos = ip6h + 1;
	c->left = plen;
	pi->ip_len = plen + 40; /* a jumbogram's wraps: XDP frames are far smaller */
	pi->ttl = ip6h->hop_limit;
	__builtin_memcpy(pi->addr, &ip6h->saddr, 16);
	/* An IPv4-mapped source (::ffff:0:0/96) is not valid on the wire
	 * (RFC 4291 2.5.5.2; Linux drops it in ip6_rcv_core) and would alias
	 * the IPv4 host inside our v4-mapped keys: malformed. */
	if (is_v4_mapped_addr(pi->addr))
		return -EG_R_BAD_IPV6;
	next = ip6h->nexthdr;

#pragma unroll
	for (int i = 0; i < EG_MAX_IPV6_EXT; i++) {
		struct ipv6_ext *ext = c->pos;

		/* The first two bytes are checked against the frame (end),
		 * for the verifier, not against the payload length: a header
		 * is at least 8 bytes, so when they lie past the datagram
		 * ext_skip refuses it whatever they say. */
		switch (next) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
			if ((void *)(ext + 1) > c->end)
				return -EG_R_BAD_IPV6;
			next = ext->nexthdr;
			if (ext_skip(c, (ext->hdrlen + 1) * 8))
				return -EG_R_BAD_IPV6;
			break;
		case IPPROTO_AH:
			/* At least next header, length, reserved, SPI and
			 * sequence number (12 bytes, RFC 4302 2.2). */
			if ((void *)(ext + 1) > c->end || ext->hdrlen < 1)
				return -EG_R_BAD_IPV6;
			next = ext->nexthdr;
			if (ext_skip(c, (ext->hdrlen + 2) * 4))
				return -EG_R_BAD_IPV6;
			break;
		case IPPROTO_FRAGMENT: {
			struct ipv6_frag *fh = c->pos;

			if (c->left < sizeof(*fh) || (void *)(fh + 1) > c->end)
				return -EG_R_BAD_IPV6;
			c->pos = fh + 1;
			c->left -= sizeof(*fh);
			next = fh->nexthdr;
			pi->proto = next;
			if (fh->frag_off & bpf_htons(0xfff8)) {
				/* non-first fragment: no L4 header, but its
				 * protocol is known */
				if (next == IPPROTO_ICMP)
					return -EG_R_ICMP_WRONG_FAMILY;
				return -1;
			}
			break;
		}
		default:
			pi->proto = next;
			return next;
		}
	}
	/* Exactly EG_MAX_IPV6_EXT headers: L4 follows. A longer chain: limit
	 * by source, without L4 fields. */
	pi->proto = next;
	if (is_ipv6_ext(next))
		return -1;
	return next;
}

/* parse_l4 reads ports (ICMP: type as dport). Returns 0 or a negative reason.
 * Unknown protocols have no ports and are not an error. Headers must fit in
 * the datagram (left); the end checks are for the verifier. v4 says which
 * IP family carried the packet: ICMP of the other one is malformed. */
static __always_inline int parse_l4(struct cursor *c, struct pkt_info *pi, int proto, int v4)
{
	switch (proto) {
	case IPPROTO_TCP: {
		struct tcphdr *th = c->pos;

		if ((void *)(th + 1) > c->end)
			return -EG_R_BAD_L4;
		/* The header with its options must fit in the datagram (their
		 * contents are not read: the kernel ignores a malformed option
		 * list). This also refuses a header cut off by the datagram,
		 * whatever the data offset read from past it says. */
		if (th->doff < 5 || th->doff * 4 > c->left)
			return -EG_R_BAD_L4;
		pi->sport = bpf_ntohs(th->source);
		pi->dport = bpf_ntohs(th->dest);
		pi->tcp_flags = ((__u8 *)th)[13];
		pi->has_l4 = 1;
		return 0;
	}
	case IPPROTO_UDP: {
		struct udphdr *uh = c->pos;

		if (c->left < sizeof(*uh) || (void *)(uh + 1) > c->end)
			return -EG_R_BAD_L4;
		pi->sport = bpf_ntohs(uh->source);
		pi->dport = bpf_ntohs(uh->dest);
		pi->has_l4 = 1;
		return 0;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: {
		/* type, code, checksum, and 4 bytes of rest-of-header */
		__u8 *h = c->pos;

		if ((proto == IPPROTO_ICMP) != v4)
			return -EG_R_ICMP_WRONG_FAMILY;
		if (c->left < 8 || (void *)(h + 8) > c->end)
			return -EG_R_BAD_L4;
		pi->dport = h[0];
		pi->has_l4 = 1;
		return 0;
	}
	}
	return 0;
}
