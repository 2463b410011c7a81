"""The policy and shadow follower."""

from __future__ import annotations

from collections.abc import Sequence

from fleetloop.daemon.observability import logger
from fleetloop.daemon.runtime.port import Record
from fleetloop.schemas.control import ActivePolicy

log = logger("fleetloop.daemon")


def active_of(records: Sequence[Record], group: str) -> ActivePolicy | None:
    """The newest ActivePolicy for ``group`` among the records of control.policy.active."""
    latest: bytes | None = None
    key = group.encode()
    for r in records:
        if r.key == key and r.value:
            latest = r.value
    if latest is None:
        return None
    try:
        return ActivePolicy.model_validate_json(latest)
    except ValueError:
        log.warning("control.policy.active holds an unreadable record for this group; ignored")
        return None
