#!/usr/bin/env bash
# Runs every Edgeguard test. Needs root: the BPF tests load programs into the
# kernel and the integration tests create network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $EUID -ne 0 ]]; then
  echo "scripts/test.sh: run as root (sudo): the BPF and netns tests need CAP_BPF and CAP_NET_ADMIN" >&2
  exit 1
fi
bash scripts/install-deps.sh
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

go test -count=1 -timeout 40m "${@:-./...}"
