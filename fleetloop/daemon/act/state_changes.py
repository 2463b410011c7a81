"""Which enforced decisions go to ``control.state``: each key's desired state when it changes, and a
periodic refresh (pure; no I/O, no clock: time is the decision's own ``ts_ms``).

``control.decisions`` keeps every decision the engine makes (replay compares against it, byte for
byte; nothing here touches it). ``control.state`` is keyed ``<kind>/<entity>`` and compacted, so a
reader keeps the newest record per key whatever was left out between: a record re-sent unchanged
tells it nothing new. A decision goes to ``control.state`` when

- what it asks for differs from the last record this process sent for its key: the body without
  its explanatory ``inputs`` (weights, states, thresholds, targets, the reason), or the policy's
  hash or mode, or
- this process did not decide the key on the tick before (``tick_id`` is not one more than the last
  decided): its first decision here, after a restart, after a rebalance brought the partition back
  (another owner may have sent something else meanwhile), after boundaries not decided, or
- its refresh slot moved: ``(ts_ms + phase(key)) // refresh_ms`` with ``phase = crc32(key) %
  refresh_ms``, so about one tick's worth of a ``refresh_ms`` period's keys are re-sent each tick,
  staggered, and every key at least once every ``refresh_ms`` plus one tick.

The refresh bounds how old a reader's newest record of a key can be while the daemon decides it
(the fail-static clock of a router counts from there), and repairs a record lost downstream.

The form is on the wire: each such record carries the headers ``fleetloop.state_form: 2`` and
``fleetloop.refresh_ms: <refresh_ms>`` (:func:`fleetloop.schemas.decisions.state_headers`). A
reader that knows them (the router library's follower) keeps a routing decision fresh for its
fail-static TTL *plus* the refresh, since an unchanged pool is not re-sent every tick; one that
does not (or a daemon of the old form, every decision every tick, no headers) reads the same
absolute records as ever, less often. ``refresh_ms`` 0 is the old
form: every enforced decision, no headers.

Breaker records come here already change-only (:mod:`fleetloop.policies.breaker.emission`, which
also shapes ``control.decisions``); this rule leaves out, on ``control.state`` only, the open nodes'
records that repeat themselves tick after tick.
"""

from __future__ import annotations

import zlib
from typing import Any

from fleetloop.schemas.decisions import Decision

# What a key's last record asked for: the body's fields but its inputs, and the policy's hash and mode.
Wanted = tuple[dict[str, Any], str, str]


def _wanted(d: Decision) -> Wanted:
    fields = dict(d.body.__dict__)
    fields.pop("inputs", None)
    return fields, d.policy.hash, d.policy.mode


class StateChanges:
    """The rule (module docstring) over one process's enforced decisions, in the order published."""

    __slots__ = ("_keys", "_newest_ms", "_phases", "_swept_ms", "refresh_ms", "sent", "skipped")

    def __init__(self, refresh_ms: int) -> None:
        self.refresh_ms = refresh_ms
        # key -> (what its last record sent asked for, that record's refresh slot, last tick decided)
        self._keys: dict[str, tuple[Wanted, int, int]] = {}
        self._phases: dict[str, int] = {}
        self._newest_ms = 0
        self._swept_ms = 0
        self.sent = 0
        self.skipped = 0

    def _slot(self, key: str, ts_ms: int) -> int:
        p = self._phases.get(key)
        if p is None:
            p = self._phases[key] = zlib.crc32(key.encode()) % self.refresh_ms
        return (ts_ms + p) // self.refresh_ms

    def publish(self, d: Decision) -> bool:
        """Whether ``d`` (enforced) goes to ``control.state``; remembers it either way."""
        if self.refresh_ms <= 0:
            self.sent += 1
            return True
        key = d.key
        slot = self._slot(key, d.ts_ms)
        wanted = _wanted(d)
        before = self._keys.get(key)
        send = before is None or d.tick_id != before[2] + 1 or slot != before[1] or wanted != before[0]
        if send:
            self._keys[key] = (wanted, slot, d.tick_id)
            self.sent += 1
        else:
            assert before is not None
            self._keys[key] = (before[0], before[1], d.tick_id)
            self.skipped += 1
        self._sweep(d.ts_ms)
        return send

    def _sweep(self, ts_ms: int) -> None:
        """Forget, once a refresh period, the keys not decided for a refresh period (a pool gone,
        a partition handed to another owner): their next decision is sent whatever it says."""
        self._newest_ms = max(self._newest_ms, ts_ms)
        if self._newest_ms - self._swept_ms < self.refresh_ms:
            return
        self._swept_ms = self._newest_ms
        horizon = self._slot("", self._newest_ms - self.refresh_ms)  # phase 0: a plain period count
        for key in [k for k, v in self._keys.items() if v[1] < horizon - 1]:
            del self._keys[key]
            self._phases.pop(key, None)

    def __len__(self) -> int:
        return len(self._keys)
