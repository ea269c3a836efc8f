#!/usr/bin/env bash
# Installs what Edgeguard's build, tests and benchmarks need on Debian 12 /
# Ubuntu 24.04 (run as root). Used by .ci/run, the Vagrantfile and the README.
# Go itself (1.26) is not installed here: see the README.
set -euo pipefail

# The one pin of the BPF toolchain is CLANG in the Makefile; keep them equal.
CLANG_VERSION=19

pkgs=(
  "clang-${CLANG_VERSION}" "llvm-${CLANG_VERSION}" libbpf-dev linux-libc-dev
  make iproute2 redis-server prometheus nftables iptables ethtool wrk nginx-light
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts these as services on install; tests start their own on loopback.
for svc in redis-server nginx prometheus; do
  systemctl disable --now "$svc" >/dev/null 2>&1 || true
done
