#!/usr/bin/env python3
"""Zero-downtime upgrade under a load generator: wrk (a new connection per request, so every request counts and
no idle keep-alive close can hide a failure) and a rate-limited curl download run through Portico while it is
upgraded (SIGUSR2) from one binary to another. Reports requests, socket errors, non-2xx answers, the download and
the old process's exit.

  python3 bench/upgrade.py                                  # target/release/portico to itself
  PORTICO_UPGRADE_FROM=/path/to/older/portico python3 bench/upgrade.py [--process-model multi_process]

Uses the harness of bench/run.py (nginx as the backend, wrk). Results go to bench/RESULTS.md by hand, with the
command that produced them.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the benchmark harness: backend, tools)

PORT, ADMIN = 18190, 18191


def admin(path):
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}{path}", timeout=5).read())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--process-model", default="threads", choices=["threads", "multi_process"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--duration", type=int, default=12, help="seconds of load; the upgrade comes at a third")
    ap.add_argument("--connections", type=int, default=20)
    args = ap.parse_args()

    run.ensure_tools()
    bench = run.Bench(args.workers, args.duration, 1)
    new = run.PORTICO
    old = os.environ.get("PORTICO_UPGRADE_FROM", new)
    bin_dir = os.path.join(bench.work, "bin")
    os.makedirs(bin_dir)
    path = os.path.join(bin_dir, "portico")
    shutil.copy(old, path)
    # A download that lasts well past the hand-over.
    size = 96 << 20
    with open(os.path.join(bench.work, "www", "big.bin"), "wb") as f:
        f.write(os.urandom(size))
    os.chmod(os.path.join(bench.work, "www", "big.bin"), 0o644)
    endpoints = bench.endpoints(2, False)
    bench.start_backend(endpoints)
    eps = "\n".join(f'      - address: "{e}"' for e in endpoints)
    config = os.path.join(bench.work, "portico.yaml")
    with open(config, "w") as f:
        # Only when asked: releases before multi_process refuse the key.
        model = f"process_model: {args.process_model}" if args.process_model != "threads" else ""
        f.write(f"""workers: {args.workers}
{model}
log: {{ level: error }}
shutdown: {{ grace: 30s }}
admin: {{ address: "127.0.0.1:{ADMIN}" }}
listeners: [ {{ name: web, address: "127.0.0.1:{PORT}" }} ]
routes: [ {{ cluster: be }} ]
clusters:
  be:
    endpoints:
{eps}
""")
    proxy = subprocess.Popen(["taskset", "-c", bench.proxy_cpu, path, "run", "-c", config],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        run.wait_port(PORT)
        time.sleep(0.5)
        # (Releases before bca4946 have no /admin/process.)
        version = subprocess.run([old, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
        old_process = {"pid": proxy.pid, "version": version.removeprefix("portico ")}
        wrk = subprocess.Popen(["taskset", "-c", bench.load_cpu, "wrk", "-t1", f"-c{args.connections}",
                                f"-d{args.duration}s", "-H", "Connection: close", f"http://127.0.0.1:{PORT}/small"],
                               stdout=subprocess.PIPE, text=True)
        rate = size // (args.duration * 2 // 3)  # ends about two thirds into the run
        curl = subprocess.Popen(["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", "--limit-rate",
                                 str(rate), f"http://127.0.0.1:{PORT}/big.bin"], stdout=subprocess.PIPE, text=True)
        time.sleep(args.duration / 3)
        staged = path + ".new"
        shutil.copy(new, staged)
        os.rename(staged, path)  # what `install` does: the running binary shows as deleted
        upgraded_at = time.time()
        os.kill(proxy.pid, signal.SIGUSR2)
        old_exit = proxy.wait(timeout=60)
        drained = time.time() - upgraded_at
        wrk_out, _ = wrk.communicate(timeout=args.duration + 30)
        curl_out, _ = curl.communicate(timeout=120)
        new_process = admin("/admin/process")
    finally:
        for pid in filter(None, [locals().get("new_process", {}).get("pid")]):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            os.killpg(proxy.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        bench.stop_all()

    requests = int(re.search(r"(\d+) requests in", wrk_out).group(1))
    errors = re.search(r"Socket errors: (.*)", wrk_out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", wrk_out)
    print(f"upgrade {old_process['version']} (pid {old_process['pid']}) -> {new_process['version']} "
          f"(pid {new_process['pid']}), process_model {args.process_model}, {args.workers} workers")
    print(f"  wrk, a new connection per request: {requests} requests in {args.duration}s, "
          f"socket errors: {errors.group(1) if errors else 'none'}, non-2xx: {non2xx.group(1) if non2xx else 0}")
    print(f"  download: {curl_out.strip()} of {size} bytes, curl exit {curl.returncode}")
    print(f"  old process: exit {old_exit}, {drained:.1f}s after SIGUSR2 (it drained the download)")
    ok = (not errors and not non2xx and curl.returncode == 0 and int(curl_out.strip() or 0) == size
          and old_exit == 0 and new_process["pid"] != old_process["pid"])
    print("  result:", "no failed request, no refused connection" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
