"""The CLI run in-process, as a user runs it: `cli(capsys, *args)` -> (exit code, stdout, stderr).
Arguments may be paths; each is passed as its str."""

from __future__ import annotations

import pytest

from audit.cli import main


def cli(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err
