"""Static archives (`ar`): the members of a System V/GNU or BSD archive, read from its bytes.

    members = read_members(buf, label)   # buf: bytes or an mmap of the archive; label names it in errors

A static archive holds object files that a build links in (libcublas_static.a, MKL's .a files):
each member is audited as a file of its own (inputs.py). Understood here: the 60-byte member
headers, the symbol tables (`/`, `/SYM64/`, BSD `__.SYMDEF*`, an MSVC library's first and second
linker members, both named `/`, and `/<ECSYMBOLS>/`; skipped), the long-name table `//` with its
`/123` references (GNU ends each name with "/\n", MSVC's lib.exe and llvm-lib with a NUL), and
BSD `#1/len` names. An MSVC library (a static one, or an import library of short import
objects) is a System V archive of this kind. A thin archive
(`!<thin>`) only names files outside it: it cannot be audited from its own bytes.

Everything is checked against the archive's size before it is believed: a member's size, a
long-name offset, the number of members and the length of a name. A malformed archive raises
InputError, one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.errors import InputError

MAGIC = b"!<arch>\n"
THIN_MAGIC = b"!<thin>\n"
_HEADER = 60
_FMAG = b"`\n"
MAX_MEMBERS = 200_000  # libmkl_core.a, among the largest real ones, has a few thousand
MAX_NAME_BYTES = 4096  # a member's name (PATH_MAX): a longer one is no file name


@dataclass(frozen=True)
class ArMember:
    name: str  # as stored (GNU's closing "/" left out); bytes that are not UTF-8 kept as surrogates
    offset: int  # where its bytes start in the archive
    size: int  # how many bytes it has


def _symbol_table(name: bytes) -> bool:
    return name in (b"/", b"/SYM64/") or name.startswith((b"__.SYMDEF", b"/<"))


def _decimal(field: bytes) -> int | None:
    text = field.rstrip(b" ")
    return int(text) if text and text.isdigit() else None


def read_members(buf, label: str, max_members: int = MAX_MEMBERS) -> list[ArMember]:
    """The members of the archive in `buf`, in archive order, symbol tables and the long-name
    table left out. Raises InputError (its message starts with `label`)."""
    size = len(buf)
    magic = bytes(buf[:8])
    if magic == THIN_MAGIC:
        raise InputError(f"{label}: thin archive: members live outside it (audit the object files it names)")
    if magic != MAGIC:
        raise InputError(f"{label}: not a static archive (no !<arch> header)")

    def bad(what: str) -> InputError:
        return InputError(f"{label}: malformed static archive: {what}")

    out: list[ArMember] = []
    long_names: bytes | None = None
    at = 8
    while at < size:
        if at + 1 == size and buf[at:at + 1] == b"\n":  # the last member's padding byte
            break
        if at + _HEADER > size:
            raise bad(f"truncated member header at offset {at} ({size - at} of {_HEADER} bytes)")
        header = bytes(buf[at:at + _HEADER])
        if header[58:60] != _FMAG:
            raise bad(f"bad member header at offset {at}")
        length = _decimal(header[48:58])
        if length is None:
            raise bad(f"bad member size {header[48:58].decode('latin-1').strip()!r} at offset {at}")
        data = at + _HEADER
        if data + length > size:
            raise bad(f"the member at offset {at} has {length} bytes, past the end of the archive "
                      f"({size} bytes): truncated")
        field = header[:16].rstrip(b" ")
        nxt = data + length + (length & 1)
        if field == b"//":  # GNU long-name table
            if long_names is not None:
                raise bad("two long-name tables")
            long_names = bytes(buf[data:data + length])
            at = nxt
            continue
        if _symbol_table(field):
            at = nxt
            continue
        start, body = data, length
        if field.startswith(b"#1/"):  # BSD: the name is the member's first bytes
            n = _decimal(field[3:])
            if n is None or n > length or n > MAX_NAME_BYTES:
                raise bad(f"bad BSD name length {field[3:].decode('latin-1')!r} at offset {at}")
            raw = bytes(buf[data:data + n]).rstrip(b"\0")
            start, body = data + n, length - n
            if raw.startswith(b"__.SYMDEF"):
                at = nxt
                continue
        elif field[:1] == b"/" and field[1:].isdigit():  # GNU: an offset into the long-name table
            if long_names is None:
                raise bad(f"long name reference {field.decode('latin-1')!r} at offset {at} with no long-name table")
            offset = int(field[1:])
            if offset >= len(long_names):
                raise bad(f"long name reference {field.decode('latin-1')!r} at offset {at} past the "
                          f"{len(long_names)}-byte long-name table")
            # GNU ends each name with "/\n", MSVC (lib.exe, llvm-lib) with a NUL
            window = long_names[offset:offset + MAX_NAME_BYTES + 2]
            ends = [k for k in (window.find(b"\n"), window.find(b"\0")) if k >= 0]
            raw = window[:min(ends)] if ends else window
            raw = raw[:-1] if raw.endswith(b"/") else raw
        else:
            raw = field[:-1] if field.endswith(b"/") else field
        if not raw or b"\0" in raw or len(raw) > MAX_NAME_BYTES:
            raise bad(f"member at offset {at} has " + ("no name" if not raw else "a name that is no file name"))
        if len(out) >= max_members:
            raise bad(f"more than {max_members} members")
        out.append(ArMember(raw.decode("utf-8", "surrogateescape"), start, body))
        at = nxt
    return out
