"""Where ``gpuperfd probe``'s points run, one read-only :func:`~gpuperfd.probing.executors.measure_once`
each through the executor the one choice gives a command (:func:`~gpuperfd.probing.executors.command_executor`),
and their run records."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from gpuperfd.console import ProgressBar
from gpuperfd.probe_data.result import ProbeResult
from gpuperfd.probe_data.spec import ProbeSpec
from gpuperfd.probing.matrix import ProbeOptions, simulate_index

__all__ = ["Points", "write_results"]


class Points:
    """Where the points run, through the daemon's sessions (:func:`~gpuperfd.probing.executors.measure_once`):
    ``--simulate N`` on the simulator's GPUs through its executor (its physics: power, clocks,
    temperature, energy; no torch, no workload), else in a probe child on this host's torch device,
    the GPU under it watched unless ``--no-idle-check``. Read-only: no cap is ever set."""

    def __init__(self, options: ProbeOptions, specs: Sequence[ProbeSpec]) -> None:
        from gpuperfd.probe_data.spec import default_timeout
        from gpuperfd.probing.executors import command_executor

        self.options = options
        self.backend: Any = None
        #: The simulated GPUs by index, or the NVML device of each torch device (None: not watched).
        self.devices: dict[Any, Any] = {}
        self.window = options.measure_seconds or 1.0
        seed = None
        if options.simulate is not None:
            from gpuperfd.config import config_with_flags
            from gpuperfd.device.factory import open_backend

            config = config_with_flags(None, {"simulation.model": options.simulate_model}, simulate=options.simulate)
            self.backend, seed = open_backend(config), config.simulation.seed
            self.devices = {d.index: d for d in self.backend.devices()}
        else:
            os.environ.setdefault("GPUPERFD_PROBE_NICE", "0")  # no exporter to yield to: the child keeps its priority
        self.executor = command_executor(
            self.backend.name if self.backend is not None else "nvml",
            options.timeout or max(default_timeout(s) for s in specs), options.idle_threshold, self.window, seed)

    @property
    def simulated(self) -> bool:
        return self.backend is not None

    def gpu(self, spec: ProbeSpec) -> dict[str, Any] | None:
        """The simulated GPU's identity for the run record (None: a real point's child reports its own)."""
        import dataclasses

        if not self.simulated:
            return None
        info = self.devices[simulate_index(spec, len(self.devices))].info()
        return {k: v for k, v in dataclasses.asdict(info).items() if k != "serial"}

    def run(self, spec: ProbeSpec, bar: ProgressBar, on_progress: Any, abort: Any) -> ProbeResult:
        """One point, read-only at the cap the GPU holds now: no settle (the table's windows are the spec's)."""
        from gpuperfd.probe_data.request import ProbeRequest
        from gpuperfd.probe_data.spec import default_timeout
        from gpuperfd.probing.executors import measure_once

        if self.simulated:  # the spec's parameters (repeats among them): one window per repeat, pooled;
            # the options the simulator does not model ride along, so its result names them
            named = {"variant": spec.variant, "weights_path": spec.weights_path, "dataset_path": spec.dataset_path}
            options = {**spec.params(), **{k: v for k, v in named.items() if v is not None}}
            request = ProbeRequest(spec.probe, spec.preset, options, settle_seconds=0.0)
            device = self.devices[simulate_index(spec, len(self.devices))]
        else:  # every field of the spec, its torch device included
            request = ProbeRequest.from_spec(spec, self.options.timeout or default_timeout(spec))
            device = self._watched(spec, bar)
        return measure_once(self.executor, device, request, abort, on_progress)

    def _watched(self, spec: ProbeSpec, bar: ProgressBar) -> Any:
        """The NVML device under a CUDA point, for the idle check and the watch (None: a CPU point,
        ``--no-idle-check``, or NVML cannot say: run without the check, but say so)."""
        if not spec.is_cuda or self.options.no_idle_check:
            return None
        if spec.device not in self.devices:
            from gpuperfd.device.errors import DriverNotFound

            try:
                self.devices[spec.device] = _nvml_device(spec)
            except DriverNotFound:  # no driver: no CUDA point can run here (exit 3, as every command)
                raise
            except Exception as exc:  # noqa: BLE001 - run without the check, but say so
                bar.write(f"gpuperfd probe: warning: no idle check for {spec.device}: {exc}")
                self.devices[spec.device] = None
        return self.devices[spec.device]

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


def _nvml_device(spec: ProbeSpec) -> Any:
    """The NVML device behind ``spec.device`` for the idle check (CUDA_VISIBLE_DEVICES aware)."""
    from gpuperfd.device.nvml import NvmlBackend

    devices = NvmlBackend(indices=None).devices()
    index = spec.cuda_index or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if index >= len(entries):
            raise RuntimeError(f"device {spec.device}: CUDA_VISIBLE_DEVICES lists only {len(entries)} GPU(s)")
        entry = entries[index]
        if entry.isdigit():
            index = int(entry)
        else:
            for dev in devices:
                if dev.info().uuid.startswith(entry):
                    return dev
            raise RuntimeError(f"device {spec.device}: no GPU matches CUDA_VISIBLE_DEVICES entry {entry!r}")
    if index >= len(devices):
        raise RuntimeError(f"device {spec.device}: NVML sees only {len(devices)} GPU(s)")
    return devices[index]


def write_results(path: str, results: list[ProbeResult], host: str | None = None,
                  labels: dict[str, str] | None = None, gpu: dict[str, Any] | None = None) -> None:
    """Append ``results`` to ``path`` as run records (:func:`gpuperfd.probe_data.record.append_records`)."""
    from gpuperfd.probe_data.record import append_records, build_record

    append_records(path, [build_record(r, "probe", host=host, labels=labels, gpu=gpu) for r in results])
