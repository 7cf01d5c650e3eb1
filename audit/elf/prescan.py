"""A large symbol table selected in a forked child while this process reads everything else.

The pattern scan over a big `.symtab` (libtorch_cpu.so: 530k entries, a 76 MB string table) is
regex work that holds the GIL, so a thread cannot share it; a forked child can, on the second
core. The child runs exactly the in-process code (audit.elf.symbols.select and names_at) on the
same mapped file and sends back the selected indices, name ends, decoded names and warnings; the
parent builds the Symbol objects as usual. Anything unusual (no fork, another thread already
running, a child that fails or dies) leaves the table to be read in process: the result is the
same either way, only slower.
"""

from __future__ import annotations

import os
import pickle
import threading

from audit.elf.symbols import SymbolTable, names_at, select

MIN_ENTRIES = 200_000  # below this, forking costs more than it saves


class Prescan:
    def __init__(self, pid: int, fd: int, index: int):
        self.pid, self.fd, self.index = pid, fd, index
        self._result = None
        self._done = False

    def result(self):
        """(idx, ends, names, warnings) from the child, or None if it did not deliver."""
        if not self._done:
            self._done = True
            try:
                with os.fdopen(self.fd, "rb") as fh:
                    data = fh.read()
                _, status = os.waitpid(self.pid, 0)
                if os.waitstatus_to_exitcode(status) == 0:
                    idx, ends, names, warnings = pickle.loads(data)  # our own child's answer
                    self._result = idx, ends, (names.split("\0") if len(idx) else []), warnings
            except (OSError, pickle.UnpicklingError, ValueError, EOFError):
                self._result = None
        return self._result

    def close(self) -> None:
        """Reap the child if its answer was never read (the parent stopped on an error)."""
        if not self._done:
            self._done = True
            try:
                os.close(self.fd)  # a child still writing gets EPIPE and exits
                os.waitpid(self.pid, 0)
            except OSError:
                pass


def start(img, tables: list[SymbolTable], pattern, keep_imports: dict[int, bool]) -> Prescan | None:
    """Fork a child selecting the largest table (if it is large enough), or return None."""
    if pattern is None or not tables or not hasattr(os, "fork") or threading.active_count() > 1:
        return None
    table = max(tables, key=len)
    if len(table) < MIN_ENTRIES:
        return None
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # the child: compute, send, exit without running any of the parent's cleanup
        code = 1
        try:
            os.close(r)
            warnings: list[str] = []
            idx, ends = select(img, table, pattern, keep_imports[table.index], warnings)
            names = names_at(img, table, table.syms["st_name"][idx].tolist(), ends.tolist())
            payload = pickle.dumps((idx, ends, "\0".join(names), warnings), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(w, "wb") as out:
                out.write(payload)
            code = 0
        except BaseException:  # noqa: BLE001  (any failure: the parent reads the table itself)
            pass
        os._exit(code)
    os.close(w)
    return Prescan(pid, r, table.index)
