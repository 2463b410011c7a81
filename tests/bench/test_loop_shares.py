"""How the benches read a daemon's "loop" log lines back (``loadgen.loop_shares``), and bench
latency's per-process CPU (a daemon with its reaped checkpoint children, the machine's busy time)."""

from __future__ import annotations

import os
from typing import Any

from fleetloop.bench import latency
from fleetloop.bench.loadgen import loop_shares


def test_the_benches_read_a_daemons_loop_lines_back(tmp_path: Any) -> None:
    """The daemon's own log line, as ``fleetloop run`` writes it, parsed into shares of wall time."""
    # Two lines as fleetloop run's console log writes them (copied from a bench's daemon log).
    line = (
        "2026-12-01T17:30:02.963010Z [info     ] loop                           [fleetloop.daemon] "
        "acks=9.00/0.50/7.50 cpu_s=6.0 decide=12.00/5.00/7.00 fetch_held_back=10.00/0.50/0.50 "
        "gc_full=1 gc_max_s=0.25 gc_s=0.3 "
        "runq_s=15.0 ticker_late_s=2.0 ticker_s=1.5 waiting_s=9.0 window_s=30.0\n"
    )
    path = tmp_path / "daemon.log"
    path.write_text("noise loop=1\n" + line + "[info] daemon stopped events_in=3\n" + line)
    shares = loop_shares(str(path))
    assert shares is not None
    assert shares["window_s"] == 60.0
    assert (shares["cpu"], shares["runq"], shares["waiting"]) == (0.2, 0.5, 0.3)
    assert list(shares["phases"]) == ["decide", "fetch_held_back", "acks"]
    assert shares["phases"]["decide"] == 0.4
    assert (shares["gc"], shares["gc_max_s"], shares["gc_full"]) == (0.01, 0.25, 2)
    assert loop_shares(str(tmp_path / "absent.log")) is None


def test_bench_latency_counts_a_process_with_its_reaped_children() -> None:
    pid = os.fork()
    if pid == 0:  # the child burns a little CPU and leaves
        sum(i * i for i in range(3_000_000))
        os._exit(0)
    os.waitpid(pid, 0)
    own = latency._cpu_s(os.getpid())
    with_children = latency._cpu_s(os.getpid(), children=True)
    assert own is not None
    assert with_children is not None
    assert with_children > own
    assert latency._cpu_s(None) is None
    busy = latency._machine_busy_s()
    assert busy is not None
    assert busy > 0


def test_bench_latency_joins_the_daemons_trip_path_lines_to_its_trials(tmp_path: Any) -> None:
    """``latency.trip_path_stages``: a daemon's "trip path" lines (as ``fleetloop run`` writes them)
    joined to the trials by boundary, each stage's earliest over the daemons, ``arrived`` from the
    bench; a trial no daemon traced has no ``path_ms``."""
    line = (
        "2026-12-01T21:00:00.071284Z [info     ] trip path                      [fleetloop.daemon] "
        "acked=71 boundary={b} cut_ready=26 decided=44 folded=26 read_up=15 staged=45 "
        "ticks_acked=65 ticks_read=26 woke=1\n"
    )
    a, b = tmp_path / "d.log.0", tmp_path / "d.log.1"
    a.write_text("noise boundary=5\n" + line.format(b=1000) + line.format(b=2000) + line.format(b=6000))
    b.write_text(line.format(b=2000).replace("acked=71", "acked=60").replace("woke=1", "woke=3"))
    rows: list[dict[str, Any]] = [
        {"boundary_ms": 1000, "after_boundary_ms": 80.0},
        {"boundary_ms": 2000, "after_boundary_ms": 70.0},
        {"boundary_ms": 3000, "after_boundary_ms": 90.0},
        {"boundary_ms": 5000, "after_boundary_ms": 1100.0},  # missed its cut: tripped at 6000
    ]
    stages = latency.trip_path_stages(rows, [str(a), str(b), str(tmp_path / "absent")])
    assert stages["trials_traced"] == 3
    assert stages["trials_at_the_next_boundary"] == 1
    assert rows[3]["path_next_boundary"] is True
    assert rows[3]["path_ms"]["woke"] == 1001
    assert rows[3]["path_ms"]["arrived"] == 1100.0
    assert rows[0]["path_ms"] == {
        "woke": 1, "read_up": 15, "ticks_acked": 65, "ticks_read": 26, "cut_ready": 26,
        "folded": 26, "decided": 44, "staged": 45, "acked": 71, "arrived": 80.0,
    }  # fmt: skip
    assert rows[1]["path_ms"]["acked"] == 60
    assert rows[1]["path_ms"]["woke"] == 1
    assert "path_ms" not in rows[2]
    assert stages["acked"]["max"] == 1071.0
    assert stages["arrived"]["p50"] == 80.0
    assert list(stages)[2:] == [*latency.TRIP_STAGES, "arrived"]
