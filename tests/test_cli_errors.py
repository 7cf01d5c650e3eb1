"""Every command's usage errors are one line and exit 2 (the usage itself is in --help); an
empty --policy is one clear line; `verify --key` exit codes are those its help and docs state;
the exit codes are documented where users look (README, the top-level --help)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from audit.cli import COMMANDS
from audit.errors import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from cli_runner import cli

REPO = Path(__file__).resolve().parent.parent


EVERY = list(COMMANDS) + ["policy show", "policy list"]


@pytest.mark.parametrize("command", EVERY)
def test_an_unknown_option_is_one_line_exit_2(command, capsys):
    rc, out, err = cli(capsys, *command.split(), "--no-such-option")
    assert rc == EXIT_USAGE and out == ""
    assert err.splitlines() == [f"error: sovereign-audit {command}: No such option '--no-such-option'. "
                                f"(see sovereign-audit {command} --help)"]


@pytest.mark.parametrize("command", EVERY)
def test_help_is_intact(command, capsys):
    rc, out, err = cli(capsys, *command.split(), "--help")
    assert rc == EXIT_OK and err == "" and out.startswith(f"Usage: sovereign-audit {command} ")


@pytest.mark.parametrize("args, message", [
    (["check"], "sovereign-audit check: Missing argument 'PATHS...'."),
    (["inspect"], "sovereign-audit inspect: Missing argument 'PATHS...'."),
    (["verify"], "sovereign-audit verify: Missing argument 'DIR'."),
    (["keygen"], "sovereign-audit keygen: Missing option '--out'."),
    (["no-such-command"], "sovereign-audit: No such command 'no-such-command'."),
    (["policy", "no-such-command"], "sovereign-audit policy: No such command 'no-such-command'."),
])
def test_missing_or_unknown_is_one_line(args, message, capsys):
    rc, _, err = cli(capsys, *args)
    assert rc == EXIT_USAGE and len(err.splitlines()) == 1 and err.startswith(f"error: {message}"), err


def test_typed_text_in_a_usage_error_is_escaped(capsys):
    rc, _, err = cli(capsys, "check", "--bad\x1b[31m")
    assert rc == EXIT_USAGE and "\x1b" not in err and "\\x1b[31m" in err and len(err.splitlines()) == 1


def test_a_bare_group_still_shows_its_help(capsys):
    rc, _, err = cli(capsys, "policy")
    assert rc == EXIT_USAGE and "Commands:" in err and "show" in err


@pytest.mark.parametrize("command", [["policy", "show"], ["check", "/bin/true"], ["inspect", "/bin/true"]])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_policy_is_one_clear_line(command, value, capsys):
    rc, out, err = cli(capsys, *command, "--policy", value)
    assert rc == EXIT_USAGE and out == ""
    assert err.splitlines() == ["error: the policy is empty: give a policy file or a shipped policy's name (sovereign, strict)"]


def _stated(text: str, code: int) -> str:
    """What a help text or doc says exit `code` means: the words after the code, up to the next code."""
    flat = " ".join(text.replace("*", "").replace("`", "").split())
    m = re.search(rf"(?:^|[;:,] ){code} (.*?)(?:; \d+ |$)", flat)
    assert m, (code, flat)
    return m.group(1)


def test_verify_key_exit_codes_match_its_help_and_docs(capsys, tmp_path):
    (tmp_path / "bundle").mkdir()
    (tmp_path / "junk.pub").write_text("not a key\n")
    rc_bad, _, err_bad = cli(capsys, "verify", tmp_path / "bundle", "--key", tmp_path / "junk.pub")
    rc_missing, _, err_missing = cli(capsys, "verify", tmp_path / "bundle", "--key", tmp_path / "absent.pub")
    assert (rc_bad, rc_missing) == (EXIT_USAGE, EXIT_INPUT)
    assert "not a PEM public key" in err_bad and "cannot read public key" in err_missing
    _, help_text, _ = cli(capsys, "verify", "--help")
    doc = (REPO / "docs" / "verify.md").read_text()
    doc = doc[doc.index("Exit codes:"):]
    for text in (help_text[help_text.index("Exit codes:"):], doc):
        assert "--key file that is not an Ed25519" in _stated(text, EXIT_USAGE)
        assert "--key file cannot be read" in _stated(text, EXIT_INPUT)


def test_exit_130_is_documented():
    readme = (REPO / "README.md").read_text()
    assert re.search(r"^\| 130 \| interrupted", readme, re.M)
    assert f"EXIT_INTERRUPTED = {EXIT_INTERRUPTED}" in (REPO / "audit" / "errors.py").read_text()


def test_top_level_help_lists_every_exit_code(capsys):
    rc, out, _ = cli(capsys, "--help")
    flat = " ".join(out.split())
    assert rc == EXIT_OK and "130 interrupted" in flat and "3 unreadable input" in flat


def _run_without(module: str, *args: str, tmp_path) -> "subprocess.CompletedProcess[str]":
    """The CLI in a fresh interpreter where importing `module` fails as if it were not installed."""
    import subprocess
    import sys

    code = ("import sys; sys.modules[%r] = None\n"
            "from audit.cli import main\n"
            "main(sys.argv[1:])\n") % module
    return subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_a_missing_third_party_package_is_named_exit_2(tmp_path):
    proc = _run_without("cryptography", "keygen", "--out", str(tmp_path / "k"), tmp_path=tmp_path)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.splitlines() == ["error: the Python package 'cryptography' is not installed and this "
                                        "command needs it: pip install 'cryptography'"]
    assert "Traceback" not in proc.stderr and not (tmp_path / "k").exists()


def test_check_without_numpy_names_it(tmp_path):
    proc = _run_without("numpy", "check", "/bin/true", tmp_path=tmp_path)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.strip() == ("error: the Python package 'numpy' is not installed and this command "
                                   "needs it: pip install 'numpy'")


@pytest.mark.parametrize("name, install", [("torch.nn", "sovereign-audit[evidence]"),
                                           ("diffusers", "sovereign-audit[pipeline]"),
                                           ("elftools.elf", "pyelftools"), ("yaml", "pyyaml")])
def test_the_hint_names_what_to_install(name, install):
    from audit.cli import missing_package_hint

    hint = missing_package_hint(ModuleNotFoundError(f"No module named {name!r}", name=name))
    assert hint.endswith(f"pip install '{install}'") and f"'{name.split('.')[0]}'" in hint


def test_a_missing_module_of_our_own_is_still_an_internal_error(tmp_path):
    proc = _run_without("audit.signing.keys", "keygen", "--out", str(tmp_path / "k"), tmp_path=tmp_path)
    assert proc.returncode == 4 and proc.stderr.startswith("error: internal error: ModuleNotFoundError"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize("command", [["run", "--device", "cpu"], ["report", str(REPO / "docs" / "research-object-h200" / "evidence")]])
def test_an_out_folder_that_cannot_be_made_is_one_line_exit_2(command, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("kept\n")
    rc, _, err = cli(capsys, *command, "--out", blocker / "bundle")
    assert rc == EXIT_USAGE and err.splitlines() == [
        f"error: --out {blocker / 'bundle'}: cannot create the bundle folder: Not a directory"], err
    assert blocker.read_text() == "kept\n"


@pytest.mark.parametrize("command", [
    ["bench", "--device", "cpu", "--target", "cpu", "--shape", "1,1,16,64", "--repeats", "1", "--warmup", "0",
     "--json"],
    ["parity", "--device", "cpu", "--target", "cpu", "--shape", "1,1,16,64", "--json"],
    ["build", "--target", "cpu", "--out"],
])
def test_an_output_under_a_file_is_one_line_exit_2(command, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("kept\n")
    rc, _, err = cli(capsys, *command, blocker / "out.json")
    assert rc == EXIT_USAGE and len(err.splitlines()) == 1 and str(blocker) in err, err
    assert blocker.read_text() == "kept\n"


def test_an_internal_error_quoting_hostile_text_is_one_escaped_error_line():
    """An unexpected exception whose message carries a newline, a workflow command and an ANSI escape
    (text an input can put there) is one `error:` line with the control characters escaped."""
    script = ("import sys, audit.cli as c\n"
              "from audit.linkage import check\n"
              "def boom(*a, **k): raise RuntimeError('x\\n::warning file=INJECTED::pwn \\x1b[31mred')\n"
              "check.check_paths = boom\n"
              "sys.argv = ['sovereign-audit', 'check', sys.argv[1]]\n"
              "c.main()\n")
    proc = subprocess.run([sys.executable, "-c", script, sys.executable], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: internal error: RuntimeError: x"), proc.stderr
    assert "\x1b" not in proc.stderr and "\\x1b" in lines[0]
