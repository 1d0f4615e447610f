"""Command line: ``gpuperfd run``, ``check-config``, ``collectors``; every other command is a module of commands/.

Exit codes (also in docs/operations.md):
  0 success; 1 runtime failure; 2 invalid configuration or usage;
  3 no usable GPU backend (e.g. no NVIDIA driver); 4 cannot listen on the address.
``gpuperfd check`` has its own: 0 healthy, 10 degraded, 11 unhealthy, 12 could not check
(no driver included), 2 usage (gpuperfd/commands/check.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

import gpuperfd
from gpuperfd.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigError,
    Vocabulary,
    config_with_flags,
    env_config_path,
    load_config,
    use_vocabulary,
)

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_DEVICE, EXIT_LISTEN = 0, 1, 2, 3, 4

log = logging.getLogger("gpuperfd")


def config_vocabulary() -> Vocabulary:
    """The names the configuration checks that other packages own (the config imports none of them):
    probe options and presets, collector names, health threshold keys. Imported only when a config needs them."""
    from gpuperfd.health.checks import defaults
    from gpuperfd.probe_data.spec import OPTION_KEYS, check_options, schedule_fault, unknown_key_message
    from gpuperfd.telemetry.collectors import COLLECTOR_NAMES

    def check_probe_options(probe: str, options: dict[str, Any], preset: str | None) -> None:
        try:
            allowed = {"inject_fault"} if schedule_fault(options) else set()
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        unknown = [key for key in options if key not in OPTION_KEYS and key not in allowed]
        if unknown:
            raise ValueError(unknown_key_message(unknown[0], OPTION_KEYS, where="options"))
        try:
            check_options(probe, options, preset)
        except ValueError as exc:
            raise ValueError(f"options/preset: {exc}") from None

    def point_window_seconds(probe: str, options: dict[str, Any], preset: str | None) -> float:
        from gpuperfd.probe_data.spec import ProbeSpec

        spec = ProbeSpec(probe=probe, preset=preset, **options)
        return spec.repeats * (spec.measure_seconds or 0.0) + spec.warmup_seconds + spec.busy_profile_seconds

    from gpuperfd.probe_data.kinds import KINDS, node_kind_names
    from gpuperfd.probe_data.spec import DEFAULT_PRESET

    return Vocabulary(check_probe_options, tuple(COLLECTOR_NAMES), tuple(defaults()), point_window_seconds,
                      dict(DEFAULT_PRESET), tuple(KINDS), node_kind_names())


use_vocabulary(config_vocabulary)  # every command, and the daemon's reload, validates through cli


def _add_run(subparsers: Any) -> None:
    run = subparsers.add_parser(
        "run",
        help="run the daemon (exporter, sampler, scheduled probes)",
        description="Run the gpuperfd daemon. Command-line flags override the config file.",
    )
    run.add_argument(
        "--config",
        metavar="FILE",
        help=f"YAML config file (default: $GPUPERFD_CONFIG or {DEFAULT_CONFIG_PATH} if it exists; else built-in defaults)",
    )
    run.add_argument(
        "--simulate",
        metavar="N",
        type=int,
        help="use N simulated GPUs instead of NVML (for demos and tests; never chosen automatically)",
    )
    run.add_argument("--web.listen-address", dest="listen_address", metavar="HOST:PORT", help="address to serve HTTP on")
    run.add_argument("--web.telemetry-path", dest="telemetry_path", metavar="PATH", help="path of the metrics endpoint")
    run.add_argument(
        "--web.config.file", dest="web_config_file", metavar="FILE", help="exporter-toolkit web config (TLS, basic auth)"
    )
    for flag, dest, kind, text in (
        ("--web.max-connections", "max_connections", int, "open connections at most (default 512)"),
        ("--web.max-requests", "max_requests", int, "requests served or queued at once; more get 503 (default 256)"),
        ("--web.workers", "workers", int, "request worker threads (default 4)"),
        ("--web.header-timeout", "header_timeout_seconds", float, "seconds for a request head (default 10)"),
        ("--web.tls-handshake-timeout", "tls_handshake_timeout_seconds", float, "seconds for a TLS handshake (default 10)"),
        ("--web.idle-timeout", "idle_timeout_seconds", float, "seconds a keep-alive connection may idle (default 120)"),
    ):
        run.add_argument(flag, dest=dest, type=kind, metavar="N", help=text)
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="log verbosity")
    run.set_defaults(func=cmd_run)


def _add_check_config(subparsers: Any) -> None:
    check = subparsers.add_parser(
        "check-config",
        help="validate a config file and exit",
        description="Validate a config file without starting anything; exit 0 if valid, 2 if not.",
    )
    check.add_argument("file", metavar="FILE")
    check.set_defaults(func=cmd_check_config)


def _add_collectors(subparsers: Any) -> None:
    collectors = subparsers.add_parser(
        "collectors", help="list telemetry collectors and their metrics", description="List telemetry collectors."
    )
    collectors.set_defaults(func=cmd_collectors)


#: The module whose ``register`` adds each command's parser, in the order ``--help`` lists them.
COMMAND_MODULES: dict[str, str] = {
    "check": "gpuperfd.commands.check",
    "probe": "gpuperfd.commands.probe",
    "sweep": "gpuperfd.commands.sweep",
    "restore-caps": "gpuperfd.commands.sweep",
    "apply": "gpuperfd.commands.apply",
    "dashboards": "gpuperfd.commands.dashboards",
    "install": "gpuperfd.commands.install",
    "uninstall": "gpuperfd.commands.install",
    "report": "gpuperfd.commands.report",
    "top": "gpuperfd.commands.top",
}


def _command(argv: Sequence[str]) -> str | None:
    """The command word of ``argv`` (its first argument that is not an option), if any."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given ``argv`` whose command is built in (``run`` above all) or comes from
    one module, only that command's module is imported: the daemon does not carry the probe, sweep,
    report, dashboard and install commands' modules (2 MB of its resident memory)."""
    parser = argparse.ArgumentParser(
        prog="gpuperfd",
        description="GPU performance daemon: NVML telemetry for Prometheus, probe workloads, power-cap sweeps.",
    )
    parser.add_argument("--version", action="version", version=f"gpuperfd {gpuperfd.__version__}")
    parser.set_defaults(func=None)  # no command named: the help, exit 2
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(subparsers)
    _add_check_config(subparsers)
    _add_collectors(subparsers)
    command = _command(argv) if argv is not None else None
    if command in ("run", "check-config", "collectors"):
        wanted: list[str] = []
    elif command in COMMAND_MODULES:
        wanted = [COMMAND_MODULES[command]]
    else:  # no command, --help, or a word argparse will refuse: every command, so both list them all
        wanted = list(dict.fromkeys(COMMAND_MODULES.values()))
    for module_name in wanted:
        try:
            module = __import__(module_name, fromlist=["register"])
        except ImportError:  # optional part not installed yet
            continue
        module.register(subparsers)
    return parser


def _config_for_run(args: argparse.Namespace) -> Config:
    """Config file (if any) with command-line flags applied, validated as one."""
    path = args.config or env_config_path()
    if path is None and DEFAULT_CONFIG_PATH.exists():
        path = str(DEFAULT_CONFIG_PATH)
    flags = {
        "web.listen_address": args.listen_address,
        "web.telemetry_path": args.telemetry_path,
        "web.config_file": args.web_config_file,
        "web.max_connections": args.max_connections,
        "web.max_requests": args.max_requests,
        "web.workers": args.workers,
        "web.header_timeout_seconds": args.header_timeout_seconds,
        "web.tls_handshake_timeout_seconds": args.tls_handshake_timeout_seconds,
        "web.idle_timeout_seconds": args.idle_timeout_seconds,
        "log_level": args.log_level,
    }
    return config_with_flags(path, flags, simulate=args.simulate)


def cmd_run(args: argparse.Namespace) -> int:
    from gpuperfd.daemon import Daemon
    from gpuperfd.device.errors import DeviceError, DriverNotFound
    from gpuperfd.system.logs import setup_logging

    config = _config_for_run(args)
    setup_logging(config.log_level)
    try:
        daemon = Daemon(config, reload_config=lambda: _config_for_run(args))
    except DriverNotFound as exc:
        log.error("%s", exc)
        return EXIT_DEVICE
    except DeviceError as exc:
        log.error("cannot open GPUs: %s", exc)
        return EXIT_DEVICE
    except OSError as exc:
        log.error("cannot listen on %s: %s", config.web.listen_address, exc)
        return EXIT_LISTEN
    daemon.install_signal_handlers()
    daemon.start()
    try:
        daemon.wait()
    finally:
        daemon.stop()
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    config = load_config(args.file, required=True)
    web = None
    if config.web.config_file is not None:  # checked before any "OK": a bad web config once followed one
        from gpuperfd.web.config import load_web_config

        web = load_web_config(config.web.config_file)
    said = canary_words(config)  # the daemon's start-up refusal or warning, said here first
    if said is not None and said[0]:
        print(f"gpuperfd: {args.file}: invalid configuration: {said[1]}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{args.file}: OK (backend {config.device.backend}, listen {config.web.listen_address})")
    if web is not None:
        print(f"{config.web.config_file}: OK ({web.describe()})")
    if said is not None:
        print(f"{args.file}: warning: {said[1]}", file=sys.stderr)
    return EXIT_OK


def _node_uuids(config: Config) -> dict[int, str]:
    """The configured GPUs' indices and UUIDs (``device.gpus`` applied); raises DeviceError."""
    from gpuperfd.device.factory import open_backend, selected_devices

    backend = open_backend(config)
    try:
        return {device.index: device.info().uuid for device in selected_devices(backend, config)}
    finally:
        backend.close()


def canary_words(config: Config) -> tuple[bool, str] | None:
    """check-config's word on canary mode with the GPUs here read (the simulated ones are built from the
    file, NVML is opened for a moment), as (an error?, the words): the daemon refuses to start where
    ``apply.canary_gpus`` names a GPU the node lacks, and warns where the canary picks none of its GPUs,
    where check-config had said OK (issue 61). Which GPUs a share picks hangs on their UUIDs; where they
    cannot be read (no driver here) it says it cannot tell. None: not canary, or all is well."""
    from gpuperfd.apply.policy import ApplySettings, in_canary
    from gpuperfd.device.errors import DeviceError

    settings = ApplySettings.from_config(config.apply)
    if settings.mode != "canary":
        return None
    how = (f"apply.canary_gpus {list(settings.canary_gpus)}" if settings.canary_gpus is not None
           else f"apply.canary_share {settings.canary_share:g} (by a hash of each GPU's UUID)")
    try:
        uuids = _node_uuids(config)
    except DeviceError as exc:
        return False, (f"{how}: cannot tell which of this node's GPUs it picks ({str(exc).split('. ')[0]}); "
                       "the daemon warns at its start if it picks none")
    if missing := sorted(set(settings.canary_gpus or ()) - set(uuids)):
        return True, (f"apply.canary_gpus: GPU {', '.join(map(str, missing))} does not exist on this node (its "
                      f"GPUs: {', '.join(map(str, sorted(uuids))) or 'none'}): the daemon refuses to start")
    if any(in_canary(index, uuid, settings) for index, uuid in uuids.items()):
        return None
    return False, (f"{how} picks none of this node's {len(uuids)} GPU(s): canary mode would apply no cap here; "
                   "name them in apply.canary_gpus or raise apply.canary_share")


def cmd_collectors(args: argparse.Namespace) -> int:
    from gpuperfd.telemetry.collectors import COLLECTORS

    for name, cls in sorted(COLLECTORS.items()):
        lane = "slow lane" if cls.slow else ("events" if cls.event_driven else "fast lane")
        print(f"{name:14} {lane:10} {cls.help}")
        for spec in cls.metrics:
            print(f"    {spec.name}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.func is None:
        parser.print_help(sys.stderr)
        return EXIT_CONFIG
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"gpuperfd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
