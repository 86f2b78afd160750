#!/usr/bin/env python3
"""Portico's MQTT broker against Mosquitto, in the same run on this machine, with the same load generator
(bench/mqtt-load: a compiled MQTT 3.1.1 client on tokio, end-to-end latency from a send time in each payload).

    python3 bench/mqtt.py                                  # every scenario, every broker, 3 runs, 10 s each
    python3 bench/mqtt.py --scenarios fanin-q0-64,fanout100-q0-64 --runs 1 --duration 5
    python3 bench/mqtt.py --brokers mosquitto,portico-w1 --idle 10000 --json out.json

Brokers: `mosquitto` (the Debian package, a generated mosquitto.conf: one listener, `allow_anonymous true`,
`persistence false`), `mosquitto+persist` (`persistence true`, `autosave_interval 1800`, Debian's default: Mosquitto
writes its in-memory state to mosquitto.db every 30 minutes and at shutdown, so it does no disk work per message),
`portico-w1` and `portico-w2` (`workers: 1` / `workers: 2`), `portico+persist` (workers: 1, `mqtt.persistence`
with `fsync: true`: every QoS 1 acknowledgement for a persistent session waits for a commit of the redb store).
The persistence brokers run only the QoS 1 scenarios, with persistent subscribers (clean session off).

Each broker runs alone while measured. On a machine with two or more cores the one-thread brokers (Mosquitto,
Portico with one worker) are pinned to CPU 0 and the load generator to the others; `portico-w2` is not pinned
(it needs both cores of a 2-core machine, which it then shares with the load generator).

Reports per scenario and broker: delivered messages per second, broker CPU microseconds per delivered message
(utime+stime of the broker's threads from /proc, read at the load generator's START and END lines), p50/p99
end-to-end latency, and Portico/Mosquitto ratios. Medians of the runs, with the spread. Idle memory: RSS of the
broker with N connected clients, each with one subscription, that do nothing, read `--idle-wait` seconds (15) after
the last one subscribed.

`--callgrind` runs each broker under `valgrind --tool=callgrind` and reports, instead of CPU time, the broker's
user-space instructions per delivered message between the load generator's START and END lines (zeroed and
dumped there with callgrind_control): repeatable where CPU time on a shared machine is not. Throughput and
latency are then those of a broker slowed down some fifty times, and mean nothing.

Standard library only; builds Portico (`cargo build --release -p portico`) and bench/mqtt-load.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (/proc readings, wait_port, raise_fd_limit)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
PORTICO = os.path.join(TARGET, "release", "portico")
LOAD = os.path.join(TARGET, "release", "mqtt-load")
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MQTT_EXTRA = ""
TICK = os.sysconf("SC_CLK_TCK")

# name: load generator arguments, description
SCENARIOS = {
    "fanin-q0-64": (["--mode", "fanin", "--pubs", "50", "--subs", "1", "--qos", "0", "--size", "64"],
                    "fan-in: 50 publishers, 1 subscriber (bench/in/+), QoS 0, 64 B"),
    "fanin-q1-64": (["--mode", "fanin", "--pubs", "50", "--subs", "1", "--qos", "1", "--size", "64"],
                    "fan-in: 50 publishers, 1 subscriber, QoS 1, 64 B"),
    "fanout100-q0-64": (["--mode", "fanout", "--subs", "100", "--qos", "0", "--size", "64"],
                        "fan-out: 1 publisher, 100 subscribers, QoS 0, 64 B"),
    "fanout100-q1-64": (["--mode", "fanout", "--subs", "100", "--qos", "1", "--size", "64"],
                        "fan-out: 1 publisher, 100 subscribers, QoS 1, 64 B"),
    "fanin-q0-4k": (["--mode", "fanin", "--pubs", "50", "--subs", "1", "--qos", "0", "--size", "4096"],
                    "fan-in: 50 publishers, 1 subscriber, QoS 0, 4 KiB"),
    "fanin-q1-4k": (["--mode", "fanin", "--pubs", "50", "--subs", "1", "--qos", "1", "--size", "4096"],
                    "fan-in: 50 publishers, 1 subscriber, QoS 1, 4 KiB"),
    "fanout1000-q0-64": (["--mode", "fanout", "--subs", "1000", "--qos", "0", "--size", "64", "--window", "2"],
                         "fan-out: 1 publisher, 1,000 subscribers, QoS 0, 64 B"),
    "fanout1000-q1-64": (["--mode", "fanout", "--subs", "1000", "--qos", "1", "--size", "64", "--window", "2"],
                         "fan-out: 1 publisher, 1,000 subscribers, QoS 1, 64 B"),
    "m2m-q0-64": (["--mode", "m2m", "--pubs", "100", "--subs", "100", "--groups", "10", "--qos", "0", "--size", "64"],
                  "many-to-many: 100 publishers, 100 subscribers, 10 topics (each message to 10), QoS 0, 64 B"),
    "m2m-q1-64": (["--mode", "m2m", "--pubs", "100", "--subs", "100", "--groups", "10", "--qos", "1", "--size", "64"],
                  "many-to-many: as above, QoS 1, 64 B"),
    "fanout100-q0-4k": (["--mode", "fanout", "--subs", "100", "--qos", "0", "--size", "4096"],
                        "fan-out: 1 publisher, 100 subscribers, QoS 0, 4 KiB"),
}
BROKERS = ["mosquitto", "portico-w1", "portico-w2", "mosquitto+persist", "portico+persist"]
PERSIST = {"mosquitto+persist", "portico+persist"}


def build():
    env = {**os.environ, "CARGO_TARGET_DIR": TARGET}
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "portico"], cwd=ROOT, check=True, env=env)
    subprocess.run(["cargo", "build", "--release", "-q"], cwd=os.path.join(ROOT, "bench", "mqtt-load"), check=True,
                   env=env)


def versions():
    mosq = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True).stdout.splitlines()[0]
    port = subprocess.run([PORTICO, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return {"mosquitto": mosq, "portico": port}


CALLGRIND = False


def start_broker(name, work, port, pin):
    d = os.path.join(work, f"{name}-{port}")
    os.makedirs(d, exist_ok=True)
    if name.startswith("mosquitto"):
        conf = os.path.join(d, "mosquitto.conf")
        with open(conf, "w") as f:
            f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_connections -1\n")
            if name.endswith("+persist"):
                f.write(f"persistence true\npersistence_location {d}/\nautosave_interval 1800\n")
            else:
                f.write("persistence false\n")
        args = [MOSQUITTO, "-c", conf]
    else:
        workers = 2 if name == "portico-w2" else 1
        conf = os.path.join(d, "portico.yaml")
        with open(conf, "w") as f:
            f.write(f"workers: {workers}\nlog: {{ level: error }}\n"
                    f'listeners:\n  - {{ name: mqtt, address: "127.0.0.1:{port}", protocol: mqtt, '
                    "limits: { max_connections: 30000 } }\n")
            if name.endswith("+persist") or MQTT_EXTRA:
                f.write("mqtt:\n")
            if name.endswith("+persist"):
                f.write(f"  persistence: {{ path: {d}/store, fsync: true }}\n")
            if MQTT_EXTRA:
                f.write(f"  {MQTT_EXTRA}\n")
        args = [PORTICO, "run", "-c", conf]
    if CALLGRIND:
        args = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/callgrind.out"] + args
    if pin is not None:
        args = ["taskset", "-c", pin] + args
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "stderr.log"), "w"))
    proc.bench_dir = d
    run.wait_port(port, timeout=60 if CALLGRIND else 10)
    time.sleep(0.3)
    return proc


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(a, name, proc, port, scenario, load_pin, persist):
    args, _ = SCENARIOS[scenario]
    cmd = [LOAD, "--port", str(port), "--duration", str(a.duration), "--warmup", str(a.warmup),
           "--threads", str(a.load_threads), "--prefix", f"r{time.monotonic_ns()}"] + args
    if persist:
        cmd.append("--persistent")
    if load_pin is not None:
        cmd = ["taskset", "-c", load_pin] + cmd
    pids = run.Bench.tree_pids(proc.pid)
    lp = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    t = {}
    result = None
    for line in lp.stdout:
        line = line.strip()
        if line in ("START", "END"):
            t[line] = (run.Bench.cpu_ticks(pids), time.monotonic())
            if CALLGRIND:
                subprocess.run(["callgrind_control", "-z" if line == "START" else "-d", str(proc.pid)],
                               stdout=subprocess.DEVNULL, check=True)
        elif line.startswith("{"):
            result = json.loads(line)
    lp.wait()
    if result is None or "END" not in t:
        raise RuntimeError(f"{name} {scenario}: the load generator failed ({lp.returncode})")
    (u0, s0), _ = t["START"]
    (u1, s1), _ = t["END"]
    delivered = max(result["delivered"], 1)
    result["cpu_us"] = ((u1 - u0) + (s1 - s0)) / TICK / delivered * 1e6
    result["cpu_sys_us"] = (s1 - s0) / TICK / delivered * 1e6
    result["broker_cores"] = ((u1 - u0) + (s1 - s0)) / TICK / result["seconds"]
    result["rss_kib"] = run.Bench.rss_kib(pids)
    if CALLGRIND:
        result["instructions"] = callgrind_total(os.path.join(proc.bench_dir, "callgrind.out")) / delivered
    return result


def callgrind_total(out):
    """The instructions of the last dump of `out` (callgrind_control -d writes OUT.1, OUT.2, ...)."""
    dumps = sorted((f for f in os.listdir(os.path.dirname(out)) if f.startswith(os.path.basename(out) + ".")),
                   key=lambda f: int(f.rsplit(".", 1)[1]))
    with open(os.path.join(os.path.dirname(out), dumps[-1])) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {dumps[-1]}")


def idle_memory(a, name, work, port, pin, load_pin):
    proc = start_broker(name, work, port, pin)
    try:
        pids = run.Bench.tree_pids(proc.pid)
        before = run.Bench.rss_kib(pids)
        cmd = [LOAD, "--port", str(port), "--mode", "idle", "--clients", str(a.idle), "--threads", "1",
               "--prefix", f"i{time.monotonic_ns()}"]
        if load_pin is not None:
            cmd = ["taskset", "-c", load_pin] + cmd
        lp = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = lp.stdout.readline().split()
        connected = int(line[1]) if line and line[0] == "READY" else 0
        time.sleep(a.idle_wait)
        after = run.Bench.rss_kib(pids)
        lp.stdin.close()
        lp.wait(30)
    finally:
        stop(proc)
    run.log(f"idle {name}: {connected} clients, RSS {before} -> {after} KiB")
    return {"connected": connected, "rss_before_kib": before, "rss_kib": after,
            "per_client_b": (after - before) * 1024 / max(connected, 1)}


def med(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated: " + ", ".join(SCENARIOS))
    ap.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated: " + ", ".join(BROKERS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--load-threads", type=int, default=1, help="tokio worker threads of the load generator")
    ap.add_argument("--idle", type=int, default=10000, help="idle clients for the memory test (0: skip it)")
    ap.add_argument("--mqtt-extra", default="",
                    help="a YAML line added under Portico's `mqtt:` section, e.g. 'limits: { park_after: 0s }'")
    ap.add_argument("--idle-wait", type=float, default=15,
                    help="seconds between the last SUBACK and reading the RSS (Portico parks a connection idle for "
                         "mqtt.limits.park_after, 10 s by default; the same wait for every broker)")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--portico", help="the portico binary to run (default: $CARGO_TARGET_DIR/release/portico)")
    ap.add_argument("--load", help="the mqtt-load binary (default: $CARGO_TARGET_DIR/release/mqtt-load)")
    ap.add_argument("--callgrind", action="store_true",
                    help="instructions per delivered message, each broker under callgrind (see above)")
    ap.add_argument("--json")
    a = ap.parse_args()
    global CALLGRIND
    CALLGRIND = a.callgrind
    global PORTICO, LOAD, MQTT_EXTRA
    PORTICO = a.portico or PORTICO
    LOAD = a.load or LOAD
    MQTT_EXTRA = a.mqtt_extra
    if not a.no_build:
        build()
    run.raise_fd_limit()
    n = os.cpu_count() or 1
    one_core, rest = ("0", f"1-{n - 1}") if n > 1 else (None, None)
    brokers = a.brokers.split(",")
    scenarios = [s for s in a.scenarios.split(",") if s]  # empty: the idle memory test only
    vers = versions()
    run.log(f"{vers['mosquitto']}; {vers['portico']}; {n} CPUs")
    work = tempfile.mkdtemp(prefix="mqtt-bench-")
    port = 21883
    results = {}
    for sc in scenarios:
        for name in brokers:
            persist = name in PERSIST
            if persist and "-q0-" in sc:
                continue
            pin = None if name == "portico-w2" else one_core
            load_pin = None if name == "portico-w2" else rest
            runs = []
            for r in range(a.runs):
                port += 1
                proc = start_broker(name, work, port, pin)
                try:
                    res = measure(a, name, proc, port, sc, load_pin, persist)
                finally:
                    stop(proc)
                runs.append(res)
                instr = f", {res['instructions']:,.0f} instructions/msg" if "instructions" in res else ""
                run.log(f"{sc} {name} run {r + 1}: {res['delivered_per_s']:.0f} msg/s, {res['cpu_us']:.2f} us/msg, "
                        f"p50 {res['p50_ms']:.3f} ms, p99 {res['p99_ms']:.3f} ms, lost {res['lost']}, "
                        f"stalls {res['stalls']}, broker {res['broker_cores']:.2f} cores{instr}")
            results[(sc, name)] = runs
    idle = {}
    if a.idle:
        for name in [b for b in brokers if b not in PERSIST]:
            port += 1
            pin = None if name == "portico-w2" else one_core
            idle[name] = idle_memory(a, name, work, port, pin, None if name == "portico-w2" else rest)
    shutil.rmtree(work, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ report
    print(f"\n{vers['mosquitto']}; {vers['portico']}; {n} CPUs; {a.runs} run(s) of {a.duration:g} s "
          f"(+{a.warmup:g} s warm-up); medians, spread in brackets\n")
    print("| scenario | broker | delivered msg/s | CPU us/msg | p50 ms | p99 ms | msg/s vs Mosquitto | "
          "CPU vs Mosquitto |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for sc in scenarios:
        base = {}
        for name in brokers:
            runs = results.get((sc, name))
            if not runs:
                continue
            rate, rlo, rhi = med([x["delivered_per_s"] for x in runs])
            cpu, clo, chi = med([x["cpu_us"] for x in runs])
            p50 = med([x["p50_ms"] for x in runs])[0]
            p99 = med([x["p99_ms"] for x in runs])[0]
            ref = "mosquitto+persist" if name in PERSIST else "mosquitto"
            if name == ref:
                base[ref] = (rate, cpu)
            r_rate = r_cpu = ""
            if name != ref and ref in base:
                r_rate = f"{rate / base[ref][0]:.2f}x"
                r_cpu = f"{cpu / base[ref][1]:.2f}x"
            spread = f" ({rlo:,.0f}-{rhi:,.0f})" if len(runs) > 1 else ""
            cspread = f" ({clo:.2f}-{chi:.2f})" if len(runs) > 1 else ""
            print(f"| {sc} | {name} | {rate:,.0f}{spread} | {cpu:.2f}{cspread} | {fmt(p50, '.2f')} | "
                  f"{fmt(p99, '.2f')} | {r_rate} | {r_cpu} |")
    if a.callgrind:
        print("\n| scenario | broker | instructions per delivered message |")
        print("|---|---|---:|")
        for sc in scenarios:
            for name in brokers:
                runs = results.get((sc, name))
                if runs:
                    ins, lo, hi = med([x["instructions"] for x in runs])
                    spread = f" ({lo:,.0f}-{hi:,.0f})" if len(runs) > 1 else ""
                    print(f"| {sc} | {name} | {ins:,.0f}{spread} |")
    if idle:
        print(f"\n| broker | idle clients connected | RSS before | RSS with them | bytes per client |")
        print("|---|---:|---:|---:|---:|")
        for name, m in idle.items():
            print(f"| {name} | {m['connected']:,} | {m['rss_before_kib'] / 1024:.1f} MiB | {m['rss_kib'] / 1024:.1f} MiB "
                  f"| {m['per_client_b']:,.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"versions": vers, "args": vars(a), "idle": idle,
                       "results": {f"{k[0]}/{k[1]}": v for k, v in results.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
