#!/usr/bin/env bash
# Measures req/s, p50 and p99 through the L7 stage as operators run it
# (`edgectl run` with an l7: policy), once with each engine (event-loop and
# net-http), with a limit that is never hit and one that is always hit,
# beside nginx limit_req in front of the same upstream, with wrk; also the
# upstream alone as a baseline. Prints the edgeguard/nginx ratios.
#
# Everything runs inside a private network namespace (loopback only): the
# two daemons attach their XDP program (generic mode) to a veth pair created
# inside that namespace, never to a real interface, and keep their pins in
# their own directories under /sys/fs/bpf. Every process, the namespace and
# the pins are removed on exit. Needs root.
#
#   bench/l7.sh                              # 10s per case, 2 threads, 64 connections
#   DURATION=5s CONNS=32 THREADS=1 bench/l7.sh
#   ROUNDS=5 bench/l7.sh                     # every case 5 times, interleaved; then medians
#
# Needs wrk, nginx, iproute2 (scripts/install-deps.sh) and Go. Ports (in the
# namespace): UP_PORT, EL_PORT (event loop), NH_PORT (net/http), NGINX_PORT.
set -euo pipefail

cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-1}
UP_PORT=${UP_PORT:-18080}
EL_PORT=${EL_PORT:-18081}
NGINX_PORT=${NGINX_PORT:-18082}
NH_PORT=${NH_PORT:-18083}

for tool in wrk nginx go ip nsenter; do
	command -v "$tool" >/dev/null || { echo "bench/l7.sh: $tool not found (scripts/install-deps.sh)" >&2; exit 1; }
done
if [ "$(id -u)" -ne 0 ]; then
	echo "bench/l7.sh: needs root (a network namespace and XDP on a veth in it)" >&2
	exit 1
fi

ns=eg-l7bench-$$
pins=/sys/fs/bpf/eg-l7bench-$$
tmp=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	ip netns del "$ns" 2>/dev/null || true
	rm -rf "$pins-el" "$pins-nh" "$tmp"
}
trap cleanup EXIT INT TERM

# nsrun CMD...: runs CMD in the namespace. Only the network namespace
# changes (not `ip netns exec`, which gives a private /sys): the daemons see
# the host's bpffs. Background processes start with nsenter itself, so $!
# is the process (nsenter execs it).
nsrun() { nsenter --net="/run/netns/$ns" "$@"; }

ip netns add "$ns"
nsrun ip link set lo up
nsrun ip link add eg-l7b0 type veth peer name eg-l7b1
nsrun ip link add eg-l7b2 type veth peer name eg-l7b3
for l in eg-l7b0 eg-l7b1 eg-l7b2 eg-l7b3; do nsrun ip link set "$l" up; done

wait_port() {
	for _ in $(seq 200); do
		if nsrun curl -s -m 2 -o /dev/null "http://127.0.0.1:$1/"; then return 0; fi
		sleep 0.1
	done
	echo "bench/l7.sh: nothing answers on 127.0.0.1:$1 in $ns" >&2
	for f in "$tmp"/*.log; do echo "== $f" >&2; tail -20 "$f" >&2; done
	exit 1
}

go build -o "$tmp/l7upstream" ./bench/l7upstream
go build -o "$tmp/edgectl" ./cmd/edgectl

nsenter --net="/run/netns/$ns" "$tmp/l7upstream" -addr "127.0.0.1:$UP_PORT" &
pids+=($!)

# policy ENGINE PORT IFACE METRICS: the daemon's policy, XDP on IFACE with
# limits no benchmark packet reaches, and the l7: section under test.
policy() {
	cat <<YAML
apiVersion: edgeguard/v1
interfaces:
  - {name: $3, xdp_mode: generic}
defaults:
  per_source:
    key: {ipv4: 32, ipv6: 64}
    packets: {rate: 1000000/s, burst: 1000000}
  per_prefix: {}
  per_asn: {}
metrics:
  listen: 127.0.0.1:$4
l7:
  listen: 127.0.0.1:$2
  upstream: http://127.0.0.1:$UP_PORT
  engine: $1
  routes:
    - name: never
      match: {path_prefix: /never}
      limits: [{name: never-hit, key: ip, rate: 100000000/s}]
    - name: always
      match: {path_prefix: /always}
      limits: [{name: always-hit, key: ip, rate: 1/h, burst: 1}]
YAML
}
policy event-loop "$EL_PORT" eg-l7b0 19481 >"$tmp/el.yaml"
policy net-http "$NH_PORT" eg-l7b2 19482 >"$tmp/nh.yaml"
mkdir -p "$tmp/el" "$tmp/nh" # a state directory each (its lock, the socket)
nsenter --net="/run/netns/$ns" "$tmp/edgectl" run --config "$tmp/el.yaml" --pin-dir "$pins-el" --socket "$tmp/el/edgeguard.sock" --state-dir "$tmp/el" --interval 0 \
	>"$tmp/el.log" 2>&1 &
pids+=($!)
nsenter --net="/run/netns/$ns" "$tmp/edgectl" run --config "$tmp/nh.yaml" --pin-dir "$pins-nh" --socket "$tmp/nh/edgeguard.sock" --state-dir "$tmp/nh" --interval 0 \
	>"$tmp/nh.log" 2>&1 &
pids+=($!)

mkdir -p "$tmp/nginx"
cat >"$tmp/nginx/nginx.conf" <<NGINX
daemon off;
worker_processes auto;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log warn;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path $tmp/nginx/body;
	proxy_temp_path $tmp/nginx/proxy;
	fastcgi_temp_path $tmp/nginx/fastcgi;
	uwsgi_temp_path $tmp/nginx/uwsgi;
	scgi_temp_path $tmp/nginx/scgi;
	limit_req_zone \$binary_remote_addr zone=never:10m rate=100000000r/s;
	limit_req_zone \$binary_remote_addr zone=always:10m rate=1r/m;
	limit_req_status 429;
	upstream up { server 127.0.0.1:$UP_PORT; keepalive 128; }
	server {
		listen 127.0.0.1:$NGINX_PORT;
		proxy_http_version 1.1;
		proxy_set_header Connection "";
		location /never { limit_req zone=never burst=1000000 nodelay; proxy_pass http://up; }
		location /always { limit_req zone=always nodelay; proxy_pass http://up; }
		location / { proxy_pass http://up; }
	}
}
NGINX
nsenter --net="/run/netns/$ns" nginx -e "$tmp/nginx/error.log" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" &
pids+=($!)

wait_port "$UP_PORT"
wait_port "$EL_PORT"
wait_port "$NH_PORT"
wait_port "$NGINX_PORT"
for m in 19481 19482; do
	nsrun curl -s "http://127.0.0.1:$m/metrics" | grep '^edgeguard_l7_stage_info' | sed 's/^/# serving: /'
done

echo "# cpus:    $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# load:    $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# go:      $(go version)"
echo "# nginx:   $(nginx -v 2>&1 | cut -d/ -f2)"
echo "# commit:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "# wrk:     wrk -t$THREADS -c$CONNS -d$DURATION --latency URL (in the namespace, on loopback)"
echo

# run NAME URL: one wrk run, one table row (also kept for the medians).
run() {
	local out rps p50 p99 non2xx
	out=$(nsrun wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$2")
	rps=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' <<<"$out")
	p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
	p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
	non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
	printf "%-34s %10s %10s %10s %12s\n" "$1" "$rps" "$p50" "$p99" "${non2xx:-0}"
	printf "%s\t%s\t%s\t%s\n" "$1" "$rps" "$(ms "$p50")" "$(ms "$p99")" >>"$tmp/rows"
}

# ms converts wrk's latency (850.00us, 2.41ms, 1.02s) to milliseconds.
ms() {
	awk -v v="$1" 'BEGIN {
		n = v + 0
		if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n *= 1; else if (v ~ /s$/) n *= 1000
		printf "%.2f", n
	}'
}

cases=(
	"upstream alone (Go net/http)|http://127.0.0.1:$UP_PORT/never"
	"edgeguard event-loop, never hit|http://127.0.0.1:$EL_PORT/never"
	"edgeguard net-http, never hit|http://127.0.0.1:$NH_PORT/never"
	"nginx limit_req, never hit|http://127.0.0.1:$NGINX_PORT/never"
	"edgeguard event-loop, always hit|http://127.0.0.1:$EL_PORT/always"
	"edgeguard net-http, always hit|http://127.0.0.1:$NH_PORT/always"
	"nginx limit_req, always hit|http://127.0.0.1:$NGINX_PORT/always"
)
: >"$tmp/rows"
for round in $(seq "$ROUNDS"); do
	[ "$ROUNDS" -gt 1 ] && echo "# round $round of $ROUNDS"
	printf "%-34s %10s %10s %10s %12s\n" "case" "req/s" "p50" "p99" "non-2xx"
	for c in "${cases[@]}"; do
		run "${c%%|*}" "${c#*|}"
	done
	echo
done

echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
if true; then
	echo "# medians of $ROUNDS round(s) (p50 and p99 in ms; ratio: edgeguard / nginx req/s, median of the rounds' ratios)"
	printf "%-34s %10s %10s %10s %8s\n" "case" "req/s" "p50" "p99" "ratio"
	for c in "${cases[@]}"; do
		name=${c%%|*}
		med() { awk -F'\t' -v n="$name" -v col="$1" '$1 == n {print $col}' "$tmp/rows" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
		ratio=""
		case $name in
		"edgeguard "*", never hit") other="nginx limit_req, never hit" ;;
		"edgeguard "*", always hit") other="nginx limit_req, always hit" ;;
		*) other="" ;;
		esac
		if [ -n "$other" ]; then
			ratio=$(paste <(awk -F'\t' -v n="$name" '$1 == n {print $2}' "$tmp/rows") \
				<(awk -F'\t' -v n="$other" '$1 == n {print $2}' "$tmp/rows") |
				awk '{print $1 / $2}' | sort -g |
				awk '{v[NR] = $1} END {printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
		fi
		printf "%-34s %10.0f %10.2f %10.2f %8s\n" "$name" "$(med 2)" "$(med 3)" "$(med 4)" "$ratio"
	done
fi
