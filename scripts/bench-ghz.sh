#!/usr/bin/env bash
# bench-ghz.sh: cross-check bin/tollgate-load against ghz, the client of
# envoyproxy/ratelimit's published figures: the same ShouldRateLimit call
# (domain bench, descriptor tenant=acme), 50 concurrent calls over one
# connection, against one Tollgate of the working tree, ghz first and
# tollgate-load right after.
#
#   STORE=memory DURATION=10s scripts/bench-ghz.sh      (make bench-ghz)
#
# STORE      memory or redis: a private redis-server on a free loopback port
#            (default memory)
# DURATION   measured time of each tool (default 10s), after WARMUP (1s)
# GHZ        the ghz binary (default bin/ghz: make bin/ghz)
#
# Each tool warms the server with a short run of its own first, then its
# measured run is timed: wall, the client's CPU and the server's CPU.
#
# ghz reads the RateLimitService proto from Tollgate's server reflection;
# the call data is static, so its templating is off. ghz cancels the
# calls in flight when -z ends and counts them as Unavailable ("use of
# closed network connection"): a few such errors are its own.
# The command, for another server:
#
#   bin/ghz --insecure --call envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit \
#     -d '{"domain":"bench","descriptors":[{"entries":[{"key":"tenant","value":"acme"}]}]}' \
#     --disable-template-data --disable-template-functions \
#     -c 50 --connections 1 -z 10s 127.0.0.1:8081

source "$(dirname "$0")/lib.sh"

STORE=${STORE:-memory}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-1s}
GHZ=${GHZ:-$REPO/bin/ghz}

[[ $STORE == memory || $STORE == redis ]] || die "STORE is $STORE, want memory or redis"
[[ -x $GHZ ]] || die "$GHZ not found: make bin/ghz"

(cd "$REPO" && go build -o "$TMP/tollgate" ./cmd/tollgate && go build -o "$TMP/tollgate-load" ./cmd/tollgate-load)
serve_args=()
if [[ $STORE == redis ]]; then
	start_redis
	serve_args=(--redis-url "redis://127.0.0.1:$REDIS_PORT/0")
fi
start_tollgate "$TMP/tollgate" "$TMP/tollgate.log" ${serve_args[@]+"${serve_args[@]}"}

ghz=("$GHZ" --insecure --call envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit
	-d '{"domain":"bench","descriptors":[{"entries":[{"key":"tenant","value":"acme"}]}]}'
	--disable-template-data --disable-template-functions -c 50 --connections 1)
printf 'store %s, %s, c=50 over 1 connection, %s each after %s of warm-up\n\n' \
	"$STORE" "$(describe WORKTREE)" "$DURATION" "$WARMUP"
# measure NAME CMD...: run CMD and print the CPU it and the server used.
# Client and server share the cores, so a client that costs more CPU per
# call leaves the server less.
hz=$(getconf CLK_TCK)
server_cpu() { awk '{ print $14 + $15 }' "/proc/$TG_PID/stat"; }
measure() {
	local name=$1 before
	shift
	before=$(server_cpu)
	TIMEFORMAT="$name: %R s wall, client CPU %U s user + %S s sys"
	time "$@"
	printf '%s: server CPU %.2f s\n' "$name" "$(awk -v a="$before" -v b="$(server_cpu)" -v hz="$hz" 'BEGIN { print (b - a) / hz }')"
}

printf '== ghz %s\n' "$(go version -m "$GHZ" | awk '$1 == "mod" { print $3 }')"
"${ghz[@]}" -z "$WARMUP" "$TG_GRPC" >/dev/null
measure ghz "${ghz[@]}" -z "$DURATION" "$TG_GRPC"

printf '\n== tollgate-load\n'
load=("$TMP/tollgate-load" -addr "$TG_GRPC" -domain bench -descriptor tenant=acme -c 50 -conns 1)
"${load[@]}" -d "$WARMUP" >/dev/null
measure tollgate-load "${load[@]}" -d "$DURATION"
