"""The built wheel carries every package, the policies, templates and schemas, and an installed
(non-editable) copy finds its default policy through importlib.resources."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Built in a copy: setuptools writes build/ next to the sources, and build/<target>/ is ours.
_TOP_IGNORED = {".git", "build", "out", "report", ".make", ".venv", ".whl", ".device", ".hypothesis", ".pytest_cache"}
_ANY_IGNORED = shutil.ignore_patterns("*.egg-info", "__pycache__", "_fixtures_build")


def IGNORE(directory, names):
    skip = set(_ANY_IGNORED(directory, names))
    if Path(directory) == REPO:
        skip |= _TOP_IGNORED & set(names)
    return skip


def _package_dirs() -> set[str]:
    """Every directory of the import packages that has an __init__.py, as wheel paths."""
    dirs = set()
    for top, wheel_top in (("audit", "audit"), ("policies", "audit/policies"), ("templates", "audit/templates"),
                           ("flash_kernel", "flash_kernel")):
        for init in (REPO / top).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / top)
            if "__pycache__" in rel.parts:
                continue
            dirs.add(str(Path(wheel_top) / rel) if str(rel) != "." else wheel_top)
    return dirs


@pytest.mark.slow
def test_wheel_contents_and_installed_policy_lookup(tmp_path):
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401
        isolation = ["--no-build-isolation"]  # the build backend is here: no index needed
    except ImportError:
        isolation = []
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=IGNORE, symlinks=True)
    out = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", "-w", str(out), *isolation],
                          cwd=src, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheels = list(out.glob("sovereign_audit-*.whl"))
    assert len(wheels) == 1
    names = set(zipfile.ZipFile(wheels[0]).namelist())

    assert "audit/policies/sovereign.toml" in names
    assert "audit/schemas/sarif-2.1.0.json" in names
    for toml in (REPO / "policies").glob("*.toml"):
        assert f"audit/policies/{toml.name}" in names
    templates = [p for p in (REPO / "templates").iterdir() if p.suffix in (".html", ".css", ".j2")]
    for t in templates:
        assert f"audit/templates/{t.name}" in names
    assert "audit/templates/__init__.py" in names
    for d in _package_dirs():
        assert f"{d}/__init__.py" in names, f"package {d} is missing from the wheel (pyproject packages)"
    assert any(n.endswith("entry_points.txt") for n in names)
    # a plain install reads lz4/zstd-compressed CUDA fatbins: both are unconditional requirements
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line for line in zipfile.ZipFile(wheels[0]).read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    for dist in ("lz4", "zstandard"):
        assert any(line.split()[1].startswith(dist) and "extra ==" not in line for line in requires), requires

    # installed, not editable: the shipped policy is found as package data
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           str(wheels[0])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code = ("import audit, audit.linkage.judging.policy as p; print(audit.__file__); "
            "pol = p.load_policy(None); print(len(pol.rules), pol.sources[0]['path'])")
    env = dict(os.environ, PYTHONPATH=str(target))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where, loaded = proc.stdout.splitlines()
    assert where.startswith(str(target))
    assert loaded.endswith("sovereign (shipped)") and int(loaded.split()[0]) >= 20
