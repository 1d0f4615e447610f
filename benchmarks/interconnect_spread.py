"""How much a healthy node's peer copies scatter, per copy size and repeat count (issue 55).

One process per GPU (torch.multiprocessing), one NCCL group and one gloo group, the interconnect
worker's own copy code (``peer_copies``: host barrier between pairs, events around each copy), run
``--rounds`` times per size. Each round gives each ordered pair the median of its repeats, as the
probe reports it; across rounds this gives the spread a verdict sees. Written to ``--out`` (JSON):
per size and repeats, per pair, the round medians; and a summary (min, max, CV of the round
medians over all pairs, and their min as a share of the expected figure of the link).

Read-only (copies only). Usage, on a node of 2+ GPUs: python3 benchmarks/interconnect_spread.py --out F
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta

SIZES = {"64MiB": 64 << 20, "256MiB": 256 << 20, "1GiB": 1 << 30}


def _rank(rank: int, gpus: list[int], port: int, rounds: int, repeats: list[int], out: str) -> None:
    import torch
    import torch.distributed as dist

    from gpuperfd.probe_child.interconnect.worker import Rank, open_peers, peer_copies
    from gpuperfd.probe_data.interconnect import InterconnectRequest

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    me = Rank(rank, gpus, True)
    torch.cuda.set_device(me.device)
    dist.init_process_group("nccl", rank=rank, world_size=len(gpus), timeout=timedelta(seconds=300),
                            device_id=me.device)
    me.host_group = dist.new_group(backend="gloo")
    open_peers(me)
    me.host_barrier()
    rows: list[dict] = []
    for label, size in SIZES.items():
        for reps in repeats:
            request = InterconnectRequest(gpus=tuple(gpus), copy_bytes=size, repeats=reps, warmup=2)
            t0 = time.perf_counter()
            for r in range(rounds):
                for copy in peer_copies(me, request):
                    rows.append({"size": label, "repeats": reps, "round": r, "pair": f"{copy['src']}->{copy['dst']}",
                                 "gbps": copy["bandwidth_bytes_per_second"] / 1e9, "cv": copy["cv"]})
            if rank == 0:
                print(f"{label} x{reps}: {rounds} rounds in {time.perf_counter() - t0:.1f} s", flush=True)
    gathered: list = [None] * len(gpus)
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump([row for part in gathered for row in part], fh)
    dist.destroy_process_group()


def summarize(rows: list[dict], expected_gbps: float) -> dict:
    out = {}
    for key in sorted({(r["size"], r["repeats"]) for r in rows}, key=lambda k: (SIZES[k[0]], k[1])):
        values = [r["gbps"] for r in rows if (r["size"], r["repeats"]) == key]
        per_pair = {}
        for r in rows:
            if (r["size"], r["repeats"]) == key:
                per_pair.setdefault(r["pair"], []).append(r["gbps"])
        out[f"{key[0]} x{key[1]}"] = {
            "samples": len(values), "min_gbps": round(min(values), 1), "max_gbps": round(max(values), 1),
            "median_gbps": round(statistics.median(values), 1),
            "cv_all": round(statistics.pstdev(values) / statistics.fmean(values), 4),
            "min_share_of_expected": round(min(values) / expected_gbps, 3),
            "min_share_of_node_median": round(min(values) / statistics.median(values), 3),
            "worst_pair_cv": round(max(statistics.pstdev(v) / statistics.fmean(v) for v in per_pair.values()), 4),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, nargs="+", default=[5, 10])
    args = parser.parse_args()
    import torch
    import torch.multiprocessing as mp

    from gpuperfd.device.interconnect_figures import NVLINK_BYTES_PER_SECOND_PER_LINK, COPY_EFFICIENCY

    gpus = list(range(torch.cuda.device_count()))
    if len(gpus) < 2:
        print("needs 2+ GPUs", file=sys.stderr)
        return 2
    raw = args.out + ".rows.json"
    mp.spawn(_rank, args=(gpus, 29533, args.rounds, args.repeats, raw), nprocs=len(gpus), join=True)
    rows = json.load(open(raw))
    expected = 18 * NVLINK_BYTES_PER_SECOND_PER_LINK * COPY_EFFICIENCY / 1e9
    body = {"gpus": len(gpus), "name": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "rounds": args.rounds, "expected_gbps": round(expected, 1), "summary": summarize(rows, expected),
            "rows": rows}
    with open(args.out, "w") as fh:
        json.dump(body, fh, indent=1)
    os.unlink(raw)
    print(json.dumps(body["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
