#!/usr/bin/env python3
"""User-space instructions per request, counted with callgrind: repeatable to well under 1%, where the CPU time
that bench/run.py measures swings 5-20% on these shared machines.

Each binary (`--binary NAME=PATH`, several allowed) runs under `valgrind --tool=callgrind` with one worker in
front of one nginx backend (100 B responses), and h2load sends a fixed number of requests over 8 keep-alive
connections: HTTP/1.1 (`--protocol h1`) or HTTP/2 by prior knowledge (`--protocol h2`). It is run twice, with
N1 and N2 requests; (instructions(N2) - instructions(N1)) / (N2 - N1) is the cost of one request without the
start-up and shutdown. Extra YAML for the route (`--route-extra`) measures a route's filters; `--pipeline-depth N`
sets the cluster's `pool.pipeline_depth`, and `--pipelined M` has each HTTP/1.1 connection pipeline M requests
(h2load `-m`; with `--protocol h2`, M concurrent streams). `--body-size N` POSTs N bytes with every request
(with Content-Length; past 64 KiB Portico's request buffering and nginx's `client_body_buffer_size` write it
to a temporary file). `--peers nginx,haproxy` counts the peers set up the
same way (one worker, upstream keep-alive), in the same run. `--admin` gives Portico its admin address (the
dashboard's sampler then runs, once a second), and `--sse-clients N` keeps N dashboard pages' live updates
(`/admin/events`) open and read for the whole run: what open dashboards cost per request.

`--gateway jwt` puts a `jwt` filter on the route (ES256: a key and tokens made with PyJWT from
target/test-tools/venv, `.ci/install-test-deps` installs it; issuer, audience, `exp` and the subject forwarded
upstream) and HAProxy does the same with `jwt_verify` and `jwt_payload_query` (nginx OSS has no JWT module):
every request carries the same token, unless `--distinct-tokens` (HTTP/1.1 only), where a Python client sends
each request with a token of its own, so nothing can be remembered. `--gateway rate_limit` puts a `rate_limit`
per client address on the route (a limit never reached), nginx's `limit_req` and HAProxy's stick table
`http_req_rate` beside it; `--gateway rate_limit-noheaders` the same without the RateLimit fields.
Compression: `--json-response N` has the backend answer N bytes of JSON (`application/json`, with its length)
instead of 100 B, `--accept-encoding VALUE` sends that `Accept-Encoding` with every request, and `--gzip-level L`
turns nginx's `gzip` on at level L for JSON (`gzip_proxied any`, the same 1 KiB minimum as Portico's
`compress`); Portico's filter comes with `--route-extra`.

    python3 bench/instructions.py --protocol h1 --binary before=/tmp/portico-before --binary after=target/release/portico
    python3 bench/instructions.py --protocol h2 --binary portico=target/release/portico --peers nginx,haproxy
    python3 bench/instructions.py --protocol h1 --pipeline-depth 16 --pipelined 8 --binary after=target/release/portico
    python3 bench/instructions.py --protocol h1 --admin --sse-clients 10 --binary portico=target/release/portico
    python3 bench/instructions.py --protocol h1 --gateway jwt --binary portico=target/release/portico --peers haproxy
    python3 bench/instructions.py --protocol h1 --gateway jwt --distinct-tokens --binary portico=target/release/portico --peers haproxy
    python3 bench/instructions.py --protocol h1 --gateway rate_limit --binary portico=target/release/portico --peers nginx,haproxy
    python3 bench/instructions.py --protocol h1 --requests 100,600 --json-response 65536 --accept-encoding gzip \
        --gzip-level 5 --peers nginx --binary portico=target/release/portico \
        --route-extra '    filters: [ { compress: { encodings: [gzip], level: 5 } } ]'
"""
import argparse
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from run import json_document  # (bench/ is on the path when a script of it runs)

# Ports: --port-base (or PORTICO_BENCH_PORT_BASE) moves them all, for two runs on one machine: the backend, the
# proxy on the next one, a second backend on the one after, the admin address after that.
BACKEND_PORT = int(os.environ.get("PORTICO_BENCH_PORT_BASE", "18280"))
PROXY_PORT = BACKEND_PORT + 1
ADMIN_PORT = BACKEND_PORT + 3
ADMIN = False
SSE_CLIENTS = 0


def wait_port(port, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def start_backend(work):
    # With request bodies, nginx's `return` would answer before reading the body (and read it after): a
    # real upstream reads it first. So bodies go through a second nginx server, whose proxying reads them whole.
    answer = f'return 200 "{"x" * 100}";'
    if JSON_RESPONSE:
        answer = f"root {work}; default_type application/json; try_files /response.json =404;"
    reads_body = f"proxy_pass http://127.0.0.1:{BACKEND_PORT + 2};" if BODY else answer
    conf = f"""worker_processes 1; daemon off; pid {work}/nginx.pid; error_log stderr error;
events {{ worker_connections 1024; }}
http {{ access_log off; keepalive_requests 10000000; client_max_body_size 0; client_body_buffer_size 1m;
  server {{ listen 127.0.0.1:{BACKEND_PORT}; location / {{ {reads_body} }} }}
  server {{ listen 127.0.0.1:{BACKEND_PORT + 2}; location / {{ {answer} }} }} }}
"""
    with open(f"{work}/nginx.conf", "w") as f:
        f.write(conf)
    proc = subprocess.Popen(["nginx", "-c", f"{work}/nginx.conf"], stderr=subprocess.DEVNULL)
    wait_port(BACKEND_PORT)
    return proc


BODY = None  # with --body-size: the file h2load POSTs with every request
HEADERS = []  # with --gateway jwt: the header every request carries
TOKENS = None  # with --distinct-tokens: a token per request


def load_distinct(requests):
    """Sends `requests` GETs over 8 keep-alive HTTP/1.1 connections, in turn, each with a token of its own."""
    conns = [http.client.HTTPConnection("127.0.0.1", PROXY_PORT, timeout=60) for _ in range(8)]
    for i in range(requests):
        conn = conns[i % 8]
        conn.request("GET", "/small", headers={"authorization": f"Bearer {TOKENS[i % len(TOKENS)]}"})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise SystemExit(f"request {i} answered {resp.status}")
    for conn in conns:
        conn.close()
JSON_RESPONSE = False  # with --json-response: the backend answers response.json
ACCEPT_ENCODING = None  # with --accept-encoding: sent with every request
GZIP_LEVEL = 0  # with --gzip-level: nginx compresses JSON at this level


def load(requests, protocol, pipelined=1):
    """Sends `requests` requests through the proxy with h2load over 8 keep-alive connections, `pipelined` in
    flight on each (POSTs of BODY when set)."""
    if not requests:
        return
    if TOKENS:
        return load_distinct(requests)
    args = ["h2load", "-n", str(requests), "-c", "8", "-m", str(pipelined)]
    for header in HEADERS:
        args += ["-H", header]
    if BODY:
        args += ["-d", BODY]
    if ACCEPT_ENCODING:
        args += ["-H", f"accept-encoding: {ACCEPT_ENCODING}"]
    if protocol == "h1":
        args.append("--h1")
    args.append(f"http://127.0.0.1:{PROXY_PORT}/small")
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    ok = re.search(r"requests: .* (\d+) succeeded", done.stdout)
    if not ok or int(ok.group(1)) != requests:
        raise SystemExit(f"h2load did not complete every request:\n{done.stdout}")


class LivePages:
    """`n` dashboard pages' live updates: connections to /admin/events, read until stopped. Returns the updates
    (server-sent events) they received."""

    def __init__(self, n):
        import threading
        self.stop = threading.Event()
        self.events = [0] * n
        self.threads = [threading.Thread(target=self.follow, args=(i,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def follow(self, i):
        s = socket.create_connection(("127.0.0.1", ADMIN_PORT), timeout=60)
        s.sendall(b"GET /admin/events HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n")
        s.settimeout(0.5)
        while not self.stop.is_set():
            try:
                data = s.recv(65536)
            except socket.timeout:
                continue
            if not data:
                break
            self.events[i] += data.count(b"data: ")
        s.close()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        return sum(self.events)


def count(binary, requests, protocol, route_extra, work, pipeline_depth=0, pipelined=1):
    """Total instructions (Ir) of a Portico run that served `requests` requests."""
    pool = f", pool: {{ pipeline_depth: {pipeline_depth} }}" if pipeline_depth else ""
    admin = f'admin: {{ address: "127.0.0.1:{ADMIN_PORT}" }}\n' if ADMIN else ""
    conf = f"""workers: 1
{admin}log: {{ level: error }}
listeners: [ {{ name: web, address: "127.0.0.1:{PROXY_PORT}" }} ]
routes:
  - cluster: be
{route_extra}
clusters:
  be: {{ endpoints: [ {{ address: "127.0.0.1:{BACKEND_PORT}" }} ]{pool} }}
"""
    path = f"{work}/portico.yaml"
    with open(path, "w") as f:
        f.write(conf)
    out = f"{work}/callgrind.out"
    if os.path.exists(out):
        os.remove(out)
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary, "run", "-c", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pages = None
    try:
        wait_port(PROXY_PORT)
        if ADMIN:
            wait_port(ADMIN_PORT)
        if SSE_CLIENTS:
            pages = LivePages(SSE_CLIENTS)
            time.sleep(3)  # the pages are following before the load starts
        started = time.time()
        load(requests, protocol, pipelined)
        if pages:
            took = time.time() - started
            print(f"  ({requests} requests in {took:.1f} s under callgrind; {SSE_CLIENTS} pages got "
                  f"{pages.finish()} updates in all)", file=sys.stderr)
    finally:
        if pages:
            pages.finish()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise SystemExit("no totals in the callgrind output")


GATEWAY = None  # --gateway: jwt, rate_limit or rate_limit-noheaders


def gateway_route(work):
    """The route's filters for Portico under --gateway."""
    if GATEWAY == "jwt":
        return f"""    filters:
      - jwt:
          keys: [ {{ algorithm: ES256, public_key_file: "{work}/es256.pub" }} ]
          issuer: https://idp.example
          audience: orders
          forward_claims: {{ sub: x-user-id }}"""
    if GATEWAY in ("rate_limit", "rate_limit-noheaders"):
        headers = "false" if GATEWAY.endswith("noheaders") else "true"
        return f"""    filters:
      - rate_limit: {{ rate: 1000000/s, burst: 1000000, headers: {headers} }}"""
    return ""


def peer_gateway(peer, work):
    """What a peer does for --gateway: (nginx http-level lines, nginx location lines, HAProxy frontend lines)."""
    if GATEWAY == "jwt" and peer == "haproxy":
        return "", "", f"""  http-request set-var(txn.bearer) http_auth_bearer
  http-request set-var(txn.jwt_alg) var(txn.bearer),jwt_header_query('$.alg')
  http-request deny deny_status 401 unless {{ var(txn.jwt_alg) -m str ES256 }}
  http-request deny deny_status 401 unless {{ var(txn.bearer),jwt_payload_query('$.iss') -m str https://idp.example }}
  http-request deny deny_status 401 unless {{ var(txn.bearer),jwt_payload_query('$.aud') -m str orders }}
  http-request set-var(txn.now) date()
  http-request deny deny_status 401 unless {{ var(txn.bearer),jwt_payload_query('$.exp','int'),sub(txn.now) -m int gt 0 }}
  http-request deny deny_status 401 unless {{ var(txn.bearer),jwt_verify(txn.jwt_alg,"{work}/es256.pub") -m int 1 }}
  http-request set-header x-user-id %[var(txn.bearer),jwt_payload_query('$.sub')]
"""
    if GATEWAY == "jwt":
        raise SystemExit(f"{peer} has no JWT verification here (nginx OSS has no auth_jwt): use --peers haproxy")
    if GATEWAY and GATEWAY.startswith("rate_limit"):
        return ("limit_req_zone $binary_remote_addr zone=perip:16m rate=1000000r/s;",
                "limit_req zone=perip burst=1000000 nodelay;",
                """  stick-table type ip size 1m expire 60s store http_req_rate(1s)
  http-request track-sc0 src
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1000000 }
""")
    return "", "", ""


def make_tokens(work, distinct):
    """An ES256 key (es256.pub in `work`) and tokens signed with PyJWT: one, or `distinct` different ones."""
    python = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../target/test-tools/venv/bin/python")
    script = f"""
import jwt, time, sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
k = ec.generate_private_key(ec.SECP256R1())
open("{work}/es256.pub", "wb").write(k.public_key().public_bytes(serialization.Encoding.PEM,
    serialization.PublicFormat.SubjectPublicKeyInfo))
exp = int(time.time()) + 86400
for i in range({max(distinct, 1)}):
    print(jwt.encode({{"iss": "https://idp.example", "aud": "orders", "sub": f"user-{{i}}", "exp": exp, "jti": str(i)}},
                     k, algorithm="ES256", headers={{"kid": "k1"}}))
"""
    done = subprocess.run([python, "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"PyJWT is needed in target/test-tools/venv (bash .ci/install-test-deps):\n{done.stderr}")
    return done.stdout.split()


def peer_command(peer, protocol, work):
    """The command line of a peer proxy (`nginx` or `haproxy`) set up as Portico is: one worker, the same
    backend, upstream keep-alive, HTTP/2 by prior knowledge for `--protocol h2`; and the signal that stops it
    gracefully (so that callgrind writes its totals)."""
    http_extra, location_extra, frontend_extra = peer_gateway(peer, work)
    if peer == "nginx":
        h2 = " http2" if protocol == "h2" else ""
        gzip = (f"gzip on; gzip_comp_level {GZIP_LEVEL}; gzip_types application/json; gzip_proxied any; "
                f"gzip_min_length 1024; gzip_vary on;" if GZIP_LEVEL else "")
        conf = f"""worker_processes 1; daemon off; master_process off; pid {work}/peer.pid; error_log stderr error;
events {{ worker_connections 1024; }}
http {{ access_log off; keepalive_requests 10000000; {http_extra} {gzip}
  upstream be {{ server 127.0.0.1:{BACKEND_PORT}; keepalive 64; }}
  server {{ listen 127.0.0.1:{PROXY_PORT}{h2};
    location / {{ {location_extra} proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; }} }} }}
"""
        with open(f"{work}/peer-nginx.conf", "w") as f:
            f.write(conf)
        return ["nginx", "-c", f"{work}/peer-nginx.conf"], signal.SIGQUIT
    if peer == "haproxy":
        h2 = " proto h2" if protocol == "h2" else ""
        conf = f"""global
  nbthread 1
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend fe
  bind 127.0.0.1:{PROXY_PORT}{h2}
{frontend_extra}  default_backend be
backend be
  http-reuse always
  server s1 127.0.0.1:{BACKEND_PORT}
"""
        with open(f"{work}/peer-haproxy.cfg", "w") as f:
            f.write(conf)
        return ["haproxy", "-db", "-f", f"{work}/peer-haproxy.cfg"], signal.SIGUSR1
    raise SystemExit(f"unknown peer {peer} (nginx or haproxy)")


def count_peer(peer, requests, protocol, work):
    """Total instructions (Ir) of a peer's run that served `requests` requests."""
    command, stop = peer_command(peer, protocol, work)
    out = f"{work}/callgrind-{peer}.out"
    if os.path.exists(out):
        os.remove(out)
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + command,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(PROXY_PORT)
        load(requests, protocol)
    finally:
        proc.send_signal(stop)
        proc.wait(timeout=120)
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise SystemExit(f"no totals in {peer}'s callgrind output")


def main():
    global GATEWAY, HEADERS, TOKENS, BACKEND_PORT, PROXY_PORT, ADMIN_PORT, BODY, JSON_RESPONSE, ACCEPT_ENCODING, \
        GZIP_LEVEL, ADMIN, SSE_CLIENTS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", action="append", default=[], help="NAME=PATH of a portico binary")
    ap.add_argument("--peers", default="", help="peers measured the same way, comma-separated: nginx,haproxy")
    ap.add_argument("--protocol", choices=["h1", "h2"], default="h1")
    ap.add_argument("--requests", default="2000,12000", help="N1,N2")
    ap.add_argument("--body-size", type=int, default=0, help="POST a body of this many bytes with every request")
    ap.add_argument("--route-extra", default="", help="YAML lines added under the route (indented 4 spaces)")
    ap.add_argument("--pipeline-depth", type=int, default=0, help="the cluster's pool.pipeline_depth (0: unset)")
    ap.add_argument("--port-base", type=int, default=BACKEND_PORT,
                    help="the backend's port; the proxy listens on the next one, a second backend on the one after")
    ap.add_argument("--gateway", choices=["jwt", "rate_limit", "rate_limit-noheaders"],
                    help="an API gateway filter on the route, and the peers' equivalent")
    ap.add_argument("--distinct-tokens", action="store_true",
                    help="with --gateway jwt: a token of its own for every request (HTTP/1.1, a Python client)")
    ap.add_argument("--json-response", type=int, default=0, help="the backend answers this many bytes of JSON")
    ap.add_argument("--accept-encoding", default="", help="the Accept-Encoding every request sends")
    ap.add_argument("--gzip-level", type=int, default=0, help="nginx's gzip_comp_level (0: gzip off)")
    ap.add_argument("--pipelined", type=int, default=1,
                    help="requests each connection pipelines (h2load -m; HTTP/2: concurrent streams)")
    ap.add_argument("--admin", action="store_true", help="give Portico an admin address (the dashboard's sampler runs)")
    ap.add_argument("--sse-clients", type=int, default=0,
                    help="dashboard pages following /admin/events during the run (implies --admin)")
    a = ap.parse_args()
    SSE_CLIENTS = a.sse_clients
    ADMIN = a.admin or a.sse_clients > 0
    for tool in ("valgrind", "nginx", "h2load") + (("haproxy",) if "haproxy" in a.peers else ()):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed (apt-get install valgrind nginx nghttp2-client haproxy)")
    n1, n2 = (int(x) for x in a.requests.split(","))
    work = tempfile.mkdtemp(prefix="portico-instr-")
    if a.body_size:
        BODY = f"{work}/body"
        with open(BODY, "wb") as f:
            f.write(b"b" * a.body_size)
    BACKEND_PORT, PROXY_PORT, ADMIN_PORT = a.port_base, a.port_base + 1, a.port_base + 3
    GATEWAY = a.gateway
    if a.gateway == "jwt":
        if a.distinct_tokens and a.protocol != "h1":
            raise SystemExit("--distinct-tokens sends HTTP/1.1 only")
        tokens = make_tokens(work, n2 if a.distinct_tokens else 1)
        if a.distinct_tokens:
            TOKENS = tokens
        else:
            HEADERS = [f"authorization: Bearer {tokens[0]}"]
    route_extra = "\n".join(filter(None, [a.route_extra, gateway_route(work)]))
    ACCEPT_ENCODING, GZIP_LEVEL = a.accept_encoding or None, a.gzip_level
    if a.json_response:
        JSON_RESPONSE = True
        with open(f"{work}/response.json", "wb") as f:
            f.write(json_document(a.json_response))
        # nginx's workers run unprivileged: they must be able to read it.
        os.chmod(work, 0o755)
        os.chmod(f"{work}/response.json", 0o644)
    backend = start_backend(work)
    try:
        gateway = f", {a.gateway}" + (" with a token per request" if a.distinct_tokens else "") if a.gateway else ""
        print(f"| binary | protocol | instructions per request ({n1} and {n2} requests, 8 connections, "
              f"{a.pipelined} in flight on each, pipeline_depth {a.pipeline_depth}"
              f"{', admin address' if ADMIN else ''}{f', {SSE_CLIENTS} live dashboard pages' if SSE_CLIENTS else ''}"
              f"{f', POSTs of {a.body_size} bytes' if a.body_size else ''}{gateway}) |")
        print("|---|---|---|")
        for spec in a.binary:
            name, path = spec.split("=", 1)
            low = count(path, n1, a.protocol, route_extra, work, a.pipeline_depth, a.pipelined)
            high = count(path, n2, a.protocol, route_extra, work, a.pipeline_depth, a.pipelined)
            print(f"| {name} | {a.protocol} | {(high - low) / (n2 - n1):,.0f} |", flush=True)
        for peer in filter(None, a.peers.split(",")):
            low = count_peer(peer, n1, a.protocol, work)
            high = count_peer(peer, n2, a.protocol, work)
            print(f"| {peer} | {a.protocol} | {(high - low) / (n2 - n1):,.0f} |", flush=True)
    finally:
        backend.send_signal(signal.SIGQUIT)
        backend.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
