/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types the SYN path (bpf/syncookie.c) shares with Go. bpf2go generates the
 * Go types (-type flags on the Syncookie line of generate.go); nobody
 * mirrors them by hand. Addresses are 16 bytes, IPv4 as ::ffff:a.b.c.d,
 * like the limiter's.
 */
#pragma once

#include <linux/types.h>

/* A protected service's protection mode (docs/tcp.md). */
enum eg_syn_mode {
	EG_SYN_OFF = 0,     /* not looked at: the limiter alone */
	EG_SYN_MONITOR = 1, /* counted as if on; the kernel answers */
	EG_SYN_AUTO = 2,    /* on while SYNs exceed the on rate, off again below the off rate for hold */
	EG_SYN_ALWAYS = 3,
};

/* Per-service counters, one u64 each per CPU (struct eg_syn_counters). */
enum eg_syn_counter {
	EG_SYNC_SYN = 0,            /* SYNs to the service */
	EG_SYNC_ANSWERED = 1,       /* SYN-ACK with our cookie sent (XDP_TX) */
	EG_SYNC_WOULD_ANSWER = 2,   /* monitor, or auto while off: would have answered */
	EG_SYNC_ANSWER_LIMITED = 3, /* answer budget of the source's prefix spent: dropped */
	EG_SYNC_BAD_SYN = 4,        /* IPv4 options or first fragment, or no SYN-ACK built: dropped while on */
	EG_SYNC_VALIDATED_PASS = 5, /* SYN from a validated source: to the kernel */
	EG_SYNC_COOKIE_VALID = 6,   /* ACK whose cookie checked out: handed to the kernel */
	EG_SYNC_COOKIE_INVALID = 7, /* ACK with no connection and a bad cookie: dropped */
	EG_SYNC_OOS_DROP = 8,       /* RST/FIN/other with no connection: dropped */
	EG_SYNC_OOS_BUDGET = 9,     /* no connection, passed within the out-of-state budget */
	EG_SYNC_ESTABLISHED = 10,   /* non-SYN packet of a known connection: continues */
	EG_SYNC_ACTIVATIONS = 11,   /* auto: times protection turned on */
	EG_SYNC_REQSK = 12,         /* tcx: requests handed to the kernel (bpf_sk_assign_tcp_reqsk) */
	EG_SYNC_REQSK_FAIL = 13,    /* tcx: no listener, or the kernel refused the request */
	EG_SYNC_DENY = 14,          /* deny-listed source: dropped before anything else */
	EG_SYNC_MAX = 15,
};

enum eg_syn_sizes {
	EG_SYN_MAX_SERVICES = 256,
	EG_SYN_MAX_ENDPOINTS = 4096,
	/* Cookies carry their options in the low 8 bits; the other 24 are the MAC. */
	EG_SYN_COOKIE_BITS = 8,
	/* Cookie time windows are 2^36 ns (~68.7 s); the current and the
	 * previous one are accepted, so a cookie is good for 69-137 s. */
	EG_SYN_WINDOW_SHIFT = 36,
	/* auto mode measures SYN rates over 2^30 ns (~1.07 s) windows. */
	EG_SYN_RATE_SHIFT = 30,
	/* Metadata an XDP verdict on a valid ACK leaves for the tcx program. */
	EG_SYN_META_MAGIC = 0x45475331, /* "EGS1" */
	EG_SYN_CONTINUE = -1, /* decide(): not decided, on to the limiter */
};

/* syn_endpoints key: a protected address and port (network order port). An
 * all-zero address is the service's "any local address" entry. */
struct eg_syn_endpoint {
	__u8 addr[16];
	__u16 port; /* network order */
	__u8 _pad[2];
};

/* syn_services value, indexed by service id. Written by the control plane. */
struct eg_syn_service {
	__u8 mode;    /* enum eg_syn_mode */
	__u8 wscale;  /* our window scale, 0-14 */
	__u8 valid;
	__u8 _pad0;
	__u16 mss4;   /* MSS we announce over IPv4 */
	__u16 mss6;   /* ... and IPv6 */
	__u32 on_syns;  /* auto: SYNs per rate window that turn protection on */
	__u32 off_syns; /* auto: SYNs per rate window under which it may turn off */
	__u64 hold_ns;  /* auto: how long under off_syns before it turns off */
	/* Out-of-state budget (GCRA, ns): oos_t 0 drops every such packet. */
	__u64 oos_t;
	__u64 oos_tau;
	/* Answers per source prefix (GCRA, ns); ans_t 0: unlimited. */
	__u64 ans_t;
	__u64 ans_tau;
	__u8 ans_len4; /* prefix length of an IPv4 source's answer budget (0-32) */
	__u8 ans_len6; /* ... IPv6 (0-128) */
	__u8 _pad1[6];
	/* How long a validated source bypasses the SYN path (0: never). */
	__u64 validated_ns;
};

/* syn_state value, indexed by service id: what the data plane keeps. */
struct eg_syn_state {
	__u64 win;       /* current rate window (ns >> EG_SYN_RATE_SHIFT) */
	__u64 syns;      /* SYNs in it */
	__u64 last_busy; /* ns: end of the last window at or over off_syns */
	__u64 oos_tat;   /* out-of-state GCRA */
	__u32 active;    /* auto: protection on */
	__u32 _pad;
};

struct eg_syn_counters {
	__u64 c[EG_SYNC_MAX];
};

struct eg_syn_prefix_key {
	__u8 addr[16]; /* masked to the service's answer prefix */
	__u32 service;
};

/* The XDP program leaves this in front of a valid ACK (bpf_xdp_adjust_meta)
 * for the tcx program, which hands the kernel the request it describes. */
struct eg_syn_meta {
	__u32 magic; /* EG_SYN_META_MAGIC */
	__u32 tsval; /* the ACK's timestamp value, if tstamp */
	__u32 tsecr; /* the ACK's timestamp echo (our SYN-ACK's value) */
	__u16 mss;   /* the client's MSS, from the cookie */
	__u8 snd_wscale; /* the client's window scale, from the cookie */
	__u8 rcv_wscale; /* ours, from the service */
	__u8 wscale_ok;
	__u8 sack_ok;
	__u8 tstamp_ok;
	__u8 service;
};

/* syn_secret value: the cookie MAC key (SipHash-2-4), set once from Go. */
struct eg_syn_secret {
	__u64 k0;
	__u64 k1;
};
