"""Report input from Prometheus: ``/api/v1/query_range`` on the gpuperf_probe_* gauges.

The probe gauges hold the latest result per (gpu, probe, preset, power_cap) and
keep their value until the next run, so a range query sees each run as a stretch
of equal samples. Every change of (throughput, energy per unit, power) in one
series starts a new :class:`~gpuperfd.report.records.Run` at the sample's time.
GPU model and driver come from ``gpuperf_gpu_info``; the node is the ``node``
label when the scrape config adds one, else ``instance``.

What Prometheus cannot give: per-cap latency percentiles (the latency
histograms only observe runs at the operator's cap, see docs/metrics.md) and
batch sizes (not a label; the preset's default is used). Use history files for those.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from gpuperfd.probe_data.kinds import work_unit
from gpuperfd.report.records import (
    GpuId,
    Loaded,
    ReportError,
    Run,
    default_batch_size,
)

RATE = "gpuperf_probe_work_units_per_second"
ENERGY = "gpuperf_probe_energy_per_unit_joules"
POWER = "gpuperf_probe_average_power_watts"
BUSY = "gpuperf_probe_gpu_busy_ratio"
INFO = "gpuperf_gpu_info"
#: Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS = 10_000
MIN_STEP = 15.0

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    match = _DURATION.match(text.strip())
    if not match:
        raise ReportError(f"{text!r} is not a duration (e.g. 30s, 15m, 6h, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_time(text: str, now: float | None = None) -> float:
    """Unix seconds, RFC 3339 / ISO 8601 (``2025-06-01T12:00:00Z``), ``now`` or ``now-6h`` / ``-6h``."""
    now = time.time() if now is None else now
    value = text.strip()
    if value == "now":
        return now
    relative = value[3:] if value.startswith("now") else value
    if relative.startswith("-") and _DURATION.match(relative[1:]):
        return now - parse_duration(relative[1:])
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ReportError(f"{text!r} is not a time (unix seconds, RFC 3339, now, now-6h)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def default_step(start: float, end: float) -> float:
    return max(MIN_STEP, math.ceil((end - start) / MAX_POINTS))


Fetch = Callable[[str], Any]


#: An answer larger than this is refused rather than held in memory (10,000 points x a few hundred series).
MAX_ANSWER_BYTES = 512 * 1024 * 1024


def check_base_url(base_url: str) -> None:
    """ReportError unless ``base_url`` is an http(s) URL with a host (urllib would try FTP or a file, or
    raise a bare ValueError)."""
    try:
        parts = urllib.parse.urlsplit(base_url)
        parts.port  # noqa: B018 (raises ValueError on a port that is not a number)
    except ValueError as exc:
        raise ReportError(f"--prometheus {base_url!r} is not a URL ({exc}); e.g. http://prometheus:9090") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ReportError(f"--prometheus {base_url!r}: expected an http:// or https:// URL with a host, "
                          "e.g. http://prometheus:9090")


def _fetch_json(url: str, timeout: float = 30.0) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (operator-given URL)
        body = response.read(MAX_ANSWER_BYTES + 1)
    if len(body) > MAX_ANSWER_BYTES:
        raise ValueError(f"answered more than {MAX_ANSWER_BYTES // 2**20} MiB; narrow --start/--end or raise --step")
    try:
        return json.loads(body.decode("utf-8", errors="replace"))
    except RecursionError:
        raise ValueError("answered JSON nested too deeply to be a Prometheus answer") from None


def query_range(base_url: str, query: str, start: float, end: float, step: float, fetch: Fetch | None = None) -> list[dict]:
    """The ``result`` list of one range query (matrix); ReportError on any failure."""
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    url = f"{base_url.rstrip('/')}/api/v1/query_range?{params}"
    try:
        body = (fetch or _fetch_json)(url)
    except urllib.error.HTTPError as exc:
        detail = ""
        try:
            detail = json.loads(exc.read().decode()).get("error", "")
        except Exception:  # noqa: BLE001 (best-effort detail)
            pass
        raise ReportError(f"Prometheus {base_url}: HTTP {exc.code} for {query}: {detail or exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ReportError(f"Prometheus {base_url}: {exc}") from None
    except http.client.HTTPException as exc:  # its bytes are not echoed: they may be anything
        raise ReportError(f"Prometheus {base_url} did not answer HTTP ({type(exc).__name__}): is Prometheus "
                          "listening there?") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        raise ReportError(f"Prometheus {base_url}: query {query} failed: {body.get('error') if isinstance(body, dict) else body}")
    data = body.get("data") or {}
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise ReportError(f"Prometheus {base_url}: expected a matrix for {query}, got {got}")
    result = data.get("result") or []
    if not isinstance(result, list) or not all(isinstance(s, dict) and isinstance(s.get("metric"), dict)
                                               and isinstance(s.get("values") or [], list) for s in result):
        raise ReportError(f"Prometheus {base_url}: the answer for {query} is not a list of series "
                          "(is this Prometheus?)")
    return list(result)


def _node(labels: dict[str, str]) -> str:
    return labels.get("node") or labels.get("instance") or labels.get("job") or "prometheus"


def _values(series: dict) -> dict[float, float]:
    out = {}
    for pair in series.get("values") or []:
        try:
            stamp, value = pair
            number, stamp = float(value), float(stamp)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[stamp] = number
    return out


def _index(label: object) -> int:
    """A ``gpu`` label as an index; -1 where it is absent or not a number (another exporter's label)."""
    try:
        return int(str(label))
    except ValueError:
        return -1


def _key(labels: dict[str, str]) -> tuple[str, ...]:
    return (_node(labels), labels.get("gpu", ""), labels.get("uuid", ""), labels.get("probe", ""),
            labels.get("preset", ""), labels.get("power_cap", ""))


def load_prometheus(
    base_url: str,
    start: float,
    end: float,
    step: float | None = None,
    fetch: Fetch | None = None,
) -> Loaded:
    """Runs from the probe gauges over [start, end]."""
    check_base_url(base_url)
    if end <= start:
        raise ReportError(f"the time range is empty: end {end} <= start {start}")
    step = step or default_step(start, end)
    if (end - start) / step > 11_000:
        raise ReportError(f"step {step:g}s gives more than 11,000 points; use a larger --step")

    def matrix(query: str) -> list[dict]:
        return query_range(base_url, query, start, end, step, fetch)

    rates = matrix(RATE)
    energies = {_key(s["metric"]): _values(s) for s in matrix(ENERGY)}
    powers = {_key(s["metric"]): _values(s) for s in matrix(POWER)}
    busy = {_key(s["metric"]): _values(s) for s in matrix(BUSY)}
    identities: dict[tuple[str, str], GpuId] = {}
    for series in matrix(INFO):
        labels = series["metric"]
        values = _values(series)
        if not values:
            continue
        gpu = GpuId(
            node=_node(labels), index=_index(labels.get("gpu")), uuid=labels.get("uuid", "?"),
            name=labels.get("name", "?"), driver_version=labels.get("driver_version", "?"),
            compute_capability=labels.get("compute_capability", "?"), backend=labels.get("backend", "?"),
            pci_bus_id=labels.get("pci_bus_id", "?"),
        )
        identities[(gpu.node, gpu.uuid)] = gpu  # later series (newer driver) win: results are time-sorted

    runs: list[Run] = []
    for series in rates:
        labels = series["metric"]
        key = _key(labels)
        node, gpu_index, uuid, probe, preset, cap = key
        try:
            cap_watts = float(cap)
        except ValueError:
            continue
        gpu = identities.get((node, uuid)) or GpuId(node=node, index=_index(gpu_index), uuid=uuid)
        rate_values = _values(series)
        previous: tuple | None = None
        for stamp in sorted(rate_values):
            energy = energies.get(key, {}).get(stamp)
            power = powers.get(key, {}).get(stamp)
            current = (rate_values[stamp], energy, power)
            if current == previous:
                continue
            previous = current
            runs.append(Run(
                time=stamp, gpu=gpu, cap_watts=cap_watts, probe=probe, preset=preset,
                batch_size=default_batch_size(probe, preset), status="ok",
                work_unit=labels.get("unit") or work_unit(probe), rate=current[0],
                energy_per_unit=energy, power=power, gpu_busy_ratio=busy.get(key, {}).get(stamp),
                source=base_url,
            ))
    runs.sort(key=lambda r: r.time)
    notes = ["from Prometheus: no per-cap latency percentiles (histograms observe the operator's cap only); "
             "batch sizes are the presets' defaults"]
    return Loaded(runs, [f"{base_url} ({_iso(start)} to {_iso(end)}, step {step:g}s)"], 0, notes)


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
