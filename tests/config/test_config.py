"""Config loading: defaults, valid files, and invalid ones rejected with a clear message."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuperfd.cli import main
from gpuperfd.config import (
    DEFAULT_PORT,
    Config,
    ConfigError,
    load_config,
    parse_listen_address,
)


def test_no_file_gives_defaults(tmp_path):
    config = load_config(tmp_path / "absent.yaml")
    assert config == Config()
    assert config.device.backend == "nvml"  # never simulated unless asked
    assert config.web.listen_address == f"127.0.0.1:{DEFAULT_PORT}"


def test_valid_file_is_loaded(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("device: {backend: simulated}\nsimulation: {gpus: 4, model: H200}\nsampler: {collectors: {pcie: {enabled: false}}}\n")
    config = load_config(path)
    assert config.simulation.gpus == 4 and config.simulation.model == "H200"
    assert config.sampler.collectors["pcie"].enabled is False


@pytest.mark.parametrize(
    "text,field,words",
    [
        ("web: {listen_address: 'nonsense'}", "web.listen_address", "HOST:PORT"),
        ("web: {listen_address: '1.2.3.4:99999'}", "web.listen_address", "port"),
        ("sampler: {interval_seconds: 0}", "sampler.interval_seconds", "greater than or equal"),
        ("simulation: {gpus: -1}", "simulation.gpus", "greater than or equal"),
        ("probes: {round_window_seconds: -5}", "probes.round_window_seconds", "greater than or equal to 0"),
        ("probes: {round_window_seconds: 1e9}", "probes.round_window_seconds", "less than or equal to 86400"),
        ("probes: {round_window_seconds: soon}", "probes.round_window_seconds", "number"),
        ("device: {backend: cuda}", "device.backend", "'nvml' or 'simulated'"),
        ("web: {listen_adress: '1.2.3.4:1'}", "web.listen_adress", "unknown field"),
        ("sampler: {collectors: {bogus: {}}}", "sampler.collectors", "unknown collector"),
        ("simulation: {faults: [{kind: melt}]}", "simulation.faults.0.kind", "not_supported"),
        ("log_level: loud", "log_level", "'debug'"),
        ("- a\n- b\n", "top level", "mapping"),
        ("web: [1, 2", "", "not valid YAML"),
    ],
)
def test_invalid_config_is_rejected_naming_file_field_and_problem(tmp_path, text, field, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert str(path) in message
    assert field in message
    assert words in message
    assert "Traceback" not in message


def test_check_config_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("log_level: debug\n")
    assert main(["check-config", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("sampler: {interval_seconds: -5}\n")
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "sampler.interval_seconds" in err and str(bad) in err
    assert main(["check-config", str(tmp_path / "missing.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_run_rejects_bad_flag_value_before_starting(capsys):
    assert main(["run", "--simulate", "1", "--web.listen-address", "localhost"]) == 2
    assert "web.listen_address" in capsys.readouterr().err


def test_listen_address_forms():
    assert parse_listen_address("0.0.0.0:9") == ("0.0.0.0", 9)
    assert parse_listen_address("[::1]:10187") == ("::1", 10187)
    assert parse_listen_address(":10187") == ("", 10187)


def test_help_and_version_on_every_command():
    import argparse

    from gpuperfd.cli import build_parser

    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    commands = sorted(actions[0].choices)
    assert {"run", "check-config", "probe", "sweep", "restore-caps", "dashboards", "report", "install",
            "uninstall", "collectors"} <= set(commands)
    for args in (["--help"], ["--version"], *([c, "--help"] for c in commands)):
        out = subprocess.run([sys.executable, "-m", "gpuperfd", *args], capture_output=True, text=True)
        assert out.returncode == 0, (args, out.stderr)
        assert "usage: gpuperfd" in out.stdout or out.stdout.startswith("gpuperfd "), args


# --- issue 19, case 5: safe by default --------------------------------------------------------


def test_case5_read_only_is_the_default_so_a_half_written_file_never_sweeps(tmp_path):
    from gpuperfd.config import Config, load_config

    assert Config().probes.read_only is True
    full = "probes:\n  read_only: false\n  schedules:\n    - {probe: llm, interval_seconds: 60, caps: [max, 300]}\n"
    path = tmp_path / "gpuperfd.yaml"
    path.write_text(full)
    assert load_config(path).probes.read_only is False
    # the file cut before its read_only line (a writer caught mid-way by SIGHUP): caps are never changed
    path.write_text("probes:\n  schedules:\n    - {probe: llm, interval_seconds: 60, caps: [max, 300]}\n")
    assert load_config(path).probes.read_only is True


def test_case3_restart_only_table_is_documented_and_applied():
    from pathlib import Path

    from gpuperfd.config import (
        RESTART_ONLY,
        Config,
        keep_restart_only,
        restart_only_changes,
    )

    docs = (Path(__file__).resolve().parents[2] / "docs/configuration.md").read_text()
    for path, _ in RESTART_ONLY:
        assert f"| `{path}` |" in docs, f"{path} missing from the restart-only table in docs/configuration.md"
    running = Config()
    new = Config.model_validate({"probes": {"state_dir": "/elsewhere", "timeout_seconds": 5, "idle_seconds": 1,
                                            "history": {"path": None}}, "log_level": "debug"})
    assert restart_only_changes(running, new) == ["probes.state_dir", "probes.timeout_seconds", "probes.history"]
    kept = keep_restart_only(running, new)
    assert kept.probes.state_dir == running.probes.state_dir
    assert kept.probes.timeout_seconds == running.probes.timeout_seconds
    assert kept.probes.history == running.probes.history
    assert kept.probes.idle_seconds == 1 and kept.log_level == "debug"  # reloadable settings do reload


def test_memory_budget_takes_bytes_or_a_quantity_and_names_file_and_field() -> None:
    from gpuperfd.config import ConfigError, config_from_mapping, parse_quantity

    assert config_from_mapping({"probes": {"memory_budget": "2560Mi"}}).probes.memory_budget == 2560 * 2**20
    assert config_from_mapping({"probes": {"memory_budget": 4 * 2**30}}).probes.memory_budget == 4 * 2**30
    assert config_from_mapping({}).probes.memory_budget is None
    assert parse_quantity("1.5Gi") == 3 * 2**29 and parse_quantity("500M") == 500 * 10**6
    for bad in ("lots", "-1Gi", 0, "4 GB"):
        try:
            config_from_mapping({"probes": {"memory_budget": bad}}, "/etc/gpuperfd/gpuperfd.yaml")
        except ConfigError as exc:
            assert "/etc/gpuperfd/gpuperfd.yaml" in str(exc) and "probes.memory_budget" in str(exc)
        else:
            raise AssertionError(f"{bad!r} was accepted")


# --- issue 42: the configuration is a leaf; the names other packages own are handed in ----------


@pytest.mark.parametrize(
    "text,field,words",
    [
        ("health: {thresholds: {nope: 1}}", "health", "health.thresholds: unknown key(s) nope"),
        ("probes: {schedules: [{probe: llm, interval_seconds: 60, options: {batch: 3}}]}",
         "probes.schedules.0", "'batch' is 'batch_size'"),
        ("probes: {schedules: [{probe: llm, interval_seconds: 60, preset: nonesuch}]}",
         "probes.schedules.0", "options/preset:"),
    ],
)
def test_outside_names_are_still_checked_naming_file_and_field(tmp_path, text, field, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(path) in str(error.value) and f"  - {field}: " in str(error.value) and words in str(error.value)


def test_without_a_vocabulary_only_files_that_need_one_fail_and_loudly(monkeypatch, tmp_path):
    import gpuperfd.config as config

    monkeypatch.setattr(config, "_vocabulary_source", None)
    monkeypatch.setattr(config, "_vocabulary", None)
    assert config.config_from_mapping({"web": {"listen_address": "127.0.0.1:1"}}).web.listen_address
    for data in ({"sampler": {"collectors": {"pcie": {}}}}, {"health": {"thresholds": {"peer_ratio": 1}}},
                 {"probes": {"schedules": [{"probe": "llm", "interval_seconds": 60, "preset": "gpt2"}]}}):
        with pytest.raises(RuntimeError, match="no vocabulary handed in"):
            config.config_from_mapping(data)
    # a model built in code (a script without the CLI) is not checked here; the probe's spec checks it later
    assert config.ScheduleConfig(probe="llm", interval_seconds=60, options={"batch": 3}).options == {"batch": 3}
    assert not config._vocabulary_required.get()  # config_from_mapping put it back, errors included


def test_a_model_built_in_code_is_checked_when_a_vocabulary_was_handed_in():
    from gpuperfd.config import ScheduleConfig

    with pytest.raises(ValueError, match="'batch' is 'batch_size'"):
        ScheduleConfig(probe="llm", interval_seconds=60, options={"batch": 3})


def test_bad_outside_names_fail_run_and_check_at_once(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("sampler: {collectors: {bogus: {}}}\n")
    for command in (["run", "--simulate", "1"], ["check", "--simulate", "1"]):
        out = subprocess.run([sys.executable, "-m", "gpuperfd", *command, "--config", str(path)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, (command, out.stderr)
        assert f"{path}: invalid configuration" in out.stderr and "sampler.collectors: unknown collector(s) bogus" \
            in out.stderr, out.stderr


@pytest.mark.parametrize("count", [0, -1, 65])
def test_a_simulate_count_out_of_range_names_the_flag(count: int, capsys) -> None:
    """``--simulate 0`` once answered "simulation.gpus: Input should be greater than or equal to 1"."""
    from gpuperfd.cli import main

    assert main(["sweep", "--simulate", str(count), "--probe", "llm", "--caps", "300"]) == 2
    assert f"--simulate {count}: give 1 to 64 simulated GPUs" in capsys.readouterr().err


@pytest.mark.parametrize(("section", "words"), [
    ({"probes": {"schedules": [{"probe": "llm", "interval_seconds": 60, "caps": []}]}},
     "probes.schedules.0.caps: List should have at least 1 items"),
    ({"device": {"gpus": [0, 0]}}, "device.gpus: a GPU is named twice in [0, 0]"),
    ({"health": {"thresholds": {"busy_min_samples": -1}}},
     "health.thresholds.busy_min_samples: Input should be greater than or equal to 0"),
])
def test_careless_values_that_were_accepted_are_refused_by_name(section: dict, words: str) -> None:
    """An empty cap list, a GPU named twice and a negative threshold once passed check-config."""
    from gpuperfd.config import ConfigError, config_from_mapping

    with pytest.raises(ConfigError) as info:
        config_from_mapping(section, "<test>")
    assert words in str(info.value)


def test_the_probe_history_follows_the_state_directory_unless_set() -> None:
    """A daemon given its own state directory (a demo, a second daemon, a test) once still appended to
    the node's /var/lib/gpuperfd/history.jsonl."""
    from pathlib import Path

    from gpuperfd.config import config_from_mapping

    assert config_from_mapping({}).probes.history_path == Path("/var/lib/gpuperfd/history.jsonl")
    own = config_from_mapping({"probes": {"state_dir": "/srv/gpuperfd-b"}})
    assert own.probes.history_path == Path("/srv/gpuperfd-b/history.jsonl")
    set_ = config_from_mapping({"probes": {"state_dir": "/srv/b", "history": {"path": "/logs/h.jsonl"}}})
    assert set_.probes.history_path == Path("/logs/h.jsonl")
    none = config_from_mapping({"probes": {"state_dir": "/srv/b", "history": {"path": None}}})
    assert none.probes.history_path is None
