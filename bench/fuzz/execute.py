"""Running one command of the CLI with a wall-clock limit, its peak RSS measured, and the audit
hook installed.

Two ways, same contract: `fork` (default) forks a process that has already imported the CLI
(fast: no interpreter start per run) and runs `audit.cli.main()` in the child as `python3 -m
audit` would; `exec` starts a real `python3 -m audit` through runpy. Either way the child gets its
own process group (killed whole at the limit), stdout/stderr to files, stdin from /dev/null, cwd
and TMPDIR in the case folder, and ru_maxrss comes from wait4 (it covers the workers it waited
for).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

BOOT = ("import sys,json,runpy; a=json.loads(sys.argv[1]); sys.path.insert(0,a['hookdir']); import hook; "
        "hook.install(a['log'],a['canary'],a['allowed']); sys.argv=['sovereign-audit',*a['argv']]; "
        "runpy.run_module('audit',run_name='__main__',alter_sys=True)")


@dataclass
class Outcome:
    rc: int | None  # None: killed at the limit
    signal: int | None
    timed_out: bool
    maxrss_kb: int
    wall: float
    stdout: bytes
    stderr: bytes
    hook: list[str]
    orphans: bool


def _stdio_settings() -> dict:
    """The encodings and error handlers a fresh `python3` gives stdout/stderr redirected to
    files under this environment, so a forked run writes what a real one would."""
    out = subprocess.run([sys.executable, "-c", "import sys,json;print(json.dumps([sys.stdout.encoding,"
                          "sys.stdout.errors,sys.stderr.encoding,sys.stderr.errors]))"],
                         capture_output=True, text=True, timeout=60).stdout
    enc, err, eenc, eerr = json.loads(out)
    return {"out": (enc, err), "err": (eenc, eerr)}


class Runner:
    def __init__(self, mode: str, canary: str, timeout: float, env: dict[str, str]):
        self.mode = mode
        self.canary = canary
        self.timeout = timeout
        self.env = env
        self.stamp = None
        if mode == "fork":
            self.stdio = _stdio_settings()
            self.refresh()

    def refresh(self) -> None:
        """Import the CLI in this process (each fork then starts warm), again whenever a source
        file under audit/ changed since: a fork must never mix old modules with new ones."""
        if self.mode != "fork":
            return
        stamp = _source_stamp()
        if stamp == self.stamp:
            return
        if self.stamp is not None:  # changed while running: start again from the files
            for name in [m for m in sys.modules if m == "audit" or m.startswith("audit.")]:
                del sys.modules[name]
        import audit.cli  # noqa: F401
        import audit.linkage.commands  # noqa: F401
        import audit.linkage.inspect_command  # noqa: F401
        import importlib
        import pkgutil

        import audit

        for mod in pkgutil.walk_packages(audit.__path__, "audit."):  # what the commands import lazily
            if mod.name.startswith(("audit.elf", "audit.linkage", "audit.pe", "audit.macho")):
                try:
                    importlib.import_module(mod.name)
                except Exception:
                    pass
        try:  # the shipped policy's patterns compiled once: each fork finds them in re's cache
            from audit.linkage.judging.policy import load_policy

            load_policy()
        except Exception:
            pass
        self.stamp = stamp

    def run(self, argv: list[str], case_dir: str, cwd: str, extra_env: dict[str, str], tag: str) -> Outcome:
        out_p, err_p, log_p = (os.path.join(case_dir, f"{tag}.{x}") for x in ("stdout", "stderr", "hook"))
        env = dict(self.env, **extra_env)
        start = time.monotonic()
        if self.mode == "fork":
            pid = self._fork(argv, cwd, env, out_p, err_p, log_p, case_dir)
        else:
            arg = json.dumps({"hookdir": str(HERE), "log": log_p, "canary": self.canary, "allowed": case_dir,
                              "argv": argv})
            with open(out_p, "wb") as o, open(err_p, "wb") as e:
                proc = subprocess.Popen([sys.executable, "-c", BOOT, arg], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                        stdout=o, stderr=e, start_new_session=True)
            pid = proc.pid
        timed_out = False
        delay = 0.002
        while True:
            got, status, ru = os.wait4(pid, os.WNOHANG)
            if got:
                break
            if time.monotonic() - start > self.timeout:
                timed_out = True
                _killpg(pid)
                got, status, ru = os.wait4(pid, 0)
                break
            time.sleep(delay)
            delay = min(delay * 1.5, 0.05)
        wall = time.monotonic() - start
        orphans = False
        if _group_alive(pid):  # a worker left behind once the command returned
            time.sleep(0.3)
            if _group_alive(pid):
                orphans = not timed_out
                _killpg(pid)
        rc = os.waitstatus_to_exitcode(status)
        sig = -rc if rc < 0 else None
        hook = Path(log_p).read_text(errors="replace").splitlines() if os.path.exists(log_p) else []
        return Outcome(None if timed_out else (rc if rc >= 0 else None), sig if not timed_out else None, timed_out,
                       ru.ru_maxrss, wall, Path(out_p).read_bytes(), Path(err_p).read_bytes(), hook, orphans)

    def _fork(self, argv, cwd, env, out_p, err_p, log_p, case_dir) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        code = 70
        try:
            os.setpgid(0, 0)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.chdir(cwd)
            fd_in = os.open(os.devnull, os.O_RDONLY)
            fd_out = os.open(out_p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fd_err = os.open(err_p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for fd, target in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
                os.dup2(fd, target)
                os.close(fd)
            os.environ.clear()
            os.environ.update(env)
            import tempfile

            tempfile.tempdir = None  # TMPDIR is read again
            enc, errors = self.stdio["out"]
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=enc, errors=errors)
            enc, errors = self.stdio["err"]
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=enc, errors=errors,
                                          line_buffering=True)
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
            sys.argv = ["sovereign-audit", *argv]
            import atexit

            atexit._clear()  # the fuzzer's (or pytest's) own exit handlers are not the command's
            sys.path.insert(0, str(HERE))
            import hook

            hook.install(log_p, self.canary, case_dir)
            from audit.cli import main

            try:
                main()
                code = 0
            except SystemExit as exc:  # as the interpreter would turn it into a status
                if exc.code is None:
                    code = 0
                elif isinstance(exc.code, int):
                    code = exc.code & 0xFF
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException as exc:  # the fork itself failed: say so where the contract looks
            try:
                os.write(2, f"fuzz runner failure: Traceback {exc!r}\n".encode())
            except OSError:
                pass
        os._exit(code)


def _source_stamp() -> tuple:
    newest, count = 0, 0
    for root, _dirs, files in os.walk(REPO / "audit"):
        for n in files:
            if n.endswith(".py"):
                count += 1
                newest = max(newest, os.stat(os.path.join(root, n)).st_mtime_ns)
    return newest, count


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """A live (not zombie) process in the group: /proc, since a container's init may leave
    zombies unreaped and kill(0) would count them."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                rest = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(rest[2]) == pgid and rest[0] not in (b"Z", b"X"):
            return True
    return False
