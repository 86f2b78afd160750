#!/usr/bin/env python3
"""What an idle proxy costs: wake-ups per second and user-space instructions per second with no traffic.

Each proxy (Portico binaries given with `--binary NAME=PATH`, and `--peers nginx,haproxy`) is started with a
listener, a cluster of one endpoint (nothing listens there: nothing is ever sent) and nothing else configured:
no health checks, no file watch, no access log, no admin address unless `--admin`. After `--settle` seconds it
is left alone for `--seconds` seconds, and the figures are:

- wake-ups per second: the context switches of every thread of the proxy's processes (voluntary and not, from
  /proc/PID/task/TID/status, the master and its workers alike), whose difference over the quiet seconds counts
  how often a thread went to sleep and was woken again;
- with `--callgrind`: user-space instructions per second, from two runs under `valgrind --tool=callgrind`,
  instrumented from the end of the settling time, idle for `--seconds` and `2 * --seconds` (the difference, so
  shutdown cancels out). nginx runs with
  `master_process off` there (one process, as instructions.py runs it), HAProxy in the foreground.

    python3 bench/idle.py --binary portico=target/release/portico --peers nginx,haproxy
    python3 bench/idle.py --binary portico=target/release/portico --peers nginx,haproxy --callgrind
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from instructions import wait_port  # (bench/ is on the path when a script of it runs)

PORT = int(os.environ.get("PORTICO_BENCH_PORT_BASE", "18480"))


def command(kind, path, work, workers, admin, callgrind):
    """The command line of a proxy and the signal that stops it gracefully."""
    if kind == "portico":
        admin_line = f'admin: {{ address: "127.0.0.1:{PORT + 2}" }}\n' if admin else ""
        conf = f"""workers: {workers}
{admin_line}log: {{ level: error }}
listeners: [ {{ name: web, address: "127.0.0.1:{PORT}" }} ]
routes: [ {{ cluster: be }} ]
clusters:
  be: {{ endpoints: [ {{ address: "127.0.0.1:{PORT + 1}" }} ] }}
"""
        with open(f"{work}/portico.yaml", "w") as f:
            f.write(conf)
        return [path, "run", "-c", f"{work}/portico.yaml"], signal.SIGTERM
    if kind == "nginx":
        master = "master_process off;" if callgrind else ""
        conf = f"""worker_processes {workers}; daemon off; {master} pid {work}/nginx.pid; error_log stderr error;
events {{ worker_connections 1024; }}
http {{ access_log off;
  upstream be {{ server 127.0.0.1:{PORT + 1}; keepalive 64; }}
  server {{ listen 127.0.0.1:{PORT}; location / {{ proxy_pass http://be; }} }} }}
"""
        with open(f"{work}/nginx.conf", "w") as f:
            f.write(conf)
        return ["nginx", "-c", f"{work}/nginx.conf"], signal.SIGQUIT
    if kind == "haproxy":
        conf = f"""global
  nbthread {workers}
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend fe
  bind 127.0.0.1:{PORT}
  default_backend be
backend be
  server s1 127.0.0.1:{PORT + 1}
"""
        with open(f"{work}/haproxy.cfg", "w") as f:
            f.write(conf)
        return ["haproxy", "-db", "-f", f"{work}/haproxy.cfg"], signal.SIGUSR1
    raise SystemExit(f"unknown proxy {kind}")


def descendants(pid):
    """`pid` and every process under it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def switches(pid):
    """Context switches so far of every thread of `pid` and its descendants."""
    total = 0
    for p in descendants(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                            total += int(line.split()[1])
            except OSError:
                pass
    return total


def wakeups(kind, path, work, workers, admin, settle, seconds):
    cmd, stop = command(kind, path, work, workers, admin, False)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(PORT)
        time.sleep(settle)
        before = switches(proc.pid)
        time.sleep(seconds)
        after = switches(proc.pid)
        threads = sum(len(os.listdir(f"/proc/{p}/task")) for p in descendants(proc.pid))
    finally:
        proc.send_signal(stop)
        proc.wait(timeout=60)
    return (after - before) / seconds, threads


def instructions(kind, path, work, workers, admin, settle, seconds):
    cmd, stop = command(kind, path, work, workers, admin, True)
    out = f"{work}/callgrind.out"
    if os.path.exists(out):
        os.remove(out)
    # Instrumentation starts after the settling time (callgrind_control), so start-up's varying cost is left out.
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
                            + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(PORT)
        time.sleep(settle)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
        time.sleep(seconds)
    finally:
        proc.send_signal(stop)
        proc.wait(timeout=120)
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise SystemExit("no totals in the callgrind output")


def main():
    global PORT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", action="append", default=[], help="NAME=PATH of a portico binary")
    ap.add_argument("--peers", default="", help="nginx,haproxy")
    ap.add_argument("--workers", type=int, default=1, help="workers (threads or processes) of each proxy")
    ap.add_argument("--admin", action="store_true", help="give Portico an admin address (the dashboard samples)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds after start-up before counting")
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds counted")
    ap.add_argument("--callgrind", action="store_true", help="also count instructions per idle second")
    ap.add_argument("--port-base", type=int, default=PORT, help="the proxy's port (the next two are used too)")
    a = ap.parse_args()
    PORT = a.port_base
    work = tempfile.mkdtemp(prefix="portico-idle-")
    proxies = [("portico",) + tuple(b.split("=", 1)) for b in a.binary]
    proxies += [(p, p, p) for p in filter(None, a.peers.split(","))]
    for kind, _, _ in proxies:
        if kind != "portico" and not shutil.which(kind):
            raise SystemExit(f"{kind} is needed")
    if a.callgrind and not shutil.which("valgrind"):
        raise SystemExit("valgrind is needed for --callgrind")
    try:
        print(f"| proxy | threads | wake-ups per idle second ({a.seconds:g} s, {a.workers} worker(s)"
              f"{', admin address' if a.admin else ''}) |" + (" instructions per idle second |" if a.callgrind else ""))
        print("|---|---|---|" + ("---|" if a.callgrind else ""))
        for kind, name, path in proxies:
            rate, threads = wakeups(kind, path, work, a.workers, a.admin, a.settle, a.seconds)
            row = f"| {name} | {threads} | {rate:,.1f} |"
            if a.callgrind:
                low = instructions(kind, path, work, a.workers, a.admin, a.settle, a.seconds)
                high = instructions(kind, path, work, a.workers, a.admin, a.settle, 2 * a.seconds)
                row += f" {(high - low) / a.seconds:,.0f} |"
            print(row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
