"""Policies and templates are found from a bare checkout too (PYTHONPATH=., no install), as on
the device machine, where nothing can be installed from an index."""

import shutil
import site
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_policies_and_templates_found_without_install(tmp_path):
    for name in ("audit", "policies", "templates", "flash_kernel"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    # -S: no site processing, so no editable-install finder can supply audit.policies.
    code = (
        "import sys; sys.path[:0] = [sys.argv[1]] + sys.argv[2:]\n"
        "import audit.linkage.judging.policy as p, audit.report.render as r\n"
        "assert p.__file__.startswith(sys.argv[1]), p.__file__\n"
        "print(p.shipped_policies(), len(p.load_policy(None).rules) > 0,\n"
        "      '<html' in r._load('report.html.j2').lower())\n"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code, str(tmp_path), *site.getsitepackages()],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['sovereign',", "'strict']", "True", "True"]
