"""The daemon's settings (:class:`DaemonConfig`) and the tick record's headers.

Every part of the runtime reads its settings here; ``fleetloop run`` builds one from its flags and
environment. Why each default is what it is: ``docs/decisions/runtime.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetloop.core.model.fleet import ModelConfig
from fleetloop.daemon.observe.decode import Door
from fleetloop.kafka_security import Bootstrap
from fleetloop.policies.registry import CompiledPolicy

# Headers of a tick record on control.ticks: its cut (the input offsets it folds, JSON), and for a
# record that stands for boundaries not decided, the reason and the first such tick id.
CUT_HEADER = "fleetloop.cut"
SKIPPED_HEADER = "fleetloop.skipped"
SKIPPED_FROM_HEADER = "fleetloop.skipped_from"
STATE_REFRESH_S = 10.0


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    bootstrap_servers: Bootstrap  # a host:port list, or a KafkaConnection with TLS / SASL settings
    policy: CompiledPolicy
    prefix: str = ""
    group_id: str = "fleetloop"
    client_id: str = "fleetloop"
    follow_policy: str | None = None  # policy name to follow on control.policy (default: the initial's)
    run_ticker: bool = True
    idempotence: bool = True
    # Records one fetch hands the loop at most: read (the client's record objects built, decoded
    # through the door into the shards) in one turn of the loop. 5,000 held it up to 200 ms of
    # its own CPU at 10,000 nodes; 1,000: ~20-40 ms.
    max_batch: int = 1000
    warmup_records: int = 10_000  # history read by a group without a checkpoint (its first start)
    max_tick_hold_s: float = 2.0  # a tick without a cut waits at most this long for its inputs
    checkpoint_interval_s: float = 5.0  # checkpoint a changed shard at most this often
    # ... and, when checkpoints are costly, less often: so the encoding children's CPU stays near
    # this share of one core (the next gap is the last checkpoint's CPU over it), at most
    # ``checkpoint_max_stretch`` times the interval (``checkpoint.gap_s``). A longer gap costs a new
    # owner (a restart, a rebalance) that much more fold-forward of records. 0: no stretch.
    checkpoint_cpu_share: float = 0.05
    checkpoint_max_stretch: float = 6.0
    # The consumer group's session timeout: a member whose heartbeats stop this long loses its
    # partitions (the failover time after a crash). Short, the embedded broker completes a join in
    # about half of it; a large fleet on a busy machine may need longer (its heartbeats come late
    # and the group rebalances over and over). The heartbeat interval is a sixth of it, at most 1 s.
    session_timeout_s: float = 6.0
    # Static membership (KIP-345): a name of this instance, stable across its restarts and unique in
    # the group. A member that restarts under the same name within the session timeout gets its
    # partitions back without a rebalance of the whole group (and a stop leaves none: its
    # partitions wait out the session timeout); pair it with a session timeout longer than a
    # restart. None: dynamic membership, every join and leave a rebalance.
    group_instance_id: str | None = None
    # How long the group waits, in a rebalance, for every member to join again. A member's revoke
    # callback first checkpoints every shard it holds (a fork and seconds of encoding at 10,000
    # nodes on a loaded machine); the client's default is the session timeout (6 s), past which
    # the slow member is dropped from the generation and its late join starts another rebalance.
    # The session timeout still bounds how long a crashed member holds its partitions.
    rebalance_timeout_s: float = 60.0
    # control.state gets each key's decision when it changes and re-sends every key at least this
    # often (fleetloop.daemon.act.state_changes); 0: every enforced decision every tick (the old
    # form). Below the routers' fail-static default (30 s), so a router that does not know the
    # change-only form still finds its routing fresh.
    state_refresh_s: float = STATE_REFRESH_S
    catchup_max_ticks: int = 600  # missed boundaries decided after an outage, per pool; older: skipped
    # ... and fewer when the shard is already slow: when its recent pace (wall seconds per boundary
    # decided) says the catch-up would take longer than this, the newest boundaries that fit it (at
    # least overload_max_ticks) are decided and the older ones skipped. 0: off (catchup_max_ticks
    # alone).
    catchup_budget_s: float = 10.0
    # Overload: a pool with this many boundaries published and not yet decided gets no new tick; once
    # fewer are waiting, the ticker publishes the boundaries it held back as one tick marked skipped
    # ("overload: ...") and the newest boundary. 0: never (every boundary is decided, however late).
    # 2: a shard more than one boundary behind. Each boundary allowed to wait adds one boundary's
    # decide time to how stale the decisions are.
    overload_max_ticks: int = 2
    # At a boundary the ticker waits at most this long for the loop to read every input record the
    # broker had acknowledged then, so a record acknowledged just before the boundary is in its cut
    # (not one tick later); 0: the cut is what was read at the boundary.
    tick_read_wait_s: float = 0.1
    # Cyclic GC: the young generation is collected every this many new container objects (Python's
    # default, 700, runs it every few dozen decoded records: ~25% of ingest CPU, measured by
    # ``fleetloop bench ingest``), and what survives a collection is frozen (freeze_survivors), so
    # a collection walks only the young objects: its pause grows with this figure. 100,000 paused
    # the loop up to 74-100 ms of CPU at 10,000 nodes on a loaded machine, 50,000 up to 88 ms (a
    # young collection found 0 unreachable objects every time); 10,000 walks a fifth as many
    # objects per pause, five times as often. 0 leaves the interpreter's settings alone.
    gc_gen0_threshold: int = 10_000
    door: Door = field(default_factory=Door)  # record size, event-time window around the broker's
    max_policy_version_step: int = 1000  # refuse a policy version further above the active one
    model: ModelConfig = field(default_factory=ModelConfig)  # caps and retention of each shard's model
