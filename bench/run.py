#!/usr/bin/env python3
"""The one place Animal Store's performance is measured: `bash bench/run.sh` runs this.

Every contender is measured in the same run as its peers, on loopback, and reported as ratios,
because these machines are shared and noisy. Pinning on 2 cores: the proxy under test on CPU 0;
the load generator, the upstream and Redis on CPU 1. Rounds run every contender back to back, in
alternating order; values are medians with the spread (min-max) of the rounds.

Parts (each can be chosen with PARTS=get,open,idle,creates,tls,redis,instr):
  get      closed loop (wrk -t1 -c64): upstream direct, nginx limit_req, HAProxy stick table,
           bare pingora pass-through (and again with upstream connections kept per thread, as
           the gateway keeps them), the gateway (embedded store, Redis store, two gateways on
           one Redis); req/s, p99, proxy CPU time per request and how much of it is the
           kernel's; then the pass-through and the gateway alone, PAIR_ROUNDS more times each in
           alternating pairs, for the 0.9x target
  open     open loop at fixed offered rates (oha -q RATE --latency-correction): p50/p99 against
           offered load, each rate ROUNDS times in alternating order, medians plotted to
           bench/latency.svg; then nginx and the gateway alone at half of nginx's maximum,
           TARGET_ROUNDS more times each, for the p99 target's reading
  idle     RSS of each proxy holding 10,000 idle keep-alive connections that each made one GET
           (`serve`: the median of ROUNDS fresh processes); with tls, also over HTTPS/1.1 and
           HTTP/2 for the gateway and nginx
  creates  durable creates straight to the backend: commit = group, per_request, none
  tls      HTTPS: wrk over HTTP/1.1, h2load over HTTP/2, full handshakes per second, and the
           proxy's CPU per connection with full and resumed handshakes over TLS 1.3 and 1.2
           (openssl s_time); the gateway against nginx with the same certificate
  redis    two gateways on one Redis under load: admitted requests against the key's limit
  instr    user-space instructions per request under valgrind's callgrind, which counts the same
           for the same binary and load, within about 2%, however busy the machine is: nginx,
           HAProxy, the bare pass-through (both ways) and the gateway (embedded store,
           lowercase, Redis store, whose server's own work is not counted; with where the
           gateway's own phases spend theirs), each the difference of two runs of INSTR_N and
           3 x INSTR_N requests (oha -n, 8 connections), so start-up and shutdown cancel out;
           and the gateway and nginx over HTTP/2 with TLS (h2load -n, 8 connections, one stream
           each)
"""

import asyncio
import concurrent.futures
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
DUR = int(os.environ.get("DUR", "8"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CONN = int(os.environ.get("CONN", "64"))
IDLE = int(os.environ.get("IDLE", "10000"))
PARTS = os.environ.get("PARTS", "get,open,idle,creates,tls,redis,instr").split(",")
INSTR_N = int(os.environ.get("INSTR_N", "2000"))
# More open-loop runs of nginx and the gateway alone at half of nginx's maximum, for the p99
# target's reading (see `part_open`).
TARGET_ROUNDS = int(os.environ.get("TARGET_ROUNDS", "6"))
TARGET_PAIR = ("nginx", "gateway (embedded)")
# More closed-loop runs of the pass-through and the gateway alone, for the reading of the target
# nearest its edge: the gateway at 0.9x the pass-through (see `part_get`).
PAIR_ROUNDS = int(os.environ.get("PAIR_ROUNDS", "12"))
FLOOR_PAIR = ("pingora pass-through", "gateway (embedded)")
# The pass-through with idle upstream connections kept per thread, as the gateway keeps them: the
# gateway against it is what the gateway's features cost.
KEPT_PASS = "pass-through, kept upstreams"
# MAX_SPREAD: see `parse_max_spread`, `too_noisy` and `bound_to_be_too_noisy`; read by `main`.
MAX_SPREAD = None
# The closed-loop rows a target of issue 8 is read from, and so the rows MAX_SPREAD judges (see
# `gated`): the gateway against nginx and against the pass-through, and what its features cost
# against the pass-through with kept upstreams. The others (the upstream direct, HAProxy, the
# gateway on Redis, whose Redis shares CPU 1 with the load generator and the upstream, and with
# lowercase names) are reported with their spread but do not stop a run.
GATED = ("nginx", "pingora pass-through", KEPT_PASS, "gateway (embedded)")
# The binaries measured: the plain release builds, or those GATEWAY_BIN and PASSTHROUGH_BIN name
# (see `chosen_binary`); set by `main`.
PLAIN_BIN = ROOT / "target/release/animal-store"
PLAIN_PASS = ROOT / "target/release/passthrough"
BIN = PLAIN_BIN
PASS = PLAIN_PASS
# The run's temporary directory, made by `main` (importing this module, as bench/test_run.py
# does, makes nothing).
WORK = None
PROCS = []
BODY = '[{"id":1,"name":"Rex","categoryId":1,"status":"available"}]'


def log(*args):
    print(*args, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, proc=None):
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                sys.exit(f"a process exited early: {proc.args}")
            time.sleep(0.05)
    sys.exit(f"port {port} never opened")


def start(cpu, argv, name, env=None):
    out = open(WORK / f"{name}.log", "ab")
    proc = subprocess.Popen(["taskset", "-c", str(cpu), *map(str, argv)], stdout=out,
                            stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                            start_new_session=True)
    PROCS.append(proc)
    return proc


def stop(proc):
    """Stops `proc`'s process group: SIGTERM, then SIGKILL after 20 s. True when it was killed."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
    return False


class PartFailed(Exception):
    """A part could not measure what it is for; the parts measured before it are still reported."""


def cleanup():
    for p in PROCS:
        try:
            stop(p)
        except ProcessLookupError:
            pass
    shutil.rmtree(WORK, ignore_errors=True)


def proxy_pid(proc):
    """The pid doing the work: taskset execs, so it is the Popen's own."""
    return proc.pid


def cpu_times(pid):
    """User and kernel CPU seconds of a process (all its threads)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def over_tree(pid, read):
    """`read` of a process and of each of its children, and theirs (nginx and HAProxy work in
    forked workers); a child that is gone meanwhile is left out."""
    values = [read(pid)]
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids = task / "children"
        if kids.exists():
            for kid in kids.read_text().split():
                try:
                    values += over_tree(int(kid), read)
                except FileNotFoundError:
                    pass
    return values


def tree_cpu_times(pid):
    """User and kernel CPU seconds of a process and its children."""
    user, kernel = zip(*over_tree(pid, cpu_times))
    return sum(user), sum(kernel)


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def children_rss_kib(pid):
    """RSS of a process and its children."""
    return sum(over_tree(pid, rss_kib))


# ---------------------------------------------------------------- load generators

def wrk(url, key=None, conns=CONN, dur=DUR, script="get.lua"):
    env = {**os.environ, "KEY": key or ""}
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{dur}s", "--latency",
                          "-s", str(BENCH / script), url], capture_output=True, text=True, env=env,
                         check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    value, unit = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()
    p99 = float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    total = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"rps": rps, "p99": p99, "requests": total, "non2xx": int(non2xx.group(1)) if non2xx else 0}


def oha(url, rate, key, dur=DUR):
    out = subprocess.run(["taskset", "-c", "1", "oha", "-z", f"{dur}s", "-q", str(rate),
                          "--latency-correction", "-c", str(CONN), "--no-tui",
                          "--output-format", "json", "-H", f"Authorization: Bearer {key}", url],
                         capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    pct = data["latencyPercentiles"]
    return {"p50": pct["p50"] * 1000, "p99": pct["p99"] * 1000,
            "rps": data["summary"]["requestsPerSec"], "ok": data["summary"]["successRate"]}


def median_spread(values):
    return statistics.median(values), min(values), max(values)


def round_spreads(rows):
    """Each contender's closed-loop rounds: their range as a fraction of their median req/s."""
    spreads = {}
    for name, runs in rows.items():
        median, lo, hi = median_spread([r["rps"] for r in runs])
        spreads[name] = (hi - lo) / median
    return spreads


def parse_max_spread(value):
    """MAX_SPREAD's value: None when unset or empty (the run always goes on), else a fraction
    above 0 such as 0.10; anything else is refused with a message saying so."""
    if not value:
        return None
    try:
        fraction = float(value)
    except ValueError:
        fraction = math.nan
    if not (math.isfinite(fraction) and fraction > 0):
        raise ValueError(f"MAX_SPREAD must be a fraction above 0 such as 0.10, not {value!r}")
    return fraction


# What each variable names, and the plain release build measured without it.
BINARIES = {"GATEWAY_BIN": ("animal-store", PLAIN_BIN), "PASSTHROUGH_BIN": ("passthrough", PLAIN_PASS)}


def chosen_binary(variable, value):
    """The binary measured by `variable`'s `value`: GATEWAY_BIN names the `animal-store` measured
    as the gateway, `serve` and the backend, PASSTHROUGH_BIN the pass-through, such as the
    profile-guided builds of `bench/pgo.sh`; the plain release build when unset or empty. A path
    that is not an executable file is refused with a message saying so."""
    what, plain = BINARIES[variable]
    if not value:
        return plain
    path = Path(value).resolve()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ValueError(f"{variable} must name an executable {what}, not {value!r}")
    return path


def shown(path):
    """`path` as a report shows it: relative to the repository when it is inside it."""
    try:
        return path.relative_to(ROOT)
    except ValueError:
        return path


def gated(rows):
    """The rows of `rows` whose spread MAX_SPREAD judges: those named in GATED, in its order."""
    return {name: rows[name] for name in GATED if name in rows}


def widest_reaching(spreads, max_spread):
    """The contender whose spread is widest, with that spread, when it reaches `max_spread`;
    else None (always None without a `max_spread` or any contender)."""
    if max_spread is None or not spreads:
        return None
    widest = max(spreads, key=spreads.get)
    return (widest, spreads[widest]) if spreads[widest] >= max_spread else None


def too_noisy(rows, max_spread):
    """Whether a run stops after its closed-loop rounds, writing nothing: the message saying why
    when any contender's rounds spread by `max_spread` of their median req/s or more
    (MAX_SPREAD=0.10 is the rule a run of record must meet), else None. Without a `max_spread`
    the run always goes on; its spread is reported either way."""
    found = widest_reaching(round_spreads(rows), max_spread)
    if found is None:
        return None
    widest, spread = found
    return (f"too noisy to go on: the rounds of {widest} spread by {spread:.1%} of their "
            f"median (MAX_SPREAD={max_spread:g}); nothing written")


def bound_to_be_too_noisy(rows, max_spread):
    """Whether the rounds so far already make `too_noisy`'s stop certain, so the run can stop
    before its last round: the message saying why, else None. However the rounds end, the median
    of a contender's rounds is at most the fastest of them, and adding rounds can only raise the
    fastest and lower the slowest, so its final spread of the median is at least (fastest -
    slowest) / fastest of its rounds so far. Without a `max_spread` the run always goes on."""
    bound = {}
    for name, runs in rows.items():
        if runs:
            _, slowest, fastest = median_spread([r["rps"] for r in runs])
            bound[name] = (fastest - slowest) / fastest
    found = widest_reaching(bound, max_spread)
    if found is None:
        return None
    widest, spread = found
    return (f"too noisy to go on: the rounds of {widest} already spread by {spread:.1%} "
            f"of their fastest, so their spread of the median cannot end below "
            f"MAX_SPREAD={max_spread:g}; nothing written")


# ---------------------------------------------------------------- contenders

class Upstream:
    """A trivial nginx upstream on CPU 1: 200 with a one-pet JSON array, keep-alive forever."""

    def __init__(self):
        self.port = free_port()
        d = WORK / "upstream"
        d.mkdir()
        (d / "nginx.conf").write_text(f"""
worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;
events {{ worker_connections 20000; }}
http {{ access_log off; keepalive_requests 100000000; keepalive_timeout 300s;
  server {{ listen 127.0.0.1:{self.port};
    location / {{ default_type application/json; return 200 '{BODY}'; }} }} }}""")
        self.proc = start(1, ["nginx", "-c", d / "nginx.conf", "-g", "daemon off;"], "upstream")
        wait_port(self.port, self.proc)


def nginx_proxy(upstream, tls=None, wrap=()):
    """nginx in front of `upstream`; under `wrap` (a command prefix such as valgrind) it runs as
    one process (`master_process off`), so that the prefix sees the worker."""
    port = free_port()
    d = WORK / f"nginx-{port}"
    d.mkdir()
    listen = f"listen 127.0.0.1:{port}" + (" ssl http2" if tls else "")
    certs = f"ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]}; ssl_protocols TLSv1.2 TLSv1.3;" if tls else ""
    (d / "nginx.conf").write_text(("master_process off;" if wrap else "") + f"""
worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log; worker_rlimit_nofile 19000;
events {{ worker_connections 18000; }}
http {{ access_log off; keepalive_requests 100000000;
  limit_req_zone $http_authorization zone=keys:10m rate=100000000r/s;
  upstream up {{ server 127.0.0.1:{upstream.port}; keepalive 64; }}
  server {{ {listen}; {certs}
    location = /v1/docs/ {{ return 308 /v1/docs; }}
    location /v1/ {{ limit_req zone=keys burst=100000000 nodelay;
      proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header Authorization "";
      proxy_set_header X-Forwarded-For $remote_addr; proxy_pass http://up; }} }} }}""")
    proc = start(0, [*wrap, "nginx", "-c", d / "nginx.conf", "-g", "daemon off;"], f"nginx-{port}")
    wait_port(port, proc)
    return proc, port


def haproxy_proxy(upstream, wrap=()):
    port = free_port()
    cfg = WORK / f"haproxy-{port}.cfg"
    cfg.write_text(f"""
global
  nbthread 1
  maxconn 9900
defaults
  mode http
  timeout client 300s
  timeout server 300s
  timeout connect 5s
  http-reuse always
frontend fe
  bind 127.0.0.1:{port}
  stick-table type string len 128 size 1m expire 60s store http_req_rate(60s)
  http-request track-sc0 req.hdr(Authorization)
  http-request deny deny_status 429 if {{ sc_http_req_rate(0) gt 100000000 }}
  http-request del-header Authorization
  default_backend be
backend be
  server up 127.0.0.1:{upstream.port} maxconn 1000
""")
    proc = start(0, [*wrap, "haproxy", "-f", cfg, "-db"], f"haproxy-{port}")
    wait_port(port, proc)
    return proc, port


def passthrough(upstream, wrap=(), kept=False):
    """The bare pass-through; with `kept`, its thread keeps idle upstream connections as the
    gateway's do, instead of pingora's pool (`vendor/README.md`)."""
    port = free_port()
    proc = start(0, [*wrap, PASS, f"127.0.0.1:{port}", f"127.0.0.1:{upstream.port}",
                     *(["--kept-upstreams"] if kept else [])], f"passthrough-{port}")
    wait_port(port, proc)
    return proc, port


def bench_config(extra=""):
    path = WORK / f"config-{len(list(WORK.glob('config-*')))}.toml"
    path.write_text(f"[gateway]\nkey_refresh_ms = 200\n{extra}\n")
    return path


def gateway(upstream_port, data, extra_args=(), config=None, cpu=0, wrap=()):
    port, admin = free_port(), free_port()
    config = config or bench_config()
    proc = start(cpu, [*wrap, BIN, "gateway", "--config", config, "--data-dir", data, "--listen", f"127.0.0.1:{port}",
                       "--admin-listen", f"127.0.0.1:{admin}", "--backend-listen",
                       f"127.0.0.1:{upstream_port}", *extra_args], f"gateway-{port}",
                 env={"RUST_LOG": "warn"})
    wait_port(port, proc)
    wait_port(admin, proc)
    return proc, port


def make_key(data, *args, config=None):
    config = config or bench_config()
    return subprocess.run([BIN, "keys", "create", "--config", config, "--data-dir", data, *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def redis_server():
    port = free_port()
    d = WORK / f"redis-{port}"
    d.mkdir()
    proc = start(1, ["redis-server", "--bind", "127.0.0.1", "--port", port, "--dir", d, "--save", "",
                     "--appendonly", "no"], f"redis-{port}")
    wait_port(port, proc)
    return proc, f"redis://127.0.0.1:{port}"


ENTERPRISE = ("--plan", "enterprise", "--per-minute", "1000000000000", "--per-day", "1000000000000")


# ---------------------------------------------------------------- parts

def part_get(upstream, results):
    log("== get: closed loop, GET with a valid key")
    data = WORK / "gw-data"
    key = make_key(data, *ENTERPRISE)
    redis_proc, redis_url = redis_server()
    rkey = make_key(WORK / "cli", *ENTERPRISE, "--redis-url", redis_url)
    lower_data = WORK / "gw-lower"
    lower_key = make_key(lower_data, *ENTERPRISE)
    contenders = {
        "direct": (None, upstream.port),
        "nginx": nginx_proxy(upstream),
        "haproxy": haproxy_proxy(upstream),
        "pingora pass-through": passthrough(upstream),
        KEPT_PASS: passthrough(upstream, kept=True),
        "gateway (embedded)": gateway(upstream.port, data),
        "gateway (redis)": gateway(upstream.port, WORK / "gw-redis-a", ["--redis-url", redis_url]),
        "gateway (header_case = lower)": gateway(upstream.port, lower_data,
                                                 config=bench_config('header_case = "lower"')),
    }
    keys = {name: rkey if "redis" in name else lower_key if "lower" in name else key for name in contenders}
    second = gateway(upstream.port, WORK / "gw-redis-b", ["--redis-url", redis_url])
    time.sleep(1.5)  # keys loaded, heartbeats seen
    rows = {name: [] for name in [*contenders, "2 gateways (redis)"]}

    def closed_loop(name):
        """One run of wrk against one contender after a warm-up, with its CPU time per request."""
        proc, port = contenders[name]
        wrk(f"http://127.0.0.1:{port}/v1/pets", keys[name], dur=1)  # warm-up
        before = tree_cpu_times(proc.pid) if proc else (0, 0)
        r = wrk(f"http://127.0.0.1:{port}/v1/pets", keys[name])
        r["cpu_us"] = r["user_us"] = r["kernel_us"] = None
        if proc:
            user, kernel = ((after - b) / r["requests"] * 1e6
                            for after, b in zip(tree_cpu_times(proc.pid), before))
            r.update(cpu_us=user + kernel, user_us=user, kernel_us=kernel)
        return r

    def two_gateways(dur):
        """wrk against the two gateways on one Redis at once, half the connections each."""
        ports = [contenders["gateway (redis)"][1], second[1]]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(wrk, f"http://127.0.0.1:{p}/v1/pets", rkey, CONN // 2, dur) for p in ports]
            return [f.result() for f in futs]

    names = list(rows)
    for rnd in range(ROUNDS):
        order = names if rnd % 2 == 0 else list(reversed(names))
        for name in order:
            if name == "2 gateways (redis)":
                two_gateways(1)  # the warm-up every contender gets
                with_threads = two_gateways(DUR)
                r = {"rps": sum(x["rps"] for x in with_threads), "p99": max(x["p99"] for x in with_threads),
                     "requests": sum(x["requests"] for x in with_threads),
                     "non2xx": sum(x["non2xx"] for x in with_threads), "cpu_us": None}
            else:
                r = closed_loop(name)
            if r["non2xx"]:
                sys.exit(f"{name}: {r['non2xx']} non-2xx responses")
            rows[name].append(r)
            log(f"  round {rnd + 1} {name}: {r['rps']:.0f} req/s, p99 {r['p99']:.2f} ms"
                + (f", {r['cpu_us']:.1f} us CPU/request" if r.get("cpu_us") else ""))
            stop_message = bound_to_be_too_noisy(gated(rows), MAX_SPREAD)
            if stop_message:
                sys.exit(stop_message)
    stop_message = too_noisy(gated(rows), MAX_SPREAD)
    if stop_message:
        sys.exit(stop_message)
    # Rounds of eight contenders spread the two of the pass-through target over minutes, in which
    # the shared machine's speed drifts; pairs run back to back compare them under the same load.
    pairs = {name: list(rows[name]) for name in FLOOR_PAIR}
    for rnd in range(PAIR_ROUNDS):
        for name in FLOOR_PAIR if rnd % 2 else reversed(FLOOR_PAIR):
            r = closed_loop(name)
            if r["non2xx"]:
                sys.exit(f"{name}: {r['non2xx']} non-2xx responses")
            pairs[name].append(r)
            log(f"  pair {rnd + 1} {name}: {r['rps']:.0f} req/s, {r['cpu_us']:.1f} us CPU/request")
    results["get"] = rows
    results["floor_pairs"] = pairs
    results["get_procs"] = {n: c for n, c in contenders.items()}
    results["keys"] = keys
    stop(second[0])
    results["_stop_later"] = [redis_proc]


def part_open(upstream, results):
    log("== open: latency at fixed offered rates (oha --latency-correction)")
    contenders = results["get_procs"]
    nginx_max = statistics.median(r["rps"] for r in results["get"]["nginx"])
    rates = [int(nginx_max * f) for f in (0.25, 0.5, 0.75)]
    # A p99 of one 8 s run moves with a single stall of the machine: every contender runs every
    # rate once a round, in alternating order as in the closed loop, and the rounds' medians are
    # reported with their range.
    runs = {name: {rate: [] for rate in rates} for name in contenders}
    names = list(contenders)
    for rnd in range(ROUNDS):
        for name in names if rnd % 2 == 0 else list(reversed(names)):
            _, port = contenders[name]
            key = results["keys"][name]
            for rate in rates:
                r = oha(f"http://127.0.0.1:{port}/v1/pets", rate, key)
                runs[name][rate].append(r)
                log(f"  round {rnd + 1} {name} at {rate}/s: p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, "
                    f"achieved {r['rps']:.0f}/s")
    rows = {name: [{"rate": rate,
                    "p50": statistics.median(r["p50"] for r in by_rate[rate]),
                    "p99": statistics.median(r["p99"] for r in by_rate[rate]),
                    "p99_range": (min(r["p99"] for r in by_rate[rate]), max(r["p99"] for r in by_rate[rate]))}
                   for rate in rates]
            for name, by_rate in runs.items()}
    # The p99 target compares two runs' tails at one rate, and a stall of the machine in either
    # run decides a single pair: nginx and the gateway run there TARGET_ROUNDS more times, in
    # alternating pairs, and the target is read from every run of the two at that rate.
    half = rates[1]
    target = {name: list(runs[name][half]) for name in TARGET_PAIR}
    for rnd in range(TARGET_ROUNDS):
        for name in TARGET_PAIR if rnd % 2 == 0 else reversed(TARGET_PAIR):
            _, port = contenders[name]
            r = oha(f"http://127.0.0.1:{port}/v1/pets", half, results["keys"][name])
            target[name].append(r)
            log(f"  target round {rnd + 1} {name} at {half}/s: p99 {r['p99']:.2f} ms, achieved {r['rps']:.0f}/s")
    results["open"] = {"rates": rates, "rows": rows, "runs": runs, "target": target}
    plot(results["open"], BENCH / "latency.svg")


# One colour a contender's line: ten, for the eight the open loop measures and room for two more.
PLOT_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf"]


def plot(open_results, path):
    """p99 latency (log scale) against offered load, one line per contender, as a small SVG."""
    import math
    rates = open_results["rates"]
    rows = open_results["rows"]
    w, h, left, bottom = 640, 400, 70, 50
    values = [r["p99"] for series in rows.values() for r in series]
    lo = 10 ** math.floor(math.log10(max(min(values), 0.01)))
    hi = 10 ** math.ceil(math.log10(max(values)))
    xmin, xmax = rates[0] * 0.9, rates[-1] * 1.05
    x = lambda v: left + (v - xmin) / (xmax - xmin) * (w - left - 20)
    y = lambda v: h - bottom - (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (h - bottom - 20)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 20 * len(rows)}" font-family="sans-serif" font-size="12">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="black"/>',
             f'<line x1="{left}" y1="20" x2="{left}" y2="{h - bottom}" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">offered load (requests/s, open loop, oha --latency-correction)</text>',
             f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">p99 latency (ms, log scale)</text>']
    v = lo
    while v <= hi * 1.001:
        parts.append(f'<line x1="{left}" y1="{y(v)}" x2="{w - 10}" y2="{y(v)}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 5}" y="{y(v) + 4}" text-anchor="end">{v:g}</text>')
        v *= 10
    for r in rates:
        parts.append(f'<text x="{x(r)}" y="{h - bottom + 15}" text-anchor="middle">{r}</text>')
    for i, (name, series) in enumerate(rows.items()):
        c = PLOT_COLORS[i % len(PLOT_COLORS)]
        pts = " ".join(f"{x(s['rate']):.1f},{y(s['p99']):.1f}" for s in series)
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
        for s in series:
            parts.append(f'<circle cx="{x(s["rate"]):.1f}" cy="{y(s["p99"]):.1f}" r="3" fill="{c}"/>')
        parts.append(f'<text x="{left}" y="{h + 15 + 20 * i}" fill="{c}">&#9632; {name}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts))


def h2_frame(kind, flags, stream, payload):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def h2_get(key):
    """The client preface, an empty SETTINGS frame and a GET of /v1/pets with the key on stream 1
    (HPACK literals without indexing, so no table is needed)."""
    fields = [(":method", "GET"), (":scheme", "https"), (":path", "/v1/pets"), (":authority", "localhost"),
              ("authorization", f"Bearer {key}")]
    block = b"".join(b"\0" + bytes([len(k)]) + k.encode() + bytes([len(v)]) + v.encode() for k, v in fields)
    return b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, b"") + h2_frame(1, 0x5, 1, block)


async def h2_answer(reader, writer):
    """Reads frames until stream 1 ends, acknowledging the server's settings; the answer must be a
    200 (HPACK's indexed `:status 200`, as both servers encode it)."""
    while True:
        head = await reader.readexactly(9)
        kind, flags = head[3], head[4]
        payload = await reader.readexactly(int.from_bytes(head[:3], "big"))
        if kind == 1 and not payload.startswith(b"\x88"):
            raise RuntimeError(f"not a 200: {payload[:8]!r}")
        if kind == 4 and not flags & 1:
            writer.write(h2_frame(4, 1, 0, b""))
        elif kind == 7:
            raise RuntimeError("GOAWAY before the answer")
        elif kind in (0, 1) and flags & 1:
            return


async def hold_idle(port, key, n, alpn=None):
    """Opens n connections (over TLS with `alpn` if given: "http/1.1" or "h2"), sends one GET with
    the key on each, reads the answer, keeps them."""
    context = None
    if alpn:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        context.set_alpn_protocols([alpn])
    conns = []
    request = f"GET /v1/pets HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n\r\n".encode()
    sem = asyncio.Semaphore(500)

    async def one():
        async with sem:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            if alpn == "h2":
                writer.write(h2_get(key))
                await h2_answer(reader, writer)
            else:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
                await reader.readexactly(length)
            conns.append(writer)
    await asyncio.gather(*(one() for _ in range(n)))
    return conns


def part_idle(upstream, results):
    log(f"== idle: RSS with {IDLE} idle keep-alive connections")
    rows = {}
    for name, (proc, port) in results["get_procs"].items():
        if proc is None:
            continue
        key = results["keys"][name]
        # HAProxy needs two descriptors per allowed connection, and this sandbox allows 20,000.
        n = min(IDLE, 9800) if name == "haproxy" else IDLE
        rows[name] = measure_idle(name, proc, port, key, n)
        time.sleep(1)
    # The target is stated for `serve`, and one measurement moves by several MiB from run to run
    # (how the allocator's pages end up shared between the connections and the requests that
    # opened them): a fresh process per round, the median reported with the range.
    serves = sorted((idle_serve() for _ in range(ROUNDS)), key=lambda row: row[1])
    rows["serve (gateway and backend, shipped configuration)"] = serves[len(serves) // 2]
    results["idle"] = rows
    results["idle_serve_range"] = (serves[0][1], serves[-1][1])


def measure_idle(name, proc, port, key, n, alpn=None):
    """RSS of proc (and its children) before and while it holds n idle connections."""
    before = children_rss_kib(proc.pid)
    loop = asyncio.new_event_loop()
    conns = loop.run_until_complete(hold_idle(port, key, n, alpn))
    time.sleep(1)
    after = children_rss_kib(proc.pid)
    for w in conns:
        w.close()
    loop.run_until_complete(asyncio.sleep(0.5))
    loop.close()
    log(f"  {name}: {before / 1024:.1f} MiB -> {after / 1024:.1f} MiB, {(after - before) / n * 1024:.0f} B per connection")
    return before, after, n


def idle_serve():
    """The memory target is stated for `serve`: the gateway and the backend in one process."""
    config = ROOT / "config/animal-store.toml"
    data = WORK / "serve-data"
    key = make_key(data, *ENTERPRISE, config=config)
    port, admin, back = free_port(), free_port(), free_port()
    proc = start(0, [BIN, "serve", "--config", config, "--data-dir", data, "--listen", f"127.0.0.1:{port}",
                     "--admin-listen", f"127.0.0.1:{admin}", "--backend-listen", f"127.0.0.1:{back}"],
                 "serve", env={"RUST_LOG": "warn"})
    wait_port(port, proc)
    wait_port(back, proc)
    wrk(f"http://127.0.0.1:{port}/v1/pets", key, dur=1)
    time.sleep(1)
    row = measure_idle("serve", proc, port, key, IDLE)
    stop(proc)
    return row


def part_creates(results):
    log("== creates: durable creates straight to the backend")
    rows = {m: [] for m in ("group", "per_request", "none")}
    for rnd in range(ROUNDS):
        for mode in (rows if rnd % 2 == 0 else reversed(list(rows))):
            port = free_port()
            config = WORK / f"backend-{mode}.toml"
            config.write_text(f'[backend]\ncommit = "{mode}"\n')
            proc = start(0, [BIN, "backend", "--config", config, "--data-dir", WORK / f"data-{mode}-{rnd}",
                             "--backend-listen", f"127.0.0.1:{port}"], f"backend-{mode}", env={"RUST_LOG": "warn"})
            wait_port(port, proc)
            r = wrk(f"http://127.0.0.1:{port}/v1/pets", script="create.lua")
            stop(proc)
            rows[mode].append(r)
            log(f"  round {rnd + 1} {mode}: {r['rps']:.0f} creates/s, p99 {r['p99']:.2f} ms")
    results["creates"] = rows


def h2load(url, *args):
    out = subprocess.run(["taskset", "-c", "1", "h2load", *args, url], capture_output=True, text=True).stdout
    m = re.search(r"finished in ([\d.]+)(ms|s), ([\d.]+) req/s", out)
    ok = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded", out)
    if not m:
        sys.exit(f"h2load failed: {out[-500:]}")
    secs = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    return {"rps": float(m.group(3)), "secs": secs, "ok": int(ok.group(1)) if ok else 0, "out": out}


def s_time(port, version, reuse, secs=2):
    """`openssl s_time` on CPU 1: one client making TLS connections to `port` one after another
    for `secs` seconds, each fetching `/v1/docs/` (answered by the proxy itself with a redirect,
    by the gateway as by nginx's configuration: no key, no upstream), over TLS `version` ("1_2" or "1_3"), each a full handshake, or each resuming the first
    connection's session (`reuse`). Returns the connections made."""
    out = subprocess.run(["taskset", "-c", "1", "openssl", "s_time", "-connect", f"127.0.0.1:{port}",
                          f"-tls{version}", "-reuse" if reuse else "-new", "-time", str(secs),
                          "-www", "/v1/docs/"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+) connections in [\d.]+s;", out)
    if not m:
        sys.exit(f"openssl s_time failed: {out[-500:]}")
    return int(m.group(1))


def handshake_cpu(proc, port, version, reuse):
    """The proxy's CPU microseconds (user and kernel, all its processes) per connection of
    [`s_time`], and the connections made."""
    before = tree_cpu_times(proxy_pid(proc))
    n = s_time(port, version, reuse)
    after = tree_cpu_times(proxy_pid(proc))
    return sum(after) - sum(before), n


def certificate():
    """A self-signed ECDSA P-256 certificate for localhost and its key, made once per run."""
    cert, keyf = WORK / "cert.pem", WORK / "key.pem"
    if not cert.exists():
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", keyf, "-out", cert],
                       check=True, capture_output=True)
    return cert, keyf


def gateway_tls(upstream_port, data, wrap=()):
    """The gateway with its HTTPS listener too; returns the process and the HTTPS port."""
    cert, keyf = certificate()
    tls_port = free_port()
    proc, _ = gateway(upstream_port, data, ["--tls-listen", f"127.0.0.1:{tls_port}", "--tls-cert", cert,
                                            "--tls-key", keyf], wrap=wrap)
    wait_port(tls_port, proc)
    return proc, tls_port


# The connections `part_tls` measures one after another with `s_time`: (TLS version, resumed).
HANDSHAKE_KINDS = [("1_3", False), ("1_3", True), ("1_2", False), ("1_2", True)]


def part_tls(upstream, results):
    log("== tls: HTTPS through the gateway and nginx, same certificate")
    data = WORK / "gw-tls"
    key = make_key(data, *ENTERPRISE)
    gw, tls_port = gateway_tls(upstream.port, data)
    ng, ng_port = nginx_proxy(upstream, tls=certificate())
    contenders = {"gateway": (gw, tls_port), "nginx": (ng, ng_port)}
    rows = {n: {"h1": [], "h2": [], "handshakes": [], **{kind: [] for kind in HANDSHAKE_KINDS}}
            for n in contenders}
    auth = ["-H", f"Authorization: Bearer {key}"]
    for rnd in range(ROUNDS):
        for name in (contenders if rnd % 2 == 0 else reversed(list(contenders))):
            _, port = contenders[name]
            url = f"https://127.0.0.1:{port}/v1/pets"
            h1 = wrk(url, key)
            h2 = h2load(url, "-c", str(CONN), "-m", "10", "-D", str(DUR), "-t", "1", *auth)
            hs = h2load(url, "--h1", "-c", "1000", "-n", "1000", "-t", "1", *auth)
            rows[name]["h1"].append(h1["rps"])
            rows[name]["h2"].append(h2["rps"])
            rows[name]["handshakes"].append(hs["ok"] / hs["secs"])
            log(f"  round {rnd + 1} {name}: HTTPS/1.1 {h1['rps']:.0f} req/s, HTTP/2 {h2['rps']:.0f} req/s, "
                f"{hs['ok'] / hs['secs']:.0f} handshakes/s ({hs['ok']} of 1000 ok)")
            for version, reuse in HANDSHAKE_KINDS:
                cpu, n = handshake_cpu(contenders[name][0], port, version, reuse)
                rows[name][(version, reuse)].append(cpu * 1e6 / n)
                log(f"    TLS {version.replace('_', '.')} {'resumed' if reuse else 'full'}: "
                    f"{cpu * 1e6 / n:.0f} us of CPU a connection ({n} connections)")
    results["tls"] = rows
    stop(gw)
    stop(ng)
    if "idle" not in PARTS:
        return
    # Fresh processes, as for `serve`: after the load above, both hold memory they reuse.
    for alpn, label in (("http/1.1", "tls_idle"), ("h2", "h2_idle")):
        log(f"  {IDLE} idle {alpn} connections over TLS (fresh processes)")
        gw, tls_port = gateway_tls(upstream.port, data)
        ng, ng_port = nginx_proxy(upstream, tls=certificate())
        results[label] = {}
        for name, (proc, port) in {"gateway": (gw, tls_port), "nginx": (ng, ng_port)}.items():
            wrk(f"https://127.0.0.1:{port}/v1/pets", key, dur=1)
            time.sleep(1)
            results[label][name] = measure_idle(name, proc, port, key, IDLE, alpn)
        stop(gw)
        stop(ng)


def part_redis_exactness(upstream, results):
    log("== redis: two gateways on one Redis, admitted requests against the limit")
    redis_proc, url = redis_server()
    a, pa = gateway(upstream.port, WORK / "ex-a", ["--redis-url", url])
    b, pb = gateway(upstream.port, WORK / "ex-b", ["--redis-url", url], cpu=1)
    rows = []
    for rnd in range(ROUNDS):
        limit = 5000
        key = make_key(WORK / "ex-cli", "--plan", "enterprise", "--per-minute", str(limit), "--per-day", "1000000",
                       "--redis-url", url)
        time.sleep(1)
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(wrk, f"http://127.0.0.1:{p}/v1/pets", key, CONN // 2, 5) for p in (pa, pb)]
            rs = [f.result() for f in futs]
        sent = sum(r["requests"] for r in rs)
        admitted = sum(r["requests"] - r["non2xx"] for r in rs)
        rows.append((limit, sent, admitted))
        log(f"  round {rnd + 1}: {sent} requests sent across both gateways in 5 s, {admitted} admitted, limit {limit}")
    results["exactness"] = rows
    for p in (a, b, redis_proc):
        stop(p)


# ---------------------------------------------------------------- report

# The gateway's own phases, as callgrind names the poll functions of their futures.
PHASES = {
    "request_filter (address, key, limits, route)": "Gateway as pingora_proxy::proxy_trait::ProxyHttp>::request_filter::{{closure}}",
    "upstream_request_filter (headers upstream)": "Gateway as pingora_proxy::proxy_trait::ProxyHttp>::upstream_request_filter::{{closure}}",
    "response_filter (headers to the client)": "Gateway as pingora_proxy::proxy_trait::ProxyHttp>::response_filter::{{closure}}",
    "upstream_peer": "Gateway as pingora_proxy::proxy_trait::ProxyHttp>::upstream_peer::{{closure}}",
    "logging (metrics)": "Gateway as pingora_proxy::proxy_trait::ProxyHttp>::logging::{{closure}}",
    "of request_filter: SHA-256 of the key, in software under valgrind": "sha2::sha256::compress256",
}


class UnreadableProfile(Exception):
    """A callgrind profile that is missing or that callgrind_annotate refuses."""


def unfinished_profile(path):
    """Why the callgrind profile at `path` is not a whole one, or None when it is: callgrind
    makes its file, empty, at start and writes the profile at exit, header (with its `events:`
    line) first and `totals:` last."""
    size = path.stat().st_size
    if size == 0:
        return "it is empty: callgrind never wrote the profile (it writes at exit)"
    with open(path, "rb") as f:
        head = f.read(4096)
        f.seek(max(0, size - 256))
        tail = f.read()
    if not re.search(rb"^events: ", head, re.MULTILINE):
        return f"its {size:,} bytes have no events line in their header"
    if not re.search(rb"^totals: \d+\s*\Z", tail, re.MULTILINE):
        return f"its {size:,} bytes end before the totals line: cut off while being written"
    return None


def callgrind_functions(path, inclusive):
    """Instructions by function in a callgrind profile, self or inclusive."""
    path = Path(path)
    why = unfinished_profile(path)
    if why:
        raise UnreadableProfile(f"{path.name} is not a whole profile: {why}")
    run = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
                          "--threshold=100", path], capture_output=True, text=True)
    if run.returncode != 0:
        raise UnreadableProfile(f"callgrind_annotate refused {path.name} "
                                f"({path.stat().st_size:,} bytes): {run.stderr.strip()[-300:]}")
    out = run.stdout
    counts = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*?)(?:\s+\[[^\]]*\])?$", line)
        if m:
            counts[m.group(2)] = counts.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return counts


PROFILE_TRIES = 2


def retaken(what, take, tries=PROFILE_TRIES):
    """What `take()` returns, taken again when it raises UnreadableProfile, up to `tries` times in
    all, each refusal logged with why. A run takes eighteen profiles; on 2026-12-02 one came out
    empty (nginx over HTTP/2, killed when it ignored SIGTERM) and ended a 28-minute run."""
    why = []
    for attempt in range(1, tries + 1):
        try:
            return take()
        except UnreadableProfile as e:
            why.append(str(e))
            log(f"  {what}: {e}" + ("; taking it again" if attempt < tries else ""))
    raise PartFailed(f"instr: no readable profile of {what} in {tries} tries: " + " / ".join(why))


# The HTTP/2 contenders of the instructions part, reported in a table of their own.
H2_NGINX, H2_GATEWAY = "nginx, HTTP/2 over TLS", "gateway, HTTP/2 over TLS"


def part_instr(upstream, results):
    log("== instr: user-space instructions per request (callgrind)")
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is needed for PARTS=instr: apt-get install -y valgrind")
    data = WORK / "instr-data"
    key = make_key(data, *ENTERPRISE)
    _, redis_url = redis_server()
    rkey = make_key(WORK / "instr-cli", *ENTERPRISE, "--redis-url", redis_url)
    # Under valgrind a decision takes far longer than the shipped 50 ms it may take in Redis
    # before the gateway decides alone; this bound keeps every decision in Redis.
    redis_config = bench_config("[gateway.redis]\ntimeout_ms = 5000")

    def http1(key):
        def load(port, n):
            subprocess.run(["taskset", "-c", "1", "oha", "-n", str(n), "-c", "8", "--no-tui",
                            "-H", f"Authorization: Bearer {key}", f"http://127.0.0.1:{port}/v1/pets"],
                           capture_output=True, check=True)
        return load

    def http2(port, n):
        h2load(f"https://127.0.0.1:{port}/v1/pets", "-n", str(n), "-c", "8", "-m", "1", "-t", "1",
               "-H", f"Authorization: Bearer {key}")

    starters = {
        "nginx": (lambda wrap: nginx_proxy(upstream, wrap=wrap), http1(key)),
        "haproxy": (lambda wrap: haproxy_proxy(upstream, wrap=wrap), http1(key)),
        "pingora pass-through": (lambda wrap: passthrough(upstream, wrap=wrap), http1(key)),
        KEPT_PASS: (lambda wrap: passthrough(upstream, wrap=wrap, kept=True), http1(key)),
        "gateway (embedded)": (lambda wrap: gateway(upstream.port, data, wrap=wrap), http1(key)),
        "gateway (header_case = lower)": (lambda wrap: gateway(
            upstream.port, data, config=bench_config('header_case = "lower"'), wrap=wrap), http1(key)),
        "gateway (redis)": (lambda wrap: gateway(
            upstream.port, WORK / "instr-redis", ["--redis-url", redis_url], config=redis_config,
            wrap=wrap), http1(rkey)),
        H2_NGINX: (lambda wrap: nginx_proxy(upstream, tls=certificate(), wrap=wrap), http2),
        H2_GATEWAY: (lambda wrap: gateway_tls(upstream.port, data, wrap=wrap), http2),
    }
    counts, copies, phases = {}, {}, {}
    sizes = (INSTR_N, 3 * INSTR_N)
    for name, (starter, load) in starters.items():
        def profile(n, starter=starter, load=load, inclusive=name.startswith("gateway")):
            """One profile of `n` requests read: instructions by function, self and inclusive."""
            out = WORK / f"callgrind-{len(list(WORK.glob('callgrind-*')))}.out"
            proc, port = starter(["valgrind", "--tool=callgrind", "--dump-instr=no",
                                  f"--callgrind-out-file={out}"])
            time.sleep(1.0)
            load(port, n)
            # A proxy killed rather than stopped leaves callgrind's file empty.
            how = "was killed 20 s after SIGTERM" if stop(proc) else f"exited with status {proc.returncode}"
            if not out.exists():
                raise UnreadableProfile(f"callgrind wrote no profile; the proxy {how}")
            try:
                return (callgrind_functions(out, False), callgrind_functions(out, True) if inclusive else None)
            except UnreadableProfile as e:
                raise UnreadableProfile(f"{e}; the proxy {how}") from None

        def per_request(functions, match):
            first, second = functions
            return sum(second[f] - first.get(f, 0) for f in second if match(f)) / (sizes[1] - sizes[0])

        taken = [retaken(f"{name}, {n:,} requests", lambda n=n: profile(n)) for n in sizes]
        own = [t[0] for t in taken]
        counts[name] = per_request(own, lambda f: f == "PROGRAM TOTALS")
        # glibc's copy routines: under callgrind, about one instruction a byte copied. A large
        # copy a request (pingora-proxy's state machine, before its patch) shows here first.
        copies[name] = per_request(own, lambda f: re.search(r":__(memcpy|memmove)_", f) is not None)
        if name.startswith("gateway"):
            # Each function itself, not the closures inside it (their cost is in its own).
            inclusive = [t[1] for t in taken]
            phases[name] = {label: per_request(inclusive, lambda f, fn=fn: f.endswith(fn))
                            for label, fn in PHASES.items()}
        log(f"  {name}: {counts[name]:,.0f} instructions per request")
    results["instr"] = (counts, copies, phases)


def version(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True)
        return (out.stdout + out.stderr).strip().splitlines()[0]
    except (OSError, IndexError):
        return "not installed"


def binaries_measured():
    """The report's lines on which builds were measured, when not both plain release builds."""
    if (BIN, PASS) == (PLAIN_BIN, PLAIN_PASS):
        return []
    gateway = ("the plain release build" if BIN == PLAIN_BIN else f"`{shown(BIN)}` (GATEWAY_BIN)")
    floor = ("the plain release build" if PASS == PLAIN_PASS else f"`{shown(PASS)}` (PASSTHROUGH_BIN)")
    return [f"The `animal-store` measured here (the gateway, `serve` and the backend's creates) is "
            f"{gateway}; the pass-through is {floor}.", ""]


def fell_behind(runs, rate, share=0.99):
    """The open-loop runs of `runs` that served less than `share` of the offered `rate`: the
    proxy, or the machine under it, could not keep up for part of the run, and a queue built
    up that the p99 then reads."""
    return [r for r in runs if r["rps"] < share * rate]


def quietness(rows):
    """The report's sentence on how quiet the machine was: the widest spread of the rows the
    targets are read from (what MAX_SPREAD judges), then the widest of the others."""
    spread = round_spreads(rows)
    judged = gated(spread)
    widest = max(judged, key=judged.get)
    also = "" if widest == "nginx" else f"; nginx {spread['nginx']:.1%}"
    others = {name: s for name, s in spread.items() if name not in judged}
    sentence = (f"How quiet the machine was: the rounds of the contenders the targets are read from "
                f"({'; '.join(judged)}) spread by at most **{spread[widest]:.1%}** of their median "
                f"throughput ({widest}{also}). A quiet machine keeps this to a few percent; a run "
                "whose rounds spread by 10% or more there was shared with other load and is not "
                "worth comparing with another run.")
    if others:
        loudest = max(others, key=others.get)
        sentence += (f" Of the other contenders, {loudest} spread the most, by "
                     f"{others[loudest]:.1%}.")
    return sentence


def report(results, path=BENCH / "results.md"):
    def fmt(values, digits=0):
        m, lo, hi = median_spread(values)
        return f"{m:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"

    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    lines = ["# Benchmark results", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `bash bench/run.sh` "
             f"(DUR={DUR} s per run, ROUNDS={ROUNDS}, CONN={CONN}, IDLE={IDLE}).", "",
             f"Machine: {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Linux {os.uname().release}.",
             f"Versions: {version(['rustc', '--version'])}; {version(['nginx', '-v'])}; "
             f"{version(['haproxy', '-v'])}; {version(['redis-server', '--version'])}; {version(['wrk', '-v'])}; "
             f"{version(['oha', '--version'])}; {version(['h2load', '--version'])}.", "",
             *binaries_measured(),
             "Method: the proxy under test pinned to CPU 0 (one worker: nginx `worker_processes 1`, "
             "HAProxy `nbthread 1`, pingora with one thread, which is the gateway's default when it may use "
             "one CPU, and no work stealing, as the gateway ships); the load generator, the upstream (nginx returning a one-pet JSON array, keep-alive) "
             "and Redis on CPU 1. Access logs off. Every round runs every contender after a 1 s warm-up, in "
             "alternating order; values are medians with the rounds' range in brackets. Reproduce with "
             "`bash bench/run.sh` (environment: DUR, ROUNDS, CONN, IDLE, PARTS, INSTR_N, TARGET_ROUNDS, PAIR_ROUNDS, MAX_SPREAD, GATEWAY_BIN, PASSTHROUGH_BIN).", ""]
    if "get" in results:
        rows = results["get"]
        med = {n: statistics.median(r["rps"] for r in v) for n, v in rows.items()}
        lines += ["## Closed loop: GET /v1/pets with a valid key (wrk -t1 -c%d)" % CONN, "",
                  "| path | req/s | p99 ms | proxy CPU µs/request | of it, user / kernel µs | vs nginx | vs pass-through |",
                  "|---|---|---|---|---|---|---|"]
        for n, v in rows.items():
            cpu_us = [r["cpu_us"] for r in v if r.get("cpu_us")]
            split = "-"
            if cpu_us:
                split = (f"{statistics.median(r['user_us'] for r in v):.1f} / "
                         f"{statistics.median(r['kernel_us'] for r in v):.1f}")
            lines.append(f"| {n} | {fmt([r['rps'] for r in v])} | {fmt([r['p99'] for r in v], 2)} | "
                         f"{fmt(cpu_us, 1) if cpu_us else '-'} | {split} | "
                         f"{med[n] / med['nginx']:.2f} | {med[n] / med['pingora pass-through']:.2f} |")
        lines += ["", "User and kernel time are the kernel's accounting of the proxy's threads "
                  "(`/proc/PID/stat`). Their sum is the scheduler's own measure of the time run; the "
                  "split between them is sampled at each clock tick (100 a second), so one run's "
                  "split is good to about ±0.4 µs a request, its median over the rounds to better."]
        lines += ["", f"Redis store / embedded store throughput: **{med['gateway (redis)'] / med['gateway (embedded)']:.2f}x**; "
                  f"two gateways on one Redis (both on CPU 0, wrk -c{CONN // 2} each): "
                  f"{med['2 gateways (redis)']:,.0f} req/s together.", ""]
        kept_cpu, gw_cpu = (statistics.median(r["cpu_us"] for r in rows[n])
                            for n in (KEPT_PASS, "gateway (embedded)"))
        lines += [f"The gateway keeps idle upstream connections per thread ({KEPT_PASS} does the same): "
                  f"against that pass-through, **{med['gateway (embedded)'] / med[KEPT_PASS]:.2f}x** in "
                  f"throughput and {kept_cpu / gw_cpu:.2f}x in CPU time per request: what the gateway's "
                  f"features cost, {gw_cpu - kept_cpu:.1f} µs a request.", ""]
        floor, gw = (results["floor_pairs"][n] for n in FLOOR_PAIR)
        by_rps = [g["rps"] / f["rps"] for f, g in zip(floor, gw)]
        by_cpu = [f["cpu_us"] / g["cpu_us"] for f, g in zip(floor, gw)]
        rps_f, rps_g = (statistics.median(r["rps"] for r in runs) for runs in (floor, gw))
        cpu_f, cpu_g = (statistics.median(r["cpu_us"] for r in runs) for runs in (floor, gw))
        lines += [f"The gateway against the pass-through over {len(gw)} runs of each (the table's {ROUNDS} "
                  f"and {len(gw) - ROUNDS} more of the two alone, in alternating pairs): "
                  f"**{rps_g / rps_f:.2f}x** in throughput ({rps_g:,.0f} against {rps_f:,.0f} req/s, medians) "
                  f"and **{cpu_f / cpu_g:.2f}x** in CPU time per request ({cpu_g:.1f} against {cpu_f:.1f} µs). "
                  f"Run by run, throughput: "
                  f"{', '.join(f'{x:.2f}x' for x in by_rps)} (median {statistics.median(by_rps):.2f}x); "
                  f"CPU: {', '.join(f'{x:.2f}x' for x in by_cpu)} (median {statistics.median(by_cpu):.2f}x).", ""]
        # Inside a VM another tenant's load is invisible except as spread between rounds.
        lines += [quietness(rows), ""]
    if "open" in results:
        o = results["open"]
        lines += ["## Open loop: latency at fixed offered rates (oha --latency-correction, -c%d)" % CONN, "",
                  "![p99 latency against offered load](latency.svg)", "",
                  "| path | " + " | ".join(f"{r}/s p50 / p99 ms" for r in o["rates"]) + " |",
                  "|---|" + "---|" * len(o["rates"])]
        for n, series in o["rows"].items():
            lines.append(f"| {n} | " + " | ".join(
                f"{s['p50']:.2f} / {s['p99']:.2f} ({s['p99_range'][0]:.2f}-{s['p99_range'][1]:.2f})"
                for s in series) + " |")
        half = o["rates"][1]
        nginx, gw = ([r["p99"] for r in o["target"][n]] for n in TARGET_PAIR)
        pairs = [g / n for g, n in zip(gw, nginx)]
        lines += ["", f"Medians of {ROUNDS} rounds, p99's range in brackets.", "",
                  f"At half of nginx's maximum ({half}/s), over {len(gw)} runs of each (the table's "
                  f"{ROUNDS} and {len(gw) - ROUNDS} more of the two alone, in alternating pairs), the "
                  f"gateway's p99 over nginx's: **{statistics.median(gw) / statistics.median(nginx):.2f}x** "
                  f"({statistics.median(gw):.2f} ms against {statistics.median(nginx):.2f} ms, medians). "
                  f"Pair by pair: {', '.join(f'{x:.2f}x' for x in pairs)}; their median "
                  f"{statistics.median(pairs):.2f}x."]
        behind = {n: fell_behind(o["target"][n], half) for n in TARGET_PAIR}
        lines += [f"Runs that served less than 99% of the offered {half}/s (a queue built up, "
                  "which the p99 then reads): " + "; ".join(
                      f"{n} {len(b)} of {len(o['target'][n])}"
                      + (f" (the slowest {min(r['rps'] for r in b):,.0f}/s)" if b else "")
                      for n, b in behind.items()) + ".", ""]
    if "idle" in results:
        lines += [f"## Memory: {IDLE:,} idle keep-alive connections, each after one GET", "",
                  "| path | connections | RSS before MiB | RSS with the connections MiB | bytes per connection |",
                  "|---|---|---|---|---|"]
        for n, (before, after, count) in results["idle"].items():
            lines.append(f"| {n} | {count:,} | {before / 1024:.1f} | {after / 1024:.1f} | {(after - before) * 1024 / count:,.0f} |")
        low, high = results["idle_serve_range"]
        lines += ["", f"One measurement per proxy; `serve` is the median of {ROUNDS} fresh processes "
                  f"(with the connections: {low / 1024:.1f}-{high / 1024:.1f} MiB).", ""]
    if "creates" in results:
        c = results["creates"]
        g, none = (statistics.median(r["rps"] for r in c[m]) for m in ("group", "none"))
        lines += ["## Durable creates: POST /v1/pets straight to the backend (backend on CPU 0)", "",
                  "| backend.commit | creates/s | p99 ms |", "|---|---|---|"]
        for m, v in c.items():
            lines.append(f"| {m}{' (not durable)' if m == 'none' else ''} | {fmt([r['rps'] for r in v])} | {fmt([r['p99'] for r in v], 2)} |")
        lines += ["", f"Group commit reaches **{g / none:.2f}x** the creates per second of `commit = \"none\"`.", ""]
    if "tls" in results:
        t = results["tls"]
        lines += ["## HTTPS: the gateway against nginx, same certificate (ECDSA P-256)", "",
                  "| path | HTTPS/1.1 req/s (wrk) | HTTP/2 req/s (h2load -c%d -m10) | full handshakes/s (h2load --h1, 1,000 connections) |" % CONN,
                  "|---|---|---|---|"]
        for n, v in t.items():
            lines.append(f"| {n} | {fmt(v['h1'])} | {fmt(v['h2'])} | {fmt(v['handshakes'])} |")
        gw, ng = t["gateway"], t["nginx"]
        ratio = lambda k: statistics.median(gw[k]) / statistics.median(ng[k])
        lines += ["", f"Gateway / nginx: HTTPS/1.1 {ratio('h1'):.2f}x, HTTP/2 {ratio('h2'):.2f}x, handshakes {ratio('handshakes'):.2f}x.", ""]
        if all(kind in gw for kind in HANDSHAKE_KINDS):
            lines += ["The proxy's CPU (user and kernel) per connection of one request, full and resumed "
                      "handshakes (`openssl s_time -new` and `-reuse`, one client on CPU 1, 2 s each; "
                      "each connection fetches `/v1/docs/`):", "",
                      "| path | " + " | ".join(f"TLS {v.replace('_', '.')} {'resumed' if r else 'full'} us"
                                          for v, r in HANDSHAKE_KINDS) + " |",
                      "|---|" + "---|" * len(HANDSHAKE_KINDS)]
            for n, v in t.items():
                lines.append(f"| {n} | " + " | ".join(fmt(v[kind]) for kind in HANDSHAKE_KINDS) + " |")
            lines.append("")
    for label, what in (("tls_idle", "HTTPS/1.1 keep-alive connections"),
                        ("h2_idle", "HTTP/2 connections (TLS, ALPN h2)")):
        if label not in results:
            continue
        lines += [f"{IDLE:,} idle {what}, each after one GET (fresh processes after 1 s of load, one "
                  "measurement):", "",
                  "| path | RSS before MiB | RSS with the connections MiB | bytes per connection |", "|---|---|---|---|"]
        for n, (before, after, count) in results[label].items():
            lines.append(f"| {n} | {before / 1024:.1f} | {after / 1024:.1f} | {(after - before) * 1024 / count:,.0f} |")
        lines.append("")
    if "exactness" in results:
        lines += ["## Two gateways on one Redis: admitted against the limit under load", "",
                  "A fresh key with a limit of 5,000 a minute, hammered for 5 s through both gateways at once "
                  f"(wrk -c{CONN // 2} on each; gateway A on CPU 0, gateway B on CPU 1).", "",
                  "| round | requests sent | admitted | limit |", "|---|---|---|---|"]
        for i, (limit, sent, admitted) in enumerate(results["exactness"], 1):
            lines.append(f"| {i} | {sent:,} | {admitted:,} | {limit:,} |")
        lines.append("")
    if "instr" in results:
        counts, copies, phases = results["instr"]
        lines += ["## User-space instructions per request (callgrind)", "",
                  f"Each proxy alone under valgrind's callgrind on CPU 0, once for {INSTR_N:,} and once for "
                  f"{3 * INSTR_N:,} GETs with a valid key (oha -n, 8 keep-alive connections); per request is "
                  "the difference of the two totals over the difference in requests, so start-up and "
                  "shutdown cancel out. The same binaries and load give the same counts, within about 2%, however "
                  "busy the machine is. Not counted: the kernel's work (nginx and pingora make the same number of "
                  "system calls per request), nor Redis's for the gateway with the Redis store. "
                  "`rep movsb` copies count one instruction per byte: the copies column is glibc's `memcpy` "
                  "and `memmove`, about the bytes copied.", "",
                  "| proxy | instructions per request | of them, copies | vs nginx | vs pass-through |",
                  "|---|---|---|---|---|"]
        for n, c in counts.items():
            if n not in (H2_NGINX, H2_GATEWAY):
                lines.append(f"| {n} | {c:,.0f} | {copies[n]:,.0f} | {c / counts['nginx']:.2f} | "
                             f"{c / counts['pingora pass-through']:.2f} |")
        lines += ["", f"Over HTTP/2 with TLS, the same certificate (h2load -n, 8 connections, one stream each; "
                  "the handshakes, 8 a run, cancel out like start-up):", "",
                  "| proxy | instructions per request | of them, copies | vs nginx |", "|---|---|---|---|"]
        for n in (H2_NGINX, H2_GATEWAY):
            lines.append(f"| {n} | {counts[n]:,.0f} | {copies[n]:,.0f} | {counts[n] / counts[H2_NGINX]:.2f} |")
        lines += ["", "Where the gateway's own phases spend theirs (each including what it calls), per request:", "",
                  "| phase | " + " | ".join(phases) + " |", "|---|" + "---|" * len(phases)]
        for label in PHASES:
            lines.append(f"| {label} | " + " | ".join(f"{p[label]:,.0f}" for p in phases.values()) + " |")
        if BIN != PLAIN_BIN:
            lines += ["", "A build other than the plain one (GATEWAY_BIN) may inline a phase into its "
                      "caller, where its instructions are then counted: such a phase reads 0 here."]
        lines.append("")
    if "failed" in results:
        lines += ["## Not measured", "",
                  f"The run stopped here, having measured the parts above: {results['failed']}. "
                  "The parts after it did not run.", ""]
    path.write_text("\n".join(lines))
    log("\n".join(lines))


def main():
    global MAX_SPREAD, WORK, BIN, PASS
    try:
        MAX_SPREAD = parse_max_spread(os.environ.get("MAX_SPREAD"))
        BIN = chosen_binary("GATEWAY_BIN", os.environ.get("GATEWAY_BIN"))
        PASS = chosen_binary("PASSTHROUGH_BIN", os.environ.get("PASSTHROUGH_BIN"))
    except ValueError as e:
        sys.exit(str(e))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < IDLE + 1000:
        sys.exit(f"IDLE={IDLE} connections need more than the {hard} open files allowed here")
    for tool in ("wrk", "nginx", "haproxy", "oha", "h2load", "redis-server", "taskset", "openssl"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is needed: see bench/README.md for how to install the benchmark's tools")
    results = {}
    WORK = Path(tempfile.mkdtemp(prefix="animal-bench-"))
    try:
        upstream = Upstream()
        try:
            if any(p in PARTS for p in ("get", "open", "idle")):
                part_get(upstream, results)
            if "open" in PARTS:
                part_open(upstream, results)
            if "idle" in PARTS:
                part_idle(upstream, results)
            if "creates" in PARTS:
                part_creates(results)
            if "tls" in PARTS:
                part_tls(upstream, results)
            if "redis" in PARTS:
                part_redis_exactness(upstream, results)
            if "instr" in PARTS:
                part_instr(upstream, results)
        except PartFailed as e:
            results["failed"] = str(e)
        report(results)
    finally:
        cleanup()
    if "failed" in results:
        sys.exit(f"bench/run.py: {results['failed']}; bench/results.md has what was measured before it")


if __name__ == "__main__":
    main()
