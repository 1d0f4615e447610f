"""Video encoder and decoder utilization (NVENC/NVDEC), where the GPU has them."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class CodecCollector(Collector):
    name = "codec"
    help = "Video encoder and decoder utilization"
    slow = True
    default_interval_seconds = 10.0
    metrics = (
        MetricSpec(
            "gpuperf_codec_utilization_ratio",
            "Video encoder or decoder busy share over the driver's sampling period, by engine (encoder, decoder).",
            labels=("engine",),
        ),
    )

    def read(self, device: Device) -> list[Point]:
        codec = device.codec_utilization()
        return [
            Point("gpuperf_codec_utilization_ratio", ratio, (engine,))
            for engine, ratio in (("encoder", codec.encoder_ratio), ("decoder", codec.decoder_ratio))
            if ratio is not None
        ]
