"""A cancelled CI job (SIGTERM to sovereign-audit alone, as a runner or `timeout` sends it)
stops the audit at once: exit 130, the wheel's extraction folder removed, no worker process
left behind. The wheel holds real gcc-built libraries, large enough that the audit is caught
in the middle (the process group is frozen with SIGSTOP while the signal is sent, so the test
does not race the audit)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from conftest import require_tool

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def big_wheel(tmp_path_factory) -> Path:
    require_tool("gcc")
    d = tmp_path_factory.mktemp("term-wheel")
    (d / "blob.bin").write_bytes(os.urandom(8 << 20))  # incompressible: the audit reads all of it
    asm = d / "blob.s"
    asm.write_text('\t.section .rodata\n\t.globl blob\nblob:\n\t.incbin "blob.bin"\n'
                   '\t.section .note.GNU-stack,"",@progbits\n')
    lib = d / "libblob.so"
    subprocess.run(["gcc", "-shared", "-o", str(lib), str(asm)], cwd=d, check=True, capture_output=True)
    wheel = d / "blob-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for i in range(12):
            zf.write(lib, f"blob/libblob{i}.so")
    return wheel


def children(pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stopped_midway(wheel: Path, tmp: Path, sig: int, group: bool = False):
    """Run check -j 2 on `wheel`, send `sig` to it alone (to its whole process group with
    `group`, as a terminal's Ctrl-C is) once members are being unpacked; its result, stderr and
    the worker processes it had then. On a loaded machine this test's process can be descheduled
    between seeing the extraction and freezing the audit, long enough for the audit to finish:
    a run that had already exited when it was frozen was never stopped midway, so it is run
    again (up to three times); one that was alive must have been stopped."""
    for _ in range(3):
        result = _stop_once(wheel, tmp, sig, group)
        if result is not None:
            return result
    pytest.fail("the audit finished before it could be stopped, three times")


def _stop_once(wheel: Path, tmp: Path, sig: int, group: bool):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp))
    # SIGINT at its default disposition, as a terminal's foreground job has it: a test run started
    # in the background by a shell without job control inherits SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler (the audit would rightly finish, exit 0)
    proc = subprocess.Popen([sys.executable, "-m", "audit", "check", "-j", "2", str(wheel)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not any(tmp.glob("sovereign-audit-wheel-*/blob/*")):  # extraction under way
            assert proc.poll() is None and time.monotonic() < deadline, "the audit ended before it was stopped"
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGSTOP)
        if proc.poll() is not None:  # it had finished: not stopped midway
            try:  # whatever of its group is left (workers exiting) may run on
                os.killpg(proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            proc.communicate(timeout=60)
            return None
        workers = children(proc.pid)
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        os.killpg(proc.pid, signal.SIGCONT)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while [w for w in workers if alive(w)] and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [w for w in workers if alive(w)]
        if left:  # they hold the output pipes open
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        try:  # whatever is left of the group (orphaned workers included)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, err.decode(), workers, left


def test_sigterm_stops_the_audit_and_cleans_up(big_wheel, tmp_path):
    rc, err, workers, left = stopped_midway(big_wheel, tmp_path, signal.SIGTERM)
    assert rc == 130, err
    assert err.splitlines() == ["error: interrupted"], err  # one line, nothing before it
    assert list(tmp_path.iterdir()) == []  # the extraction folder is gone
    assert workers and not left


def test_ctrl_c_gives_one_line_and_exit_130(big_wheel, tmp_path):
    rc, err, workers, left = stopped_midway(big_wheel, tmp_path, signal.SIGINT, group=True)
    assert rc == 130, err
    assert err.splitlines() == ["error: interrupted"], err  # no traceback, from it or a worker
    assert list(tmp_path.iterdir()) == []
    assert workers and not left


def test_workers_do_not_outlive_a_killed_audit(big_wheel, tmp_path):
    rc, _, workers, left = stopped_midway(big_wheel, tmp_path, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    assert workers and not left  # they would wait for work forever


def sigint_at_every_fork(body: str) -> subprocess.CompletedProcess:
    """Run `body` (Python, the repository importable) in a process where every forked child sends
    itself SIGINT the moment it is forked, before any of its code runs: a Ctrl-C to the process
    group that lands just after a fork."""
    script = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGINT))\n"
        + body
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_a_ctrl_c_at_a_workers_fork_is_dropped_there():
    """Ctrl-C reaches the whole process group, so also a worker forked an instant before it: that
    worker must drop it, not run the audit's own handler (a traceback on stderr, a dead worker)."""
    r = sigint_at_every_fork("from audit.linkage import parallel\n"
                             "print(parallel.map_ordered(abs, [-1, -2, -3, -4], jobs=2))\n")
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "[1, 2, 3, 4]", "")


def test_a_ctrl_c_at_a_hashing_fork_is_taken_inside_the_child(tmp_path):
    """The same for the child that hashes a large file beside the audit: the Ctrl-C reaches it
    inside its own handling (it exits, and the audit hashes the file itself), never before."""
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:  # sparse: large enough for the forked child, cheap to write
        fh.write(os.urandom(4096))
        fh.truncate(65 << 20)
    want = hashlib.sha256(big.read_bytes()).hexdigest()
    r = sigint_at_every_fork("from audit.elf import hashing\n"
                             f"h = hashing.Hasher({str(big)!r})\n"
                             "h.start()\n"
                             "print(h.result())\n")
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, want, "")
