#!/usr/bin/env bash
# bench-targets.sh: the load figures of issue 5's targets, measured on this
# machine with the working tree's build, RUNS times each, and their medians.
#
#   RUNS=3 DURATION=10s scripts/bench-targets.sh
#
#   1  ShouldRateLimit, descriptor tenant=acme (sliding window, 1e9/s), on
#      Redis (leases on, the default), c=50 over one connection
#   1b the same with leases off (--lease-fraction=0): every decision is a
#      Redis script
#   2  the same on the in-memory store, in the same run; Redis/memory ratio
#   3  ext_authz Check, 2 KB JSON body, API key, token reservation, Redis
#   4  Redis commands per decision, 100,000/min for one tenant spread over
#      three replicas on one Redis (INFO commandstats via -redis-info)
#   5  Redis commands per decision for a key over its limit (hot=x,
#      600/min), after the first second
#
# Targets 6 (allocations, CPU per decision) and 7 (memory per key) are Go
# benchmarks and bench-memory: see docs/benchmarks.md.
#
# The client, the server(s) and Redis share the machine's cores: run it on
# a quiet machine. Everything it starts is stopped on exit.

source "$(dirname "$0")/lib.sh"

RUNS=${RUNS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-1s}
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "RUNS is $RUNS, want a positive number"

log "building the working tree: $(describe WORKTREE)"
(cd "$REPO" && go build -o "$TMP/tollgate-load" ./cmd/tollgate-load && go build -o "$TMP/tollgate" ./cmd/tollgate)
start_redis
REDIS=redis://127.0.0.1:$REDIS_PORT/0
log "redis-server on 127.0.0.1:$REDIS_PORT"

# load NAME [tollgate-load flags]: one measured run against $TG_GRPC,
# JSON in $TMP/NAME.json; sets RPS and P99 (ms).
load() {
	local name=$1 out=$TMP/$1.json
	shift
	"$TMP/tollgate-load" -c 50 -conns 1 -d "$DURATION" -warmup "$WARMUP" -json "$@" >"$out" ||
		die "tollgate-load $name failed: $(cat "$out")"
	read -r RPS P99 ERRS < <(jq -r '[(.requests_per_second | round), (.latency_ms.p99 * 100 | round / 100), .errors_total] | @tsv' "$out")
	((ERRS == 0)) || log "$name: $ERRS calls failed"
}

# serve_and_load NAME SERVE_FLAGS... -- LOAD_FLAGS...: a fresh Tollgate on
# a flushed Redis, one run, stopped.
serve_and_load() {
	local name=$1 serve=() arg
	shift
	while (($#)); do
		arg=$1
		shift
		[[ $arg == -- ]] && break
		serve+=("$arg")
	done
	redis-cli -p "$REDIS_PORT" flushall >/dev/null
	start_tollgate "$TMP/tollgate" "$TMP/$name.log" ${serve[@]+"${serve[@]}"}
	load "$name" -addr "$TG_GRPC" "$@"
	stop_tollgate
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A rps p99
cpd4=() cpd5=() busy_pids=()
rls=(-domain bench -descriptor tenant=acme)
for ((i = 1; i <= RUNS; i++)); do
	log "run $i of $RUNS"
	serve_and_load "redis-$i" --redis-url "$REDIS" -- "${rls[@]}"
	rps[redis]+="$RPS " p99[redis]+="$P99 "
	serve_and_load "mem-$i" -- "${rls[@]}"
	rps[mem]+="$RPS " p99[mem]+="$P99 "
	serve_and_load "nolease-$i" --redis-url "$REDIS" --lease-fraction=0 -- "${rls[@]}"
	rps[nolease]+="$RPS " p99[nolease]+="$P99 "
	serve_and_load "check-$i" --redis-url "$REDIS" --config "$RULES/authz/rules.yaml" \
		--authz-config "$RULES/authz/authz.yaml" -- -api check -key bench-key-0123456789abcdef -body-bytes 2048
	rps[check]+="$RPS " p99[check]+="$P99 "

	# 4: three replicas, one limit of 100,000/min.
	redis-cli -p "$REDIS_PORT" flushall >/dev/null
	addrs=()
	for r in 1 2 3; do
		start_tollgate "$TMP/tollgate" "$TMP/busy-$i-$r.log" --redis-url "$REDIS" --replica-id "r$r"
		addrs+=("$TG_GRPC")
		busy_pids+=("$TG_PID")
	done
	load "busy-$i" -addr "$(IFS=,; echo "${addrs[*]}")" -domain busy -descriptor tenant=acme -redis-info "127.0.0.1:$REDIS_PORT"
	cpd4+=("$(jq -r '.redis.commands_per_call * 10000 | round / 10000' "$TMP/busy-$i.json")")
	rps[busy]+="$RPS "
	for pid in "${busy_pids[@]}"; do stop_pid "$pid"; forget_pid "$pid"; done
	busy_pids=()

	# 5: a key over its limit.
	redis-cli -p "$REDIS_PORT" flushall >/dev/null
	start_tollgate "$TMP/tollgate" "$TMP/hot-$i.log" --redis-url "$REDIS"
	load "hot-$i" -addr "$TG_GRPC" -domain bench -descriptor hot=x -redis-info "127.0.0.1:$REDIS_PORT"
	cpd5+=("$(jq -r '.redis.commands_per_call * 10000 | round / 10000' "$TMP/hot-$i.json")")
	rps[hot]+="$RPS " p99[hot]+="$P99 "
	stop_tollgate
done

m() { median ${1}; }
printf '\n%s, %s runs of %s (+%s warm-up), c=50 over one connection per replica\n' "$(describe WORKTREE)" "$RUNS" "$DURATION" "$WARMUP"
printf '%-52s %-28s %s\n' case 'runs' median
printf '%-52s %-28s %.0f/s, p99 %.2f ms\n' "1  RLS tenant=acme, Redis, leases" "${rps[redis]}" "$(m "${rps[redis]}")" "$(m "${p99[redis]}")"
printf '%-52s %-28s %.0f/s, p99 %.2f ms\n' "1b RLS tenant=acme, Redis, leases off" "${rps[nolease]}" "$(m "${rps[nolease]}")" "$(m "${p99[nolease]}")"
printf '%-52s %-28s %.0f/s, p99 %.2f ms\n' "2  RLS tenant=acme, memory" "${rps[mem]}" "$(m "${rps[mem]}")" "$(m "${p99[mem]}")"
printf '%-52s %-28s %.3f\n' "2  Redis/memory (medians)" "" "$(awk -v r="$(m "${rps[redis]}")" -v x="$(m "${rps[mem]}")" 'BEGIN { print r / x }')"
printf '%-52s %-28s %.0f/s, p99 %.2f ms\n' "3  Check 2 KB body, key, reservation, Redis" "${rps[check]}" "$(m "${rps[check]}")" "$(m "${p99[check]}")"
printf '%-52s %-28s %s (at %.0f/s)\n' "4  Redis commands/decision, 100k/min, 3 replicas" "${cpd4[*]}" "$(median "${cpd4[@]}")" "$(m "${rps[busy]}")"
printf '%-52s %-28s %s (at %.0f/s)\n' "5  Redis commands/decision, key over its limit" "${cpd5[*]}" "$(median "${cpd5[@]}")" "$(m "${rps[hot]}")"
