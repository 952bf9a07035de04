#!/usr/bin/env bash
# The shared budget's benchmark: redis-server, `kvgate sim --on-overflow oom`,
# three `kvgate serve` replicas sharing its budget through Redis and one
# gateway with the in-process budget, all real processes on loopback; a
# closed-loop load of ~10x what the budget holds; phases for the added
# latency, KV use at saturation, big requests at one replica, a paused, a
# cut-off and a SIGKILLed replica, and a Redis outage.
# Prints one table and a PASS/FAIL line per acceptance bar; exits 1 if a bar
# is missed or a component is missing. Extra arguments go to the driver
# (go run ./bench/shared-budget -h lists them).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin"
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"

command -v redis-server >/dev/null 2>&1 || { echo "redis-server is required (apt-get install redis-server)" >&2; exit 1; }
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/kvgate" ./cmd/kvgate
go run ./bench/shared-budget -kvgate "$bin/kvgate" "$@"
