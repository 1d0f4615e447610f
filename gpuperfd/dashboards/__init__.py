"""Grafana dashboards for gpuperfd, written with grafanalib (``pip install 'gpuperfd[dashboards]'``).

Four dashboards: fleet overview (:mod:`.fleet`), node/GPU detail (:mod:`.node`),
probes (:mod:`.probes`) and power-cap efficiency (:mod:`.power_cap`).
:mod:`.generate` renders them to JSON (``gpuperfd dashboards --out DIR``; the
committed copies live in ``dashboards/generated/``), and
:func:`all_panel_queries` lists every panel query with the template variables
filled in, for tests that run them against a real Prometheus.

grafanalib is imported only when a dashboard is built, so the CLI works without it.
"""

from gpuperfd.dashboards.queries import all_panel_queries, substitute_variables

__all__ = ["all_panel_queries", "substitute_variables"]
