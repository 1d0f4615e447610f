#!/usr/bin/env python3
"""Start a simulated gpuperfd fleet and one Prometheus for a demo (docs/fleet-simulation.md).

    .venv/bin/python scripts/fleet.py --nodes 4 --gpus 2 --minutes 10

starts N daemons on simulated H100s (three GPUs degraded on purpose), backfills
a week of healthy probe history, starts Prometheus (from Debian: apt-get install
prometheus) with the repository's rules (timing-accelerated unless
--real-timing), prints the URLs and, every 30 s, the firing alerts. Ctrl-C (or
the end of --minutes) stops every process it started.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuperfd.fleet import Fleet, FleetSpec  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4, help="daemons to start (default 4)")
    parser.add_argument("--gpus", type=int, default=2, help="simulated GPUs per daemon (default 2)")
    parser.add_argument("--model", default="H100", choices=["H100", "H200", "A100"])
    parser.add_argument("--minutes", type=float, default=0, help="stop after this long (default 0: until Ctrl-C)")
    parser.add_argument("--interval", type=float, default=20.0, help="seconds between sweeps of each probe (default 20)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-degrade", action="store_true", help="all GPUs healthy")
    parser.add_argument("--real-timing", action="store_true",
                        help="load the rule files as they are (baselines every 15 min, alerts after 1 h) "
                             "instead of the accelerated copy (2 s intervals, for: 10s)")
    parser.add_argument("--workdir", type=Path, help="keep configs, logs and the TSDB here (default: a temp dir, removed)")
    parser.add_argument("--prometheus", default="prometheus", help="Prometheus binary")
    parser.add_argument("--promtool", default="promtool", help="promtool binary")
    parser.add_argument("--no-alertmanager", action="store_true",
                        help="no Alertmanager (default: deploy/alertmanager/alertmanager.yml, receivers -> a local webhook)")
    parser.add_argument("--shards", type=int, default=0,
                        help="also run N shard Prometheus servers (hashmod) and a global one (default 0)")
    parser.add_argument("--no-pods", action="store_true",
                        help="no GPU owners (default: fake kubelets with pods on three nodes and a Slurm job on node-2; "
                             "needs grpcio and grpcio-tools)")
    return parser.parse_args(argv)


def alert_summary(fleet: Fleet) -> str:
    by_gpu: dict[str, set[str]] = defaultdict(set)
    for alert in fleet.alerts("firing"):
        labels = alert["labels"]
        gpu = fleet.gpu_of(labels)
        where = f"{gpu.node}/gpu{gpu.index} ({gpu.defect or 'healthy'})" if gpu else labels.get("instance", "fleet")
        by_gpu[where].add(labels["alertname"])
    if not by_gpu:
        return "  no alerts firing yet"
    return "\n".join(f"  {where}: {', '.join(sorted(names))}" for where, names in sorted(by_gpu.items()))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        spec = FleetSpec(
            nodes=args.nodes,
            gpus_per_node=args.gpus,
            model=args.model,
            seed=args.seed,
            probe_interval_seconds=args.interval,
            degrade=not args.no_degrade,
            accelerated_rules=not args.real_timing,
            alertmanager=not args.no_alertmanager,
            shards=args.shards,
            pods=not args.no_pods,
        )
    except ValueError as error:
        print(f"fleet.py: {error}", file=sys.stderr)
        return 2
    fleet = Fleet(spec, args.workdir, prometheus=args.prometheus, promtool=args.promtool)
    # SIGTERM ends the demo like Ctrl-C, so the finally below stops every process.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        print("backfilling a week of healthy history and starting the fleet ...", flush=True)
        fleet.start()
        print(fleet.describe(), flush=True)
        print("\nCtrl-C stops everything." + (f" Stopping by itself after {args.minutes:g} min." if args.minutes else ""))
        end = time.monotonic() + args.minutes * 60 if args.minutes else float("inf")
        next_report = time.monotonic() + 30
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            if not all(fleet.running().values()):
                print(f"a process exited: {fleet.running()}", file=sys.stderr)
                return 1
            if time.monotonic() >= next_report:
                next_report += 30
                print(f"\n{time.strftime('%H:%M:%S')} firing alerts:\n{alert_summary(fleet)}", flush=True)
    except KeyboardInterrupt:
        print("\nstopping ...")
    finally:
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
