"""The CLI run in-process, as a user runs it: `cli(capsys, *args)` -> (exit code, stdout, stderr)
(arguments may be paths; each is passed as its str); one file audited in-process against the
shipped policy, `audit(path)`, and its findings of one rule and kind, `found(res, rule, kind)`."""

from __future__ import annotations

import functools

import pytest

from audit.cli import main


def cli(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@functools.cache
def shipped_policy():
    from audit.linkage.judging.policy import load_policy

    return load_policy(None)


def audit(path):
    """One file checked in-process against the shipped policy, as `check FILE` judges it."""
    from audit.linkage.check import check_paths
    from audit.linkage.resolution.ldso import ResolveOptions

    (res,) = check_paths([str(path)], shipped_policy(), ResolveOptions()).files
    return res


def found(res, rule: str, kind: str) -> list:
    """The findings of one rule and kind in a file's result."""
    return [f for f in res.findings if f.rule == rule and f.kind == kind]
