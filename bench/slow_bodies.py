#!/usr/bin/env python3
"""Slow request bodies through Portico at its default settings, beside nginx and HAProxy at theirs: slow
clients must not hold an upstream's connections (request buffering, the minimum body rate).

Each proxy (one worker) fronts the same nginx backend. N clients (default 300) each start a chunked POST and
send one byte a second. Reported per proxy:

- trickle: the clients send for --seconds (default 5; below Portico's 10 s `timeouts.body_rate_grace`), then
  finish their bodies. Upstream connections open at the backend while they trickled (nginx's stub_status
  `Active connections`, less the status request's own), answers by status, p50 / p99 of the time from the
  last chunk to the answer, and the proxy's memory.
- --endless S: the clients never finish; after S seconds, how many are still sending, how the others ended
  (answered, by status, or closed) and the median time it took. Portico answers 408 once a client falls below
  `limits.min_body_rate` (256 bytes/s after a 10 s grace); nginx's `client_body_timeout` (60 s) is a pause
  between reads, which one byte a second never reaches.

The backend's `/upload` reads the whole body before it answers, as an application does.

    python3 bench/slow_bodies.py --clients 300 --seconds 5
    python3 bench/slow_bodies.py --clients 300 --endless 30
"""
import argparse
import asyncio
import os
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the harness: backends, proxies, /proc readings)
from burst import each_proxy  # noqa: E402  (each proxy in turn, at its stock settings)

HEAD = b"POST /upload HTTP/1.1\r\nHost: slow\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"


def backend_active():
    text = urllib.request.urlopen(f"http://127.0.0.1:{run.STATUS_PORT}/", timeout=5).read().decode()
    # "Active connections: N" counts this status request's own connection too.
    return int(text.splitlines()[0].split(":")[1]) - 1


async def client(port, seconds, results):
    """Sends a byte a second for `seconds`, then the last chunk; records the status and the time to it."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HEAD)
        for _ in range(seconds):
            await asyncio.sleep(1)
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
    except OSError:
        results.append(("cut", None))
        return
    last = time.monotonic()
    try:
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 30)
        status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "no answer"
    except (OSError, asyncio.TimeoutError):
        status = "no answer"
    results.append((status, time.monotonic() - last))
    writer.close()


async def watch_cutoffs(port, n, seconds):
    """Endless trickle: each client sends a byte a second until the proxy answers or closes, for `seconds`."""
    results = []

    async def one():
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(HEAD)
            while time.monotonic() - started < seconds:
                try:
                    data = await asyncio.wait_for(reader.read(1), 1)
                    if data:
                        line = data + await asyncio.wait_for(reader.readline(), 5)
                        kind = line.split(b" ", 2)[1].decode() if line.startswith(b"HTTP/") else "answered"
                    else:
                        kind = "closed"
                    results.append((kind, time.monotonic() - started))
                    writer.close()
                    return
                except asyncio.TimeoutError:
                    writer.write(b"1\r\nx\r\n")
                    await writer.drain()
            results.append(("still open", None))
            writer.close()
        except OSError:
            results.append(("closed", time.monotonic() - started))

    await asyncio.gather(*(one() for _ in range(n)))
    return results


async def trickle(port, n, seconds):
    results = []
    tasks = [asyncio.create_task(client(port, seconds, results)) for _ in range(n)]
    await asyncio.sleep(seconds - 0.5)
    held = backend_active()
    await asyncio.gather(*tasks)
    return held, results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=300)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--endless", type=int, default=0, help="clients never finish; report cut-offs after this")
    ap.add_argument("--proxies", default="nginx,haproxy,portico")
    a = ap.parse_args()
    run.ensure_tools()
    bench = run.Bench(workers=1, duration=1, runs=1)
    rows = []
    for name, proc, port in each_proxy(bench, a.proxies):
        if a.endless:
            results = asyncio.run(watch_cutoffs(port, a.clients, a.endless))
            cut = [t for s, t in results if s != "still open"]
            kinds = {}
            for s, _ in results:
                kinds[s] = kinds.get(s, 0) + 1
            rss = bench.rss_kib(bench.tree_pids(proc.pid)) / 1024
            run.log(f"{name}: {kinds}")
            rows.append((name, kinds, statistics.median(cut) if cut else None, rss))
            continue
        held, results = asyncio.run(trickle(port, a.clients, a.seconds))
        rss = bench.rss_kib(bench.tree_pids(proc.pid)) / 1024
        statuses = {}
        for s, _ in results:
            statuses[s] = statuses.get(s, 0) + 1
        times = sorted(t for s, t in results if s == "200")
        run.log(f"{name}: {held} upstream connections held, answers {statuses}")
        rows.append((name, held, statuses, times, rss))
    if a.endless:
        print(f"# {a.clients} clients sending one byte a second, never finishing; after {a.endless} s; "
              "stock settings, 1 worker each\n")
        print("| proxy | clients still sending | answered (by status) or closed | median time to it s | RSS MiB |")
        print("|---|---|---|---|---|")
        for name, kinds, median, rss in rows:
            ended = {k: v for k, v in kinds.items() if k != "still open"} or "-"
            when = f"{median:.1f}" if median is not None else "-"
            print(f"| {name} | {kinds.get('still open', 0)} | {ended} | {when} | {rss:.1f} |")
        return
    print(f"# {a.clients} chunked POSTs sending one byte a second for {a.seconds} s, then finishing; "
          "stock settings, 1 worker each\n")
    print("| proxy | upstream connections held while they trickled | answers | p50 ms | p99 ms | RSS MiB |")
    print("|---|---|---|---|---|---|")
    for name, held, statuses, times, rss in rows:
        pct = lambda q: f"{1000 * times[max(0, int(len(times) * q) - 1)]:.0f}" if times else "-"  # noqa: E731
        print(f"| {name} | {held} | {statuses} | {pct(0.5)} | {pct(0.99)} | {rss:.1f} |")


if __name__ == "__main__":
    main()
