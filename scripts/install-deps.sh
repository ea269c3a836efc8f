#!/usr/bin/env bash
# Installs what Edgeguard's build, tests and benchmarks need on Debian 12/13
# or Ubuntu 24.04 (run as root). Used by .ci/run, the Vagrantfile and the
# README. Go itself (1.26) is not installed here: see the README.
set -euo pipefail

# The one pin of the BPF toolchain is CLANG in the Makefile; keep them equal.
CLANG_VERSION=19

# command-or-file:package, installed when the command (or file) is missing.
needs=(
  "clang-${CLANG_VERSION}:clang-${CLANG_VERSION}"
  "llvm-strip-${CLANG_VERSION}:llvm-${CLANG_VERSION}"
  "/usr/include/bpf/bpf_helpers.h:libbpf-dev"
  "/usr/include/linux/bpf.h:linux-libc-dev"
  "make:make"
  "ip:iproute2"
  "nsenter:util-linux"
  "redis-server:redis-server"
  "redis-cli:redis-tools"
  "promtool:prometheus"
  "nft:nftables"
  "iptables:iptables"
  "wrk:wrk"
  "nginx:nginx"
  "nghttp:nghttp2-client"
  "ethtool:ethtool"
  "timeout:coreutils"
  "sysctl:procps"
  "bird:bird2"
  "birdc:bird2"
  "tcpdump:tcpdump"
  "tshark:tshark"
)

missing=()
for n in "${needs[@]}"; do
  what=${n%%:*} pkg=${n#*:}
  if [[ $what == /* ]]; then
    [[ -e $what ]] || missing+=("$pkg")
  else
    command -v "$what" >/dev/null 2>&1 || [[ -x /usr/sbin/$what ]] || missing+=("$pkg")
  fi
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts these as services on install; the tests start their own on
# loopback. Stopping and disabling them is only for machines that exist to
# run the tests: CI (CI=true) and the throwaway Vagrant VM
# (EDGEGUARD_THROWAWAY_VM=1, set by the Vagrantfile). On any other host
# they are left as they are, and the script says so.
services=(redis-server nginx prometheus bird)
if [[ ${CI:-} == true || ${EDGEGUARD_THROWAWAY_VM:-} == 1 ]]; then
  for svc in "${services[@]}"; do
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
  done
else
  echo "install-deps: the ${services[*]} services are left as they are (not CI, not the throwaway VM);" \
    "the tests start their own on loopback. CI=true stops and disables them." >&2
fi
