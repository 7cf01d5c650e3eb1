"""The bundle's layout: which files it holds, where they go, and how evidence is read back.

Both `run` (which writes evidence as each stage ends) and the report (which turns saved evidence
into a bundle) use these names, so they live apart from either.

Every destination path is joined through `safe_join`, which refuses absolute names and `..`, so
names taken from evidence (targets, file names) cannot place a file outside the bundle.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from audit.errors import InputError, UsageError

# Evidence file of each stage (bundle-relative under evidence/).
EVIDENCE_FILES = {
    "environment": "environment.json",
    "build": "build.json",
    "linkage": "linkage.json",
    "parity": "parity.json",
    "bench": "bench.json",
    "pipeline": "pipeline.json",
}
# What a bundle folder may already hold from an earlier run (the only things ever removed).
BUNDLE_ENTRIES = ("evidence", "artifacts", "attestations", "report.html", "ro-crate-metadata.json",
                  "manifest.json", "manifest.dsse.json", "public.pem")
MAX_EVIDENCE_BYTES = 64 * 1024 * 1024  # evidence JSON is small; refuse to parse anything huge
EVIDENCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}\.json$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# --------------------------------------------------------------------------------------------
# paths


def safe_component(name: str) -> bool:
    """One path component that cannot leave its folder: no separators, not `.`/`..`, printable."""
    return (bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name
            and not _CONTROL.search(name) and len(name.encode("utf-8", "surrogateescape")) <= 255)


def safe_join(root: Path, rel: str) -> Path:
    """root/rel for a bundle-relative POSIX path; InputError if it is absolute or climbs out."""
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or rel.startswith("\\") or re.match(r"^[A-Za-z]:", rel):
        raise InputError(f"unsafe bundle path {rel!r}: absolute paths are refused")
    if any(part in ("..", "") for part in rel.split("/")) or not all(safe_component(c) for c in p.parts):
        raise InputError(f"unsafe bundle path {rel!r}: '..' and odd components are refused")
    dest = root.joinpath(*p.parts)
    # Symlinked folders inside the bundle could still point elsewhere: check the real location.
    real_root = root.resolve()
    real_parent = dest.parent.resolve()
    if real_parent != real_root and real_root not in real_parent.parents:
        raise InputError(f"unsafe bundle path {rel!r}: it resolves outside the bundle")
    return dest


def prepare_out(out: Path) -> str | None:
    """Make `out` ready: empty, or an earlier bundle whose generated entries are removed.

    Refuses a non-empty folder that is not a bundle: nothing is deleted that a bundle did not hold.
    Returns one line saying what was replaced (the earlier run and the entries removed), or None
    when there was nothing to replace: a re-run into the same folder never overwrites silently.
    """
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    replaced = None
    if out.is_dir():
        entries = {p.name for p in out.iterdir()}
        if entries and not ((out / "evidence" / "run.json").is_file()
                            or (out / "ro-crate-metadata.json").is_file()):
            raise UsageError(f"--out {out}: folder is not empty and is not a sovereign-audit bundle")
        unknown = sorted(entries - set(BUNDLE_ENTRIES))
        if unknown:
            raise UsageError(f"--out {out}: holds files a bundle does not ({', '.join(unknown[:3])});"
                             " choose an empty folder")
        present = [n for n in BUNDLE_ENTRIES if (out / n).is_symlink() or (out / n).exists()]
        if present:
            replaced = (f"replacing the earlier bundle in {out} ({earlier_run(out)}): "
                        + ", ".join(n + ("/" if (out / n).is_dir() and not (out / n).is_symlink() else "")
                                    for n in present))
        for name in BUNDLE_ENTRIES:
            p = out / name
            if p.is_symlink() or p.is_file():
                p.unlink()
            elif p.is_dir():
                shutil.rmtree(p)
    try:
        (out / "evidence").mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only or missing parent, /proc...: the user's choice of folder
        raise UsageError(f"--out {out}: cannot create the bundle folder: {exc.strerror or exc}") from None
    return replaced


def earlier_run(out: Path) -> str:
    """What the bundle in `out` came from, in a few words (its run.json's start and verdict)."""
    try:
        run = json.loads(read_plain(out / "evidence" / "run.json", MAX_EVIDENCE_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return "no readable run record"
    if not isinstance(run, dict):
        return "no readable run record"
    started = run.get("started")
    code = run.get("exit_code")
    when = f"run started {' '.join(str(started).split())[:40]}" if started else "a run of unknown start"
    how = {0: "exit 0", 1: "exit 1"}.get(code, "never finished" if code is None else f"exit {code}")
    return f"{when}, {how}"


# --------------------------------------------------------------------------------------------
# evidence


class FileTooLarge(OSError):
    pass


def read_plain(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path` (not through a symlink), at most `limit` of them.
    Opened without blocking and checked after opening, so a FIFO or a device put where a JSON
    file was is refused, never waited on or read forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data


def load_evidence(evidence_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """{file stem: parsed JSON} for every evidence file; InputError (exit 3) on malformed JSON."""
    warnings: list[str] = []
    evidence: dict[str, Any] = {}
    if not evidence_dir.is_dir():
        raise InputError(f"{evidence_dir}: not a folder of evidence")
    try:
        entries = sorted(evidence_dir.iterdir())
    except OSError as exc:
        raise InputError(f"{evidence_dir}: cannot read the evidence folder: {exc.strerror or exc}") from None
    for p in entries:
        if p.name.startswith(".") or p.suffix != ".json":
            continue
        if not EVIDENCE_NAME.match(p.name) or p.is_symlink() or not p.is_file():
            warnings.append(f"evidence file {p.name!r} ignored: not a plain file with a safe name")
            continue
        try:
            data = json.loads(read_plain(p, MAX_EVIDENCE_BYTES).decode("utf-8"))
        except FileTooLarge:
            raise InputError(f"{p}: evidence file larger than {MAX_EVIDENCE_BYTES >> 20} MiB") from None
        except UnicodeDecodeError:
            raise InputError(f"{p}: evidence is not UTF-8 JSON") from None
        except ValueError as exc:
            raise InputError(f"{p}: malformed evidence JSON ({exc})") from None
        except RecursionError:  # json recurses once per nested array or object
            raise InputError(f"{p}: malformed evidence JSON (nested too deeply)") from None
        except OSError as exc:
            raise InputError(f"{p}: cannot read evidence ({exc.strerror or exc})") from None
        if not isinstance(data, dict):
            raise InputError(f"{p}: evidence must be a JSON object")
        schema = data.get("schema")
        if schema is not None and not isinstance(schema, str):
            raise InputError(f"{p}: 'schema' must be a string")
        evidence[p.stem] = data
    known = {Path(n).stem for n in EVIDENCE_FILES.values()} | {"run"}
    if not known & set(evidence):
        raise InputError(f"{evidence_dir}: holds none of the evidence files "
                         f"({', '.join(sorted(n + '.json' for n in known))})")
    return evidence, warnings


def build_targets(build: dict | None) -> list[dict]:
    """The per-target records of build.json (BuildResult.to_dict writes them as a list)."""
    if not isinstance(build, dict) or not isinstance(build.get("targets"), list):
        return []
    return [t for t in build["targets"] if isinstance(t, dict)]
