"""What the interconnect probe returns: one node-wide result for a set of GPUs (issue 44).

The contract between the workload (one worker process per GPU: peer copies, NCCL all-reduce with
checked sums; gloo on a CPU for tests) and everything that reads it (the simulated probe, the
series, the history, the verdicts, ``gpuperfd probe interconnect`` and ``gpuperfd check``).

Bandwidths are bytes per second (SI, as every figure here); the all-reduce's bus bandwidth follows
nccl-tests: ``algbw * 2 (n - 1) / n`` for n ranks, ``algbw = bytes / time``.

Pure Python (no torch): the daemon imports this to store and export results.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gpuperfd.probe_data.dict_fields import refuse_unknown_fields

__all__ = ["InterconnectRequest", "PeerCopy", "AllReduce", "InterconnectResult", "bus_bandwidth", "INTERCONNECT_SCHEMA_VERSION"]

INTERCONNECT_SCHEMA_VERSION = 1


def bus_bandwidth(bytes_per_rank: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: comparable across rank counts (bytes/s)."""
    if seconds <= 0 or ranks < 2:
        raise ValueError(f"bus_bandwidth: needs seconds > 0 and at least 2 ranks (got {seconds}, {ranks})")
    return bytes_per_rank / seconds * 2 * (ranks - 1) / ranks


@dataclass(frozen=True)
class InterconnectRequest:
    """What one interconnect probe run is asked to do (built once from a schedule or CLI flags).

    ``gpus``: the set, by index (None: every GPU of the node); at least two. Sizes are bytes per
    copy and per rank of an all-reduce: a small one (latency) and a large one (bandwidth).
    ``pairs``: the ordered pairs (GPU indices) to copy between (None: every ordered pair of the set);
    a retest of the pairs judged slow names them, with no all-reduce sizes."""

    gpus: tuple[int, ...] | None = None
    pairs: tuple[tuple[int, int], ...] | None = None
    #: 1 GiB: a healthy 4x H100 node's copies scattered 318-389 GB/s between rounds at 256 MiB (below
    #: 85 % of the figure) and 370-396 GB/s at 1 GiB (docs/benchmarks.md, issue 55).
    copy_bytes: int = 1 << 30
    allreduce_bytes: tuple[int, ...] = (1 << 20, 256 << 20)
    repeats: int = 10
    warmup: int = 3
    dtype: str = "bfloat16"
    timeout_seconds: float = 120.0

    def ordered_pairs(self, gpus: tuple[int, ...]) -> list[tuple[int, int]]:
        """The ordered pairs to copy between, in the set's order (ValueError for a pair outside it)."""
        every = [(a, b) for a in gpus for b in gpus if a != b]
        if self.pairs is None:
            return every
        wanted = {(int(a), int(b)) for a, b in self.pairs}
        if wanted - set(every):
            raise ValueError(f"pairs: {sorted(wanted - set(every))} not ordered pairs of GPUs {list(gpus)}")
        return [pair for pair in every if pair in wanted]

    @staticmethod
    def from_dict(body: dict[str, Any]) -> InterconnectRequest:
        """From ``dataclasses.asdict`` (JSON: lists where the fields hold tuples)."""
        values = dict(body)
        if values.get("gpus") is not None:
            values["gpus"] = tuple(values["gpus"])
        if values.get("pairs") is not None:
            values["pairs"] = tuple((int(a), int(b)) for a, b in values["pairs"])
        values["allreduce_bytes"] = tuple(values.get("allreduce_bytes", ()))
        return InterconnectRequest(**values)


@dataclass(frozen=True)
class PeerCopy:
    """Copies from GPU ``src`` to GPU ``dst`` (an ordered pair): median bandwidth over the repeats."""

    src: int
    dst: int
    bytes: int
    bandwidth_bytes_per_second: float
    repeats: int
    cv: float | None = None
    #: the copied bytes read back equal (a checksum of the destination against the source)
    ok: bool = True


@dataclass(frozen=True)
class AllReduce:
    """One all-reduce size over every GPU of the set: latency percentiles and bandwidths."""

    bytes: int
    ranks: int
    latency_p50_seconds: float
    latency_p99_seconds: float
    algorithm_bandwidth_bytes_per_second: float
    bus_bandwidth_bytes_per_second: float
    repeats: int
    #: every rank's result equals the expected sum (checked on every rank)
    sum_ok: bool = True


@dataclass(frozen=True)
class InterconnectResult:
    """The interconnect probe's result for one set of GPUs of a node."""

    gpus: tuple[int, ...]
    status: str  # ok, failed, skipped (STATUSES of probe_data.result)
    failure_reason: str | None = None
    error_message: str | None = None
    backend: str = "nccl"  # nccl on GPUs, gloo on a CPU (tests), simulated
    started_at: float | None = None
    wall_seconds: float | None = None
    copies: tuple[PeerCopy, ...] = ()
    allreduce: tuple[AllReduce, ...] = ()
    energy_joules: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = INTERCONNECT_SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InterconnectResult:
        """From :meth:`to_dict`'s output (JSON), unknown keys refused by name."""
        refuse_unknown_fields(cls, data)
        values = dict(data)
        values["gpus"] = tuple(values.get("gpus", ()))
        values["copies"] = tuple(PeerCopy(**c) for c in values.get("copies", ()))
        values["allreduce"] = tuple(AllReduce(**a) for a in values.get("allreduce", ()))
        return cls(**values)
