"""The training run of a profile-guided build (`bash bench/pgo.sh`, which runs this).

Runs the instrumented `animal-store` named by TRAIN_BIN through what its users run, each part
bounded in time, on loopback only, so that its profile counts every path a deployment takes:
`serve` with the shipped configuration (lists, filters and pages, durable creates, the
deprecated get-by-id, bad keys and the pages for clients) over HTTP/1.1, HTTPS/1.1 and HTTP/2;
the gateway alone in front of a trivial nginx upstream, as `bench/run.py` measures it; and the
gateway on a Redis limit store. Then the instrumented pass-through named by TRAIN_PASS before the
same upstream, both ways `bench/run.py` runs it, so that the gateway's floor is built as it is.
Code a profile never saw is treated as cold (inlined less, laid out apart, and partly optimised
for size), which is why each of those paths is here: a path left out may get slower, not just
not faster.

The processes exit on SIGTERM, which is when the instrumented binary writes its profile. Uses
`bench/run.py`'s helpers and tools (wrk, h2load, nginx, redis-server, openssl).
"""

import os
import sys
import tempfile
import time
from pathlib import Path

import run

# Seconds of the main GET loads; every other part is shorter (about 55 s in all).
DUR = int(os.environ.get("TRAIN_DUR", "8"))


def serve(data, config):
    """`serve` with the shipped configuration, HTTPS beside HTTP; returns it and its ports."""
    cert, keyf = run.certificate()
    port, admin, back, tls = (run.free_port() for _ in range(4))
    proc = run.start(0, [run.BIN, "serve", "--config", config, "--data-dir", data,
                         "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
                         "--backend-listen", f"127.0.0.1:{back}", "--tls-listen", f"127.0.0.1:{tls}",
                         "--tls-cert", cert, "--tls-key", keyf], "serve", env={"RUST_LOG": "warn"})
    for p in (port, admin, back, tls):
        run.wait_port(p, proc)
    return proc, port, back, tls


def load(name, url, key, dur, conns=64, script="get.lua"):
    r = run.wrk(url, key, conns=conns, dur=dur, script=script)
    run.log(f"  {name}: {r['requests']} requests, {r['non2xx']} not 2xx")


def main():
    run.BIN = Path(os.environ["TRAIN_BIN"])
    run.PASS = Path(os.environ["TRAIN_PASS"])
    run.WORK = Path(tempfile.mkdtemp(prefix="animal-pgo-"))
    try:
        config = run.ROOT / "config/animal-store.toml"
        data = run.WORK / "serve-data"
        key = run.make_key(data, *run.ENTERPRISE, config=config)
        proc, port, back, tls = serve(data, config)
        time.sleep(1)  # the key is loaded
        base, secure = f"http://127.0.0.1:{port}", f"https://127.0.0.1:{tls}"
        run.log("== serve, shipped configuration")
        load("creates", f"{base}/v1/pets", key, DUR // 2, conns=16, script="create.lua")
        load("lists", f"{base}/v1/pets?limit=20", key, DUR)
        load("filtered pages", f"{base}/v1/pets?status=available&limit=5", key, DUR // 4)
        load("deprecated get-by-id", f"{base}/v1/pets/1", key, DUR // 4)
        load("no such pet", f"{base}/v1/pets/999999999", key, 1, conns=4)
        load("bad keys", f"{base}/v1/pets", "as_0000000000000000_bad", 1, conns=4)
        load("reference page", f"{base}/v1/docs", None, 1, conns=4)
        load("HTTPS/1.1 lists", f"{secure}/v1/pets?limit=20", key, DUR // 2)
        load("HTTPS/1.1 creates", f"{secure}/v1/pets", key, DUR // 4, conns=16, script="create.lua")
        for args in (["-n", "50000", "-c", "16", "-m", "10"], ["-n", "2000", "-c", "200", "-m", "1"]):
            r = run.h2load(f"{secure}/v1/pets?limit=20", *args, "-t", "1",
                           "-H", f"Authorization: Bearer {key}")
            run.log(f"  HTTP/2 lists ({' '.join(args)}): {r['ok']} succeeded")
        run.log("== the gateway alone, before a trivial upstream (as bench/run.py measures it)")
        upstream = run.Upstream()
        gw_data = run.WORK / "gw-data"
        gw_key = run.make_key(gw_data, *run.ENTERPRISE)
        gw, gw_port = run.gateway(upstream.port, gw_data)
        load("GETs", f"http://127.0.0.1:{gw_port}/v1/pets", gw_key, DUR)
        run.log("== the gateway on a Redis limit store, before the backend")
        _, redis_url = run.redis_server()
        redis_key = run.make_key(run.WORK / "redis-cli", *run.ENTERPRISE, "--redis-url", redis_url)
        redis_gw, redis_port = run.gateway(back, run.WORK / "redis-data", ["--redis-url", redis_url])
        time.sleep(1)  # the key is loaded, a heartbeat seen
        load("lists", f"http://127.0.0.1:{redis_port}/v1/pets?limit=20", redis_key, DUR // 2)
        run.log("== the pass-through, before the same upstream")
        passes = []
        for kept, how in ((False, ""), (True, " with kept upstreams")):
            p, pass_port = run.passthrough(upstream, kept=kept)
            load(f"GETs{how}", f"http://127.0.0.1:{pass_port}/v1/pets", gw_key, DUR // 2)
            passes.append((f"the pass-through{how}", p))
        stopping = (("the Redis gateway", redis_gw), ("the gateway", gw), ("serve", proc), *passes)
        for name, p in stopping:
            run.stop(p)  # SIGTERM: each writes its profile as it exits
            if p.returncode != 0:
                sys.exit(f"{name} exited with {p.returncode}: its profile may be missing")
    finally:
        run.cleanup()


if __name__ == "__main__":
    main()
