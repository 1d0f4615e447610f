"""A key given twice in a gpuperfd file is refused with both lines named (PyYAML keeps the last one
silently); a config file far larger than any config is refused before it is parsed."""

from __future__ import annotations


import pytest

from gpuperfd.config import MAX_CONFIG_BYTES, ConfigError, load_config
from gpuperfd.config.strict_yaml import DuplicateKeyError, safe_load_strict

PASTED_TWICE = "probes:\n  idle_seconds: 5\nweb:\n  listen_address: ':9999'\nprobes:\n  jitter_seconds: 3\n"


def test_a_top_level_section_given_twice_is_refused_naming_both_lines(tmp_path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(PASTED_TWICE)
    with pytest.raises(ConfigError, match=r"key 'probes' is given twice in one mapping \(line 1 and line 5\)"):
        load_config(path, required=True)


def test_a_nested_key_given_twice_is_refused_and_merge_keys_still_work() -> None:
    with pytest.raises(DuplicateKeyError, match="key 'x' is given twice"):
        safe_load_strict("a:\n  x: 1\n  y: 2\n  x: 3\n")
    assert safe_load_strict("base: &b {p: 1}\nd:\n  <<: *b\n  q: 2\n")["d"] == {"p": 1, "q": 2}
    assert safe_load_strict("[{a: 1}, {a: 2}]") == [{"a": 1}, {"a": 2}]  # equal keys in two mappings: fine


def test_the_check_config_command_says_so(tmp_path, capsys) -> None:
    from gpuperfd.cli import main

    path = tmp_path / "config.yaml"
    path.write_text(PASTED_TWICE)
    assert main(["check-config", str(path)]) == 2
    assert "key 'probes' is given twice" in capsys.readouterr().err


def test_probe_and_web_config_files_refuse_a_key_given_twice(tmp_path) -> None:
    from gpuperfd.probing.matrix import UsageError, load_config_file
    from gpuperfd.web.config import WebConfigError, load_web_config

    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("probe: llm\nbatch_size: [1, 2]\nbatch_size: [4]\n")
    with pytest.raises(UsageError, match="key 'batch_size' is given twice"):
        load_config_file(str(matrix))
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users: {}\nbasic_auth_users: {}\n")
    with pytest.raises(WebConfigError, match="key 'basic_auth_users' is given twice"):
        load_web_config(web)


def test_a_file_far_larger_than_a_config_is_refused_before_it_is_parsed(tmp_path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("w") as handle:
        handle.write("probes:\n  schedules:\n")
        line = "    - {probe: llm, interval_seconds: 3600}\n"
        handle.write(line * (MAX_CONFIG_BYTES // len(line) + 2))
    with pytest.raises(ConfigError, match="is not a gpuperfd config .* is this the right file"):
        load_config(path, required=True)


def test_a_sections_own_check_names_the_problem_without_the_sections_repr(tmp_path) -> None:
    """``apply: {mode: on}`` once ended "(got ApplyConfig(m..._seconds=30.0))"."""
    path = tmp_path / "config.yaml"
    path.write_text("apply:\n  mode: on\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, required=True)
    assert "  - apply: mode on needs workload" in str(info.value)
    assert "ApplyConfig" not in str(info.value) and "Value error" not in str(info.value)
    path.write_text("probes:\n  idle_seconds: abc\n")
    with pytest.raises(ConfigError, match=r"probes.idle_seconds: .* \(got 'abc'\)"):  # a value is still shown
        load_config(path, required=True)


def test_an_endless_file_is_refused_after_the_limit_not_read_forever() -> None:
    """``check-config /dev/zero`` once read until killed: a device has no size to check first."""
    with pytest.raises(ConfigError, match="/dev/zero: more than 4 MiB is not a gpuperfd config"):
        load_config("/dev/zero", required=True)


def test_check_config_says_ok_only_when_the_web_config_is_good_too(tmp_path, capsys) -> None:
    from gpuperfd.cli import main

    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users: {}\nbasic_auth_users: {}\n")
    path = tmp_path / "config.yaml"
    path.write_text(f"web:\n  config_file: {web}\n")
    assert main(["check-config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "OK" not in out and "key 'basic_auth_users' is given twice" in err
    web.write_text("basic_auth_users: {}\n")
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().out.count(": OK") == 2


def test_probe_and_web_config_reads_are_bounded_too() -> None:
    from gpuperfd.probing.matrix import UsageError, load_config_file
    from gpuperfd.web.config import WebConfigError, load_web_config

    with pytest.raises(UsageError, match="/dev/zero: more than 4 MiB"):
        load_config_file("/dev/zero")
    with pytest.raises(WebConfigError, match="more than 4 MiB"):
        load_web_config("/dev/zero")
