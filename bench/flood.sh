#!/usr/bin/env bash
# Floods one veth pair inside private network namespaces and measures, for
# plain XDP_DROP, Edgeguard (native and generic XDP), nftables per-source
# meters (netdev ingress, prerouting) and iptables hashlimit, the receiving
# side's CPU time per packet, the share of the flood dropped and the success
# rate of legit UDP clients. docs/benchmarks.md ("Flood benchmark") explains
# the method and shows the results.
#
#   sudo bench/flood.sh --quick          # 2 s per case, about 3-4 minutes
#   sudo bench/flood.sh                  # 5 s per case
#   sudo ROUNDS=3 bench/flood.sh --quick # every case 3 times, interleaved, then medians
#   sudo bench/flood.sh -- -threaded     # time the NAPI kthread instead (extra flags go to floodbench)
#
# Safety: every address on an interface is in 198.18.0.0/15; the spoofed
# sources exist only inside frames sent from one namespace to another.
# No namespace has a default route or an interface outside the testbed, so
# nothing (replies, ICMP errors) can leave. nft and iptables rules are made
# inside the edge namespace only and disappear with it; the host's rulesets
# are never read or changed. Every run is bounded in packets and time.
set -euo pipefail

cd "$(dirname "$0")/.."
DURATION=5s
if [ "${1:-}" = "--quick" ]; then
	DURATION=2s
	shift
fi
[ "${1:-}" = "--" ] && shift

if [ "$(id -u)" -ne 0 ]; then
	echo "bench/flood.sh: needs root (namespaces, XDP, nft, iptables)" >&2
	exit 1
fi
# What this benchmark runs, and the Debian package that has it; all of
# them but Go are installed by scripts/install-deps.sh.
missing=()
for need in ip:iproute2 nft:nftables iptables-restore:iptables ethtool:ethtool \
	sysctl:procps timeout:coreutils go:; do
	cmd=${need%%:*} pkg=${need#*:}
	command -v "$cmd" >/dev/null || [[ -x /usr/sbin/$cmd ]] || missing+=("$cmd${pkg:+ (package $pkg)}")
done
if ((${#missing[@]})); then
	echo "bench/flood.sh: missing ${missing[*]}" >&2
	echo "bench/flood.sh: 'sudo scripts/install-deps.sh' installs them (Go 1.26 itself: see the README)" >&2
	exit 1
fi

prefix="eg-flood-$$"
bin=$(mktemp -d)
cleanup() {
	# floodbench removes its namespaces itself; this catches a killed run.
	for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix-" || true); do
		ip netns delete "$ns" || true
	done
	rm -rf "$bin"
}
trap cleanup EXIT

go build -o "$bin/floodbench" ./bench/floodbench

echo "# kernel:      $(uname -r)"
echo "# cpus:        $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# load:        $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# iptables:    $(iptables --version)"
echo "# nft:         $(nft --version)"
echo "# commit:      $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
ROUNDS=${ROUNDS:-1}
echo "# command:     floodbench -prefix $prefix -duration $DURATION -rounds $ROUNDS $*"
# 60 cases of at most ~6 s each (quick, ~10 s otherwise) per round; the
# bound is generous.
# Run in the background so that a signal reaches this shell at once: it
# is passed on (floodbench finishes its case, removing its namespaces),
# then cleanup removes anything left.
timeout $((1500 * ROUNDS)) "$bin/floodbench" -prefix "$prefix" -duration "$DURATION" -rounds "$ROUNDS" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true; wait "$child" || true; exit 130' INT TERM
wait "$child"
