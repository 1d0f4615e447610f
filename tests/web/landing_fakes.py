"""What the landing page's tests render it from: a sampler's readings of N GPUs, and one GPU's row."""

from __future__ import annotations

from gpuperfd.telemetry.collectors.base import Point
from gpuperfd.telemetry.sampler import GpuIdentity, Reading, ReadingStore


class FakeSampler:
    """The readings landing_page needs: each GPU's identity and info (model ``name``, UUID ``uuid``
    with ``{gpu}`` for the index), and its power draw and limit where given."""

    interval_seconds = 1.0

    def __init__(self, gpus: int, name: str = "H100", uuid: str = "GPU-{gpu}",
                 power: tuple[float, float] | None = None) -> None:
        self.store = ReadingStore()
        for gpu in range(gpus):
            self.store.set_identity(GpuIdentity(gpu, uuid.format(gpu=gpu)))
            self.store.put(gpu, "info", Reading((Point("gpuperf_gpu_info", 1.0, (name, "0", "1", "9.0", "sim")),),
                                                True, None, 0, 0))
            if power is not None:
                draw, limit = power
                self.store.put(gpu, "power", Reading((Point("gpuperf_power_draw_watts", draw),
                                                      Point("gpuperf_power_limit_watts", limit)), True, None, 0, 0))


def row(page: str, gpu: int) -> str:
    """The table row of GPU ``gpu``."""
    return page.split(f'data-gpu="{gpu}"', 1)[1].split("</tr>", 1)[0]
