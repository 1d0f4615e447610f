"""The alerting side of a fleet: a test copy of deploy/alertmanager/alertmanager.yml
with short timings and every receiver pointed at a loopback webhook, and that
webhook, which records what Alertmanager would have sent to a person."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from gpuperfd.fleet.spec import REPO_ROOT

ALERTMANAGER_DIR = REPO_ROOT / "deploy" / "alertmanager"
#: The keys of a receiver that send somewhere (Alertmanager 0.25).
SENDER_KEYS = (
    "webhook_configs", "email_configs", "pagerduty_configs", "slack_configs", "opsgenie_configs",
    "victorops_configs", "pushover_configs", "wechat_configs", "sns_configs", "telegram_configs",
    "webex_configs", "discord_configs",
)


def alertmanager_test_config(
    text: str, webhook_url: str, *, group_wait: str = "1s", group_interval: str = "2s",
    repeat_interval: str = "1h", config_dir: Path = ALERTMANAGER_DIR,
) -> dict[str, Any]:
    """The repository's config with short route timings, every sending receiver replaced by
    one webhook to ``{webhook_url}/{receiver name}``, and template paths made absolute.

    Routes, matchers, grouping and inhibitions stay the repository's; a receiver that
    sends nothing (``blackhole``) stays silent. Timings set on sub-routes are replaced
    too, so a notification arrives within seconds, as the accelerated rules fire.
    """
    config = yaml.safe_load(text)
    if not isinstance(config, dict) or "route" not in config or "receivers" not in config:
        raise ValueError("not an Alertmanager config: no route or receivers")

    def retime(route: dict[str, Any]) -> None:
        for key, value in (("group_wait", group_wait), ("group_interval", group_interval),
                           ("repeat_interval", repeat_interval)):
            if key in route or route is config["route"]:
                route[key] = value
        for child in route.get("routes", []):
            retime(child)

    retime(config["route"])
    receivers = []
    for receiver in config["receivers"]:
        sends = any(receiver.get(key) for key in SENDER_KEYS)
        receivers.append(
            {"name": receiver["name"],
             **({"webhook_configs": [{"url": f"{webhook_url}/{receiver['name']}", "send_resolved": True}]}
                if sends else {})}
        )
    config["receivers"] = receivers
    config["templates"] = [str((config_dir / path).resolve()) for path in config.get("templates", [])]
    return config


class WebhookRecorder:
    """An HTTP server on 127.0.0.1 that stores every webhook POST (Alertmanager's JSON, version 4).

    ``notifications`` holds one dict per POST: the payload plus ``path`` (the
    receiver name the test config put in the URL). A body that is not a JSON
    object is answered 400 and kept in ``rejected``.
    """

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.rejected: list[str] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, 10 * 1024 * 1024))
                try:
                    payload = json.loads(body)
                    if not isinstance(payload, dict):
                        raise ValueError("not a JSON object")
                except ValueError as error:
                    with recorder._lock:
                        recorder.rejected.append(f"{self.path}: {error}")
                    self.send_response(400)
                    self.end_headers()
                    return
                payload["path"] = self.path.strip("/")
                with recorder._lock:
                    recorder.notifications.append(payload)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "WebhookRecorder":
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def received(self) -> list[dict[str, Any]]:
        """A copy of the notifications so far."""
        with self._lock:
            return list(self.notifications)

    def firing(self) -> set[tuple[str, str, str, str]]:
        """(receiver, alertname, instance, gpu) of every alert ever notified as firing."""
        return {
            (n["path"], a["labels"].get("alertname", ""), a["labels"].get("instance", ""), a["labels"].get("gpu", ""))
            for n in self.received() for a in n.get("alerts", []) if a.get("status") == "firing"
        }
