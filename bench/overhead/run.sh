#!/usr/bin/env bash
# Proxy overhead: kvgate against nginx, both in front of the same instant
# backend (kvgate sim --time-scale 0), measured in one run beside the floor
# of the library kvgate is built on (a bare fasthttp reverse proxy,
# `overhead floor`). Prints a table of requests/s and the latency each
# proxy adds over the backend alone (p50, p99), and the kvgate/nginx,
# fasthttp/nginx and kvgate/fasthttp ratios, at 1, 64 and 256 connections,
# streamed and not, short and 4k-token prompts; then a table of the CPU
# time each server spent per request (on shared cores, what the throughput
# ratios follow from).
#
#   bench/overhead/run.sh [script flags] [flags of the load generator, e.g. --rounds 5 --duration 3s]
#
# Script flags, before the load generator's:
#   --log on|off         both proxies log each request (nginx's default
#                        access_log, combined, to a file; kvgate's access log
#                        at log.level info, to a file) or neither (default off)
#   --tokenizer NAME     kvgate's tokenizer: backend (default) or estimate
#   --kvgate-bin PATH    measure this kvgate binary instead of building one
#                        (e.g. an earlier commit's, for a before and after)
#   --pprof ADDR         build kvgate with net/http/pprof on ADDR (-tags
#                        pprof), to profile it under the load
#
# It builds kvgate and the load generator, installs nginx (Debian package)
# when it is missing, starts the four servers on free loopback ports and
# stops them when it ends. Anything that cannot be had or started fails the
# run: it never measures a subset.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
# go-nvml's header marks old calls deprecated; the warnings are harmless noise.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"

die() { echo "bench/overhead: $*" >&2; exit 1; }

log=off tokenizer=backend kvgate_bin="" pprof=""
while [ $# -gt 0 ]; do
	case "$1" in
	--log) log=${2:?--log needs on or off}; shift 2 ;;
	--tokenizer) tokenizer=${2:?--tokenizer needs backend or estimate}; shift 2 ;;
	--kvgate-bin) kvgate_bin=${2:?--kvgate-bin needs a path}; shift 2 ;;
	--pprof) pprof=${2:?--pprof needs an address}; shift 2 ;;
	*) break ;;
	esac
done
case "$log" in on | off) ;; *) die "--log $log: want on or off" ;; esac
case "$tokenizer" in backend | estimate) ;; *) die "--tokenizer $tokenizer: want backend or estimate" ;; esac
[ -z "$kvgate_bin" ] || [ -x "$kvgate_bin" ] || die "--kvgate-bin $kvgate_bin: not an executable"

if ! command -v nginx >/dev/null 2>&1; then
	echo "bench/overhead: nginx is missing; installing the Debian package" >&2
	sudo_=""
	[ "$(id -u)" -ne 0 ] && sudo_="sudo"
	$sudo_ apt-get update -qq || die "apt-get update failed; install nginx by hand"
	DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq nginx >/dev/null || die "could not install nginx"
	command -v nginx >/dev/null 2>&1 || die "nginx is still missing after installing it"
fi

work=$(mktemp -d)
pids=()
cleanup() {
	status=$?
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	if [ "$status" -ne 0 ]; then
		for log in "$work"/*.log; do
			[ -s "$log" ] && { echo "--- $(basename "$log") (last lines)" >&2; tail -n 20 "$log" >&2; }
		done
	fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "bench/overhead: building" >&2
if [ -n "$kvgate_bin" ]; then
	cp "$kvgate_bin" "$work/kvgate"
elif [ -n "$pprof" ]; then
	go build -tags pprof -o "$work/kvgate" ./cmd/kvgate
else
	go build -o "$work/kvgate" ./cmd/kvgate
fi
go build -o "$work/overhead" ./bench/overhead
mapfile -t ports < <("$work/overhead" --free-ports 4)
[ "${#ports[@]}" -eq 4 ] || die "could not find free ports"
sim_port=${ports[0]} nginx_port=${ports[1]} kvgate_port=${ports[2]} floor_port=${ports[3]}

# The backend: an engine that costs nothing, on a GPU large enough that 256
# concurrent 4k-token requests never wait for KV blocks.
"$work/kvgate" sim --listen "127.0.0.1:$sim_port" --time-scale 0 --gpu-memory 512GiB \
	--max-num-seqs 1024 >"$work/sim.log" 2>&1 &
sim_pid=$!
pids+=($sim_pid)

# nginx as a plain keep-alive reverse proxy, as many workers as cores, SSE
# passed through unbuffered (as kvgate does).
user_line=""
[ "$(id -u)" -eq 0 ] && user_line="user root;"
mkdir -p "$work/nginx"
# nginx's default access_log: the combined format, one write per request.
nginx_access="access_log off;" kvgate_level=warn
if [ "$log" = on ]; then
	nginx_access="access_log $work/nginx-access.log;"
	kvgate_level=info
fi
cat >"$work/nginx.conf" <<EOF
$user_line
worker_processes auto;
error_log $work/nginx-error.log warn;
pid $work/nginx.pid;
events { worker_connections 8192; }
http {
	$nginx_access
	client_body_temp_path $work/nginx/body;
	proxy_temp_path $work/nginx/proxy;
	client_max_body_size 8m;
	client_body_buffer_size 1m;
	keepalive_requests 1000000;
	keepalive_timeout 120s;
	upstream backend {
		server 127.0.0.1:$sim_port;
		keepalive 1024;
		keepalive_requests 1000000;
	}
	server {
		listen 127.0.0.1:$nginx_port;
		location / {
			proxy_pass http://backend;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_buffering off;
		}
	}
}
EOF
nginx -t -q -c "$work/nginx.conf" -p "$work/nginx" 2>"$work/nginx-test.log" || { cat "$work/nginx-test.log" >&2; die "nginx refused its configuration"; }
nginx -c "$work/nginx.conf" -p "$work/nginx" -g 'daemon off;' >"$work/nginx.log" 2>&1 &
nginx_pid=$!
pids+=($nginx_pid)

# kvgate with its defaults (tokenizer: backend unless --tokenizer), a
# budget that never queues; its access log (on by default) is written at
# info, so log.level warn silences it.
cat >"$work/kvgate.yaml" <<EOF
listen: 127.0.0.1:$kvgate_port
log: {level: $kvgate_level}
models:
  - name: llama-3-8b
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, dtype: bfloat16}
    weights_bytes: 16060522496
    max_model_len: 8192
    tokenizer: $tokenizer
backends:
  - name: sim
    url: http://127.0.0.1:$sim_port
    models: [llama-3-8b]
    gpu_memory: 512GiB
EOF
KVGATE_PPROF="$pprof" "$work/kvgate" serve --config "$work/kvgate.yaml" >"$work/kvgate.log" 2>&1 &
kvgate_pid=$!
pids+=($kvgate_pid)

# The floor: a bare fasthttp reverse proxy, what kvgate's library costs.
"$work/overhead" floor --listen "127.0.0.1:$floor_port" --backend "127.0.0.1:$sim_port" >"$work/floor.log" 2>&1 &
floor_pid=$!
pids+=($floor_pid)

rev=$(git describe --always --dirty 2>/dev/null || echo unknown)
[ -z "$kvgate_bin" ] || rev="$(basename "$kvgate_bin") (given)"
fasthttp_version=$(go list -m -f '{{.Version}}' github.com/valyala/fasthttp)
"$work/overhead" \
	--direct "http://127.0.0.1:$sim_port" \
	--nginx "http://127.0.0.1:$nginx_port" \
	--kvgate "http://127.0.0.1:$kvgate_port" \
	--fasthttp "http://127.0.0.1:$floor_port" \
	--direct-pid "$sim_pid" --nginx-pid "$nginx_pid" --kvgate-pid "$kvgate_pid" --fasthttp-pid "$floor_pid" \
	--note "$(nginx -v 2>&1 | sed 's/^nginx version: //') ($(nproc) workers, keep-alive upstream, proxy_buffering off); kvgate $rev (tokenizer: $tokenizer); logging $log; fasthttp $fasthttp_version" \
	"$@"
