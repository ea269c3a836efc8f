#!/usr/bin/env bash
# Runs the XDP data plane benchmarks (BenchmarkDataPlane in internal/loader)
# and prints the machine they ran on and the median ns/pkt of each case.
# Needs root: the benchmarks load BPF programs and run them with
# BPF_PROG_TEST_RUN. No traffic is sent anywhere.
#
#   sudo bench/dataplane.sh                  # 3 runs of every case, 1s each
#   sudo COUNT=5 BENCHTIME=2s bench/dataplane.sh
#   sudo BENCH='BenchmarkDataPlane/pass$' bench/dataplane.sh
#   sudo MEMLAT=1 bench/dataplane.sh         # also probe memory latency
#
# docs/benchmarks.md explains every case and its metrics.
set -euo pipefail

cd "$(dirname "$0")/.."
COUNT=${COUNT:-3}
BENCHTIME=${BENCHTIME:-1s}
BENCH=${BENCH:-BenchmarkDataPlane}

if [ "$(id -u)" -ne 0 ]; then
	echo "bench/dataplane.sh: needs root (CAP_BPF, CAP_NET_ADMIN) to load and run BPF programs" >&2
	exit 1
fi

echo "# kernel:      $(uname -r)"
echo "# cpus:        $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
echo "# load:        $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# go:          $(go version)"
echo "# commit:      $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "# command:     go test -run '^\$' -bench '$BENCH' -benchtime $BENCHTIME -count $COUNT ./internal/loader"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench "$BENCH" -benchtime "$BENCHTIME" -count "$COUNT" ./internal/loader | tee "$out"

# Median of every metric per case, over the runs.
echo
echo "# median and minimum over $COUNT runs"
awk '
/^BenchmarkDataPlane\// {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^BenchmarkDataPlane\//, "", name)
	if (!(name in seen)) { seen[name] = 1; order[++n] = name }
	for (i = 3; i < NF; i += 2) {
		unit = $(i + 1)
		if (unit == "ns/op") continue
		k = name SUBSEP unit
		if (!(k in cnt)) { units[name] = units[name] " " unit }
		vals[k, ++cnt[k]] = $i
	}
}
function stats(k,    m, i, j, t, a, med) {
	m = cnt[k]
	for (i = 1; i <= m; i++) a[i] = vals[k, i] + 0
	for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	med = m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
	return sprintf("%8.1f (min %7.1f)", med, a[1])
}
END {
	for (i = 1; i <= n; i++) {
		name = order[i]
		split(substr(units[name], 2), us, " ")
		for (u = 1; u in us; u++) printf "%-14s %-14s %s\n", (u == 1 ? name : ""), us[u], stats(name SUBSEP us[u])
	}
}' "$out"

if [ "${MEMLAT:-0}" = 1 ]; then
	# Dependent random loads over growing working sets: what one cache
	# and TLB miss costs on this machine. Explains the cold-run metrics.
	dir=$(mktemp -d)
	trap 'rm -f "$out"; rm -rf "$dir"' EXIT
	cat >"$dir/main.go" <<'GO'
package main

import (
	"fmt"
	"math/rand"
	"time"
)

func main() {
	for _, mb := range []int{1, 16, 128, 512} {
		n := mb << 20 / 8
		next := make([]int, n)
		perm := rand.Perm(n)
		for i := range perm {
			next[perm[i]] = perm[(i+1)%n]
		}
		const steps = 2_000_000
		p, t := 0, time.Now()
		for i := 0; i < steps; i++ {
			p = next[p]
		}
		fmt.Printf("memlat %4d MiB: %7.1f ns per dependent random load (%d)\n", mb, float64(time.Since(t).Nanoseconds())/steps, p&1)
	}
}
GO
	printf 'module memlat\n\ngo 1.22\n' >"$dir/go.mod"
	echo
	(cd "$dir" && GOFLAGS= go run .)
fi
