#!/usr/bin/env python3
"""A burst of simultaneous requests through Portico at its default limits, beside nginx and HAProxy (issue 13,
item 6: a burst must be served, not shed, where the peers serve it).

Each proxy (one worker) fronts the same nginx backend. The client opens N connections (default 5,000), then
sends one GET on every one of them at the same moment and reads the answers. Reports per proxy: answers by
status, p50 / p99 / max latency from the moment the burst was sent, upstream connections the backend accepted,
and the proxy's resident memory afterwards. Medians over --runs bursts.

    python3 bench/burst.py --requests 5000 --runs 3

Portico runs with its stock configuration (no raised circuit breaker, no raised connection limit); the peers as
bench/run.py configures them.
"""
import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the harness: backends, proxies, /proc readings)


async def one(port, ready, go, results):
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        ready.release()
        results.append(("connect failed", None))
        return
    ready.release()
    await go.wait()
    started = time.monotonic()
    writer.write(b"GET /small HTTP/1.1\r\nHost: burst\r\nConnection: close\r\n\r\n")
    try:
        data = await asyncio.wait_for(reader.read(), 60)
        status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "no answer"
    except (OSError, asyncio.TimeoutError):
        status = "no answer"
    results.append((status, time.monotonic() - started))
    writer.close()


async def burst(port, n):
    ready, go, results = asyncio.Semaphore(0), asyncio.Event(), []
    tasks = [asyncio.create_task(one(port, ready, go, results)) for _ in range(n)]
    for _ in range(n):
        await ready.acquire()
    go.set()
    await asyncio.gather(*tasks)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--proxies", default="nginx,haproxy,portico")
    a = ap.parse_args()
    run.ensure_tools()
    bench = run.Bench(workers=1, duration=1, runs=a.runs)
    if bench.fd_limit < 3 * a.requests:
        raise SystemExit(f"the open-file limit ({bench.fd_limit}) is too low for {a.requests} requests")
    rows = []
    try:
        eps = bench.endpoints(2, False)
        bench.start_backend(eps)
        for name in a.proxies.split(","):
            proc = bench.start_proxy(name, eps, stock=True)
            port = run.PROXY_PORTS[name]
            cells = []
            for _ in range(a.runs):
                before = bench.backend_accepts()
                results = asyncio.run(burst(port, a.requests))
                opened = bench.backend_accepts() - before
                rss = bench.rss_kib(bench.tree_pids(proc.pid)) / 1024
                ok = [t for s, t in results if s == "200"]
                other = {}
                for s, _ in results:
                    if s != "200":
                        other[s] = other.get(s, 0) + 1
                times = sorted(t for _, t in results if t is not None)
                cells.append((len(ok), other, times, opened, rss))
                run.log(f"{name}: {len(ok)} of {a.requests} answered 200, others {other}, "
                        f"p99 {1000 * times[int(len(times) * 0.99) - 1]:.0f} ms, upstream conns {opened}")
                time.sleep(1)
            rows.append((name, cells))
            bench.stop_all()
            bench.start_backend(eps)
    finally:
        bench.stop_all()

    print(f"# {a.requests} simultaneous requests, 1 worker each, medians of {a.runs} bursts\n")
    print("| proxy | answered 200 | other answers (all runs) | p50 ms | p99 ms | max ms | upstream conns | RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, cells in rows:
        med = lambda f: statistics.median(f(c) for c in cells)  # noqa: E731
        other = {}
        for c in cells:
            for k, v in c[1].items():
                other[k] = other.get(k, 0) + v
        pct = lambda q: med(lambda c: 1000 * c[2][max(0, int(len(c[2]) * q) - 1)])  # noqa: E731
        print(f"| {name} | {med(lambda c: c[0]):.0f} | {other or '-'} | {pct(0.5):.0f} | {pct(0.99):.0f} | "
              f"{med(lambda c: 1000 * c[2][-1]):.0f} | {med(lambda c: c[3]):.0f} | {med(lambda c: c[4]):.1f} |")


if __name__ == "__main__":
    main()
