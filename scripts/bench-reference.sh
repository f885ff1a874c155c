#!/usr/bin/env bash
# bench-reference.sh: server + Redis CPU per decision of Tollgate against
# envoyproxy/ratelimit itself (issue 17's Goal), in one run, medians of
# RUNS runs.
#
#   RUNS=2 DURATION=10s RATE=10000 scripts/bench-reference.sh   # ~6 min
#   RATE=0 scripts/bench-reference.sh                           # uncapped
#
# The reference is built from the Go module proxy (go install
# github.com/envoyproxy/ratelimit/src/service_cmd@$REF_VERSION) and runs
# with its defaults but for statistics (DISABLE_STATS=true: its stats
# sink without statsd writes a log line per stat and flush, which is not
# what a deployment pays), on the same rules: unit second, 1e9 requests,
# tenant with model nested, and user.
# Workloads as scripts/bench-redis.sh's (hot, distinct, three), tollgate-load
# at c=50 over one connection, each config on a fresh redis-server.
# Configs:
#   ref         envoyproxy/ratelimit (fixed windows, INCRBY + EXPIRE)
#   sliding     tollgate serve, sliding_window, the defaults
#   sliding-w   the same with --redis-batch-wait $BATCH_WAIT
#   fixed-o-w   fixed_window, --redis-optimistic-fixed --redis-batch-wait $BATCH_WAIT
# RATE=N (10000 by default; 0: uncapped) paces every config at N
# decisions/s: CPU per decision grows as the rate falls, for both servers
# and for Redis, so only one rate compares them.
# Columns, medians over the runs: decisions/s; Redis CPU µs per decision
# (INFO cpu); server CPU µs per decision (/proc/PID/stat); their sum; the
# sum and Redis over ref's of the same workload.

source "$(dirname "$0")/lib.sh"

RUNS=${RUNS:-2}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-1s}
RATE=${RATE:-10000}
[[ $RATE != 0 ]] || RATE=
BATCH_WAIT=${BATCH_WAIT:-1500us}
TENANTS=${TENANTS:-1000000}
WORKLOADS=${WORKLOADS:-hot distinct three}
CONFIGS=${CONFIGS:-ref sliding sliding-w fixed-o-w}
# REF_VERSION is envoyproxy/ratelimit's main of 2026-01-22 (it tags no
# releases for the Go module).
REF_VERSION=${REF_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "RUNS is $RUNS, want a positive number"
[[ -z $RATE || $RATE =~ ^[1-9][0-9]*$ ]] || die "RATE is $RATE, want a positive number of decisions a second, or 0"
pace=()
[[ -z $RATE ]] || pace=(-rate "$RATE")

BUILT=$(describe WORKTREE)
log "building the working tree: $BUILT"
(cd "$REPO" && go build -o "$TMP/tollgate-load" ./cmd/tollgate-load && go build -o "$TMP/tollgate" ./cmd/tollgate)
log "building envoyproxy/ratelimit $REF_VERSION"
(cd "$TMP" && GOBIN=$TMP/ref GOFLAGS= go install "github.com/envoyproxy/ratelimit/src/service_cmd@$REF_VERSION") ||
	die "could not build envoyproxy/ratelimit $REF_VERSION from the module proxy"

# rules DIR [ALGORITHM]: the bench rules, the reference's without an algorithm.
rules() {
	mkdir -p "$1"
	{
		echo "domain: bench"
		[[ -z ${2:-} ]] || echo "algorithm: $2"
		cat <<'YAML'
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000}
    descriptors:
      - key: model
        rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
YAML
	} >"$1/bench.yaml"
}
rules "$TMP/rt/ratelimit/config"
rules "$TMP/rules-sliding" sliding_window
rules "$TMP/rules-fixed" fixed_window

workload_args() {
	case $1 in
	hot) echo "-domain bench -descriptor tenant=acme" ;;
	distinct) echo "-domain bench -descriptor tenant=acme -tenants $TENANTS" ;;
	three) echo "-domain bench -descriptor tenant=acme -descriptor tenant=acme,model=gpt-4o -descriptor user=acme -spread-key tenant,user -tenants $TENANTS" ;;
	*) die "unknown workload $1" ;;
	esac
}

# start_ref REDIS_PORT LOG: the reference on free ports; sets TG_PID and
# TG_GRPC like start_tollgate.
start_ref() {
	local grpc http debug i
	grpc=$(free_port) http=$(free_port) debug=$(free_port)
	RUNTIME_ROOT=$TMP/rt RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
		USE_STATSD=false DISABLE_STATS=true LOG_LEVEL=warn \
		REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:$1 \
		HOST=127.0.0.1 PORT=$http GRPC_HOST=127.0.0.1 GRPC_PORT=$grpc DEBUG_HOST=127.0.0.1 DEBUG_PORT=$debug \
		"$TMP/ref/service_cmd" >"$2" 2>&1 &
	TG_PID=$!
	PIDS+=("$TG_PID")
	TG_GRPC=127.0.0.1:$grpc
	for ((i = 0; i < 100; i++)); do
		[[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http/healthcheck") == 200 ]] && return 0
		kill -0 "$TG_PID" 2>/dev/null || break
		sleep 0.1
	done
	die "envoyproxy/ratelimit did not become healthy: $(tail -5 "$2")"
}

# one RUN WORKLOAD CONFIG: appends a line to $TMP/results.tsv.
one() {
	local run=$1 wl=$2 cfg=$3 out=$TMP/$2-$3-$1.json
	start_redis
	case $cfg in
	ref) start_ref "$REDIS_PORT" "$TMP/$wl-$cfg-$run.log" ;;
	sliding) RULES=$TMP/rules-sliding start_tollgate "$TMP/tollgate" "$TMP/$wl-$cfg-$run.log" --redis-url "redis://127.0.0.1:$REDIS_PORT/0" ;;
	sliding-w) RULES=$TMP/rules-sliding start_tollgate "$TMP/tollgate" "$TMP/$wl-$cfg-$run.log" --redis-url "redis://127.0.0.1:$REDIS_PORT/0" \
		--redis-batch-wait "$BATCH_WAIT" ;;
	fixed-o-w) RULES=$TMP/rules-fixed start_tollgate "$TMP/tollgate" "$TMP/$wl-$cfg-$run.log" --redis-url "redis://127.0.0.1:$REDIS_PORT/0" \
		--redis-batch-wait "$BATCH_WAIT" --redis-optimistic-fixed ;;
	*) die "unknown config $cfg" ;;
	esac
	# shellcheck disable=SC2046 # workload_args is a list of flags
	"$TMP/tollgate-load" -addr "$TG_GRPC" -server-pid "$TG_PID" $(workload_args "$wl") -redis-info "127.0.0.1:$REDIS_PORT" \
		-c 50 -conns 1 -d "$DURATION" -warmup "$WARMUP" ${pace[@]+"${pace[@]}"} -json >"$out" ||
		die "tollgate-load $wl $cfg failed: $(cat "$out")"
	stop_tollgate
	stop_pid "$REDIS_PID"
	forget_pid "$REDIS_PID"
	check_run "$out" "$wl" "$cfg" "$run"
	jq -r --arg r "$run" --arg w "$wl" --arg c "$cfg" \
		'[$w, $c, $r, .requests_per_second, .cpu.redis_us_per_decision, .cpu.server_us_per_decision] | @tsv' "$out" >>"$TMP/results.tsv"
}

run_matrix

printf '\n%s; envoyproxy/ratelimit %s\n%s runs of %s (+%s warm-up) each, c=50 over one connection, fresh redis-server per run, -tenants %s, %s\n' \
	"$BUILT" "$REF_VERSION" "$RUNS" "$DURATION" "$WARMUP" "$TENANTS" "$(if [[ -n $RATE ]]; then echo "paced at $RATE decisions/s"; else echo uncapped; fi)"
awk -F'\t' -v order="$WORKLOADS" -v corder="$CONFIGS" "$AWK_MEDIAN"'
{ k = $1 SUBSEP $2; rps[k] = rps[k] " " $4; red[k] = red[k] " " $5; srv[k] = srv[k] " " $6; tot[k] = tot[k] " " ($5 + $6) }
END {
	nw = split(order, W, " "); nc = split(corder, C, " ")
	printf "%-9s %-10s %12s %10s %10s %10s %10s %10s\n", "workload", "config", "decisions/s", "Redis µs", "server µs", "total µs", "total/ref", "Redis/ref"
	for (w = 1; w <= nw; w++) {
		b = W[w] SUBSEP "ref"
		rt = (b in tot) ? median(tot[b]) : 0; rr = (b in red) ? median(red[b]) : 0
		for (c = 1; c <= nc; c++) {
			k = W[w] SUBSEP C[c]
			if (!(k in rps)) continue
			t = median(tot[k]); r = median(red[k])
			printf "%-9s %-10s %12.0f %10.2f %10.2f %10.2f %10s %10s\n", W[w], C[c], median(rps[k]), r, median(srv[k]), t,
				(rt > 0 ? sprintf("%.2fx", t / rt) : "-"), (rr > 0 ? sprintf("%.2fx", r / rr) : "-")
		}
	}
}' "$TMP/results.tsv"
