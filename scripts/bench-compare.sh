#!/usr/bin/env bash
# bench-compare.sh: ShouldRateLimit throughput of two builds of Tollgate,
# measured in alternating runs on the same machine, and the median ratio
# HEAD/BASE.
#
#   BASE=main HEAD=WORKTREE STORE=redis RUNS=3 DURATION=10s scripts/bench-compare.sh
#
# BASE, HEAD   git revisions to build; WORKTREE is the working tree as it is
#              (defaults: BASE=HEAD, HEAD=WORKTREE)
# STORE        memory or redis: a private redis-server on a free loopback port
#              (default memory)
# RUNS         runs of each build, alternating BASE, HEAD, BASE, ... (default 3)
# DURATION     measured time of each run (default 10s); WARMUP before it (1s)
# LOAD_ARGS    more tollgate-load flags, e.g. "-tenants 100000"
#
# Each run starts a fresh Tollgate on ephemeral loopback ports with the
# rules in scripts/bench, drives it with bin/tollgate-load of the working
# tree (50 workers over one connection, descriptor tenant=acme), and stops
# it; with Redis the database is flushed before each run. Everything this
# starts is stopped and every temp dir and worktree removed on exit.
#
# The client, the server and Redis share the machine's cores: a ratio is
# only worth its spread across runs, so run it on a quiet machine.

source "$(dirname "$0")/lib.sh"

BASE=${BASE:-HEAD}
HEAD=${HEAD:-WORKTREE}
STORE=${STORE:-memory}
RUNS=${RUNS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-1s}
LOAD_ARGS=${LOAD_ARGS:-}

[[ $STORE == memory || $STORE == redis ]] || die "STORE is $STORE, want memory or redis"
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "RUNS is $RUNS, want a positive number"
for rev in "$BASE" "$HEAD"; do
	[[ $rev == WORKTREE ]] || git -C "$REPO" rev-parse --quiet --verify "$rev^{commit}" >/dev/null ||
		die "$rev is not a git revision (or WORKTREE)"
done

log "building: BASE $(describe "$BASE"), HEAD $(describe "$HEAD"), tollgate-load of the working tree"
(cd "$REPO" && go build -o "$TMP/tollgate-load" ./cmd/tollgate-load)
build_tollgate "$BASE" "$TMP/base"
build_tollgate "$HEAD" "$TMP/head"

serve_args=()
if [[ $STORE == redis ]]; then
	start_redis
	serve_args=(--redis-url "redis://127.0.0.1:$REDIS_PORT/0")
	log "redis-server on 127.0.0.1:$REDIS_PORT"
fi

# run SIDE N: one measured run of build SIDE (base or head); sets RPS,
# P99 (ms) and ERRS. It runs in this shell, so the cleanup trap knows
# its Tollgate.
run() {
	local side=$1 n=$2 out=$TMP/$1-$2.json
	[[ $STORE == redis ]] && redis-cli -p "$REDIS_PORT" flushall >/dev/null
	start_tollgate "$TMP/$side" "$TMP/$side-$n.log" ${serve_args[@]+"${serve_args[@]}"}
	# shellcheck disable=SC2086 # LOAD_ARGS is a list of flags
	"$TMP/tollgate-load" -addr "$TG_GRPC" -domain bench -descriptor tenant=acme \
		-c 50 -conns 1 -d "$DURATION" -warmup "$WARMUP" -json $LOAD_ARGS >"$out" ||
		die "tollgate-load against $side failed: $(cat "$out")"
	stop_tollgate
	read -r RPS P99 ERRS < <(jq -r '[.requests_per_second, .latency_ms.p99, .errors_total] | @tsv' "$out")
}

printf 'store %s, %s runs of %s (+%s warm-up) each, c=50 over 1 connection, descriptor tenant=acme%s\n' \
	"$STORE" "$RUNS" "$DURATION" "$WARMUP" "${LOAD_ARGS:+ $LOAD_ARGS}"
printf 'BASE %s\nHEAD %s\n\n' "$(describe "$BASE")" "$(describe "$HEAD")"
printf '%-4s %14s %10s %14s %10s %9s %9s\n' run 'BASE req/s' 'BASE p99' 'HEAD req/s' 'HEAD p99' 'req/s' 'p99'
printf '%-4s %14s %10s %14s %10s %9s %9s\n' '' '' '' '' '' HEAD/BASE HEAD/BASE
rps_ratios=() p99_ratios=()
for ((i = 1; i <= RUNS; i++)); do
	run base "$i"
	b_rps=$RPS b_p99=$P99 b_err=$ERRS
	run head "$i"
	h_rps=$RPS h_p99=$P99 h_err=$ERRS
	((b_err + h_err == 0)) || log "run $i: errors: BASE $b_err, HEAD $h_err (see tollgate-load -json)"
	r_rps=$(awk -v h="$h_rps" -v b="$b_rps" 'BEGIN { printf "%.3f", h / b }')
	r_p99=$(awk -v h="$h_p99" -v b="$b_p99" 'BEGIN { printf "%.3f", h / b }')
	rps_ratios+=("$r_rps") p99_ratios+=("$r_p99")
	printf '%-4s %14.0f %8.2fms %14.0f %8.2fms %9s %9s\n' "$i" "$b_rps" "$b_p99" "$h_rps" "$h_p99" "$r_rps" "$r_p99"
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf '\nmedian of the per-run ratios HEAD/BASE: req/s %s, p99 %s\n' \
	"$(median "${rps_ratios[@]}")" "$(median "${p99_ratios[@]}")"
