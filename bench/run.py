#!/usr/bin/env python3
"""Portico's benchmark harness: Portico, nginx and HAProxy as reverse proxies in the same run, on the same nginx
backends, with the same worker count, pinned apart from the load generator.

    python3 bench/run.py --quick            # under two minutes: small responses, saturating and at a fixed rate
    python3 bench/run.py                    # every scenario, 3 runs per cell
    python3 bench/run.py --scenarios small,post4k --runs 5 --duration 10 --json out.json

Reports per scenario and proxy: proxy CPU microseconds per request (utime+stime of the proxy's processes from
/proc, divided by the requests completed, split into user and system), requests per second, p50/p99/max latency
(wrk; h2load at a fixed rate for rate15k), upstream connections
opened (the backend's accepted-connection counter), resident memory; then Portico/nginx and Portico/HAProxy ratios.
Medians of the runs, with the spread. Writes a markdown table to stdout and, with --json, the raw numbers.

Standard library only; installs nginx, haproxy and wrk with apt-get when they are missing.
"""

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where `cargo build --release` below puts it: $CARGO_TARGET_DIR when set.
PORTICO = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "portico")
# The filters of `portico+filters`: `headers`, `rewrite` and `cors` on the route, each doing its work on every request
# (the CORS filter answers for an Origin the load generator does not send, so it adds `Vary` and checks).
FILTERS = """, match: { path_prefix: / }, filters: [
    { headers: { request: { set: { x-api-version: "2" }, add: { x-tag: a }, remove: [cookie] },
                 response: { set: { cache-control: no-store }, remove: [server] } } },
    { rewrite: { replace_prefix: / } },
    { cors: { allow_origins: ["https://app.example.com"], allow_methods: [GET, POST], allow_credentials: true } } ]"""

PROXY_PORTS = {"portico": 18182, "nginx": 18180, "haproxy": 18181, "portico+log": 18183, "portico+pipe": 18184,
               "baseline": 18185, "baseline+pipe": 18186, "portico+mp": 18187, "portico+filters": 18188}
BACKEND_BASE_PORT = 19000
STATUS_PORT = 18999
CLK_TCK = os.sysconf("SC_CLK_TCK")

# name: (path, wrk extra args, endpoints, connections, description)
SCENARIOS = {
    "small": dict(path="/small", conns=50, endpoints=2, desc="100 B response, keep-alive, 50 connections"),
    "small-1c": dict(path="/small", conns=1, endpoints=2, desc="100 B response, keep-alive, 1 connection"),
    "small-500c": dict(path="/small", conns=500, endpoints=2, desc="100 B response, keep-alive, 500 connections"),
    "16k": dict(path="/16k.bin", conns=50, endpoints=2, desc="16 KiB response, keep-alive"),
    "1m": dict(path="/1m.bin", conns=10, endpoints=2, desc="1 MiB response, keep-alive, 10 connections"),
    "post4k": dict(path="/post", conns=50, endpoints=2, post=4096, desc="POST 4 KiB body, keep-alive"),
    "newconn": dict(path="/small", conns=50, endpoints=2, close=True, desc="new client connection per request"),
    "ep100": dict(path="/small", conns=50, endpoints=100, desc="100 upstream endpoints"),
    "ep1000": dict(path="/small", conns=50, endpoints=1000, v6_half=True, desc="1,000 endpoints, half on [::1]"),
    # Fixed offered load (h2load --rps): every proxy does the same work per second, so CPU per request compares
    # without the throughput differences of a saturating run, and the latency is that of a proxy not at its
    # limit. Latency is measured per request from h2load's log.
    "rate15k": dict(path="/small", conns=50, endpoints=2, rate=15000,
                    desc="100 B response, 15,000 req/s offered over 50 connections (h2load)"),
    # Clients that pipeline (HTTP/1.1, 8 requests in flight per connection, h2load -m 8): what
    # pool.pipeline_depth batches since 2026-11-24 (only one client's own requests share an upstream write).
    "pipelined": dict(path="/small", conns=50, streams=8, endpoints=2,
                      desc="100 B response, 50 connections each pipelining 8 requests (h2load)"),
    # TLS terminated by the proxy (ECDSA P-256 certificate, TLS 1.3), plain HTTP/1.1 to the backends.
    "tls": dict(path="/small", conns=50, endpoints=2, tls=True, desc="100 B response over TLS, keep-alive"),
    "tls-newconn": dict(path="/small", conns=50, endpoints=2, tls=True, close=True,
                        desc="a new TLS connection (full handshake) per request"),
    # HTTP/2 from the client over TLS (ALPN h2): 10 connections with 10 concurrent streams each (h2load).
    "h2": dict(path="/small", conns=10, streams=10, endpoints=2, tls=True, h2=True,
               desc="100 B response over HTTP/2 + TLS, 10 connections x 10 streams (h2load)"),
    # A 64 KiB JSON answer gzip-compressed by the proxy at level 5 for clients sending Accept-Encoding: gzip:
    # nginx `gzip on` (gzip_comp_level 5), Portico's `compress` (level 5, gzip only), HAProxy's `compression
    # algo gzip` (libslz: its own fixed level, faster and larger).
    "gzip64k": dict(path="/64k.json", conns=50, endpoints=2, gzip=5,
                    desc="64 KiB JSON response gzip-compressed by the proxy (level 5), keep-alive"),
}
QUICK = ["small", "rate15k"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ensure_tools():
    missing = [pkg for tool, pkg in (("nginx", "nginx-light"), ("haproxy", "haproxy"), ("wrk", "wrk"),
                                                ("h2load", "nghttp2-client"), ("openssl", "openssl"))
               if not (shutil.which(tool) or os.path.exists(f"/usr/sbin/{tool}"))]
    if missing:
        log(f"installing {' '.join(missing)}")
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, stdout=subprocess.DEVNULL)
    os.environ["PATH"] += ":/usr/sbin"
    subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)


def raise_fd_limit(want=65536):
    """10,000 idle connections need more descriptors than the usual 20,000 (HAProxy reserves two per
    connection): as root, raise the limit for this process and the proxies it starts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (want, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, max(target, hard)))
            return target
        except (ValueError, OSError):
            continue
    return soft


def cpus():
    n = os.cpu_count() or 1
    return ("0", f"1-{n - 1}") if n > 1 else ("0", "0")


def wait_port(port, host="127.0.0.1", timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port}")


class Bench:
    def __init__(self, workers, duration, runs, pipeline_depth=16):
        self.pipeline_depth = pipeline_depth
        self.workers = workers
        self.duration = duration
        self.runs = runs
        self.work = tempfile.mkdtemp(prefix="portico-bench-")
        # nginx workers run as an unprivileged user: they must be able to read the files served.
        os.chmod(self.work, 0o755)
        self.procs = []
        self.proxy_cpu, self.load_cpu = cpus()
        self.fd_limit = raise_fd_limit()
        # HAProxy refuses to start when maxconn needs more descriptors than the limit (about two each).
        self.haproxy_maxconn = max(1000, min(12000, self.fd_limit // 2 - 1000))
        self.idle_connections = min(10000, self.haproxy_maxconn - 500, self.fd_limit // 2 - 500)
        # When set, every proxy gets this client connection limit (bench/burst.py --limit).
        self.connection_limit = None
        www = os.path.join(self.work, "www")
        os.makedirs(www)
        with open(os.path.join(www, "small"), "w") as f:
            f.write("x" * 99 + "\n")
        for name, size in (("16k.bin", 16 << 10), ("1m.bin", 1 << 20)):
            with open(os.path.join(www, name), "wb") as f:
                f.write(os.urandom(size))
        with open(os.path.join(www, "64k.json"), "wb") as f:
            f.write(json_document(64 << 10))
        for name in os.listdir(www):
            os.chmod(os.path.join(www, name), 0o644)
        os.chmod(www, 0o755)
        # A throw-away certificate for the TLS scenarios, shared by every proxy.
        self.cert, self.key = os.path.join(self.work, "cert.pem"), os.path.join(self.work, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", self.key, "-out", self.cert, "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
        self.combined = os.path.join(self.work, "combined.pem")  # HAProxy wants both in one file
        with open(self.combined, "w") as f:
            f.write(open(self.cert).read() + open(self.key).read())
        for path in (self.cert, self.key, self.combined):
            os.chmod(path, 0o644)
        with open(os.path.join(self.work, "post.lua"), "w") as f:
            f.write('wrk.method = "POST"\nwrk.body = string.rep("p", 4096)\n'
                    'wrk.headers["Content-Type"] = "application/octet-stream"\n')

    def spawn(self, args, cpu):
        p = subprocess.Popen(["taskset", "-c", cpu, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        self.procs = []

    # -- backends: one nginx, listening on every endpoint port, with a status page counting accepted connections
    def endpoints(self, count, v6_half):
        out = []
        for i in range(count):
            host = "[::1]" if v6_half and i % 2 else "127.0.0.1"
            out.append(f"{host}:{BACKEND_BASE_PORT + i}")
        return out

    def start_backend(self, endpoints):
        d = os.path.join(self.work, "backend")
        os.makedirs(d, exist_ok=True)
        listens = "\n".join(f"    listen {e} reuseport backlog=4096;" for e in endpoints)
        conf = f"""
worker_processes 1; daemon off; pid {d}/pid; error_log stderr error;
worker_rlimit_nofile 20000;
events {{ worker_connections 16000; }}
http {{ access_log off; keepalive_requests 10000000; keepalive_timeout 300s;
  server {{
{listens}
    root {self.work}/www;
    location = /post {{ return 200 "ok\\n"; }}
    location = /64k.json {{ default_type application/json; }}
    # Reads the whole request body before answering, as an application does (`return` answers first).
    location = /upload {{ proxy_pass http://127.0.0.1:{STATUS_PORT}/ok; }}
  }}
  server {{ listen 127.0.0.1:{STATUS_PORT}; location / {{ stub_status; }} location = /ok {{ return 200 "ok\\n"; }} }}
}}"""
        path = os.path.join(d, "nginx.conf")
        with open(path, "w") as f:
            f.write(conf)
        self.spawn(["nginx", "-c", path, "-p", d], self.load_cpu)
        wait_port(STATUS_PORT)

    def backend_accepts(self):
        text = urllib.request.urlopen(f"http://127.0.0.1:{STATUS_PORT}/", timeout=5).read().decode()
        # "server accepts handled requests\n N N N"
        return int(text.splitlines()[2].split()[0]) - 1  # minus this status request's own connection

    # -- proxies
    def start_proxy(self, name, endpoints, tls=False, stock=False, gzip=0):
        """Starts proxy `name` in front of `endpoints`. `stock`: Portico with its default limits (no raised
        circuit breaker or connection limit), as a user runs it. `gzip`: the proxy gzip-compresses JSON answers
        at this level."""
        port = PROXY_PORTS[name]
        d = os.path.join(self.work, name)
        os.makedirs(d, exist_ok=True)
        if name.startswith(("portico", "baseline")):
            eps = "\n".join(f'      - address: "{e}"' for e in endpoints)
            conf = f"""workers: {self.workers}
{"process_model: multi_process" if name == "portico+mp" else ""}
log: {{ level: error }}
admin: {{ address: "127.0.0.1:{port + 100}" }}
listeners: [ {{ name: web, address: "127.0.0.1:{port}"{"" if stock and not self.connection_limit else f", limits: {{ max_connections: {self.connection_limit or self.fd_limit} }}"}{f', tls: {{ certificates: [ {{ cert: "{self.cert}", key: "{self.key}" }} ] }}' if tls else ""} }} ]
routes: [ {{ cluster: be{FILTERS if name == "portico+filters" else ""}{f", filters: [ {{ compress: {{ encodings: [gzip], level: {gzip} }} }} ]" if gzip else ""} }} ]
{f'access_log: {{ path: "{d}/access.log", format: json }}' if name == "portico+log" else ""}
clusters:
  be:
{"" if stock else "    circuit_breaker: { max_connections: 100000, max_pending: 100000, max_requests: 100000 }"}
{f"    pool: {{ pipeline_depth: {self.pipeline_depth} }}" if name.endswith("+pipe") else ""}
    endpoints:
{eps}
"""
            path = os.path.join(d, "portico.yaml")
            binary = os.environ.get("PORTICO_BASELINE", "") if name.startswith("baseline") else PORTICO
            if not binary:
                raise SystemExit("the baseline proxy needs PORTICO_BASELINE=/path/to/an/older/portico")
            args = [binary, "run", "-c", path]
        elif name == "nginx":
            servers = "\n".join(f"    server {e};" for e in endpoints)
            conf = f"""worker_processes {self.workers}; daemon off; pid {d}/pid; error_log stderr error;
worker_rlimit_nofile {self.fd_limit};
events {{ worker_connections {self.connection_limit or self.fd_limit // 2}; }}
http {{ access_log off; keepalive_requests 10000000; keepalive_timeout 300s;
  {f"gzip on; gzip_comp_level {gzip}; gzip_types application/json; gzip_proxied any; gzip_min_length 1024; gzip_vary on;" if gzip else ""}
  upstream be {{
{servers}
    keepalive 64;
  }}
  server {{ listen 127.0.0.1:{port} reuseport backlog=4096{" ssl http2" if tls else ""};
    {f"ssl_certificate {self.cert}; ssl_certificate_key {self.key}; ssl_session_cache shared:tls:10m;" if tls else ""}
    location / {{ proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; }} }}
}}"""
            path = os.path.join(d, "nginx.conf")
            args = ["nginx", "-c", path, "-p", d]
        else:
            servers = "\n".join(f"  server s{i} {e}" for i, e in enumerate(endpoints))
            conf = f"""global
  nbthread {self.workers}
  maxconn {self.connection_limit or self.haproxy_maxconn}
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend fe
  bind 127.0.0.1:{port}{f" ssl crt {self.combined} alpn h2,http/1.1" if tls else ""}
  default_backend be
backend be
  balance roundrobin
{"  compression algo gzip" + chr(10) + "  compression type application/json" if gzip else ""}
{servers}
"""
            path = os.path.join(d, "haproxy.cfg")
            args = ["haproxy", "-f", path, "-db"]
        with open(path, "w") as f:
            f.write(conf)
        proc = self.spawn(args, self.proxy_cpu)
        wait_port(port)
        return proc

    @staticmethod
    def tree_pids(root_pid):
        pids, frontier = [], [root_pid]
        while frontier:
            pid = frontier.pop()
            pids.append(pid)
            try:
                children = open(f"/proc/{pid}/task/{pid}/children").read().split()
            except OSError:
                children = []
            frontier.extend(int(c) for c in children)
        return pids

    @staticmethod
    def cpu_ticks(pids):
        """(user, system) clock ticks of these processes, all their threads included."""
        user = system = 0
        for pid in pids:
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                user += int(fields[11])
                system += int(fields[12])
            except OSError:
                pass
        return user, system

    @staticmethod
    def rss_kib(pids):
        total = 0
        for pid in pids:
            try:
                m = re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{pid}/status").read())
                total += int(m.group(1)) if m else 0
            except OSError:
                pass
        return total

    def wrk(self, url, scenario, duration):
        args = ["wrk", "-t", "1", "-c", str(scenario["conns"]), "-d", f"{duration}s", "--latency"]
        if scenario.get("post"):
            args += ["-s", os.path.join(self.work, "post.lua")]
        if scenario.get("close"):
            args += ["-H", "Connection: close"]
        if scenario.get("gzip"):
            args += ["-H", "Accept-Encoding: gzip"]
        out = subprocess.run(["taskset", "-c", self.load_cpu, *args, url], capture_output=True, text=True,
                             timeout=duration + 30).stdout
        def lat(label):
            m = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
            if not m:
                return None
            return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
        requests = int(re.search(r"(\d+) requests in", out).group(1))
        errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        sock = re.search(r"Socket errors: (.*)", out)
        max_m = re.search(r"Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out)
        max_ms = float(max_m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[max_m.group(2)] if max_m else None
        return dict(requests=requests, p50=lat("50%"), p99=lat("99%"), max=max_ms,
                    non2xx=int(errors.group(1)) if errors else 0, socket_errors=sock.group(1) if sock else "")

    @staticmethod
    def pipeline_counters(name):
        """(pipelined requests, pipeline writes) from a Portico's metrics; None for other proxies."""
        if not name.startswith(("portico", "baseline")):
            return None
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{PROXY_PORTS[name] + 100}/metrics", timeout=5).read()
        except OSError:
            return None
        def total(metric):
            return sum(float(l.rsplit(" ", 1)[1]) for l in text.decode().splitlines() if l.startswith(metric + "{"))
        return total("portico_upstream_pipelined_requests_total"), total("portico_upstream_pipeline_writes_total")

    def h2load(self, url, scenario, duration):
        """HTTP/1.1 at a fixed request rate (`rate` requests per second over `conns` connections) or pipelining
        `streams` requests per connection, or HTTP/2 with `streams` concurrent streams per connection; latencies
        from the per-request log."""
        log_path = os.path.join(self.work, "h2load.log")
        if os.path.exists(log_path):
            os.remove(log_path)  # h2load appends
        args = ["h2load", "-c", str(scenario["conns"]), "-D", str(duration), "--log-file", log_path]
        if scenario.get("h2"):
            args += ["-m", str(scenario.get("streams", 1))]
        else:
            args.append("--h1")
            if scenario.get("rate"):
                args += ["--rps", str(max(1, scenario["rate"] // scenario["conns"]))]
            if scenario.get("streams"):
                args += ["-m", str(scenario["streams"])]  # HTTP/1.1: requests pipelined per connection
        args.append(url)
        out = subprocess.run(["taskset", "-c", self.load_cpu, *args], capture_output=True, text=True,
                             timeout=duration + 30).stdout
        latencies, non2xx = [], 0
        with open(log_path) as f:
            for line in f:
                fields = line.split()
                if len(fields) == 3:
                    latencies.append(int(fields[2]) / 1000.0)
                    non2xx += not fields[1].startswith("2")
        latencies.sort()
        def pct(q):
            return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None
        failed = re.search(r"(\d+) failed, (\d+) errored, (\d+) timeout", out)
        return dict(requests=len(latencies), p50=pct(0.5), p99=pct(0.99), max=latencies[-1] if latencies else None,
                    non2xx=non2xx, socket_errors=failed.group(0) if failed and failed.group(0) != "0 failed, 0 errored, 0 timeout" else "")

    def run_cell(self, name, proxy_proc, scenario):
        scheme = "https" if scenario.get("tls") else "http"
        url = f"{scheme}://127.0.0.1:{PROXY_PORTS[name]}{scenario['path']}"
        self.wrk(url, dict(scenario, conns=min(scenario["conns"], 10)), 1)  # warm pools
        pids = self.tree_pids(proxy_proc.pid)
        accepts0 = self.backend_accepts()
        batches0 = self.pipeline_counters(name)
        cpu0 = self.cpu_ticks(pids)
        started = time.time()
        use_h2load = scenario.get("rate") or scenario.get("h2") or scenario.get("streams")
        result = (self.h2load if use_h2load else self.wrk)(url, scenario, self.duration)
        elapsed = time.time() - started
        cpu1 = self.cpu_ticks(pids)
        batches1 = self.pipeline_counters(name)
        if batches0 and batches1 and batches1[1] > batches0[1]:
            result["batch"] = (batches1[0] - batches0[0]) / (batches1[1] - batches0[1])
        per_request = 1e6 / CLK_TCK / max(result["requests"], 1)
        user, system = (cpu1[0] - cpu0[0]) * per_request, (cpu1[1] - cpu0[1]) * per_request
        result.update(
            rps=result["requests"] / elapsed,
            cpu_us=user + system,
            cpu_user_us=user,
            cpu_sys_us=system,
            upstream_opened=self.backend_accepts() - accepts0,
            rss_kib=self.rss_kib(pids),
        )
        return result

    def idle_memory(self, name, proxy_proc):
        """RSS with `idle_connections` idle keep-alive client connections open (each has served one request);
        None when the proxy did not serve them all."""
        port = PROXY_PORTS[name]
        socks = []
        count = self.idle_connections
        try:
            # One request at a time, each connection kept open afterwards: the cost of idle connections, not of
            # a burst of concurrent requests.
            for _ in range(count):
                s = socket.create_connection(("127.0.0.1", port))
                s.settimeout(10)
                s.sendall(b"GET /small HTTP/1.1\r\nHost: b\r\n\r\n")
                got = b""
                while len(got) < 100:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    got += chunk
                socks.append(s)
            time.sleep(2)
            return self.rss_kib(self.tree_pids(proxy_proc.pid))
        except OSError as e:
            log(f"  idle connections on {name}: {e}")
            return None
        finally:
            for s in socks:
                s.close()


def json_document(size):
    """`size` bytes of JSON like an API's list answer: records with ids, names, flags and timestamps (bench/instructions.py's
    too)."""
    out, i, length = ["["], 0, 1
    while True:
        item = (f'{{"id":{i},"name":"user {i * 7919 % 10007}","email":"user{i * 31 % 997}@example.com",'
                f'"active":{str(i % 3 != 0).lower()},"score":{i * 37 % 1000 / 10},"created":"2026-11-{1 + i % 28:02d}T'
                f'{i % 24:02d}:{i * 7 % 60:02d}:00Z"}}')
        if length + len(item) + 2 > size:
            break
        out.append(("," if i else "") + item)
        length += len(item) + (1 if i else 0)
        i += 1
    out.append("]")
    text = "".join(out)
    return (text + " " * (size - len(text))).encode()


def median_spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one scenario, 3 short runs: under two minutes")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated: " + ", ".join(SCENARIOS))
    ap.add_argument("--proxies", default="nginx,haproxy,portico",
                    help="any of nginx, haproxy, portico, portico+log (Portico with the JSON access log on), "
                         "portico+filters (the route with headers, rewrite and cors filters), "
                         "portico+pipe (with pool.pipeline_depth, --pipeline-depth), portico+mp (process_model: multi_process), baseline and baseline+pipe (the same with the binary "
                         "in $PORTICO_BASELINE, for A/B runs of a change)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=int, default=8, help="seconds per run")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--pipeline-depth", type=int, default=16, help="pool.pipeline_depth of the +pipe variants")
    ap.add_argument("--idle-memory", action="store_true", help="also measure RSS with 10,000 idle connections")
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args()
    scenarios = QUICK if args.quick else [s for s in args.scenarios.split(",") if s]
    if args.quick:
        args.runs, args.duration = 3, 4
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    proxies = args.proxies.split(",")

    ensure_tools()
    bench = Bench(args.workers, args.duration, args.runs, args.pipeline_depth)
    results = {}
    try:
        for sc_name in scenarios:
            sc = SCENARIOS[sc_name]
            eps = bench.endpoints(sc["endpoints"], sc.get("v6_half", False))
            bench.start_backend(eps)
            running = {p: bench.start_proxy(p, eps, tls=sc.get("tls", False), gzip=sc.get("gzip", 0)) for p in proxies}
            log(f"scenario {sc_name}: {sc['desc']}")
            cells = {p: [] for p in proxies}
            for run in range(args.runs):
                for p in proxies:  # interleaved, so drift in machine load hits every proxy alike
                    r = bench.run_cell(p, running[p], sc)
                    cells[p].append(r)
                    log(f"  run {run + 1} {p}: {r['rps']:.0f} req/s, {r['cpu_us']:.2f} CPU us/req "
                        f"({r['cpu_user_us']:.2f} user + {r['cpu_sys_us']:.2f} sys), "
                        f"p99 {r['p99']} ms, upstream conns opened {r['upstream_opened']}"
                        + (f", {r['batch']:.2f} requests per pipelined write" if r.get("batch") else ""))
            if args.idle_memory and sc_name == scenarios[0]:
                for p in proxies:
                    cells[p][0]["idle10k_rss_kib"] = bench.idle_memory(p, running[p])
            results[sc_name] = cells
            bench.stop_all()
            time.sleep(0.5)
    finally:
        bench.stop_all()
        shutil.rmtree(bench.work, ignore_errors=True)

    print(f"# Results: {args.workers} worker(s) per proxy, {args.runs} runs of {args.duration}s per cell\n")
    print("| scenario | proxy | req/s (median, min-max) | CPU µs/req | user + sys | p50 ms | p99 ms | max ms | upstream conns opened | RSS MiB | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for sc_name, cells in results.items():
        med = {}
        for p, runs in cells.items():
            rps = median_spread([r["rps"] for r in runs])
            cpu = median_spread([r["cpu_us"] for r in runs])
            user = median_spread([r["cpu_user_us"] for r in runs])[0]
            system = median_spread([r["cpu_sys_us"] for r in runs])[0]
            p50 = median_spread([r["p50"] for r in runs])[0]
            p99 = median_spread([r["p99"] for r in runs])[0]
            mx = median_spread([r["max"] for r in runs])[0]
            opened = median_spread([r["upstream_opened"] for r in runs])[0]
            rss = median_spread([r["rss_kib"] for r in runs])[0]
            errs = sum(r["non2xx"] for r in runs)
            sock = "; ".join(r["socket_errors"] for r in runs if r["socket_errors"])
            med[p] = (rps[0], cpu[0], p99)
            print(f"| {sc_name} | {p} | {rps[0]:.0f} ({rps[1]:.0f}-{rps[2]:.0f}) | {cpu[0]:.2f} ({cpu[1]:.2f}-{cpu[2]:.2f}) "
                  f"| {user:.1f} + {system:.1f} | {p50:.2f} | {p99:.2f} | {mx:.1f} | {opened:.0f} | {rss / 1024:.1f} | {errs} {sock} |")
        for ours in [p for p in med if p.startswith(("portico", "baseline"))]:
            for peer in ("nginx", "haproxy"):
                if peer in med:
                    ratios.append((sc_name, f"{ours} / {peer}", med[ours][1] / med[peer][1],
                                   med[ours][0] / med[peer][0], med[ours][2] / med[peer][2] if med[peer][2] else None))
        if "portico" in med and "portico+filters" in med:
            on, off = med["portico+filters"], med["portico"]
            ratios.append((sc_name, "filters on / off", on[1] / off[1], on[0] / off[0],
                           on[2] / off[2] if off[2] else None))
        if "portico" in med and "portico+log" in med:
            log_on, log_off = med["portico+log"], med["portico"]
            ratios.append((sc_name, "access log on / off", log_on[1] / log_off[1], log_on[0] / log_off[0],
                           log_on[2] / log_off[2] if log_off[2] else None))
    print("\n| scenario | ratio | CPU per request | req/s | p99 |")
    print("|---|---|---|---|---|")
    for sc_name, peer, cpu, rps, p99 in ratios:
        print(f"| {sc_name} | {peer} | {cpu:.2f}x | {rps:.2f}x | {p99:.2f}x |" if p99 else
              f"| {sc_name} | {peer} | {cpu:.2f}x | {rps:.2f}x | - |")
    idle = {p: cells[p][0].get("idle10k_rss_kib") for cells in results.values() for p in cells
            if cells[p][0].get("idle10k_rss_kib")}
    if idle:
        print(f"\n| proxy | RSS with {bench.idle_connections:,} idle keep-alive connections |")
        print("|---|---|")
        for p, kib in idle.items():
            print(f"| {p} | {kib / 1024:.1f} MiB |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workers": args.workers, "runs": args.runs, "duration": args.duration, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
