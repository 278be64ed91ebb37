#!/usr/bin/env bash
# Benchmarks of Animal Store, each measured against a peer in the same run, on loopback only.
#
#   bash bench/run.sh            # writes bench/results.md (needs wrk; nginx-light for the proxy peer)
#
# 1. Durable creates: POST /v1/pets straight to the backend, group commit vs one fsync per
#    request (`backend.commit`), each on a fresh data directory.
# 2. The gateway: GET /v1/pets?limit=1 straight to the backend, through the gateway (auth,
#    exact limits, headers), and through nginx as a reverse proxy doing comparable work
#    (limit_req keyed on the Authorization header, keep-alive upstream).
#
# Pinning on 2 cores: in part 1 the backend on CPU 0 and wrk on CPU 1; in part 2 the proxy under
# test (gateway or nginx, one worker) on CPU 0, the backend and wrk on CPU 1. Every round runs every contender back to back; reported values are medians.
# Environment: DUR (seconds per run, 8), ROUNDS (3), CONN (wrk connections, 64).
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-8}
ROUNDS=${ROUNDS:-3}
CONN=${CONN:-64}
BIN=target/release/animal-store
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install -y wrk" >&2; exit 1; }
cargo build --release --quiet

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 400); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }
start() { local cpu=$1; shift; taskset -c "$cpu" "$@" >>"$work/log" 2>&1 & pids+=($!); echo $!; }
stop() { kill -TERM "$1" 2>/dev/null || true; while kill -0 "$1" 2>/dev/null; do sleep 0.1; done; }

# wrk on CPU 1; prints "requests_per_second p99_ms".
measure() {
  local url=$1 script=$2
  taskset -c 1 wrk -t1 -c"$CONN" -d"${DUR}s" --latency -s "$script" "$url" >"$work/wrk.out"
  python3 - "$work/wrk.out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
value, unit = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", text, re.M).groups()
p99 = float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
if non2xx:
    sys.exit(f"wrk saw {non2xx.group(1)} non-2xx responses")
print(f"{rps:.0f} {p99:.2f}")
PY
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

config() { # $1 commit mode → a configuration file
  local file="$work/config-$1.toml"
  printf '[backend]\ncommit = "%s"\n[gateway]\nthreads = 1\n' "$1" >"$file"
  echo "$file"
}

echo "== 1. durable creates: group commit vs one fsync per request"
declare -A create_rps create_p99
for round in $(seq "$ROUNDS"); do
  for mode in group per_request; do
    port=$(free_port)
    pid=$(start 0 "$BIN" backend --config "$(config $mode)" --data-dir "$work/data-$mode-$round" --backend-listen "127.0.0.1:$port")
    wait_port "$port"
    read -r rps p99 < <(measure "http://127.0.0.1:$port/v1/pets" bench/create.lua)
    stop "$pid"
    echo "  round $round $mode: $rps creates/s, p99 $p99 ms"
    create_rps[$mode]+="$rps "; create_p99[$mode]+="$p99 "
  done
done

echo "== 2. gateway vs direct vs nginx"
bport=$(free_port); gport=$(free_port); aport=$(free_port); nport=$(free_port)
data="$work/data-gateway"
cfg=$(config group)
key=$("$BIN" keys create --config "$cfg" --data-dir "$data" --plan enterprise --per-minute 4000000000 --per-day 4000000000 --name bench 2>/dev/null)
start 1 "$BIN" backend --config "$cfg" --data-dir "$data" --backend-listen "127.0.0.1:$bport" >/dev/null
wait_port "$bport"
curl -s -o /dev/null -X POST "http://127.0.0.1:$bport/v1/pets" -H 'Content-Type: application/json' -d '{"name":"Rex","categoryId":1}'
start 0 "$BIN" gateway --config "$cfg" --data-dir "$data" --listen "127.0.0.1:$gport" --admin-listen "127.0.0.1:$aport" --backend-listen "127.0.0.1:$bport" >/dev/null
wait_port "$gport"
have_nginx=0
if command -v nginx >/dev/null; then
  have_nginx=1
  mkdir -p "$work/nginx"
  cat >"$work/nginx/nginx.conf" <<EOF
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  limit_req_zone \$http_authorization zone=keys:10m rate=100000000r/s;
  upstream backend { server 127.0.0.1:$bport; keepalive 64; }
  server {
    listen 127.0.0.1:$nport;
    location /v1/ {
      limit_req zone=keys burst=100000000 nodelay;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "";
      proxy_set_header X-Forwarded-For \$remote_addr;
      proxy_pass http://backend;
    }
  }
}
EOF
  start 0 nginx -c "$work/nginx/nginx.conf" -g 'daemon off;' >/dev/null
  wait_port "$nport"
fi
declare -A get_rps get_p99
targets="direct gateway"
[ "$have_nginx" = 1 ] && targets="direct gateway nginx"
for round in $(seq "$ROUNDS"); do
  for target in $targets; do
    case $target in
      direct) url="http://127.0.0.1:$bport/v1/pets?limit=1" ;;
      gateway) url="http://127.0.0.1:$gport/v1/pets?limit=1" ;;
      nginx) url="http://127.0.0.1:$nport/v1/pets?limit=1" ;;
    esac
    read -r rps p99 < <(KEY=$key measure "$url" bench/get.lua)
    echo "  round $round $target: $rps req/s, p99 $p99 ms"
    get_rps[$target]+="$rps "; get_p99[$target]+="$p99 "
  done
done

med() { tr ' ' '\n' <<<"$1" | grep . | median; }
ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
g=$(med "${create_rps[group]}"); p=$(med "${create_rps[per_request]}")
d=$(med "${get_rps[direct]}"); gw=$(med "${get_rps[gateway]}")
{
  echo "# Benchmark results"
  echo
  echo "Measured $(date -u +%Y-%m-%d) by \`bash bench/run.sh\` (DUR=$DUR s, ROUNDS=$ROUNDS, CONN=$CONN; medians)."
  echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/ {print $2}') GiB, Linux $(uname -r)."
  echo "Method: wrk -t1 -c$CONN on CPU 1. Part 1: the backend alone on CPU 0. Part 2: the backend on CPU 1 with wrk,"
  echo "the proxy under test on CPU 0 (one worker thread). Per-round values are in the run's output."
  echo
  echo "## Durable creates (POST /v1/pets to the backend, fsync before every 201)"
  echo
  echo "| commit | creates/s | p99 ms |"
  echo "|---|---|---|"
  echo "| group (shipped) | $g | $(med "${create_p99[group]}") |"
  echo "| per_request | $p | $(med "${create_p99[per_request]}") |"
  echo
  echo "Group commit sustains **$(ratio "$g" "$p")x** the creates per second of one flush per request."
  echo
  echo "## Gateway (GET /v1/pets?limit=1, enterprise key with limits out of reach)"
  echo
  echo "| path | req/s | p99 ms | req/s vs direct |"
  echo "|---|---|---|---|"
  for t in $targets; do
    echo "| $t | $(med "${get_rps[$t]}") | $(med "${get_p99[$t]}") | $(ratio "$(med "${get_rps[$t]}")" "$d") |"
  done
  if [ "$have_nginx" = 1 ]; then
    echo
    echo "The gateway serves **$(ratio "$gw" "$(med "${get_rps[nginx]}")")x** nginx's requests per second in the same run."
  fi
} >bench/results.md
cat bench/results.md
