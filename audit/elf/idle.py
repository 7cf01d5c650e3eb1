"""Is a CPU free for a forked child? Measured from /proc/stat, not guessed from the load average.

A large file's biggest symbol table is selected in a forked child (audit.elf.prescan) while this
process reads the rest: with a second CPU free, the read ends sooner. With every CPU taken by
other work, the child only shares the CPUs the one process would have had, and what the fork
costs (the pages both processes copy as they write, a second start) is paid for nothing: more
CPU and a longer wall time than one process alone (measured in docs/perf.md, "Audit speed").

`mark()` samples the CPUs' idle time when a command starts; `spare()`, at the moment the child
would be forked, says whether at least half a CPU stayed idle since (this process keeps one
busy meanwhile). Without a mark, or without /proc/stat, it says yes: the child is used as before.
"""

from __future__ import annotations

_SPARE = 0.5  # CPUs left idle on average since the mark, at least, for one to count as free
_MIN_TICKS = 4  # clock ticks per CPU since the mark below which nothing is concluded (10 ms each)
_mark: tuple[int, int, int] | None = None


def _sample() -> tuple[int, int, int] | None:
    """(idle ticks summed over the CPUs, all ticks summed, number of CPUs) since boot, or None."""
    try:
        with open("/proc/stat", "rb") as fh:
            text = fh.read(1 << 16)
    except OSError:
        return None
    lines = text.split(b"\n")
    try:
        fields = [int(v) for v in lines[0].split()[1:]]
    except ValueError:
        return None
    if not lines[0].startswith(b"cpu ") or len(fields) < 5:
        return None
    cpus = sum(1 for line in lines[1:] if line.startswith(b"cpu"))
    # user nice system idle iowait irq softirq steal (guest time is counted in user already)
    return fields[3] + fields[4], sum(fields[:8]), cpus


def mark() -> None:
    """Remember the CPUs' idle time now (a command's start)."""
    global _mark
    _mark = _sample()


def spare() -> bool:
    """Whether a CPU stayed free since mark() (True without a mark or /proc/stat)."""
    now = _sample() if _mark is not None else None
    return True if now is None else has_spare(_mark, now)


def has_spare(before: tuple[int, int, int], after: tuple[int, int, int]) -> bool:
    """From two samples: at least _SPARE CPUs idle on average between them. Too short a time
    apart to tell (or a counter gone backwards): True, as without a measure."""
    cpus = after[2]
    if cpus < 2:
        return False  # the one CPU is this process's
    idle, total = after[0] - before[0], after[1] - before[1]
    if total < _MIN_TICKS * cpus or idle < 0:
        return True
    return idle >= _SPARE * total / cpus
