#!/usr/bin/env python3
"""JavaScript fetch handlers served by Portico (one worker, `function:` route) beside `deno serve`, Bun and workerd:
the same handler file, the same load, in the same run, each server alone while it is measured.

Scenarios (`--scenarios`, handler files in bench/functions/):
  hello   GET, the handler parses the URL and a query parameter and answers `Response.json` (hello.js)
  parse   POST of a 4 KiB JSON order, the handler parses it and answers a summary (parse.js)
  fetch   GET, the handler fetches a 1.5 KiB product list from a backend (nginx, serving a static file), filters
          and reshapes it (fetch.js); Portico's `fetch("http://api/...")` goes to its cluster `api`, the others
          get the backend's URL from $API

h2load sends a fixed number of HTTP/1.1 requests over --connections keep-alive connections (after 2,000 warm-up
requests). Nothing is pinned unless --pin (the server on CPU 0, h2load and nginx on CPU 1: on a 2-core machine shared
with other work, pinning made Deno's fetch wait for its helper threads behind other processes). Each server is
measured from /proc: CPU per request (user + system of all its threads), requests per second, p50 / p99 latency
(from h2load's per-request log) and RSS after. Medians over --runs, runs interleaved across servers.

    python3 bench/functions.py --portico /path/to/portico --requests 30000 --runs 3
    python3 bench/functions.py --cold-start 10 --idle-memory 1,10,50 --scenarios none
    python3 bench/functions.py --callgrind --requests 2000 --runs 2 --scenarios static,hello,parse,fetch

--callgrind: Portico alone under `valgrind --tool=callgrind`, user-space instructions per request (repeatable
where CPU time is not); --keep-profile DIR keeps each scenario's profile for callgrind_annotate.

--cold-start N: Portico's first request after a reload, N times (the function's file rewritten, SIGHUP, 300 ms, then
the first request timed on a new connection, and the next one as the warm reference), and N times racing the reload
(requests from the SIGHUP on until the new version answers; that one timed).
--idle-memory 1,10,50: Portico started with N distinct functions, each called once: RSS per idle function runtime.

Runtimes: Deno from the PATH or target/test-tools (`bash .ci/install-test-deps`); Bun and workerd from the PATH or
target/bench-tools, where this script installs them from the npm registry when they are missing (`npm install bun
workerd`: their platform packages, @oven/bun-linux-x64 and @cloudflare/workerd-linux-64, carry the binaries).
A runtime that cannot be found or installed is left out of the tables, with a message.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (/proc readings, wait_port)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANDLERS = os.path.join(ROOT, "bench", "functions")
TOOLS = os.path.join(ROOT, "target", "bench-tools")


def free_port():
    """A port nothing listens on now (other benchmarks may share this machine: fixed ports have collided)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORTS = {name: free_port() for name in ("portico", "deno", "bun", "workerd")}
BACKEND_PORT, COLD_PORT, MEM_PORT = free_port(), free_port(), free_port()
SCENARIOS = {
    "static": dict(file="static.js", path="/static", static=True,
                   desc="GET, a fixed text (Portico: a `static:` route, no JavaScript): the HTTP path alone"),
    "hello": dict(file="hello.js", path="/hello?name=bench", desc="GET, `Response.json` from the URL's query"),
    "parse": dict(file="parse.js", path="/order", post=True, desc="POST of a 4 KiB JSON body, parsed and summed"),
    "fetch": dict(file="fetch.js", path="/products", backend=True,
                  desc="GET, fetch of a 1.5 KiB JSON list from nginx, filtered and reshaped"),
}
CPU_SERVER, CPU_LOAD = "0", "1"
# Under callgrind the function's top-level code runs some 50 times slower than its default 1 s allows.
STARTUP = ""


# ---------------------------------------------------------------------------------------------------- runtimes
def find_tool(name, dirs):
    for d in dirs:
        path = os.path.join(d, "node_modules", ".bin", name)
        if os.path.exists(path):
            return path
    return shutil.which(name)


def runtimes(wanted):
    found = {}
    if "deno" in wanted:
        found["deno"] = find_tool("deno", [os.path.join(ROOT, "target", "test-tools"), TOOLS])
    for name in ("bun", "workerd"):
        if name not in wanted:
            continue
        path = find_tool(name, [TOOLS])
        if not path and shutil.which("npm"):
            run.log(f"installing {name} (npm) into {TOOLS}")
            os.makedirs(TOOLS, exist_ok=True)
            subprocess.run(["npm", "install", "--silent", "--prefix", TOOLS, name], stdout=subprocess.DEVNULL)
            path = find_tool(name, [TOOLS])
        found[name] = path
    for name, path in list(found.items()):
        if not path:
            run.log(f"{name}: not found, left out")
            del found[name]
    return found


def version(name, path):
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
    return out.splitlines()[0] if out else "?"


# ------------------------------------------------------------------------------------------------ fixtures
def order_body():
    """A JSON order of 4 KiB (4,096 bytes exactly, padded in the note)."""
    lines = [{"sku": f"SKU-{i:05d}", "name": f"Article number {i}", "price": round(3.5 + i * 1.25, 2),
              "quantity": 1 + i % 4, "tags": ["bench", "edge"]} for i in range(30)]
    order = {"id": "ord-20261125-0001", "customer": {"name": "Ada Lovelace", "email": "ada@example.com"},
             "lines": lines, "note": ""}
    order["note"] = "x" * (4096 - len(json.dumps(order, separators=(",", ":"))))
    body = json.dumps(order, separators=(",", ":"))
    assert len(body) == 4096, len(body)
    return body


def products():
    return json.dumps({"products": [
        {"id": i, "name": f"product {i}", "price": round(9.99 + i * 0.5, 2), "stock": (i * 7) % 5,
         "description": "a product"} for i in range(20)]}, separators=(",", ":"))


def start_backend(work, pin):
    """nginx, one process, serving products.json with long keep-alive."""
    www = os.path.join(work, "www")
    os.makedirs(www, exist_ok=True)
    with open(os.path.join(www, "products.json"), "w") as f:
        f.write(products())
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off; master_process off; worker_processes 1; pid {work}/nginx.pid;
error_log {work}/nginx-error.log error;
events {{ worker_connections 4096; }}
http {{
  access_log off; keepalive_requests 1000000; keepalive_timeout 300s;
  types {{ application/json json; }}
  server {{ listen 127.0.0.1:{BACKEND_PORT}; root {www}; }}
}}
""")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    cmd = [nginx, "-p", work, "-c", conf]
    proc = subprocess.Popen(["taskset", "-c", CPU_LOAD, *cmd] if pin else cmd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run.wait_port(BACKEND_PORT)
    return proc


# ---------------------------------------------------------------------------------------------- servers
def portico_config(work, scenario, handler):
    conf = os.path.join(work, f"portico-{scenario}.yaml")
    target = ('static: { body: "hello\\n", headers: { content-type: text/plain } }'
              if SCENARIOS[scenario].get("static") else "function: bench")
    with open(conf, "w") as f:
        f.write(f"""workers: 1
log: {{ level: error }}
listeners: [ {{ name: web, address: "127.0.0.1:{PORTS['portico']}" }} ]
functions:
  bench: {{ source: "{handler}", env: {{ GREETING: Hello, API: "http://api" }}{STARTUP} }}
routes:
  - {{ {target} }}
clusters:
  api: {{ endpoints: [ {{ address: "127.0.0.1:{BACKEND_PORT}" }} ] }}
""")
    return conf


def workerd_config(work, scenario, handler):
    """A capnp config next to a copy of the handler (workerd embeds modules relative to the config)."""
    d = os.path.join(work, f"workerd-{scenario}")
    os.makedirs(d, exist_ok=True)
    shutil.copy(handler, os.path.join(d, "worker.js"))
    conf = os.path.join(d, "config.capnp")
    with open(conf, "w") as f:
        f.write(f"""using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .worker),
    (name = "internet", network = (allow = ["public", "private", "local"])),
  ],
  sockets = [ (name = "http", address = "127.0.0.1:{PORTS['workerd']}", http = (), service = "main") ],
);
const worker :Workerd.Worker = (
  modules = [ (name = "worker.js", esModule = embed "worker.js") ],
  compatibilityDate = "2025-01-01",
  bindings = [ (name = "GREETING", text = "Hello"), (name = "API", text = "http://127.0.0.1:{BACKEND_PORT}") ],
);
""")
    return conf


def server_command(name, tools, a, work, scenario):
    handler = os.path.join(HANDLERS, SCENARIOS[scenario]["file"])
    port = PORTS[name]
    if name == "portico":
        return [a.portico, "run", "-c", portico_config(work, scenario, handler)]
    if name == "deno":  # one thread serving (no --parallel)
        return [tools["deno"], "serve", "--quiet", "--host", "127.0.0.1", "--port", str(port), "--allow-net",
                "--allow-env=API", handler]
    if name == "bun":  # `bun run` of a file whose default export has fetch: Bun.serve on $BUN_PORT, one JS thread
        return [tools["bun"], "run", handler]
    if name == "workerd":  # `workerd serve`: one process, one thread serving
        return [tools["workerd"], "serve", workerd_config(work, scenario, handler)]
    raise ValueError(name)


def start_server(name, tools, a, work, scenario):
    cmd = server_command(name, tools, a, work, scenario)
    if a.pin:
        cmd = ["taskset", "-c", CPU_SERVER, *cmd]
    env = {**os.environ, "DENO_DIR": os.path.join(work, "deno"), "BUN_PORT": str(PORTS[name]),
           "API": f"http://127.0.0.1:{BACKEND_PORT}", "NO_COLOR": "1"}
    errlog = open(os.path.join(work, f"{name}-{scenario}.err"), "ab")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errlog, env=env)
    try:
        run.wait_port(PORTS[name], timeout=30)
    except RuntimeError:
        proc.kill()
        raise
    return proc


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------------------------- load
def load(a, work, port, scenario, requests, conns):
    sc = SCENARIOS[scenario]
    log_path = os.path.join(work, "h2load.log")
    if os.path.exists(log_path):
        os.remove(log_path)  # h2load appends
    args = ["h2load", "--h1", "-n", str(requests), "-c", str(conns), "-m", "1", "--log-file", log_path]
    if sc.get("post"):
        args += ["-d", os.path.join(work, "order.json"), "-H", "content-type: application/json"]
    args.append(f"http://127.0.0.1:{port}{sc['path']}")
    if a.pin:
        args = ["taskset", "-c", CPU_LOAD, *args]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600).stdout
    ok = re.search(r"requests: .* (\d+) succeeded", out)
    status = re.search(r"status codes: (\d+) 2xx", out)
    if not ok or int(ok.group(1)) != requests or not status or int(status.group(1)) != requests:
        raise RuntimeError(f"h2load: not every request answered 2xx:\n{out}")
    finished = re.search(r"finished in ([\d.]+)(ms|s)", out)
    seconds = float(finished.group(1)) / (1000 if finished.group(2) == "ms" else 1)
    lat = []
    with open(log_path) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 3:
                lat.append(int(fields[2]) / 1000.0)
    lat.sort()
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
    return seconds, pct(0.50), pct(0.99)


def check_answer(port, scenario, work):
    """One request by hand: the handler answers what it should on this runtime (the same JSON everywhere)."""
    sc = SCENARIOS[scenario]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = open(os.path.join(work, "order.json"), "rb").read() if sc.get("post") else None
    conn.request("POST" if body else "GET", sc["path"], body=body, headers={"content-type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"{scenario}: {resp.status} {data[:300]!r}")
    return data.decode() if sc.get("static") else json.loads(data)


def measure(a, work, proc, port, scenario):
    pids = run.Bench.tree_pids(proc.pid)
    load(a, work, port, scenario, 2000, a.connections)  # warm-up: runtimes made, JITs warm, pools filled
    pids = run.Bench.tree_pids(proc.pid)
    user0, sys0 = run.Bench.cpu_ticks(pids)
    seconds, p50, p99 = load(a, work, port, scenario, a.requests, a.connections)
    user1, sys1 = run.Bench.cpu_ticks(pids)
    tick = os.sysconf("SC_CLK_TCK")
    cpu_us = ((user1 - user0) + (sys1 - sys0)) / tick / a.requests * 1e6
    user_us = (user1 - user0) / tick / a.requests * 1e6
    threads = sum(len(os.listdir(f"/proc/{p}/task")) for p in pids if os.path.exists(f"/proc/{p}/task"))
    return {"rps": a.requests / seconds, "cpu_us": cpu_us, "user_us": user_us, "p50_ms": p50, "p99_ms": p99,
            "rss_mib": run.Bench.rss_kib(pids) / 1024, "threads": threads}


# ------------------------------------------------------------------------------------------- callgrind
def callgrind_total(out):
    """The instructions of the last dump of `out` (callgrind_control -d writes OUT.1, OUT.2, ...)."""
    d, base = os.path.dirname(out), os.path.basename(out)
    dumps = sorted((f for f in os.listdir(d) if f.startswith(base + ".")), key=lambda f: int(f.rsplit(".", 1)[1]))
    with open(os.path.join(d, dumps[-1])) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {dumps[-1]}")


def callgrind(a, work, scenario, run_number):
    """User-space instructions per request of Portico (one worker) under callgrind: warmed up with 300 requests,
    counters zeroed, --requests requests over 4 connections, dumped; the dump's total divided by the requests.
    Repeatable to well under 1% where CPU time on a shared machine swings 5-20%."""
    handler = os.path.join(HANDLERS, SCENARIOS[scenario]["file"])
    out = os.path.join(work, f"callgrind-{scenario}-{run_number}.out")
    # (Instrumented only once it serves: start-up under full instrumentation is some 50 times slower.)
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", a.portico, "run",
           "-c", portico_config(work, scenario, handler)]
    errors = os.path.join(work, f"callgrind-{scenario}.err")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(errors, "w"))
    try:
        try:
            run.wait_port(PORTS["portico"], timeout=120)
        except RuntimeError:
            raise SystemExit("portico under callgrind did not start:\n" + open(errors).read()[-3000:])
        check_answer(PORTS["portico"], scenario, work)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        load(a, work, PORTS["portico"], scenario, 300, 4)
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        try:
            load(a, work, PORTS["portico"], scenario, a.requests, 4)
        except RuntimeError as e:
            raise SystemExit(f"{e}\nportico's log (the last lines):\n" + open(errors).read()[-3000:])
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        return callgrind_total(out) / a.requests, out
    finally:
        stop(proc)


# ------------------------------------------------------------------------------------ cold start, memory
def timed_get(port, path):
    """(milliseconds from connect to the whole response, parsed JSON body), on a new connection."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    data = resp.read()
    ms = (time.perf_counter() - t0) * 1000
    conn.close()
    return ms, (json.loads(data) if resp.status == 200 else {"status": resp.status})


def cold_start(a, work, times):
    """Portico, one worker, the hello handler with a version number in its answer, N times each way:
    settled: rewrite the file, SIGHUP, wait 300 ms (the reload done: the file compiled, the configuration swapped),
      then time the first request (a new connection): it runs on a runtime the worker makes for the new version;
      the request after it, timed the same way, is the warm reference;
    racing: rewrite, SIGHUP, then requests at once every 2 ms until the new version answers: that one is timed."""
    src = open(os.path.join(HANDLERS, "hello.js")).read()
    handler = os.path.join(work, "cold.js")

    def write(v):
        with open(handler, "w") as f:
            f.write(src.replace("path: url.pathname", f"path: url.pathname, version: {v}"))

    write(0)
    conf = os.path.join(work, "portico-cold.yaml")
    with open(conf, "w") as f:
        f.write(f"""workers: 1
log: {{ level: error }}
listeners: [ {{ name: web, address: "127.0.0.1:{COLD_PORT}" }} ]
functions:
  hello: {{ source: "{handler}", env: {{ GREETING: Hello }} }}
routes:
  - {{ function: hello }}
""")
    cmd = [a.portico, "run", "-c", conf]
    proc = subprocess.Popen(["taskset", "-c", CPU_SERVER, *cmd] if a.pin else cmd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = {"settled": [], "warm": [], "racing": [], "polls": []}
    try:
        run.wait_port(COLD_PORT)
        for _ in range(50):
            timed_get(COLD_PORT, "/hello?name=cold")
        v = 0
        for _ in range(times):
            v += 1
            write(v)
            os.kill(proc.pid, signal.SIGHUP)
            time.sleep(0.3)
            ms, body = timed_get(COLD_PORT, "/hello?name=cold")
            if body.get("version") != v:
                raise RuntimeError(f"version {v} not answering 300 ms after the reload: {body}")
            out["settled"].append(ms)
            out["warm"].append(timed_get(COLD_PORT, "/hello?name=warm")[0])
            time.sleep(0.1)
        for _ in range(times):
            v += 1
            write(v)
            os.kill(proc.pid, signal.SIGHUP)
            deadline, n = time.time() + 10, 0
            while True:
                ms, body = timed_get(COLD_PORT, "/hello?name=cold")
                n += 1
                if body.get("version") == v:
                    out["racing"].append(ms)
                    out["polls"].append(n)
                    break
                if time.time() > deadline:
                    raise RuntimeError(f"version {v} never answered: {body}")
                time.sleep(0.002)
            time.sleep(0.3)
    finally:
        stop(proc)
    return out


def idle_memory(a, work, counts):
    """Portico started with N distinct functions (a copy of hello.js each, its own runtime once called)."""
    src = open(os.path.join(HANDLERS, "hello.js")).read()
    out = []
    for n in counts:
        d = os.path.join(work, f"mem-{n}")
        os.makedirs(d, exist_ok=True)
        funcs, routes = [], []
        for i in range(n):
            with open(os.path.join(d, f"f{i}.js"), "w") as f:
                f.write(f"// function {i}\n{src}")
            funcs.append(f'  f{i}: {{ source: "{d}/f{i}.js", env: {{ GREETING: Hello }} }}')
            routes.append(f"  - {{ match: {{ path_prefix: /f{i}/ }}, function: f{i} }}")
        conf = os.path.join(d, "portico.yaml")
        with open(conf, "w") as f:
            f.write(f"workers: 1\nlog: {{ level: error }}\n"
                    f'listeners: [ {{ name: web, address: "127.0.0.1:{MEM_PORT}" }} ]\n'
                    "functions:\n" + "\n".join(funcs) + "\nroutes:\n" + "\n".join(routes) + "\n")
        proc = subprocess.Popen([a.portico, "run", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            run.wait_port(MEM_PORT)
            time.sleep(0.5)
            pids = run.Bench.tree_pids(proc.pid)
            before = run.Bench.rss_kib(pids)
            for i in range(n):
                ms, body = timed_get(MEM_PORT, f"/f{i}/x")
                if "message" not in body:
                    raise RuntimeError(f"f{i}: {body}")
            time.sleep(0.5)
            after = run.Bench.rss_kib(pids)
        finally:
            stop(proc)
        out.append((n, before, after))
        run.log(f"idle memory: {n} functions: RSS {before} KiB before the calls, {after} KiB after")
    return out


def idle_memory_workerd(workerd, work, counts):
    """The same for workerd: N workers (an isolate each) in one process, one socket each, each called once."""
    src = open(os.path.join(HANDLERS, "hello.js")).read()
    out = []
    for n in counts:
        d = os.path.join(work, f"wmem-{n}")
        os.makedirs(d, exist_ok=True)
        ports = [free_port() for _ in range(n)]
        services, sockets, workers = [], [], []
        for i in range(n):
            with open(os.path.join(d, f"f{i}.js"), "w") as f:
                f.write(f"// function {i}\n{src}")
            services.append(f'(name = "f{i}", worker = .w{i})')
            sockets.append(f'(name = "s{i}", address = "127.0.0.1:{ports[i]}", http = (), service = "f{i}")')
            workers.append(f'const w{i} :Workerd.Worker = (modules = [ (name = "f{i}.js", esModule = embed "f{i}.js") ], '
                           f'compatibilityDate = "2025-01-01", bindings = [ (name = "GREETING", text = "Hello") ]);')
        conf = os.path.join(d, "config.capnp")
        with open(conf, "w") as f:
            f.write('using Workerd = import "/workerd/workerd.capnp";\nconst config :Workerd.Config = (\n'
                    f'  services = [ {", ".join(services)} ],\n  sockets = [ {", ".join(sockets)} ],\n);\n'
                    + "\n".join(workers) + "\n")
        proc = subprocess.Popen([workerd, "serve", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for port in ports:
                run.wait_port(port, timeout=30)
            time.sleep(0.5)
            pids = run.Bench.tree_pids(proc.pid)
            before = run.Bench.rss_kib(pids)
            for i in range(n):
                ms, body = timed_get(ports[i], f"/f{i}/x")
                if "message" not in body:
                    raise RuntimeError(f"workerd f{i}: {body}")
            time.sleep(0.5)
            after = run.Bench.rss_kib(pids)
        finally:
            stop(proc)
        out.append((n, before, after))
        run.log(f"workerd idle memory: {n} workers: RSS {before} KiB before the calls, {after} KiB after")
    return out


# ---------------------------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=30000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--scenarios", default="hello,parse,fetch", help="comma-separated, or `none`")
    ap.add_argument("--servers", default="portico,deno,bun,workerd")
    ap.add_argument("--portico", default=os.path.join(ROOT, "target", "release", "portico"))
    ap.add_argument("--pin", action="store_true", help="pin the server to CPU 0, h2load and nginx to CPU 1")
    ap.add_argument("--cold-start", type=int, default=0, metavar="N", help="Portico: N reloads, first request timed")
    ap.add_argument("--idle-memory", default="", metavar="N,N,...", help="Portico: RSS with N functions called once")
    ap.add_argument("--json", help="write the raw numbers here")
    ap.add_argument("--callgrind", action="store_true",
                    help="Portico only: user-space instructions per request under callgrind (--requests of them, "
                         "e.g. 2000), --runs times; the last run's profile is kept in --keep-profile")
    ap.add_argument("--keep-profile", metavar="DIR", help="with --callgrind: copy each scenario's last dump here")
    a = ap.parse_args()
    if not shutil.which("h2load"):
        raise SystemExit("needs h2load (apt-get install nghttp2-client)")
    if (os.cpu_count() or 1) < 2:
        a.pin = False
    scenarios = [] if a.scenarios == "none" else a.scenarios.split(",")
    wanted = a.servers.split(",")
    tools = runtimes([w for w in wanted if w != "portico"]) if scenarios or a.idle_memory else {}
    servers = [s for s in wanted if s == "portico" or s in tools]
    work = tempfile.mkdtemp(prefix="portico-fn-bench-")
    os.chmod(work, 0o755)  # nginx may read as another user
    with open(os.path.join(work, "order.json"), "w") as f:
        f.write(order_body())
    raw = {"versions": {n: version(n, p) for n, p in tools.items()}, "results": {}, "cold": None, "memory": None,
           "memory_workerd": None}
    results = {(sc, s): [] for sc in scenarios for s in servers}
    backend = start_backend(work, a.pin) if any(SCENARIOS[s].get("backend") for s in scenarios) else None
    if a.callgrind:
        global STARTUP
        STARTUP = ", limits: { startup: 120s }"
        try:
            print("| scenario | instructions per request (each run) | median |\n|---|---|---|")
            for sc in scenarios:
                counts = []
                for r in range(a.runs):
                    n, out = callgrind(a, work, sc, r)
                    counts.append(n)
                    if a.keep_profile and r == a.runs - 1:
                        os.makedirs(a.keep_profile, exist_ok=True)
                        last = max((f for f in os.listdir(work) if f.startswith(os.path.basename(out) + ".")),
                                   key=lambda f: int(f.rsplit(".", 1)[1]))
                        shutil.copy(os.path.join(work, last), os.path.join(a.keep_profile, f"callgrind-{sc}.out"))
                print(f"| {sc} | {', '.join(f'{c:,.0f}' for c in counts)} | {statistics.median(counts):,.0f} |",
                      flush=True)
        finally:
            if backend:
                stop(backend)
            shutil.rmtree(work, ignore_errors=True)
        return
    try:
        for r in range(a.runs if scenarios else 0):
            for sc in scenarios:
                answers = {}
                for name in servers:
                    proc = start_server(name, tools, a, work, sc)
                    try:
                        answers[name] = check_answer(PORTS[name], sc, work)
                        m = measure(a, work, proc, PORTS[name], sc)
                        run.log(f"run {r + 1} {sc} {name}: {m['rps']:.0f} req/s, {m['cpu_us']:.1f} µs CPU per "
                                f"request, p50 {m['p50_ms']:.2f} ms, p99 {m['p99_ms']:.2f} ms, "
                                f"{m['rss_mib']:.1f} MiB, {m['threads']} threads")
                        results[(sc, name)].append(m)
                    finally:
                        stop(proc)
                if r == 0 and len({json.dumps(v, sort_keys=True) for v in answers.values()}) > 1:
                    run.log(f"{sc}: the runtimes answered differently: {answers}")
        if a.cold_start:
            raw["cold"] = cold_start(a, work, a.cold_start)
        if a.idle_memory:
            counts = [int(n) for n in a.idle_memory.split(",")]
            raw["memory"] = idle_memory(a, work, counts)
            if "workerd" in tools:
                raw["memory_workerd"] = idle_memory_workerd(tools["workerd"], work, counts)
    finally:
        if backend:
            stop(backend)
        shutil.rmtree(work, ignore_errors=True)

    med = lambda sc, s, key: statistics.median(m[key] for m in results[(sc, s)])  # noqa: E731
    if tools:
        print("versions: " + ", ".join(f"{n} {v}" for n, v in raw["versions"].items()) + "\n")
    for sc in scenarios:
        print(f"### {sc}: {SCENARIOS[sc]['desc']}\n")
        print(f"{a.requests} requests over {a.connections} keep-alive connections, medians of {a.runs} runs "
              f"(min-max of req/s and CPU)\n")
        print("| server | req/s | CPU µs per request (user) | p50 ms | p99 ms | RSS MiB | threads |")
        print("|---|---|---|---|---|---|---|")
        for s in servers:
            rs = [m["rps"] for m in results[(sc, s)]]
            cs = [m["cpu_us"] for m in results[(sc, s)]]
            print(f"| {s} | {med(sc, s, 'rps'):.0f} ({min(rs):.0f}-{max(rs):.0f}) | {med(sc, s, 'cpu_us'):.1f} "
                  f"({med(sc, s, 'user_us'):.1f}) ({min(cs):.1f}-{max(cs):.1f}) | {med(sc, s, 'p50_ms'):.2f} | "
                  f"{med(sc, s, 'p99_ms'):.2f} | {med(sc, s, 'rss_mib'):.1f} | {med(sc, s, 'threads'):.0f} |")
        if "portico" in servers and "deno" in servers:
            print(f"\nPortico / Deno: req/s {med(sc, 'portico', 'rps') / med(sc, 'deno', 'rps'):.2f}x, CPU per "
                  f"request {med(sc, 'portico', 'cpu_us') / med(sc, 'deno', 'cpu_us'):.2f}x, p99 "
                  f"{med(sc, 'portico', 'p99_ms') / med(sc, 'deno', 'p99_ms'):.2f}x")
        print()
    if raw["cold"]:
        c = raw["cold"]
        print(f"### Portico cold start: first request after a reload, {len(c['settled'])} reloads each way\n")
        print("| request (each on a new connection) | median ms | min ms | max ms |\n|---|---|---|---|")
        for key, what in (("settled", "first after the reload, 300 ms after SIGHUP"),
                          ("warm", "the next one (warm reference)"),
                          ("racing", "first answered by the new version, polling from the SIGHUP on")):
            print(f"| {what} | {statistics.median(c[key]):.2f} | {min(c[key]):.2f} | {max(c[key]):.2f} |")
        print(f"\ncold - warm: {statistics.median(c['settled']) - statistics.median(c['warm']):.2f} ms; "
              f"polls until the new version answered: median {statistics.median(c['polls'])}\n")
    for key, who, unit in (("memory", "Portico", "functions"), ("memory_workerd", "workerd", "workers")):
        if not raw[key]:
            continue
        print(f"### {who}: RSS per idle function runtime (each of N {unit} called once)\n")
        print(f"| {unit} | RSS before the calls MiB | RSS after MiB | (after - before) / N KiB |")
        print("|---|---|---|---|")
        for n, before, after in raw[key]:
            print(f"| {n} | {before / 1024:.1f} | {after / 1024:.1f} | {(after - before) / n:.0f} |")
        (n0, b0, a0), (n1, b1, a1) = raw[key][0], raw[key][-1]
        if n1 > n0:
            print(f"\nslope from {n0} to {n1}: {(a1 - a0) / (n1 - n0):.0f} KiB per {unit[:-1]} called once "
                  f"(of which {(b1 - b0) / (n1 - n0):.0f} KiB before any call)\n")
    if a.json:
        raw["results"] = {f"{sc}/{s}": v for (sc, s), v in results.items()}
        with open(a.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
