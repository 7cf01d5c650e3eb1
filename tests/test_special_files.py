"""A FIFO named where a file is read (a policy, a symbol list, a baseline) is refused at once
with one line and exit 2: reading it would wait for a writer forever. Each case runs in a
subprocess with a timeout, so a regression fails instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from linkage_fixtures import linkage_libs  # noqa: F401  (fixture)

from audit.errors import EXIT_USAGE

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "audit", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("how", ["policy", "symbol-list", "baseline"])
def test_a_fifo_is_refused_without_waiting(linkage_libs, tmp_path, fifo, how):
    lib = linkage_libs["clean"]
    if how == "policy":
        args = ["check", lib, "--policy", fifo]
    elif how == "symbol-list":
        pol = tmp_path / "policy.toml"
        pol.write_text('extends = "sovereign"\n[[rules]]\nid = "local.x"\nreason = "r"\n'
                       f'symbol-lists = ["./{fifo.name}"]\n')
        args = ["check", lib, "--policy", pol]
    else:
        args = ["check", lib, "--baseline", fifo]
    proc = run(*args, cwd=tmp_path)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "not a regular file" in proc.stderr
