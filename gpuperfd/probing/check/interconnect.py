"""``gpuperfd check``'s interconnect step: a short interconnect probe when two or more GPUs are free.

It runs after the per-GPU probes (one holds each GPU at a time: the per-GPU children would see the
workers as a user's job, and the workers them), on the GPUs the check probed and whose locks it
holds, within what is left of the check's deadline (``INTERCONNECT_SHARE`` of ``--timeout`` is kept
for it). It checks that every pair copies and every rank sums right, and gives the figures the
verdict judges (the ``interconnect`` key of the JSON), so only a measurement that can carry a
verdict is made (issue 55):

- copies of 1 GiB, median of 10: on a healthy 4x H100 node 64 MiB copies of 5 repeats scattered
  311-365 GB/s between runs (the 85 % line at 321 sits inside that), 1 GiB copies within a few per
  cent (docs/benchmarks.md); the copies of all 12 pairs of 4 GPUs take under 0.5 s;
- a pair below its figure is measured again (:class:`~gpuperfd.probing.interconnect.executor.RetestingExecutor`):
  only a slowness that reproduces is judged;
- a run disturbed by any other compute process on a GPU of the set (a user's job, another
  daemon's probe child) is no verdict: it is run again after a pause while the deadline allows,
  and is reported ``unknown`` (``skipped``) if it never ran undisturbed.

Its outcome reaches the verdict in two ways: the copies (below), and a wrong copy or sum, charged
by :func:`~gpuperfd.health.interconnect.wrong_sum_rows`: a wrong result (``probe_wrong_result``) on
the GPUs whose own probe gave wrong answers, or, where none did, ``unknown`` on every GPU of the set
(measure again; never a replacement of a GPU whose own probe passed). A run that could not finish is
reported, not judged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from gpuperfd.config import Config
from gpuperfd.device.base import Backend, Device
from gpuperfd.health.evaluate import GpuInputs
from gpuperfd.health.interconnect import wrong_sum_rows
from gpuperfd.probe_data.interconnect import InterconnectRequest, InterconnectResult
from gpuperfd.probing.executors import choose_interconnect_executor
from gpuperfd.probing.interconnect.executor import InterconnectExecutor

__all__ = ["CHECK_REQUEST", "INTERCONNECT_SHARE", "run_interconnect",
           "apply_to_inputs"]

log = logging.getLogger(__name__)

#: Kept for the interconnect step out of ``--timeout`` when two or more GPUs are probed.
INTERCONNECT_SHARE = 0.3
#: Below this many seconds left, the step is not started (workers import torch and NCCL sets up).
MIN_SECONDS = {"cuda": 15.0, "cpu": 6.0, "simulated": 0.5}
#: The check's sizes (module docstring): 1 GiB copies, median of 10; all-reduce at 1 MiB (latency)
#: and 256 MiB (bandwidth).
CHECK_REQUEST = InterconnectRequest(copy_bytes=1 << 30, allreduce_bytes=(1 << 20, 256 << 20), repeats=10, warmup=3)
#: A run disturbed by other work (skipped: preempted, or not idle at its start) is tried again after this pause.
RETRY_PAUSE_SECONDS = 2.0
#: Why a run was skipped that is worth another try within the deadline (other work on a GPU of the set).
DISTURBED = ("preempted", "not_idle", "busy")
CPU_CHECK_REQUEST = InterconnectRequest(copy_bytes=1 << 20, allreduce_bytes=(1 << 12, 1 << 20), repeats=3, warmup=1)


def run_interconnect(config: Config, backend: Backend, devices: Sequence[Device], deadline: float,
                     executor: tuple[InterconnectExecutor, str] | None = None) -> dict[str, Any]:
    """The step on ``devices`` (two or more, their locks held) under ``deadline``: the result's
    dict, or ``{"not_run": why}``. Never raises: a bug is this step's failure, not the check's."""
    try:
        chosen, kind = executor or choose_interconnect_executor(  # a check never creates the state directory
            config, backend, keep_records=config.probes.state_dir.is_dir())
    except Exception as exc:  # noqa: BLE001 - e.g. an executor missing from this build
        log.warning("check: no interconnect executor: %s", exc)
        return {"status": "failed", "failure_reason": "exception", "error_message": f"no interconnect executor: {exc}"}
    left = deadline - time.monotonic()
    if left < MIN_SECONDS.get(kind, 5.0):
        return {"not_run": f"not run: {max(left, 0):.1f} s left of the check's timeout, needs "
                           f"{MIN_SECONDS.get(kind, 5.0):g} s (raise --timeout)"}
    attempts: list[str] = []
    while True:
        body = _run_once(chosen, kind, devices, deadline)
        if body.get("status") != "skipped" or body.get("failure_reason") not in DISTURBED:
            break
        attempts.append(f"{body.get('failure_reason')}: {body.get('error_message')}")
        if deadline - time.monotonic() < MIN_SECONDS.get(kind, 5.0) + RETRY_PAUSE_SECONDS:
            body["error_message"] = (f"not judged: every run was disturbed by other work on a GPU of the set "
                                     f"({len(attempts)} tries; last: {attempts[-1]})")
            break
        log.info("check: interconnect run disturbed (%s); trying again", attempts[-1])
        time.sleep(RETRY_PAUSE_SECONDS)
    if attempts and isinstance(body.get("extra"), dict):
        body["extra"]["disturbed_attempts"] = attempts
    return body


def _run_once(chosen: InterconnectExecutor, kind: str, devices: Sequence[Device], deadline: float) -> dict[str, Any]:
    """One run of the step's request under what is left of ``deadline``; the result's dict."""
    left = deadline - time.monotonic()
    base = CPU_CHECK_REQUEST if kind == "cpu" else CHECK_REQUEST
    request = InterconnectRequest(gpus=tuple(d.index for d in devices), copy_bytes=base.copy_bytes,
                                  allreduce_bytes=base.allreduce_bytes, repeats=base.repeats, warmup=base.warmup,
                                  timeout_seconds=max(1.0, left - 0.5))
    abort = threading.Event()
    timer = threading.Timer(max(0.0, left - 0.5), abort.set)  # the workers' timeout backs this up
    timer.daemon = True
    timer.start()
    try:
        result = chosen.run(devices, request, abort)
    except Exception as exc:  # noqa: BLE001 - as the per-GPU probes: a bug is "could not check"
        log.exception("check: interconnect probe failed")
        return {"status": "failed", "failure_reason": "exception", "error_message": str(exc)}
    finally:
        timer.cancel()
    body = result.to_dict()
    if result.failure_reason == "aborted" and abort.is_set():  # our deadline, not a caller's abort
        body.update(status="failed", failure_reason="timeout",
                    error_message=f"the interconnect probe did not finish within the check's timeout "
                                  f"({left:.0f} s were left for it); every worker was ended")
    return body


def apply_to_inputs(result: dict[str, Any], inputs: dict[int | None, GpuInputs], now: float) -> None:
    """A wrong copy or sum becomes a run of the GPUs it is charged to (``wrong_sum_rows``), put before
    each GPU's own check run (the one-shot rows read the last run: the GPU's own probe); anything else
    leaves the verdict to the per-GPU evidence."""
    if result.get("failure_reason") != "wrong_result":
        return
    parsed = InterconnectResult.from_dict(result)
    runs = {gpu: inputs[gpu].runs for gpu in parsed.gpus if gpu in inputs}
    for gpu, row in wrong_sum_rows(parsed, runs, now).items():
        inputs[gpu].runs.insert(0, row)
