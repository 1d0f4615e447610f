"""Two-tier Prometheus for a fleet: shard servers that each scrape the targets
Prometheus' ``hashmod`` relabeling gives them and run the per-GPU rules, and a
global server that federates their ``:by_model`` rule outputs and runs
deploy/prometheus/global/recording.yml (docs/scaling.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from gpuperfd.fleet.spec import JOB, FleetSpec

#: What the global tier federates from each shard: the per-model rollups only.
FEDERATE_MATCH = '{__name__=~"gpuperf:.*:by_model"}'


def hashmod(value: str, modulus: int) -> int:
    """Prometheus' ``hashmod`` relabel action: the last 8 bytes of MD5(value), big-endian, mod ``modulus``."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


def shard_config(
    shard: int, shards: int, targets: list[str], rule_files: list[Path], spec: FleetSpec, evaluation_interval: str
) -> dict[str, Any]:
    """Shard ``shard`` of ``shards``: every target listed, only its hashmod share kept (docs/scaling.md)."""
    interval = f"{spec.scrape_interval_seconds:g}s"
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": evaluation_interval,
            "external_labels": {"shard": str(shard)},
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": JOB,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": targets}],
                "relabel_configs": [
                    {"source_labels": ["__address__"], "modulus": shards, "target_label": "__tmp_shard",
                     "action": "hashmod"},
                    {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"},
                ],
            }
        ],
    }


def global_config(shard_targets: list[str], rule_files: list[Path], scrape_interval: str,
                  evaluation_interval: str) -> dict[str, Any]:
    """The global tier: federate the shards' by-model series with their labels (honor_labels)."""
    return {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                   "evaluation_interval": evaluation_interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": "federate-gpuperfd",
                "honor_labels": True,
                # /federate stamps each sample with its rule evaluation time; with those
                # timestamps kept, Prometheus inserts no staleness marker when a series
                # leaves the shard (a cap that lost its last vote), and the global tier
                # would keep summing it for 5 min. Scrape-time stamps make it go at once.
                "honor_timestamps": False,
                "metrics_path": "/federate",
                "params": {"match[]": [FEDERATE_MATCH]},
                "static_configs": [{"targets": shard_targets}],
            }
        ],
    }
