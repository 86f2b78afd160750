#!/usr/bin/env python3
"""A JavaScript fetch handler served by Portico (one worker, `function:` route) beside `deno serve` (its default:
one thread serving), the same handler file, the same load, in the same run.

The handler parses the URL, reads a query parameter and answers a small JSON body (bench/functions/hello.js).
h2load sends a fixed number of HTTP/1.1 requests over 16 keep-alive connections; each server is measured from
/proc: CPU per request (user + system of all its threads), requests per second, p50 / p99 latency (h2load's
per-request times) and RSS after. Medians over --runs.

    python3 bench/functions.py --requests 50000 --runs 3

Deno comes from the PATH or from target/test-tools (`bash .ci/install-test-deps` puts it there).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (/proc readings)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANDLER = os.path.join(ROOT, "bench", "functions", "hello.js")
PORTICO_PORT, DENO_PORT = 18701, 18702


def deno_binary():
    local = os.path.join(ROOT, "target", "test-tools", "node_modules", ".bin", "deno")
    return local if os.path.exists(local) else shutil.which("deno")


def load(port, requests):
    out = subprocess.run(["h2load", "--h1", "-n", str(requests), "-c", "16", "-m", "1",
                          f"http://127.0.0.1:{port}/hello?name=bench"], capture_output=True, text=True, timeout=600)
    ok = re.search(r"requests: .* (\d+) succeeded", out.stdout)
    if not ok or int(ok.group(1)) != requests:
        raise SystemExit(f"h2load did not complete every request:\n{out.stdout}")
    finished = re.search(r"finished in ([\d.]+)(ms|s)", out.stdout)
    seconds = float(finished.group(1)) / (1000 if finished.group(2) == "ms" else 1)
    # "time for request:  min  max  mean  sd  +/- sd": h2load gives no percentiles; mean and max instead.
    times = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out.stdout)
    to_ms = lambda t: float(t[:-2]) / 1000 if t.endswith("us") else float(t[:-2]) if t.endswith("ms") else float(t[:-1]) * 1000  # noqa: E731
    return seconds, to_ms(times.group(3)), to_ms(times.group(2))


def measure(proc, port, requests):
    pids = run.Bench.tree_pids(proc.pid)
    load(port, 2000)  # warm-up (runtimes made, JIT-free engines still fill caches)
    user0, sys0 = run.Bench.cpu_ticks(pids)
    seconds, mean_ms, max_ms = load(port, requests)
    user1, sys1 = run.Bench.cpu_ticks(pids)
    tick = os.sysconf("SC_CLK_TCK")
    cpu_us = ((user1 - user0) + (sys1 - sys0)) / tick / requests * 1e6
    user_us = (user1 - user0) / tick / requests * 1e6
    return {"rps": requests / seconds, "cpu_us": cpu_us, "user_us": user_us, "mean_ms": mean_ms,
            "max_ms": max_ms, "rss_mib": run.Bench.rss_kib(pids) / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=50000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--portico", default=os.path.join(ROOT, "target", "release", "portico"))
    a = ap.parse_args()
    deno = deno_binary()
    if not deno or not shutil.which("h2load"):
        raise SystemExit("needs deno (bash .ci/install-test-deps) and h2load (apt-get install nghttp2-client)")
    work = tempfile.mkdtemp(prefix="portico-fn-bench-")
    conf = os.path.join(work, "portico.yaml")
    with open(conf, "w") as f:
        f.write(f"""workers: 1
log: {{ level: error }}
listeners: [ {{ name: web, address: "127.0.0.1:{PORTICO_PORT}" }} ]
functions:
  hello: {{ source: "{HANDLER}", env: {{ GREETING: Hello }} }}
routes:
  - {{ function: hello }}
""")
    servers = {
        "portico": ([a.portico, "run", "-c", conf], PORTICO_PORT),
        "deno": ([deno, "serve", "--quiet", "--port", str(DENO_PORT), HANDLER], DENO_PORT),
    }
    results = {name: [] for name in servers}
    try:
        for _ in range(a.runs):
            for name, (cmd, port) in servers.items():
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        env={**os.environ, "DENO_DIR": os.path.join(work, "deno")})
                try:
                    run.wait_port(port, timeout=30)
                    r = measure(proc, port, a.requests)
                    run.log(f"{name}: {r['rps']:.0f} req/s, {r['cpu_us']:.1f} µs CPU per request")
                    results[name].append(r)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = lambda name, key: statistics.median(r[key] for r in results[name])  # noqa: E731
    print(f"# the same fetch handler, {a.requests} requests over 16 keep-alive connections, medians of {a.runs} runs\n")
    print("| server | req/s | CPU per request µs (user) | mean ms | max ms | RSS MiB |")
    print("|---|---|---|---|---|---|")
    for name in servers:
        print(f"| {name} | {med(name, 'rps'):.0f} | {med(name, 'cpu_us'):.1f} ({med(name, 'user_us'):.1f}) | "
              f"{med(name, 'mean_ms'):.2f} | {med(name, 'max_ms'):.1f} | {med(name, 'rss_mib'):.1f} |")
    ratio = med("portico", "cpu_us") / med("deno", "cpu_us")
    print(f"\nPortico / Deno CPU per request: {ratio:.2f}x")


if __name__ == "__main__":
    main()
