#!/usr/bin/env bash
# bench-redis-memory.sh: Redis memory per live sliding-window counter.
# Sends one ShouldRateLimit for each of TENANTS distinct tenants (default
# 1,000,000) through a Tollgate of the working tree on a private
# redis-server, and lets tollgate-load -redis-info read used_memory and
# DBSIZE before and after: bytes per key is the growth of one over the
# other. The rule (scripts/bench, key account) has an hour's window, so no
# counter expires during the run.
#
#   TENANTS=1000000 scripts/bench-redis-memory.sh      (make bench-memory)

source "$(dirname "$0")/lib.sh"

TENANTS=${TENANTS:-1000000}
[[ $TENANTS =~ ^[1-9][0-9]*$ ]] || die "TENANTS is $TENANTS, want a positive number"

(cd "$REPO" && go build -o "$TMP/tollgate" ./cmd/tollgate && go build -o "$TMP/tollgate-load" ./cmd/tollgate-load)
start_redis
start_tollgate "$TMP/tollgate" "$TMP/tollgate.log" --redis-url "redis://127.0.0.1:$REDIS_PORT/0"
printf '%s (%s), %s, %s tenants, one call each\n' \
	"Redis $(redis-server --version | awk '{ sub("v=", "", $3); print $3 }')" \
	"$(redis-cli -p "$REDIS_PORT" info memory | tr -d '\r' | awk -F: '$1 == "mem_allocator" { print $2 }')" \
	"$(describe WORKTREE)" "$TENANTS"
"$TMP/tollgate-load" -addr "$TG_GRPC" -domain bench -descriptor account=x -spread-key account \
	-tenants "$TENANTS" -spread round-robin -n "$TENANTS" -d 0 -c 50 -conns 1 \
	-redis-info "127.0.0.1:$REDIS_PORT"
