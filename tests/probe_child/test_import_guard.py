"""The probe child marks optional packages it never uses as absent before torch loads (issue 60: a node
with scikit-learn, pandas, pyarrow, scipy and torchvision installed paid 1.4-3.7 s of every child's
start for them). A stand-in package on the path shows both sides: importable without the guard, and
behind it as absent as on a machine without it, without its code ever running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuperfd.probe_child.import_guard import UNUSED

ROOT = Path(__file__).resolve().parents[2]


def _fake_packages(tmp_path: Path) -> tuple[dict[str, str], Path]:
    marker = tmp_path / "imported.txt"
    for name in ("sklearn", "pandas"):
        package = tmp_path / "site" / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))
    return env, marker


def _run(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_guarded_process_sees_the_unused_packages_as_not_installed(tmp_path: Path) -> None:
    env, marker = _fake_packages(tmp_path)
    assert _run("import sklearn, pandas; print('imported')", env) == "imported"  # the stand-ins work
    assert marker.read_text().split() == ["sklearn", "pandas"]
    marker.unlink()
    out = _run(
        "import importlib.util\n"
        "from gpuperfd.probe_child.import_guard import mark_unused_absent\n"
        "print(sorted(mark_unused_absent()))\n"
        "print(importlib.util.find_spec('sklearn'), importlib.util.find_spec('pandas'))\n"
        "try:\n    import pandas\nexcept ModuleNotFoundError as exc:\n    print('absent:', exc.name)\n",
        env)
    assert out.splitlines() == [str(sorted(UNUSED)), "None None", "absent: pandas"]
    assert not marker.exists()  # their code never ran


def test_a_package_already_imported_is_left_alone(tmp_path: Path) -> None:
    env, _ = _fake_packages(tmp_path)
    out = _run("import sklearn, sys\n"
               "from gpuperfd.probe_child.import_guard import mark_unused_absent\n"
               "print('sklearn' in mark_unused_absent(), sys.modules['sklearn'] is not None)", env)
    assert out == "False True"


def test_the_childs_process_entry_guards_before_anything_else(tmp_path: Path) -> None:
    env, marker = _fake_packages(tmp_path)
    out = _run("import sys\n"
               "from gpuperfd.probe_child import child\n"
               "sys.argv = ['child', '--help']\n"
               "try:\n    child._cli()\nexcept SystemExit:\n    pass\n"
               "print([name for name in ('sklearn', 'pandas', 'torch') if name in sys.modules and sys.modules[name] is None])",
               env)
    assert out.splitlines()[-1] == "['sklearn', 'pandas']"
    assert not marker.exists()
