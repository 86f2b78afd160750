#!/usr/bin/env python3
"""A burst of simultaneous requests through Portico at its default limits, beside nginx and HAProxy (a burst
must be served, not shed, where the peers serve it); with --idle, new clients while idle keep-alive connections
hold the connection limit.

Each proxy (one worker) fronts the same nginx backend. The client opens N connections (default 5,000), then
sends one GET on every one of them at the same moment and reads the answers. Reports per proxy: answers by
status, p50 / p99 / max latency from the moment the burst was sent, upstream connections the backend accepted,
and the proxy's resident memory afterwards. Medians over --runs bursts.

    python3 bench/burst.py --requests 5000 --runs 3
    python3 bench/burst.py --idle 3000 --limit 2000   # 3,000 idle keep-alive clients against a limit of 2,000

With --idle N: N client connections each make one keep-alive request and stay open; then 5 new clients, one
after another, each send a request on a new connection (5 s to answer). Reports the new clients answered and
their latency, and how many of the idle connections the proxy closed to make room, and its memory.

Portico runs with its stock configuration (no raised circuit breaker, no raised connection limit); the peers as
bench/run.py configures them.
"""
import argparse
import asyncio
import os
import shutil
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


async def idle_then_new(port, idle_count, newcomers=5):
    idle = []

    async def open_idle():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /small HTTP/1.1\r\nHost: idle\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
            length = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            idle.append((reader, writer))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, StopIteration, ValueError):
            pass

    for start in range(0, idle_count, 500):  # in waves, as clients arrive
        await asyncio.gather(*(open_idle() for _ in range(min(500, idle_count - start))))
    answered, latencies = 0, []
    for _ in range(newcomers):
        started = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            writer.write(b"GET /small HTTP/1.1\r\nHost: new\r\nConnection: close\r\n\r\n")
            data = await asyncio.wait_for(reader.read(), 5)
            if data.startswith(b"HTTP/1.1 200"):
                answered += 1
                latencies.append(time.monotonic() - started)
            writer.close()
        except (OSError, asyncio.TimeoutError):
            pass
    await asyncio.sleep(0.5)
    closed = 0
    for reader, writer in idle:
        if reader.at_eof() or writer.is_closing():
            closed += 1
        else:
            try:
                data = await asyncio.wait_for(reader.read(1), 0.001)
                closed += data == b""
            except asyncio.TimeoutError:
                pass
        writer.close()
    return len(idle), answered, latencies, closed


def each_proxy(bench, names):
    """Starts the backend, then each proxy in turn, with Portico's stock limits; yields (name, process, port)
    and stops them after each."""
    eps = bench.endpoints(2, False)
    try:
        bench.start_backend(eps)
        for name in names.split(","):
            proc = bench.start_proxy(name, eps, stock=True)
            yield name, proc, run.PROXY_PORTS[name]
            bench.stop_all()
            bench.start_backend(eps)
    finally:
        bench.stop_all()
        shutil.rmtree(bench.work, ignore_errors=True)


def idle_main(a):
    run.ensure_tools()
    bench = run.Bench(workers=1, duration=1, runs=1)
    bench.connection_limit = a.limit or None
    if bench.fd_limit < 2 * a.idle + 2000:
        raise SystemExit(f"the open-file limit ({bench.fd_limit}) is too low for {a.idle} idle connections")
    rows = []
    for name, proc, port in each_proxy(bench, a.proxies):
        opened, answered, latencies, closed = asyncio.run(idle_then_new(port, a.idle))
        rss = bench.rss_kib(bench.tree_pids(proc.pid)) / 1024
        run.log(f"{name}: {opened} idle, {answered} of 5 new clients answered, {closed} idle closed")
        rows.append((name, opened, answered, latencies, closed, rss))
    limit = f", every proxy limited to {a.limit} connections" if a.limit else ", stock limits"
    print(f"# {a.idle} idle keep-alive connections, then 5 new clients; 1 worker each{limit}\n")
    print("| proxy | idle connections opened | new clients answered | their max latency ms | idle ones closed | RSS MiB |")
    print("|---|---|---|---|---|---|")
    for name, opened, answered, latencies, closed, rss in rows:
        worst = f"{1000 * max(latencies):.0f}" if latencies else "-"
        print(f"| {name} | {opened} | {answered} of 5 | {worst} | {closed} | {rss:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--proxies", default="nginx,haproxy,portico")
    ap.add_argument("--idle", type=int, default=0, help="idle keep-alive connections before 5 new clients")
    ap.add_argument("--limit", type=int, default=0,
                    help="with --idle: every proxy's client connection limit (Portico limits.max_connections, "
                         "nginx worker_connections, HAProxy maxconn)")
    a = ap.parse_args()
    if a.idle:
        return idle_main(a)
    run.ensure_tools()
    bench = run.Bench(workers=1, duration=1, runs=a.runs)
    if bench.fd_limit < 3 * a.requests:
        raise SystemExit(f"the open-file limit ({bench.fd_limit}) is too low for {a.requests} requests")
    rows = []
    for name, proc, port in each_proxy(bench, a.proxies):
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
