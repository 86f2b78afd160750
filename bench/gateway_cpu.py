#!/usr/bin/env python3
"""CPU time per request of the `jwt` filter, beside HAProxy's `jwt_verify`: what instructions.py counts under
callgrind, measured as time on the real CPU (where the crypto libraries use the instruction sets valgrind does
not offer them). Its resolution (the kernel's 10 ms ticks over a few thousand requests, a Python client) is
about a microsecond: enough for a signature check, not for a rate limit, which instructions.py measures. Portico and HAProxy run natively, one worker each, in front of one nginx backend, set up as
instructions.py sets them up (`--gateway jwt`: ES256 tokens made with PyJWT); a Python client sends the requests over 8 keep-alive HTTP/1.1 connections, each with a token of its own
(`--distinct-tokens`) or the same one. CPU per request is the proxy's user plus system time (/proc) over
the requests, the median of `--runs` runs; the same run without the filter gives what the filter adds.

    python3 bench/gateway_cpu.py --gateway jwt --distinct-tokens --binary target/release/portico
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import instructions as ins  # noqa: E402


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(command, requests, stop, tokens):
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ins.wait_port(ins.PROXY_PORT)
        # Warm up (connections, pools) with tokens of their own, so the measured ones are new to the proxy.
        ins.TOKENS = tokens[:200] if len(tokens) > 1 else tokens
        ins.load(200, "h1")
        ins.TOKENS = tokens[200:] if len(tokens) > 1 else tokens
        before = cpu_seconds(proc.pid)
        ins.load(requests, "h1")
        return (cpu_seconds(proc.pid) - before) / requests * 1e6
    finally:
        proc.send_signal(stop)
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True, help="the portico binary")
    ap.add_argument("--gateway", choices=["jwt"], default="jwt")
    ap.add_argument("--distinct-tokens", action="store_true")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port-base", type=int, default=28380)
    a = ap.parse_args()
    ins.BACKEND_PORT, ins.PROXY_PORT = a.port_base, a.port_base + 1
    work = tempfile.mkdtemp(prefix="portico-gwcpu-")
    tokens = ins.make_tokens(work, a.requests + 200 if a.distinct_tokens else 1)
    backend = ins.start_backend(work)
    results = {}
    try:
        for gateway in (None, a.gateway):
            ins.GATEWAY = gateway
            conf = f"""workers: 1
log: {{ level: error }}
listeners: [ {{ name: web, address: "127.0.0.1:{ins.PROXY_PORT}" }} ]
routes:
  - cluster: be
{ins.gateway_route(work)}
clusters:
  be: {{ endpoints: [ {{ address: "127.0.0.1:{ins.BACKEND_PORT}" }} ] }}
"""
            with open(f"{work}/portico.yaml", "w") as f:
                f.write(conf)
            for _ in range(a.runs):
                for name in ("portico", "haproxy"):
                    if name == "portico":
                        command, stop = [a.binary, "run", "-c", f"{work}/portico.yaml"], signal.SIGTERM
                    else:
                        command, stop = ins.peer_command("haproxy", "h1", work)
                    results.setdefault((name, gateway), []).append(measure(command, a.requests, stop, tokens))
    finally:
        backend.send_signal(signal.SIGQUIT)
        backend.wait(timeout=10)
    what = a.gateway + (", a token per request" if a.distinct_tokens and a.gateway == "jwt" else "")
    print(f"| proxy | CPU per request without the filter | with {what} | the filter's cost (median of {a.runs}) |")
    print("|---|---|---|---|")
    for name in ("portico", "haproxy"):
        base = statistics.median(results[(name, None)])
        with_filter = statistics.median(results[(name, a.gateway)])
        print(f"| {name} | {base:.1f} µs | {with_filter:.1f} µs | {with_filter - base:.1f} µs |")


if __name__ == "__main__":
    sys.exit(main())
