"""The command line's own process skips the collection at exit; a caller of main() with
arguments (a test, an embedding tool) keeps a collectable heap."""

from __future__ import annotations

import subprocess
import sys

from linkage_fixtures import cc_shared

PROBE = """
import gc, sys
from audit.cli import main
args = sys.argv[1:]
if args[0] == "argv":
    sys.argv = ["sovereign-audit", "check", args[1]]
    call = lambda: main()
else:
    call = lambda: main(["check", args[1]])
try:
    call()
except SystemExit as exc:
    print(exc.code, gc.get_freeze_count() > 0)
"""


def _run(mode: str, lib) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, str(lib)], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[-1].split()  # after the report


def test_the_process_command_freezes_its_heap_and_a_caller_with_arguments_does_not(tmp_path):
    lib = cc_shared(tmp_path / "libfkplain.so", "int fk_plain(void) { return 1; }\n")
    assert _run("argv", lib) == ["0", "True"]
    assert _run("list", lib) == ["0", "False"]
