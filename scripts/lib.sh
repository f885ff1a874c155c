# Shared by the bench scripts: a private temp dir, loopback processes on
# free ports, and a cleanup trap that stops every process started here and
# removes every temp dir and git worktree, however the script ends.
# Source it from bash; it sets -euo pipefail.

set -euo pipefail

REPO=$(git -C "$(dirname "${BASH_SOURCE[0]}")/.." rev-parse --show-toplevel)
RULES=$REPO/scripts/bench
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-bench.XXXXXX")
PIDS=()
WORKTREES=()

cleanup() {
	local pid wt
	for pid in "${PIDS[@]}"; do
		stop_pid "$pid"
	done
	for wt in "${WORKTREES[@]}"; do
		git -C "$REPO" worktree remove --force "$wt" 2>/dev/null || true
	done
	((${#WORKTREES[@]})) && git -C "$REPO" worktree prune
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log() { printf '%s\n' "$*" >&2; }
die() { log "$(basename "$0"): $*"; exit 1; }

# stop_pid PID: SIGTERM, up to 15s to exit (Tollgate drains for up to 10s),
# then SIGKILL.
stop_pid() {
	local pid=$1 i
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 150; i++)); do
		kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

# forget_pid PID: drop a stopped process from the cleanup list.
forget_pid() {
	local keep=() p
	for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
	PIDS=(${keep[@]+"${keep[@]}"})
}

# build_tollgate REV OUT: build cmd/tollgate of git rev REV (or of the
# working tree when REV is WORKTREE) into OUT. A rev is checked out with
# `git worktree add` under $TMP and removed once built.
build_tollgate() {
	local rev=$1 out=$2 src
	if [[ $rev == WORKTREE ]]; then
		(cd "$REPO" && go build -o "$out" ./cmd/tollgate)
		return
	fi
	src=$TMP/src-$(basename "$out")
	git -C "$REPO" worktree add --quiet --detach "$src" "$rev"
	WORKTREES+=("$src")
	(cd "$src" && go build -o "$out" ./cmd/tollgate)
	git -C "$REPO" worktree remove --force "$src"
	git -C "$REPO" worktree prune
}

# describe REV: what REV is, for the report.
describe() {
	if [[ $1 == WORKTREE ]]; then
		echo "working tree (on $(git -C "$REPO" rev-parse --short HEAD), $(git -C "$REPO" status --porcelain | wc -l) paths changed)"
	else
		echo "$1 = $(git -C "$REPO" rev-parse --short "$1^{commit}")"
	fi
}

# free_port prints a loopback port nothing listens on now (another
# process may take it before the caller binds it: callers retry).
free_port() {
	local port
	while :; do
		port=$((20000 + RANDOM % 40000))
		ss -Hltn "sport = :$port" | grep -q . || { echo "$port"; return; }
	done
}

# AWK_MEDIAN is an awk function, median(s), of the numbers in the
# space-separated string s, for the bench scripts' tables.
# shellcheck disable=SC2016 # awk source, not shell
AWK_MEDIAN='
function median(s,   n, a, i, j, t) {
	n = split(s, a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}'

# start_redis: a private redis-server on a free loopback port, without
# persistence. Sets REDIS_PORT and REDIS_PID. redis-server cannot take
# port 0, so pick a port nothing listens on, and pick again when another
# process takes it first.
start_redis() {
	local attempt port i
	for attempt in 1 2 3 4 5; do
		port=$(free_port)
		redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
			--dir "$TMP" --logfile "$TMP/redis-$port.log" &
		REDIS_PID=$!
		PIDS+=("$REDIS_PID")
		for ((i = 0; i < 100; i++)); do
			if [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]]; then
				REDIS_PORT=$port
				return 0
			fi
			kill -0 "$REDIS_PID" 2>/dev/null || break
			sleep 0.1
		done
		stop_pid "$REDIS_PID"
		forget_pid "$REDIS_PID"
	done
	die "redis-server did not start; last log: $(tail -3 "$TMP/redis-$port.log" 2>/dev/null)"
}

# start_tollgate BIN LOG [serve flags...]: serve the bench rules on
# ephemeral loopback ports and wait until it is ready. Sets TG_PID,
# TG_GRPC and TG_ADMIN from its "serving" log line.
start_tollgate() {
	local bin=$1 logf=$2 i line
	shift 2
	: >"$logf"
	"$bin" serve --config "$RULES" --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
		--log-format json --log-level info "$@" 2>"$logf" &
	TG_PID=$!
	PIDS+=("$TG_PID")
	TG_GRPC='' TG_ADMIN=''
	for ((i = 0; i < 200; i++)); do
		line=$(grep -m1 '"msg":"serving"' "$logf" || true)
		if [[ -n $line ]]; then
			TG_GRPC=$(jq -r .grpc_addr <<<"$line")
			TG_ADMIN=$(jq -r .admin_addr <<<"$line")
			break
		fi
		kill -0 "$TG_PID" 2>/dev/null || break
		sleep 0.1
	done
	[[ -n $TG_GRPC ]] || die "$bin did not start: $(tail -5 "$logf")"
	for ((i = 0; i < 100; i++)); do
		[[ $(curl -s -o /dev/null -w '%{http_code}' "http://$TG_ADMIN/readyz") == 200 ]] && return 0
		sleep 0.1
	done
	die "$bin never became ready: $(tail -5 "$logf")"
}

# stop_tollgate: stop the last start_tollgate's process.
stop_tollgate() {
	stop_pid "$TG_PID"
	forget_pid "$TG_PID"
}

# check_run OUT WORKLOAD CONFIG RUN: say when a run's load report (OUT,
# tollgate-load's JSON) has calls that were not OK, or, with RATE set,
# when the run fell short of its pace and so measured a lower load.
check_run() {
	local out=$1 wl=$2 cfg=$3 run=$4 bad
	bad=$(jq -r '.errors_total + .over_limit + .unknown' "$out")
	((bad == 0)) || log "$wl $cfg run $run: $bad calls not OK (errors, over limit or unknown)"
	[[ -z ${RATE:-} ]] || jq -e --argjson r "$RATE" '.requests_per_second >= 0.97 * $r' "$out" >/dev/null ||
		log "$wl $cfg run $run: $(jq -r '.requests_per_second | floor' "$out") decisions/s, short of RATE=$RATE: its figures are at a lower load"
}

# run_matrix: the caller's one RUN WORKLOAD CONFIG for RUNS rounds of
# every WORKLOADS x CONFIGS, each appending its line to $TMP/results.tsv,
# which RESULTS, when set, receives a copy of.
run_matrix() {
	: >"$TMP/results.tsv"
	local i wl cfg
	for ((i = 1; i <= RUNS; i++)); do
		for wl in $WORKLOADS; do
			for cfg in $CONFIGS; do
				log "run $i of $RUNS: $wl $cfg"
				one "$i" "$wl" "$cfg"
			done
		done
	done
	[[ -z ${RESULTS:-} ]] || cp "$TMP/results.tsv" "$RESULTS"
}
