#!/usr/bin/env bash
# bench-redis.sh: CPU per decision of Tollgate on Redis against a plain
# INCRBY baseline (issue 17), in one run, medians of RUNS runs.
#
#   RUNS=3 DURATION=10s scripts/bench-redis.sh        # the defaults, ~15 min
#   RUNS=1 DURATION=3s scripts/bench-redis.sh         # quick, ~4 min
#
# Workloads (ShouldRateLimit, domain bench, c=50 over one connection):
#   hot       descriptor tenant=acme, one tenant
#   distinct  the same over -tenants 1000000, picked at random per call
#   three     tenant=T; tenant=T,model=gpt-4o; user=T: three rules, three
#             keys per call, T random of 1,000,000
# Configs, each on a fresh redis-server (and a fresh `tollgate serve` with
# rules of that algorithm, limits of 1e9/s so every call is admitted):
#   baseline         tollgate-load -api redis-baseline: per call one pipeline
#                    of INCRBY + PEXPIRE per descriptor, 1 s fixed windows
#                    (what envoyproxy/ratelimit sends Redis), no Tollgate
#   sliding, fixed, token        sliding_window, fixed_window, token_bucket,
#                                leases on (the default)
#   sliding-nl, fixed-nl, token-nl   the same with --lease-fraction 0
#   any of them with -ub after it (fixed-nl-ub)   the same unbatched,
#                    --redis-batch 0 (the default batches: concurrent decisions
#                    share round trips and script calls)
#   any of them with -w after it (sliding-nl-w)   the same with
#                    --redis-batch-wait $BATCH_WAIT (1ms by default): a batch
#                    waits that long for more decisions once one is queued
#   fixed-o (fixed-o-nl, fixed-o-w, ...)   fixed windows with
#                    --redis-optimistic-fixed: acquisitions by INCRBY, no
#                    script, a denial taken back
#   matched          the baseline capped (tollgate-load -rate) at the most
#                    decisions/s a Tollgate config of the same workload made
#                    earlier in the same run: Redis's CPU per command grows
#                    as the load falls (fewer commands per wake-up), so this
#                    compares the two at the same load. Put it after them.
# RATE=N paces every config, the baseline included, at N decisions/s
# (tollgate-load -rate: calls start evenly spaced), so that each column
# compares CPU per decision at one load. Uncapped, each config runs as
# fast as it can, and CPU per decision grows as the rate falls, Redis's
# (fewer commands per wake-up) and the server's (fewer RPCs per HTTP/2
# write and per scheduler wake-up): at 15,000/s paced, the leased hot key
# cost the server 54 µs a decision, as much as distinct keys did, and 30
# uncapped at 28,000/s. Pick N below every config's uncapped rate (a
# config that falls more than 3% short is named in the log).
# Runs alternate: for each run, each workload, each config in that order.
# WARMUP (1s) precedes each measured run; WORKLOADS and CONFIGS pick a
# subset; RESULTS=file keeps the per-run figures (TSV: workload, config,
# run, decisions/s, Redis µs, server µs, Redis commands, load µs).
#
# Columns, medians over the runs: decisions/s; Redis CPU µs per decision
# (INFO cpu used_cpu_sys + used_cpu_user, from the end of the warm-up to
# the last answer); server CPU µs per decision (utime + stime of the
# tollgate process, /proc/PID/stat); Redis commands per decision
# (commandstats); load tool CPU µs per decision; Redis / the baseline of
# the same workload; server / Tollgate's leased hot key (hot, sliding).
#
# The client, Tollgate and Redis share the machine's cores: run it on a
# quiet machine. Everything it starts is stopped on exit.

source "$(dirname "$0")/lib.sh"

RUNS=${RUNS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-1s}
TENANTS=${TENANTS:-1000000}
WORKLOADS=${WORKLOADS:-hot distinct three}
RATE=${RATE:-}
[[ -z $RATE || $RATE =~ ^[1-9][0-9]*$ ]] || die "RATE is $RATE, want a positive number of decisions a second"
pace=()
[[ -z $RATE ]] || pace=(-rate "$RATE")
if [[ -n ${RATE:-} ]]; then
	CONFIGS=${CONFIGS:-baseline sliding sliding-nl fixed fixed-nl fixed-o-w token token-nl}
else
	CONFIGS=${CONFIGS:-baseline sliding sliding-nl fixed fixed-nl fixed-o-w token token-nl matched}
fi
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "RUNS is $RUNS, want a positive number"

BUILT=$(describe WORKTREE)
log "building the working tree: $BUILT"
(cd "$REPO" && go build -o "$TMP/tollgate-load" ./cmd/tollgate-load && go build -o "$TMP/tollgate" ./cmd/tollgate)

# One rules directory per algorithm: a rule per descriptor of the
# workloads, tenant+model nested under tenant as in envoyproxy/ratelimit.
for alg in sliding_window fixed_window token_bucket; do
	mkdir -p "$TMP/rules-$alg"
	cat >"$TMP/rules-$alg/bench.yaml" <<YAML
domain: bench
algorithm: $alg
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000}
    descriptors:
      - key: model
        rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
YAML
done

# workload_args NAME: the tollgate-load flags of a workload.
workload_args() {
	case $1 in
	hot) echo "-domain bench -descriptor tenant=acme" ;;
	distinct) echo "-domain bench -descriptor tenant=acme -tenants $TENANTS" ;;
	three) echo "-domain bench -descriptor tenant=acme -descriptor tenant=acme,model=gpt-4o -descriptor user=acme -spread-key tenant,user -tenants $TENANTS" ;;
	*) die "unknown workload $1" ;;
	esac
}

# one RUN WORKLOAD CONFIG: a measured run on a fresh redis-server; appends
# a line to $TMP/results.tsv.
one() {
	local run=$1 wl=$2 cfg=$3 out=$TMP/$2-$3-$1.json alg lease=() batch=() opt=() target base
	start_redis
	local redis=127.0.0.1:$REDIS_PORT
	if [[ $cfg == baseline ]]; then
		target=(-api redis-baseline -redis-url "$redis" -window 1s)
	elif [[ $cfg == matched && -n $RATE ]]; then
		die "matched: every config runs at RATE=$RATE already; leave matched out of CONFIGS"
	elif [[ $cfg == matched ]]; then
		local rate
		rate=$(awk -F'\t' -v w="$wl" -v r="$run" '$1 == w && $3 == r && $2 != "baseline" && $2 != "matched" && $4 + 0 > m { m = $4 + 0 } END { if (m > 0) printf "%.0f", m }' "$TMP/results.tsv")
		[[ -n $rate ]] || die "matched: no Tollgate config of $wl ran before it in run $run (put matched after them in CONFIGS)"
		log "matched: the baseline at $rate decisions/s"
		target=(-api redis-baseline -redis-url "$redis" -window 1s -rate "$rate")
	else
		base=${cfg%-ub}
		[[ $base == "$cfg" ]] || batch=(--redis-batch 0)
		if [[ $base == *-w ]]; then
			[[ $base == "$cfg" ]] || die "config $cfg: -w waits for a batch, -ub has none"
			base=${base%-w}
			batch=(--redis-batch-wait "${BATCH_WAIT:-1ms}")
		fi
		if [[ $base == *-nl ]]; then
			lease=(--lease-fraction 0)
			base=${base%-nl}
		fi
		if [[ $base == *-o ]]; then
			[[ $base == fixed-o ]] || die "config $cfg: -o is --redis-optimistic-fixed, for fixed windows"
			opt=(--redis-optimistic-fixed)
			base=${base%-o}
		fi
		case $base in
		sliding) alg=sliding_window ;;
		fixed) alg=fixed_window ;;
		token) alg=token_bucket ;;
		*) die "unknown config $cfg" ;;
		esac
		RULES=$TMP/rules-$alg start_tollgate "$TMP/tollgate" "$TMP/$wl-$cfg-$run.log" \
			--redis-url "redis://$redis/0" ${lease[@]+"${lease[@]}"} ${batch[@]+"${batch[@]}"} ${opt[@]+"${opt[@]}"}
		target=(-addr "$TG_GRPC" -server-pid "$TG_PID")
	fi
	# shellcheck disable=SC2046 # workload_args is a list of flags
	"$TMP/tollgate-load" "${target[@]}" $(workload_args "$wl") -redis-info "$redis" \
		-c 50 -conns 1 -d "$DURATION" -warmup "$WARMUP" ${pace[@]+"${pace[@]}"} -json >"$out" ||
		die "tollgate-load $wl $cfg failed: $(cat "$out")"
	[[ $cfg == baseline || $cfg == matched ]] || stop_tollgate
	stop_pid "$REDIS_PID"
	forget_pid "$REDIS_PID"
	local bad
	check_run "$out" "$wl" "$cfg" "$run"
	jq -r --arg r "$run" --arg w "$wl" --arg c "$cfg" \
		'[$w, $c, $r, .requests_per_second, .cpu.redis_us_per_decision, (.cpu.server_us_per_decision // "-"),
		  .cpu.redis_commands_per_decision, .cpu.load_us_per_decision] | @tsv' "$out" >>"$TMP/results.tsv"
}

run_matrix

printf '\n%s\n%s runs of %s (+%s warm-up) each, c=50 over one connection, fresh redis-server per run, -tenants %s, %s\n' \
	"$BUILT" "$RUNS" "$DURATION" "$WARMUP" "$TENANTS" "$(if [[ -n $RATE ]]; then echo "paced at $RATE decisions/s"; else echo uncapped; fi)"
# Medians per workload and config, then the ratios.
awk -F'\t' -v order="$WORKLOADS" -v corder="$CONFIGS" "$AWK_MEDIAN"'
{
	k = $1 SUBSEP $2
	rps[k] = rps[k] " " $4; red[k] = red[k] " " $5; cmd[k] = cmd[k] " " $7; ld[k] = ld[k] " " $8
	if ($6 != "-") srv[k] = srv[k] " " $6
}
END {
	nw = split(order, W, " "); nc = split(corder, C, " ")
	hot = "hot" SUBSEP "sliding"
	hotsrv = (hot in srv) ? median(srv[hot]) : 0
	printf "%-9s %-11s %12s %10s %11s %10s %9s %12s %13s %12s\n", "workload", "config", "decisions/s", "Redis µs", "server µs", "Redis cmds", "load µs", "Redis/base", "Redis/matched", "server/hot"
	for (w = 1; w <= nw; w++) {
		b = W[w] SUBSEP "baseline"
		base = (b in red) ? median(red[b]) : 0
		b = W[w] SUBSEP "matched"
		mbase = (b in red) ? median(red[b]) : 0
		for (c = 1; c <= nc; c++) {
			k = W[w] SUBSEP C[c]
			if (!(k in rps)) continue
			r = median(red[k])
			s = (k in srv) ? sprintf("%.2f", median(srv[k])) : "-"
			rr = base > 0 ? sprintf("%.2fx", r / base) : "-"
			mr = mbase > 0 ? sprintf("%.2fx", r / mbase) : "-"
			sr = (k in srv && hotsrv > 0) ? sprintf("%.2fx", median(srv[k]) / hotsrv) : "-"
			printf "%-9s %-11s %12.0f %10.2f %11s %10.3f %9.2f %12s %13s %12s\n", W[w], C[c], median(rps[k]), r, s, median(cmd[k]), median(ld[k]), rr, mr, sr
		}
	}
}' "$TMP/results.tsv"
