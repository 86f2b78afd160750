#!/usr/bin/env bash
# Quick same-run comparison of Portico, nginx and HAProxy as single-worker reverse proxies in front of the same
# nginx backend (100-byte body, keep-alive both sides). A stop-gap until the full harness (issue 4) lands.
#
#   bash bench/quick.sh [RUNS] [DURATION] [CONNECTIONS]
#
# Installs nginx, haproxy and wrk with apt-get when missing. Pins each proxy to CPU 0 and the backend and wrk to
# the other CPU(s). Reports, per proxy and run: requests/s, proxy CPU microseconds per request (utime+stime from
# /proc), p50/p99 latency, upstream connections opened; then medians and the ratios against nginx and HAProxy.
set -euo pipefail
RUNS=${1:-3}
DURATION=${2:-10}
CONNS=${3:-50}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; sleep 0.5; rm -rf "$WORK"' EXIT

missing=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v wrk >/dev/null || missing+=(wrk)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export PATH=$PATH:/usr/sbin
(cd "$ROOT" && cargo build --release -q)

CPUS=$(nproc)
OTHER="1-$((CPUS - 1))"
[ "$CPUS" -gt 1 ] || OTHER=0
BACKEND=127.0.0.1:18001
mkdir -p "$WORK"/{backend,nginx}

cat > "$WORK/backend/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $WORK/backend/pid; error_log stderr error;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  server { listen $BACKEND; location / { return 200 "$(printf 'x%.0s' $(seq 1 99))\n"; } } }
CONF
cat > "$WORK/nginx/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $WORK/nginx/pid; error_log stderr error;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  upstream be { server $BACKEND; keepalive 64; }
  server { listen 127.0.0.1:18080; location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF
cat > "$WORK/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4000   # HAProxy refuses to start when maxconn needs more descriptors than the hard limit
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend fe
  bind 127.0.0.1:18081
  default_backend be
backend be
  server s1 $BACKEND
CONF
cat > "$WORK/portico.yaml" <<CONF
workers: 1
log: { level: error }
listeners: [ { name: web, address: 127.0.0.1:18082 } ]
routes: [ { cluster: be } ]
clusters: { be: { endpoints: [ { address: "$BACKEND" } ] } }
CONF
# The same with the access log on (JSON lines to a file), to show what logging costs.
sed -e 's/18082/18083/' "$WORK/portico.yaml" > "$WORK/portico-log.yaml"
echo "access_log: { path: $WORK/access.log, format: json }" >> "$WORK/portico-log.yaml"

taskset -c "$OTHER" nginx -c "$WORK/backend/nginx.conf" -p "$WORK/backend" 2>/dev/null &
taskset -c 0 nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" 2>/dev/null &
taskset -c 0 haproxy -f "$WORK/haproxy.cfg" -db 2>/dev/null &
taskset -c 0 "$ROOT/target/release/portico" run -c "$WORK/portico.yaml" &
taskset -c 0 "$ROOT/target/release/portico" run -c "$WORK/portico-log.yaml" &
sleep 1.5

# PIDs of a proxy's processes (nginx: master and workers).
pids_of() {
  case $1 in
    nginx) pgrep -f "nginx.*$WORK/nginx/nginx.conf" | tr '\n' ' '; pgrep -P "$(cat "$WORK/nginx/pid")" | tr '\n' ' ';;
    haproxy) pgrep -f "haproxy -f $WORK/haproxy.cfg" | tr '\n' ' ';;
    portico) pgrep -f "portico run -c $WORK/portico.yaml" | tr '\n' ' ';;
    portico+log) pgrep -f "portico run -c $WORK/portico-log.yaml" | tr '\n' ' ';;
  esac
}
cpu_ticks() { local t=0; for p in $1; do [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat))); done; echo $t; }
# Upstream connections a proxy holds open to the backend (its pool), from the proxy's side of the sockets.
backend_conns() {
  local n=0
  for p in $1; do n=$((n + $(ss -Htnp state established "( dport = :18001 )" | grep -c "pid=$p," || true))); done
  echo $n
}
TCK=$(getconf CLK_TCK)

declare -A PORT=([nginx]=18080 [haproxy]=18081 [portico]=18082 [portico+log]=18083)
RESULTS="$WORK/results.tsv"
: > "$RESULTS"
for run in $(seq 1 "$RUNS"); do
  for proxy in nginx haproxy portico portico+log; do
    url="http://127.0.0.1:${PORT[$proxy]}/"
    taskset -c "$OTHER" wrk -t1 -c10 -d1s "$url" >/dev/null 2>&1 || true   # warm the pools
    pids=$(pids_of $proxy | tr -s ' ')
    if [ -z "${pids// }" ]; then
      echo "$proxy is not running; skipped" >&2
      continue
    fi
    before=$(cpu_ticks "$pids")
    out=$(taskset -c "$OTHER" wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "$url")
    after=$(cpu_ticks "$pids")
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    p50=$(echo "$out" | awk '$1=="50%" {print $2}')
    p99=$(echo "$out" | awk '$1=="99%" {print $2}')
    errs=$(echo "$out" | awk '/Non-2xx|Socket errors/ {print}' | tr '\n' ' ')
    us=$(awk -v t=$((after - before)) -v hz="$TCK" -v r="$reqs" 'BEGIN {printf "%.2f", t / hz * 1e6 / r}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" "$proxy" "$rps" "$us" "$p50" "$p99" "$(backend_conns "$pids")" "$errs" >> "$RESULTS"
  done
done

echo "| run | proxy | req/s | proxy CPU µs/req | p50 | p99 | upstream conns open | errors |"
echo "|---|---|---|---|---|---|---|---|"
awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8}' "$RESULTS"
echo
python3 - "$RESULTS" <<'PY'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
med = {}
for p in ("nginx", "haproxy", "portico", "portico+log"):
    r = [x for x in rows if x[1] == p]
    if not r:
        continue
    med[p] = (st.median(float(x[2]) for x in r), st.median(float(x[3]) for x in r))
print("| proxy | median req/s | median CPU µs/req |")
print("|---|---|---|")
for p, (rps, us) in med.items():
    print(f"| {p} | {rps:.0f} | {us:.2f} |")
print()
for peer in ("nginx", "haproxy"):
    if peer in med and "portico" in med:
        print(f"Portico / {peer}: CPU per request {med['portico'][1] / med[peer][1]:.2f}x, req/s {med['portico'][0] / med[peer][0]:.2f}x")
if "portico+log" in med:
    print(f"Access log on / off: req/s {med['portico+log'][0] / med['portico'][0]:.2f}x, CPU per request {med['portico+log'][1] / med['portico'][1]:.2f}x")
PY
