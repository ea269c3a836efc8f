#!/usr/bin/env bash
# Measures Edgeguard's rate-limit service (internal/l7/rls) against
# envoyproxy/ratelimit, built from its Go module, over Envoy's RLS v3 gRPC
# protocol with the same client (bench/rlsbench), the same descriptors
# ([remote_address] over 4096 values, 2/s each: a mix of OK and OVER_LIMIT) and the same redis-server,
# in one run on loopback; then nginx auth_request through Edgeguard's
# subrequest endpoint against nginx limit_req alone, with wrk. Prints
# decisions/s, p50, p99 and the ratios. Every process is stopped on exit.
#
#   bench/rls.sh
#   DURATION=5s WORKERS=32 ROUNDS=5 bench/rls.sh
#   SKIP_NGINX=1 bench/rls.sh      # the gRPC rounds only
#
# Rounds are interleaved (envoyproxy/ratelimit, then Edgeguard with the
# redis, local and hybrid backends, then again), each peer started fresh
# with the same redis-server, and every ratio is taken within its round.
#
# Needs go, redis-server, nginx, wrk (scripts/install-deps.sh). Ports on
# 127.0.0.1 from BASE_PORT (default 19080) up.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
WORKERS=${WORKERS:-64} # requests in flight over all connections (WORKERS ÷ CONNS on each)
CONNS=${CONNS:-4}
ROUNDS=${ROUNDS:-3}
# PIN=1: the load client on CPU 0, every service and the redis-server on CPU 1
# (taskset; the same for every peer; Go sizes GOMAXPROCS to the CPUs it may use).
PIN=${PIN:-}
CLIENT=${CLIENT:-h2} # h2: pre-encoded requests, batched writes, multiplexed (bench/rlsbench/h2client.go; prints client-cpu/request); grpc: grpc-go's client
BASE_PORT=${BASE_PORT:-19080}
RATELIMIT_VERSION=${RATELIMIT_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}

for tool in go redis-server nginx wrk; do
	command -v "$tool" >/dev/null || { echo "bench/rls.sh: $tool not found (scripts/install-deps.sh)" >&2; exit 1; }
done
tmp=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

p=$BASE_PORT
REDIS_PORT=$p; EG_PORT=$((p + 1)); RL_GRPC=$((p + 2)); RL_HTTP=$((p + 3)); RL_DEBUG=$((p + 4))
EG_HTTP=$((p + 5)); NG_UP=$((p + 6)); NG_LIMIT=$((p + 7)); NG_AUTH=$((p + 8))

wait_port() {
	for _ in $(seq 1 200); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
		sleep 0.05
	done
	echo "bench/rls.sh: nothing listens on 127.0.0.1:$1" >&2
	return 1
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

go build -o "$tmp/rlsbench" ./bench/rlsbench

on_service=() on_client=()
if [ -n "$PIN" ]; then on_service=(taskset -c 1) on_client=(taskset -c 0); fi
"${on_service[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
	--logfile "$tmp/redis.log" >/dev/null &
redis_pid=$!
pids+=($redis_pid)
wait_port "$REDIS_PORT"

# envoyproxy/ratelimit from its module (it has no tagged release for
# Go modules: the version is a pseudo-version of its main branch).
rl_ok=1
if ! (
	mkdir -p "$tmp/rlmod" && cd "$tmp/rlmod" &&
		dir=$(go mod download -json "github.com/envoyproxy/ratelimit@$RATELIMIT_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p') &&
		cp -r "$dir" src && chmod -R u+w src && cd src &&
		go build -o "$tmp/ratelimit" ./src/service_cmd
) >"$tmp/rlbuild.log" 2>&1; then
	rl_ok=0
	echo "envoyproxy/ratelimit did not build from its module; Edgeguard's numbers only:" >&2
	tail -20 "$tmp/rlbuild.log" >&2
fi

mkdir -p "$tmp/runtime/rl/config"
cat >"$tmp/runtime/rl/config/bench.yaml" <<YAML
domain: bench
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 2
YAML

policy() { # policy BACKEND
	local backend=$1
	cat <<YAML
l7:
  redis: {addr: 127.0.0.1:$REDIS_PORT, prefix: "eg:bench:"}
  rls:
    listen: 127.0.0.1:$EG_PORT
    http_listen: 127.0.0.1:$EG_HTTP
    rules:
      - name: per-ip
        domain: bench
        descriptor: [remote_address]
        limits:
          - {name: ip-2, rate: 2/s, algorithm: sliding-window, backend: $backend}
YAML
}

load() { "${on_client[@]}" "$tmp/rlsbench" load -client "$CLIENT" -target "127.0.0.1:$1" -workers "$WORKERS" -conns "$CONNS" -duration "$DURATION" -label "$2" -cpu-pids "$3"; }
rate() { awk '{for (i = 1; i <= NF; i++) if ($i == "decisions/s") print $(i + 1)}' <<<"$1"; }
cpu() { awk '{for (i = 1; i <= NF; i++) if ($i == "cpu/decision") print $(i + 1) + 0}' <<<"$1"; }
p99() { awk '{for (i = 1; i <= NF; i++) if ($i == "p99") print $(i + 1)}' <<<"$1"; }

# One peer's run: start it, load it, stop it. Sets $out.
run_edgeguard() { # BACKEND
	local backend=$1 pid cpids
	policy "$backend" >"$tmp/eg-$backend.yaml"
	"${on_service[@]}" "$tmp/rlsbench" serve -policy "$tmp/eg-$backend.yaml" >"$tmp/eg-$backend.log" 2>&1 &
	pid=$!
	pids+=($pid)
	wait_port "$EG_PORT"
	cpids=$pid
	if [ "$backend" != local ]; then cpids=$pid,$redis_pid; fi
	out=$(load "$EG_PORT" "edgeguard $backend" "$cpids")
	stop "$pid"
}
run_envoy() {
	local pid
	RUNTIME_ROOT="$tmp/runtime" RUNTIME_SUBDIRECTORY=rl RUNTIME_WATCH_ROOT=false USE_STATSD=false \
		REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$REDIS_PORT" BACKEND_TYPE=redis \
		HOST=127.0.0.1 PORT="$RL_HTTP" GRPC_HOST=127.0.0.1 GRPC_PORT="$RL_GRPC" \
		DEBUG_HOST=127.0.0.1 DEBUG_PORT="$RL_DEBUG" LOG_LEVEL=warn "${on_service[@]}" "$tmp/ratelimit" >"$tmp/ratelimit.log" 2>&1 &
	pid=$!
	pids+=($pid)
	wait_port "$RL_GRPC"
	out=$(load "$RL_GRPC" "envoyproxy/ratelimit redis" "$pid,$redis_pid")
	stop "$pid"
}

echo "== Envoy RLS v3 (gRPC), $WORKERS concurrent requests on $CONNS connections, $DURATION each, client $CLIENT, $ROUNDS rounds${PIN:+, client on CPU 0, services and redis-server on CPU 1}"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
peers=(redis local hybrid)
[ "$rl_ok" = 1 ] && peers=(envoy redis local hybrid)
declare -A ratios
for round in $(seq 1 "$ROUNDS"); do
	declare -A got=() cpu=() lat=()
	for peer in "${peers[@]}"; do
		if [ "$peer" = envoy ]; then run_envoy; else run_edgeguard "$peer"; fi
		echo "round $round  $out"
		got[$peer]=$(rate "$out")
		cpu[$peer]=$(cpu "$out")
		lat[$peer]=$(p99 "$out")
	done
	if [ "$rl_ok" = 1 ]; then
		for peer in redis local hybrid; do
			r=$(awk -v a="${got[$peer]}" -v e="${got[envoy]}" 'BEGIN { printf "%.2f", a / e }')
			c=$(awk -v a="${cpu[$peer]}" -v e="${cpu[envoy]}" 'BEGIN { printf "%.2f", e / a }')
			ratios[$peer]+="$r "
			echo "round $round  ratio edgeguard $peer / envoyproxy/ratelimit: throughput ${r}x, cpu per decision ${c}x less, p99 ${lat[$peer]} vs ${lat[envoy]}"
		done
	fi
	echo "round $round  load average: $(cut -d' ' -f1-3 /proc/loadavg)"
done
if [ "$rl_ok" = 1 ]; then
	for peer in redis local hybrid; do
		target=10
		[ "$peer" = redis ] && target=1.5
		echo "${ratios[$peer]}" | tr ' ' '\n' | grep . | sort -n | awk -v p="$peer" -v t="$target" '
			{ v[NR] = $1 } END {
				m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
				printf "median edgeguard %s / envoyproxy/ratelimit: %.2fx (min %.2fx, target >= %sx in every round: %s)\n", p, m, v[1], t, (v[1] >= t) ? "met" : "NOT met" }'
	done
fi

[ -n "${SKIP_NGINX:-}" ] && exit 0
echo "== nginx auth_request through Edgeguard vs nginx limit_req alone (wrk -t2 -c64 -d$DURATION)"
policy local >"$tmp/eg-http.yaml"
"$tmp/rlsbench" serve -policy "$tmp/eg-http.yaml" >/dev/null &
pids+=($!)
wait_port "$EG_HTTP"
mkdir -p "$tmp/nginx"
cat >"$tmp/nginx/nginx.conf" <<NGINX
worker_processes 1;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log warn;
events { worker_connections 1024; }
http {
	access_log off;
	client_body_temp_path $tmp/nginx/body;
	proxy_temp_path $tmp/nginx/proxy;
	fastcgi_temp_path $tmp/nginx/fastcgi;
	uwsgi_temp_path $tmp/nginx/uwsgi;
	scgi_temp_path $tmp/nginx/scgi;
	limit_req_zone \$binary_remote_addr zone=perip:10m rate=1000000r/s;
	upstream app { server 127.0.0.1:$NG_UP; keepalive 64; }
	upstream edgeguard_rls { server 127.0.0.1:$EG_HTTP; keepalive 64; }
	server { listen 127.0.0.1:$NG_UP; location / { return 200 "ok\n"; } }
	server {
		listen 127.0.0.1:$NG_LIMIT;
		location / { limit_req zone=perip burst=1000 nodelay; proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
	}
	server {
		listen 127.0.0.1:$NG_AUTH;
		include $PWD/deploy/nginx/edgeguard-rls.conf;
		location / {
			include $PWD/deploy/nginx/edgeguard-rls-check.conf;
			proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection "";
		}
	}
}
NGINX
# the shipped snippet names domain "nginx": serve the bench domain under it too
sed "s/domain: bench/domain: nginx/; s/rate: 2\/s/rate: 1000000\/s/" "$tmp/eg-http.yaml" >"$tmp/eg-http2.yaml"
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
"$tmp/rlsbench" serve -policy "$tmp/eg-http2.yaml" >/dev/null &
pids+=($!)
wait_port "$EG_HTTP"
nginx -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -g 'daemon off;' &
pids+=($!)
wait_port "$NG_AUTH"
wrkrun() { wrk -t2 -c64 -d"$DURATION" --latency "http://127.0.0.1:$1/" | awk -v l="$2" '
	/Requests\/sec/ { rps = $2 } /^ +99%/ { p99 = $2 } /Non-2xx/ { bad = $5 }
	END { printf "%-28s req/s %9.0f  p99 %8s  non-2xx %s\n", l, rps, p99, bad + 0 }'; }
a=$(wrkrun "$NG_LIMIT" "nginx limit_req")
echo "$a"
b=$(wrkrun "$NG_AUTH" "nginx auth_request+edgeguard")
echo "$b"
rps() { awk '{for (i = 1; i <= NF; i++) if ($i == "req/s") print $(i + 1)}' <<<"$1"; }
awk -v a="$(rps "$a")" -v b="$(rps "$b")" 'BEGIN {
	printf "cost of auth_request through edgeguard: %.2fx the throughput of limit_req alone (%.0f%% fewer req/s)\n", b / a, 100 * (1 - b / a) }'
