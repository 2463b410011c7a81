"""Log volume of ``fleetloop run`` through a broker outage (issue 10's before/after figure).

Starts a broker, creates the topics, runs ``fleetloop run --log-format json`` against it, feeds it
telemetry for a few seconds, then takes the broker away for ``--outage-s`` seconds and brings it
back, and counts the lines (and bytes) the daemon wrote to stderr during the outage and after.

- ``--mode kill`` (Apache Kafka only): the broker process is killed and started again on the same
  port and data directory (clients see refused connections: the noisy case).
- ``--mode pause``: the broker process is stopped (SIGSTOP) and continued (SIGCONT); works on both.

``--code-root DIR`` runs another checkout's fleetloop (e.g. the tree before issue 10) with this
environment, so both figures come from the same machine in the same session::

    git archive 21fe25b | tar -x -C /tmp/before
    python scripts/outage_log_volume.py --broker kafka --mode kill --code-root /tmp/before
    python scripts/outage_log_volume.py --broker kafka --mode kill
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer
from fleetloop.daemon.brokers import ensure_topics, free_port, make_broker

FIELDS = {
    "model": "llama-8b",
    "gpu_type": "L40S",
    "weights_state": "warm",
    "interval_ms": 1000,
    "queue_depth": 0,
    "running_requests": 1,
    "kv_cache_used_frac": 0.2,
    "hbm_free_gib": 20.0,
    "gpu_util_frac": 0.5,
    "cost_rate_usd_per_h": 1.0,
}


async def feed(bootstrap: str, seconds: float) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ts = int(time.time() * 1000)  # noqa: TID251 - a script, wall time is the point
            for n in range(3):
                rec = {"ts_ms": ts, "node_id": f"p/{n}", "pool_id": "p", **FIELDS}
                await p.send("fleet.telemetry", orjson.dumps(rec), key=b"p")
            await p.flush()
            await asyncio.sleep(0.5)
    finally:
        await p.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", choices=("tansu", "kafka"), default="kafka")
    ap.add_argument("--mode", choices=("kill", "pause"), default="kill")
    ap.add_argument("--outage-s", type=float, default=20.0)
    ap.add_argument("--after-s", type=float, default=15.0)
    ap.add_argument("--show", action="store_true", help="print the lines written during the outage")
    ap.add_argument("--code-root", help="run fleetloop from this source tree instead of the installed one")
    args = ap.parse_args()
    if args.mode == "kill" and args.broker != "kafka":
        ap.error("--mode kill needs --broker kafka (the embedded broker keeps nothing across a restart)")
    broker = make_broker(args.broker)
    broker.start()
    proc = None
    try:
        asyncio.run(ensure_topics(broker.bootstrap_servers, ""))
        env = dict(os.environ)
        if args.code_root:
            env["PYTHONPATH"] = str(Path(args.code_root).resolve())
        argv = [sys.executable, "-m", "fleetloop.cli.main", "run", "--bootstrap-servers"]
        argv += [broker.bootstrap_servers, "--log-format", "json", "--idempotence", "off"]
        if not args.code_root:
            argv += ["--http-port", str(free_port())]
        cwd = Path(args.code_root).resolve() if args.code_root else Path(__file__).resolve().parents[1]
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, cwd=cwd)
        lines: list[tuple[float, bytes]] = []

        def read() -> None:
            assert proc is not None and proc.stderr is not None
            for line in proc.stderr:
                lines.append((time.monotonic(), line))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        asyncio.run(feed(broker.bootstrap_servers, 8.0))
        bproc = broker._proc
        assert bproc is not None
        t_down = time.monotonic()
        if args.mode == "pause":
            os.kill(bproc.pid, signal.SIGSTOP)
            time.sleep(args.outage_s)
            os.kill(bproc.pid, signal.SIGCONT)
        else:
            argv_b, cwd = list(bproc.args), broker.workdir  # type: ignore[arg-type]
            bproc.kill()
            bproc.wait()
            time.sleep(args.outage_s)
            console = (broker.workdir / "logs" / "kafka.restart.out").open("wb")
            broker._proc = subprocess.Popen(argv_b, cwd=cwd, stdout=console, stderr=subprocess.STDOUT)
        t_up = time.monotonic()
        time.sleep(args.after_s)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        reader.join(5)
        during = [ln for t, ln in lines if t_down <= t < t_up]
        after = [ln for t, ln in lines if t >= t_up]
        if args.show:
            sys.stdout.write(b"".join(during).decode(errors="replace"))
            sys.stdout.write("--- after ---\n")
            sys.stdout.write(b"".join(ln for t, ln in lines if t >= t_up).decode(errors="replace"))
        not_json = 0
        for _, ln in lines:
            try:
                orjson.loads(ln)
            except orjson.JSONDecodeError:
                not_json += 1
        print(
            json.dumps(
                {
                    "code": args.code_root or "this tree",
                    "broker": args.broker,
                    "mode": args.mode,
                    "outage_s": args.outage_s,
                    "lines_during_outage": len(during),
                    "bytes_during_outage": sum(len(x) for x in during),
                    "lines_after_outage": len(after),
                    "lines_total": len(lines),
                    "lines_not_json": not_json,
                    "exit_code": proc.returncode,
                }
            )
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
