"""An audit hook (PEP 578) that records what a run opens or changes outside its case folder.

Installed in the process that runs the command (inherited by the workers it forks). Each event
that touches the canary folder (read or write: the mutations point links at it, so no honest
run opens it) or writes outside the case folder is appended to a log file at once, through a
descriptor opened before the hook, so a forked worker's events are kept too.
"""

from __future__ import annotations

import os
import sys

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# events that create, change or remove a path: (index of that path, index of its dir_fd or None)
_CHANGE = {"os.mkdir": (0, 2), "os.remove": (0, 1), "os.rmdir": (0, 1), "os.chmod": (0, 2), "os.chown": (0, 3),
           "os.utime": (0, 3), "os.truncate": (0, None), "os.symlink": (1, 2), "os.link": (1, 3),
           "os.rename": (1, 3), "os.replace": (1, 3), "os.mkfifo": (0, 2), "os.mknod": (0, 3),
           "shutil.copyfile": (1, None), "shutil.move": (1, None)}
_LIST = {"os.listdir", "os.scandir", "glob.glob", "os.chdir"}


def install(log_path: str, canary: str, allowed: str) -> None:
    canary = os.path.realpath(canary)
    allowed = os.path.realpath(allowed)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        canary_inodes = {(st.st_dev, st.st_ino) for st in (os.stat(os.path.join(root, n))
                         for root, _d, names in os.walk(canary) for n in names)}
    except OSError:
        canary_inodes = set()
    busy = [False]

    def where(path, dir_fd=None) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        p = os.fsdecode(path)
        if not os.path.isabs(p):
            base = os.readlink(f"/proc/self/fd/{dir_fd}") if isinstance(dir_fd, int) and dir_fd >= 0 else os.getcwd()
            p = os.path.join(base, p)
        head, tail = os.path.split(p)
        return os.path.join(os.path.realpath(head), tail)

    def inside(p: str, top: str) -> bool:
        return p == top or p.startswith(top + os.sep)

    def record(kind: str, event: str, p: str) -> None:
        os.write(fd, f"{kind}\t{event}\t{p!a}\n".encode())

    def hook(event, args):
        if busy[0] or not (event == "open" or event in _CHANGE or event in _LIST):
            return
        busy[0] = True
        try:
            if event == "open":
                path, mode, flags = (tuple(args) + (None, None, None))[:3]
                p = where(path)
                if p is None:
                    return
                real = os.path.realpath(p)
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                          (isinstance(flags, int) and flags & _WRITE_FLAGS)
                hit = inside(real, canary)
                if not hit and not writing:
                    try:
                        st = os.stat(p)
                        hit = (st.st_dev, st.st_ino) in canary_inodes
                    except OSError:
                        pass
                if hit:
                    record("write-outside" if writing else "read-outside", event, p)
                elif writing and not inside(real, allowed) and real not in ("/dev/null", "/dev/tty"):
                    record("write-outside", event, p)
            elif event in _CHANGE:
                i, j = _CHANGE[event]
                dir_fd = args[j] if j is not None and j < len(args) else None
                p = where(args[i], dir_fd)
                if p is not None and (inside(p, canary) or not inside(p, allowed)):
                    record("write-outside", event, p)
            else:
                p = where(args[0] if args else None)
                if p is not None and inside(os.path.realpath(p), canary):
                    record("read-outside", event, p)
        except Exception:  # a path the hook cannot resolve is not a finding
            pass
        finally:
            busy[0] = False

    sys.addaudithook(hook)
