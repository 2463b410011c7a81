"""Fold by topic and snapshot CPU ms at 10k, median of 10 seconds after 6 (session 11 columns check):
``nice -n 10 .venv/bin/python scripts/fold_split_ab.py <label>`` from each tree alternately."""

import gc
import statistics
import sys
import time

from fleetloop.bench.decide import DAEMON_GEN0
from fleetloop.bench.fleetgen import BASE_TS_MS, make_fleet, outcomes_at, telemetry_at
from fleetloop.core.model.fleet import FleetModel, ModelConfig, snapshot
from fleetloop.daemon.runtime import tune_gc
from fleetloop.schemas.fast import OUTCOME_TWIN, TELEMETRY_TWIN

tune_gc(DAEMON_GEN0)
N = 10000
fleet = make_fleet(N)
model = FleetModel(ModelConfig())
ts = BASE_TS_MS
pt = time.process_time
res = []
for k in range(16):
    ts += 1000
    tel = [TELEMETRY_TWIN.of(x) for x in telemetry_at(fleet, ts)]
    out = [OUTCOME_TWIN.of(o) for o in outcomes_at(fleet, ts, workflow_base=k * N * 2)]
    gc.collect()
    c = pt()
    model.fold_telemetries(tel)
    c1 = pt()
    model.fold_outcomes(out)
    c2 = pt()
    snapshot(model, ts)
    c3 = pt()
    if k >= 6:
        res.append(((c1 - c) * 1e3, (c2 - c1) * 1e3, (c3 - c2) * 1e3))
print(
    sys.argv[1],
    *(f"{n}={statistics.median(r[i] for r in res):.1f}" for i, n in enumerate(["tel", "out", "snap"])),
)
