#!/usr/bin/env bash
# cluster.sh - N kvchat instances sharing their KV cache through Redis, with
# HAProxy routing each conversation to one of them (README "Beyond one
# machine"). On one machine, loopback ports; the same layout spreads over
# machines by pointing --cache-redis and the server lines at other hosts.
#
#   deploy/cluster.sh start -m MODEL.gguf [-n N] [-d RUNDIR] [-p ROUTER_PORT]
#                           [-r REDIS_PORT] [-- extra `kvchat serve` options]
#   deploy/cluster.sh stop [-d RUNDIR]
#
# Ports: the router on ROUTER_PORT (8080), Redis on REDIS_PORT (6380), the
# instances on ROUTER_PORT+1 .. ROUTER_PORT+N. RUNDIR (./kvchat-cluster)
# holds the pid files, logs, the HAProxy config and each instance's disk tier.
# Redis runs with maxmemory (REDIS_MAXMEMORY, 2gb) and allkeys-lru, nothing
# saved: it is a cache. Needs redis-server, haproxy and kvchat (KVCHAT, else
# kvchat on the PATH, else ./build/kvchat).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}; shift || true
n=2 dir=./kvchat-cluster port=8080 rport=6380 model=""
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    -n) n=$2; shift 2 ;;
    -d) dir=$2; shift 2 ;;
    -p) port=$2; shift 2 ;;
    -r) rport=$2; shift 2 ;;
    -m) model=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "cluster.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

kvchat=${KVCHAT:-$(command -v kvchat || echo "$here/../build/kvchat")}
find_exe() { command -v "$1" || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; } || true; }

wait_for() {  # wait_for SECONDS COMMAND...: until the command succeeds
  local t=$(( $1 * 10 )); shift
  while ! "$@" >/dev/null 2>&1; do
    t=$((t - 1)); [ $t -gt 0 ] || return 1; sleep 0.1
  done
}

stop() {
  for f in "$dir"/haproxy.pid "$dir"/kvchat-*.pid "$dir"/redis.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f"); rm -f "$f"
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}

case $cmd in
  stop) stop; exit 0 ;;
  start) ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

[ -n "$model" ] || { echo "cluster.sh: -m MODEL.gguf is needed" >&2; exit 2; }
redis=$(find_exe redis-server); haproxy=$(find_exe haproxy)
[ -n "$redis" ] && [ -n "$haproxy" ] || {
  echo "cluster.sh: needs redis-server and haproxy (apt-get install redis-server haproxy)" >&2
  exit 1; }
mkdir -p "$dir"
trap 'echo "cluster.sh: failed; stopping what started" >&2; stop' ERR

"$redis" --port "$rport" --bind 127.0.0.1 --save "" --appendonly no \
  --maxmemory "${REDIS_MAXMEMORY:-2gb}" --maxmemory-policy allkeys-lru \
  --logfile "$dir/redis.log" --dir "$dir" & echo $! > "$dir/redis.pid"
wait_for 10 redis-cli -p "$rport" ping

servers=""
for i in $(seq 1 "$n"); do
  p=$((port + i))
  "$kvchat" serve -m "$model" --host 127.0.0.1 --port "$p" --cache-dir "$dir/disk-$i" \
    --cache-redis "redis://127.0.0.1:$rport" "${extra[@]}" 2> "$dir/kvchat-$i.log" &
  echo $! > "$dir/kvchat-$i.pid"
  servers+="    server kvchat-$i 127.0.0.1:$p check\n"
done
for i in $(seq 1 "$n"); do
  wait_for 120 curl -sf "http://127.0.0.1:$((port + i))/health"
done

sed -e "s/@ROUTER_ADDR@/127.0.0.1:$port/" -e "s/@SERVERS@/${servers%\\n}/" \
  "$here/haproxy.cfg.in" > "$dir/haproxy.cfg"
"$haproxy" -f "$dir/haproxy.cfg" -p "$dir/haproxy.pid" -D
wait_for 10 curl -sf "http://127.0.0.1:$port/health"
trap - ERR
echo "kvchat cluster: router http://127.0.0.1:$port, $n instances on ports $((port + 1))-$((port + n)), Redis on $rport; stop: $0 stop -d $dir"
