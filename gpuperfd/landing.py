"""The landing page at /: the GPUs this daemon sees, with links."""

from __future__ import annotations

import html

import gpuperfd
from gpuperfd.sampler import Sampler


def landing_page(sampler: Sampler, backend_name: str, telemetry_path: str) -> bytes:
    readings, last_info, identities, _ = sampler.store.snapshot()
    rows = []
    for gpu, identity in sorted(identities.items()):
        info_points = last_info.get(gpu, ())
        name = info_points[0].labels[0] if info_points else "?"
        lost = any(r.error == "gpu_lost" for (g, _), r in readings.items() if g == gpu)
        power = readings.get((gpu, "power"))
        draw = next((p.value for p in power.points if p.metric == "gpuperf_power_draw_watts"), None) if power else None
        rows.append(
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>".format(
                gpu,
                html.escape(name),
                html.escape(identity.uuid),
                "lost" if lost else "up",
                f"{draw:.0f} W" if draw is not None else "-",
            )
        )
    body = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>gpuperfd</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px}}</style>
</head><body>
<h1>gpuperfd {html.escape(gpuperfd.__version__)}</h1>
<p>Backend: <b>{html.escape(backend_name)}</b> &middot; <a href="{html.escape(telemetry_path)}">Metrics</a> &middot; <a href="/healthz">Health</a></p>
<table id="gpus"><tr><th>GPU</th><th>Name</th><th>UUID</th><th>State</th><th>Power</th></tr>
{''.join(rows)}
</table>
</body></html>
"""
    return body.encode()
