"""Judging one audited file's evidence: its own content (symbols, strings, device code) and its
dependency tree (denied NEEDED, transitive libraries; a note for an RPATH directory that holds a
denied library the object may load at run time).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import re
from itertools import compress, filterfalse, repeat
from operator import attrgetter, methodcaller, not_

from audit.elf.model import ElfInfo, Forward, SymbolColumns
from audit.elf.strings import is_mention
from audit.linkage.model import Finding, Match
from audit.linkage.judging.patterns import newlapack_bases
from audit.linkage.judging.policy import RULE_MISMATCH, RULE_UNRESOLVED, Policy
from audit.linkage.resolution.ldso import DepNode, Resolver

_MAX_EXAMPLES = 10
_NOT_CODE = {"FILE", "SECTION"}  # symbol-table entries that name a source file or a section, not code
_KIND, _NAME, _DEFINED, _TABLE = (attrgetter(a) for a in ("kind", "name", "defined", "table"))
_MAX_DIR_LIST = 20000  # entries looked at per RPATH/RUNPATH directory


def _columns(symbols) -> tuple[list, list, list, list]:
    """(kind, name, defined, table) of every symbol, as whole columns: the reader's SymbolColumns
    as they are, any other list of Symbols read through."""
    if isinstance(symbols, SymbolColumns):
        return symbols.kind, symbols.name, symbols.defined, symbols.table
    return (list(map(_KIND, symbols)), list(map(_NAME, symbols)), list(map(_DEFINED, symbols)),
            list(map(_TABLE, symbols)))


def symbol_basis(symbols, policy: Policy, keep: bool = False) -> tuple[set[str], set[str], dict[str, set[str]], list]:
    """What judging an object's symbols starts from, made from the symbols alone: the defined and
    the imported names (source files and sections left out), the names in each table, and the
    names each rule claims (Policy.symbol_groups). Whole columns through C-level map/filter/
    compress, never a Python statement per symbol: libtorch_cpu brings ~85k vendor names.
    `prejudge` has it made ahead (`keep`: left in the reader's SymbolColumns.memo, per policy);
    the next call takes it from there, so it is not held for the rest of the run."""
    memo = getattr(symbols, "memo", None)
    hit = memo.pop("basis", None) if memo is not None else None
    if hit is not None and hit[0] is policy:
        return hit[1]
    kinds, names_all, flags, tables_of = _columns(symbols)
    if _NOT_CODE.intersection(kinds):  # a few rows (74 of 85k in libtorch_cpu): cut around them
        drop = list(compress(range(len(kinds)), map(_NOT_CODE.__contains__, kinds)))
        names_all, flags, tables_of = (_without(c, drop) for c in (names_all, flags, tables_of))
    defined = set(compress(names_all, flags))
    imported = set(compress(names_all, map(not_, flags)))
    in_table: dict[str, set[str]] = {}
    for table, lo, hi in _runs(tables_of):  # each table's rows are one run (SymbolColumns.extend)
        in_table.setdefault(table, set()).update(names_all[lo:hi])
    basis = defined, imported, in_table, policy.symbol_groups(dict.fromkeys(names_all))
    if keep and memo is not None:
        memo["basis"] = (policy, basis)
    return basis


def _without(column: list, drop: list[int]) -> list:
    """`column` without the rows at the (sorted) positions `drop`, copied a stretch at a time."""
    out: list = []
    at = 0
    for k in drop:
        out += column[at:k]
        at = k + 1
    out += column[at:]
    return out


def _runs(column: list) -> list[tuple[object, int, int]]:
    """(value, start, stop) of each run of equal values in `column`, found with list.index (in C):
    a reader's table column is a run or two, never a Python statement per row."""
    values = set(column)
    out = []
    at, n = 0, len(column)
    while at < n:
        value, stop = column[at], n
        for other in values:
            if other != value:
                try:
                    stop = column.index(other, at, stop)
                except ValueError:
                    pass
        out.append((value, at, stop))
        at = stop
    return out


def prejudge(policy: Policy, symbols) -> None:
    """symbol_basis made ahead (read_elf's on_symbols hook: while the reader waits for its helper)."""
    symbol_basis(symbols, policy, keep=True)


def scan_object(info: ElfInfo, policy: Policy, chain: list[str], in_file: str | None) -> tuple[list[Finding], list[str]]:
    """Content evidence in one object (no tree): (findings, errors that make it unauditable)."""
    findings: list[Finding] = []
    errors: list[str] = []

    def add(rule, kind, subject, where, **kw):
        findings.append(Finding.from_rule(rule, policy, kind, subject, where, chain, in_file=in_file, **kw))

    needed = set(info.needed) | {n for _, n in getattr(info, "extra_loads", ())}  # ELF: filtees load too
    interp = getattr(info, "interpreter", None)  # ELF: the kernel maps the program interpreter and runs it first
    if interp:
        rule = policy.deny_rule_for_soname(os.path.basename(interp))
        if rule:
            add(rule, "needed", os.path.basename(interp), "PT_INTERP",
                detail=f"the program interpreter is {interp}: the kernel maps it and runs it before the program")
    for vn in info.version_needs:
        rule = policy.deny_rule_for_soname(vn.file)
        if rule:
            add(rule, "verneed", vn.file, ".gnu.version_r", detail=_versions(vn.versions))
        if vn.file not in needed:
            add(policy.rule(RULE_MISMATCH), "mismatch", vn.file, ".gnu.version_r",
                detail="versioned imports name a file that DT_NEEDED does not list; " + _versions(vn.versions))

    loader = ", ".join(info.code_loading_imports[:4])
    strings: dict[tuple, list] = {}
    for hit in info.library_strings:
        rule = policy.rule_for_string(hit.text)
        if rule:
            strings.setdefault((rule.id, hit.text), []).append(hit)

    defined, imported, in_table, by_rule = symbol_basis(info.symbols, policy)
    if by_rule:
        forwards = {f.symbol: f for f in info.forwarders}
        from_lib = _library_rules(policy, info) if any(map(methodcaller("__contains__", "$NEWLAPACK"), imported)) else {}
        # a defined name whose part before "." is a forwarding stub (GCC's split-off parts: X.cold,
        # X.part.0) is a part of that stub, not a function of its own
        stubs = {p for p, f in forwards.items() if _defined_as(policy, p, f)[1] is not None}
        groups: dict[tuple, list[str]] = {}
        for rule, members in by_rule:
            parts = {n for n in members if "." in n and n.split(".", 1)[0] in stubs and n in defined
                     and n not in forwards} if stubs else set()
            plain = list(filterfalse((forwards.keys() | parts).__contains__, filter(defined.__contains__, members)))
            if plain:
                groups.setdefault((rule.id, "static-symbol", None), []).extend(plain)
            for name in filter(defined.__contains__, filter(forwards.__contains__, members)):
                fw = forwards[name]
                how = _defined_as(policy, name, fw)
                if how[1] is None and name.split(".", 1)[0] in stubs and name.split(".", 1)[0] != name:
                    parts.add(name)
                    continue
                # a stub belongs to the library whose code it reaches: cuBLAS's
                # cublasGetEnvironmentMode -> cublasLtGetEnvironmentMode@plt is cuBLASLt's
                owner = (from_lib.get(fw.target) or policy.rule_for_symbol(fw.target) or rule) if how[1] == "stub" else rule
                groups.setdefault((owner.id, *how), []).append(name)
            imports = list(filterfalse(parts.__contains__, filter(imported.__contains__, members)))
            for name in imports:  # Accelerate's new-LAPACK names: the rule of the library they come from
                groups.setdefault(((from_lib.get(name) or rule).id, "imported-symbol", None), []).append(name)
        sources = _source_files(policy, info) if any(k[1] == "static-symbol" for k in groups) else {}
        # stubs before plain names of the same kind: grouped into one finding, its detail says so
        for (rid, kind, via), names in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1], g[0][2] is None)):
            tables = ", ".join(t for t, members in sorted(in_table.items()) if not members.isdisjoint(names))
            # .symtab spells versioned imports "name@VERSION": one name, not two
            every = sorted({n.split("@", 1)[0] or n if "@" in n else n for n in names}) \
                if any(map(str.__contains__, names, repeat("@"))) else sorted(names)
            if via is None:
                files = sources.get(rid, [])
                detail = (f"{len(files)} source-file name(s) in .symtab match too (STT_FILE, not counted): "
                          + ", ".join(files[:3])) if kind == "static-symbol" and files else None
            else:
                libs = sorted(text for (r, text) in strings if r == rid)
                detail = _stub_detail(via, [forwards[n] for n in every[:3]], len(every), libs)
            add(policy.rule(rid), kind, every[0], tables, count=len(every), detail=detail,
                matches=[Match(every, tables, detail=detail)])

    for (rid, text), hits in strings.items():
        names = [h for h in hits if not is_mention(h)]
        shown = (names or hits)[0]
        said = getattr(shown, "context", "")
        quote = f': "{said}"' if said and said != text else ""
        call = getattr(shown, "call", "")  # a Python source's loader call (audit/python_source)
        if names:  # the whole string: a name a loader can be given
            detail = (f"the source hands it to {call}" if call else f"imports {loader}" if loader else
                      "no code-loading import seen: nothing in this object loads it by name") + quote
        else:
            detail = (f"mentioned in text, not a string a loader is given ({len(hits)} place(s)){quote}")
        where = getattr(shown, "where", None) or f"{shown.section} @0x{shown.offset:x}"
        add(policy.rule(rid), "dlopen-string", text, where, count=len(names or hits),
            offset=shown.offset if in_file is None else None, detail=detail)
        if not names or not loader:  # a note: nothing here is shown to load it
            findings[-1].severity = "warn"

    marker_findings(info, policy, add, in_file)
    declared_findings(info, policy, add)
    runtime_findings(info, policy, findings, add, loader)

    # A kernel without its own marker belongs to the denied library that ships it, if this is one.
    shipper = policy.deny_rule_for_soname(info.soname or "") or policy.deny_rule_for_soname(os.path.basename(info.path))
    judged: dict[str, object] = {}  # the same kernels come once per target (librocsparse: 88k names, 9 targets)
    for dc in info.device_code:
        where = f"{dc.section} @0x{dc.offset:x} {dc.kind} {dc.target}"
        if dc.error:
            errors.append(f"device code at {where}: {dc.error}")
        kern: dict[str, list[str]] = {}
        for name in dc.kernels:
            rule = judged.get(name, judged)
            if rule is judged:
                rule = judged[name] = policy.rule_for_kernel(name, shipper)
            if rule:
                kern.setdefault(rule.id, []).append(name)
        for rid, names in kern.items():
            add(policy.rule(rid), "device-kernel", names[0], where, count=len(names),
                offset=dc.offset if in_file is None else None, matches=[Match(names, where)])
    return findings, errors


def library_content(info: ElfInfo, policy: Policy, chain: list[str], in_file: str | None,
                    memo: dict) -> tuple[list[Finding], list[str]]:
    """scan_object for a library walked in a tree, scanned once per run: a library many audited
    files share (libtorch_cpu.so under each of torch's 130 extensions) would otherwise be judged
    again under each. Its findings are copied for each chain."""
    key = ("content", id(info), in_file is None)  # `memo` lives as long as the infos it keys on
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = scan_object(info, policy, [], in_file)
    findings, errors = hit
    return ([dataclasses.replace(f, chain=list(chain), in_file=in_file, examples=list(f.examples))
             for f in findings], list(errors))


_MAX_DIR_HITS = 8  # denied files kept per directory: enough to pass over the object's own links


def _denied_in_dir(d: str, policy: Policy, resolver: Resolver, own: str | None = None,
                   named: frozenset[str] = frozenset()) -> tuple[str, object] | None:
    """The first (by name) file of directory `d` that a deny rule names, with the rule, that is
    not the object itself (`own`, its real path: a library beside itself, or beside a link to
    itself, is no evidence) nor a name in `named`; looked at once per directory and run."""
    memo = resolver.memo
    key = ("dir", d)
    if key not in memo:
        found = []
        listed = resolver.paths.fs.listdir(d)
        for name in sorted(listed[:_MAX_DIR_LIST]) if listed is not None else ():
            rule = policy.deny_rule_for_soname(name)
            if rule and ".so" in name:
                found.append((name, rule, resolver.paths.real(f"{d.rstrip('/')}/{name}")))
                if len(found) == _MAX_DIR_HITS:
                    break
        memo[key] = found
    return next(((name, rule) for name, rule, real in memo[key]
                 if (own is None or real != own) and name not in named), None)


def marker_findings(info, policy: Policy, add, in_file: str | None) -> None:
    """static-string: a whole string in the data is one of a rule's markers, text only the vendor's
    own code holds (BLIS's "libblis: %s (line %lu):\\n"): a copy of its code is inside, whatever
    its symbols say (stripped, hidden, renamed). One finding per place; group.py merges them."""
    for hit in getattr(info, "marker_strings", ()):
        rule = policy.rule_for_marker(hit.text)
        if rule is None:  # starts with a marker's text, but an exact marker is not the whole string
            continue
        marker = rule.marker_for(hit.text)
        add(rule, "static-string", hit.text, f"{hit.section} @0x{hit.offset:x}",
            offset=hit.offset if in_file is None else None,
            detail=f"text only the vendor's own code contains (marker \"{marker}\"): a copy of its code is inside")


def declared_findings(info, policy: Policy, add) -> None:
    """dlopen-note: a library the file's `.note.dlopen` (systemd's dlopen metadata) says it loads.
    The authors' own declaration of a run-time dependency: a denied soname there fails like a
    NEEDED entry would, whether or not the name is also a string the scan found."""
    for decl in getattr(info, "dlopen_declared", ()):
        for soname in decl.sonames:
            rule = policy.deny_rule_for_soname(soname)
            if rule is None:
                continue
            feature = f" (feature {decl.feature!r})" if decl.feature else ""
            add(rule, "dlopen-note", soname, ".note.dlopen",
                detail=f"declared in the file's .note.dlopen{feature}: loaded at run time by its own account")


def runtime_findings(info: ElfInfo, policy: Policy, findings: list[Finding], add, loader: str) -> None:
    """A vendor library the code resolves at run time without naming it in data or symbols.

    dlsym-string: two or more of a rule's API names are strings in the data of an object that
    imports dlsym/dlvsym (cuDNN's `cudnnCreate`, ... in onnxruntime's CUDA provider), and the
    object has no other evidence of that rule (symbols, verneed or a library-name string explain
    the names otherwise: e.g. torch's `mkldnn_*` operator names beside its static oneDNN).
    assembled-name: then, where the object also imports dlopen, the library name built in code
    from instruction immediates (`libcudnn.so.9`) is looked for (that scan reads all code, so it
    runs only here), and any denied one is reported.
    """
    if not info.api_strings:
        return
    # a note (a mention in text, a name nothing here loads) explains nothing
    explained = {f.rule for f in findings if f.kind in ("static-symbol", "static-string", "imported-symbol", "verneed",
                                                        "dlopen-string")
                 and not (f.kind == "dlopen-string" and f.severity == "warn")}
    api = [h for h in info.api_strings if not _ENV_LIKE.fullmatch(h.text)]
    by_name = policy.classify_symbols(h.text for h in api)
    first: dict[str, object] = {}
    groups: dict[str, list[str]] = {}
    for hit in api:
        rule = by_name.get(hit.text)
        if rule is not None and rule.id not in explained and hit.text not in groups.get(rule.id, ()):
            groups.setdefault(rule.id, []).append(hit.text)
            first.setdefault(rule.id, hit)
    resolved = {rid: sorted(names) for rid, names in groups.items() if len(names) >= 2}
    mine = _own_names(info, [n for names in resolved.values() for n in names]) if resolved else set()
    if mine:  # the program's own functions and operators of the same name: no lookup of the vendor's
        resolved = {rid: kept for rid, names in resolved.items()
                    if len(kept := [n for n in names if n not in mine]) >= 2}
    for rid in sorted(resolved):
        own = _compiled_in(info, policy.rule(rid))
        if own:  # the vendor's code is in this file: its API names are its own strings
            names = resolved.pop(rid)
            types, at = own
            where = f"data @0x{at:x} (type names)"
            add(policy.rule(rid), "static-symbol", types[0], where, count=len(types),
                matches=[Match(types, where)],
                detail=f"compiled in: {len(types)} C++ type name(s) of the vendor's namespace are in the data "
                       f"({', '.join(types[:3])}); {len(names)} of its API names are strings too "
                       f"({', '.join(names[:3])}), and nothing imports them")
    for rid, names in resolved.items():
        hit = first[rid]
        where = f"{hit.section} @0x{hit.offset:x}"
        add(policy.rule(rid), "dlsym-string", names[0], where, count=len(names), matches=[Match(names, where)],
            detail=f"API names resolved at run time; imports {loader}")
    if not resolved or not {"dlopen", "dlmopen"} & set(info.code_loading_imports) or info.read_assembled_names is None:
        return
    built: dict[tuple, list] = {}
    for hit in info.read_assembled_names():
        rule = policy.deny_rule_for_soname(hit.text)
        if rule:
            built.setdefault((rule.id, hit.text), []).append(hit)
    for (rid, text), hits in sorted(built.items()):
        also = f"; {len(resolved[rid])} of its API names are dlsym strings" if rid in resolved else ""
        add(policy.rule(rid), "assembled-name", text, f"{hits[0].section} @0x{hits[0].offset:x} (immediates)",
            count=len(hits), detail=f"built in code from instruction immediates; imports {loader}{also}")


# An environment variable or constant (MKL_NUM_THREADS, MKL_DYNAMIC): capitals, digits and
# underscores only. The C APIs looked up with dlsym spell their names in mixed or lower case
# (cublasCreate_v2, mkl_sgemm, MKL_Set_Num_Threads).
_ENV_LIKE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
# A C++ type name in data (typeinfo name, a mangled nested name without "_Z"): "N4dnnl4impl3cpu...E"
_TYPE_NAME = rb"[A-Za-z0-9_]{4,400}"
_MIN_TYPE_NAMES = 2


def _type_prefixes(rule) -> list[bytes]:
    """Nested-name prefixes of a rule's C++ namespace patterns (`_ZN4dnnl*` -> b"N4dnnl"):
    how the namespace's type names (typeinfo names) begin."""
    out = []
    for p in rule.match_symbols:
        if p.startswith(("_ZN", "_ZNK")) and p.endswith("*") and not any(c in p[:-1] for c in "*?["):
            head = p[2:-1].replace("NK", "N", 1)
            if head not in out and len(head) > 3:
                out.append(head)
    return [h.encode("ascii") for h in out]


def _msvc_scopes(heads: list[bytes]) -> list[bytes]:
    """The MSVC spelling of each nested-name head's scope (b"N4dnnl" -> b"@dnnl@@", b"N6oneapi3mkl"
    -> b"@mkl@oneapi@@"): how an MSVC RTTI type name of that namespace ends (`.?AVprimitive_t@impl@dnnl@@`)."""
    out = []
    for head in heads:
        parts, at = [], 1
        while at < len(head):
            m = re.match(rb"[0-9]+", head[at:])
            if m is None:
                break
            size = int(m.group())
            parts.append(head[at + m.end():at + m.end() + size])
            at += m.end() + size
        if parts and at == len(head):
            out.append(b"@" + b"@".join(reversed(parts)) + b"@@")
    return out


def _compiled_in(info: ElfInfo, rule) -> tuple[list[str], int] | None:
    """(type names, file offset of the first) of the rule's C++ namespace among the file's
    NUL-delimited strings, if there are at least _MIN_TYPE_NAMES: the vendor's classes are
    defined in this file (their typeinfo names: oneDNN's N4dnnl4impl... in a library that
    builds oneDNN in and imports nothing of it; in a Windows binary their MSVC RTTI names). None if
    there are fewer, or the file cannot be read again."""
    heads = _type_prefixes(rule)
    if not heads or not info.path:
        return None
    # led by the literal names (a search the regex engine runs at memchr speed), the NUL before a
    # match checked here: a look-behind at its head made the engine try every byte (3-4 s on
    # 400 MB). A run not after a NUL cannot hide one that is: no NUL lies inside a run.
    pattern = re.compile(rb"(?:" + b"|".join(re.escape(h) for h in heads) + rb")" + _TYPE_NAME + rb"(?=\x00)")
    try:
        with open(info.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            found: dict[str, int] = {}
            for m in pattern.finditer(mm):
                if not m.start() or mm[m.start() - 1] != 0:
                    continue
                found.setdefault(m.group().decode("ascii"), m.start())
                if len(found) >= 100_000:
                    break
            if len(found) < _MIN_TYPE_NAMES and getattr(info, "format", "") in ("pe", "coff"):
                found.update(_msvc_type_names(mm, heads))
    except (OSError, ValueError):
        return None
    if len(found) < _MIN_TYPE_NAMES:
        return None
    return sorted(found), min(found.values())


def _msvc_type_names(mm, heads: list[bytes]) -> dict[str, int]:
    """MSVC RTTI type names (`.?AVprimitive_t@impl@dnnl@@`, `.?AU...`) of the heads' namespaces
    in a Windows binary, with their file offsets: what the Itanium typeinfo names are to ELF
    (torch_cpu.dll builds oneDNN in and exports none of it). Led by the literal `.?A`."""
    scopes = _msvc_scopes(heads)
    if not scopes:
        return {}
    pattern = re.compile(rb"\.\?A[UV][A-Za-z0-9_@?$]{1,400}?(?:" + b"|".join(re.escape(x) for x in scopes)
                         + rb")(?=\x00)")
    found: dict[str, int] = {}
    for m in pattern.finditer(mm):
        found.setdefault(m.group().decode("ascii"), m.start())
        if len(found) >= 100_000:
            break
    return found


def _own_names(info, names: list[str]) -> set[str]:
    """The `names` the file itself also spells as a C++ name of its own: a component of a
    mangled name, length-prefixed (`_ZN2at6native16mkl_gemm_batchedE...`), or of an MSVC-decorated
    one (`?mkldnn_view@native@at@@...`), each a function's or a class's, not a variable's (a
    loader's wrapper object of the API's name, PaddlePaddle's phi::dynload::cblas_sgemm, is no
    own name), or the last part of a qualified name in its text
    (`aten::mkldnn_adaptive_avg_pool2d`). Such a string is the
    program's function or operator name (torch's `mkl_gemm_batched`, `mkldnn_linear` operators,
    in a build with neither MKL nor oneDNN), not a vendor C API looked up by name: a C API has
    no namespace and no mangled form. One search over the file, led by the names themselves."""
    if not names or not info.path:
        return set()
    wanted = sorted(set(names), key=len, reverse=True)
    pattern = re.compile(b"|".join(re.escape(n.encode("ascii")) for n in wanted))
    own: set[str] = set()
    try:
        with open(info.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for m in pattern.finditer(mm):
                name = m.group()
                at, end = m.start(), m.end()
                size = str(len(name)).encode("ascii")
                if mm[max(0, at - len(size)):at] == size and not mm[at - len(size) - 1:at - len(size)].isdigit():
                    if _ITANIUM_OWN.match(mm[end:end + 2]):  # <len><name> as a function or a scope
                        own.add(name.decode("ascii"))
                elif mm[max(0, at - 2):at] == b"::" and not _IDENT_BYTE.match(mm[end:end + 1]):
                    own.add(name.decode("ascii"))
                elif mm[end:end + 1] == b"@" and (mm[at - 1:at] in (b"?", b"@") or mm[max(0, at - 3):at - 1] == b"??"):
                    scope_end = mm.find(b"@@", end, end + 256)  # an MSVC-decorated name: ?name@scope@@Y...
                    if scope_end >= 0 and mm[scope_end + 2:scope_end + 3] not in (b"3", b"2", b""):
                        own.add(name.decode("ascii"))  # a function or a class's member, not a variable
                if len(own) == len(wanted):
                    break
    except (OSError, ValueError):
        return set()
    return own


_IDENT_BYTE = re.compile(rb"[A-Za-z0-9_]")
# What follows <len><name> in an Itanium-mangled definition of the program's own: the end of a
# nested name and a parameter type (a function: at::native::mkl_gemm_batched(...)), or the next
# component, a constructor or destructor (a class named so: at::_ops::mkldnn_linear_out::call).
# Not a variable (the symbol ends after its nested name: phi::dynload::cblas_sgemm, a loader's
# wrapper object) nor a call inside an expression (decltype(cblas_sgemm(...)): `cl11cblas_sgemmsp`).
_ITANIUM_OWN = re.compile(rb"E[A-DF-Za-z0-9_]|[0-9]|[CD][0-9]")


def _library_rules(policy: Policy, info) -> dict:
    """Imported name with an Accelerate new-LAPACK suffix -> the rule that denies the library it
    is imported from (Mach-O two-level namespace: Symbol.version_file), where one does. Those
    names are Accelerate's own entry points (no other library exports them), so an import of
    `dgetrf$NEWLAPACK` from Accelerate.framework is Accelerate's, not only the LAPACK API's."""
    cols = info.symbols
    names = getattr(cols, "name", None)
    if names is None:
        names, defined, libs = [s.name for s in cols], [s.defined for s in cols], [s.version_file for s in cols]
    else:
        defined, libs = cols.defined, cols.version_file
    out = {}
    for name, d, lib in zip(names, defined, libs):
        if not d and lib and "$NEWLAPACK" in name and newlapack_bases(name):
            rule = policy.deny_rule_for_soname(lib)
            if rule is not None:
                out[name] = rule
    return out


def _defined_as(policy: Policy, name: str, fw: Forward | None) -> tuple[str, str | None]:
    """(kind, how) of a defined vendor name: a static copy, or a stub that forwards the call.

    A stub counts as forwarding the vendor API when it jumps to a name of the same or another
    rule (it is then reported under the target's rule), or to one that contains its own name
    (scipy's dgemm_ -> scipy_dgemm_@plt), or through a pointer dlsym fills with its own name. A
    destructor whose only code is a tail call to free() forwards too, but its code is the
    vendor's: it stays a static symbol.
    """
    if fw is None:
        return "static-symbol", None
    if fw.via in ("dlsym", "GetProcAddress"):  # a PE export that resolves its own name: audit/pe/stubs.py
        return "dlopen-string", fw.via
    if fw.via == "trampoline":  # a lazy trampoline: its table's slot is filled by dlsym on first call
        return "dlopen-string", "trampoline"
    if policy.rule_for_symbol(fw.target) is not None or name.rstrip("_") in fw.target:
        return "imported-symbol", "stub"
    return "static-symbol", None


_VIA = {"plt": "@plt", "got": " (GOT)", "stub": " (stub)"}  # how a stub reaches its import, as the detail says it


def _stub_detail(via: str, stubs: list[Forward], count: int, libs: list[str]) -> str:
    """What the forwarding stubs do, with the first few targets named."""
    if via in ("dlsym", "GetProcAddress"):
        text = ", ".join(f'{f.symbol} -> {via}("{f.target}") slot @0x{f.slot:x}' for f in stubs)
        where = f"; the library is loaded by name ({', '.join(libs[:3])})" if libs else ""
        return (f"{count} defined function(s) are stubs that jump through a pointer filled at run time by "
                f"{via} of their own name, not copies: {text}{where}")
    if via == "trampoline":
        tables = sorted({f.target.rsplit("[", 1)[0] for f in stubs})
        text = ", ".join(f"{f.symbol} -> {f.target} @0x{f.slot:x}" for f in stubs)
        where = f"; the library is loaded by name ({', '.join(libs[:3])})" if libs else ""
        return (f"{count} defined function(s) are lazy-loading trampolines (Implib.so shape) through the "
                f"trampoline table {', '.join(tables)}, whose slots are filled at run time by dlopen and dlsym, "
                f"not copies: {text}{where}")
    text = ", ".join(f"{f.symbol} -> {f.target}{_VIA.get(f.via, ' (GOT)')}" for f in stubs)
    return f"{count} defined function(s) are forwarding stubs to imports, not copies: {text}"


def _source_files(policy: Policy, info: ElfInfo) -> dict[str, list[str]]:
    """rule id -> source-file names (STT_FILE) whose stem is a name of that rule (cblas_daxpy.c)."""
    kinds, names, _, _ = _columns(info.symbols)
    files = sorted(set(compress(names, map("FILE".__eq__, kinds))))
    stems = {f: f.rsplit(".", 1)[0] for f in files if "." in f}
    by_stem = policy.classify_symbols(stems.values())
    out: dict[str, list[str]] = {}
    for f, stem in stems.items():
        if stem in by_stem:
            out.setdefault(by_stem[stem].id, []).append(f)
    return out


def _versions(versions) -> str:
    shown = ", ".join(versions[:_MAX_EXAMPLES])
    return f"versions {shown}" + (f" and {len(versions) - _MAX_EXAMPLES} more" if len(versions) > _MAX_EXAMPLES else "")


def rpath_findings(node: DepNode, resolver: Resolver, policy: Policy, chain: list[str]) -> list[Finding]:
    """A note (severity warn, never a failure on its own): the object's RPATH/RUNPATH directory
    holds a denied library that it does not load by name, but it imports dlopen.

    A directory on an object's search path is not a linkage of what else lies there (numpy's
    bundled libgfortran has RPATH $ORIGIN, the folder of the OpenBLAS it neither needs nor
    loads). What the object does load from it is reported by its own mechanism: a DT_NEEDED
    resolved there (`needed`, `transitive`), a name string (`dlopen-string`), a name built in
    code (`assembled-name`). Left over is a library no name in the object points at: only an
    object that calls dlopen could still reach it (by a name read or built at run time), and
    that is worth a note. System directories are left out: ld.so searches them anyway, so a
    libblas.so among the thousands of files in /usr/lib/<triplet> says nothing about this object.
    """
    info = node.info
    loaders = sorted({n.split("@", 1)[0] for n in info.code_loading_imports} & {"dlopen", "dlmopen"})
    if not loaders:
        return []
    # a name it needs or holds as a string is reported as that, wherever it resolves
    named = frozenset(list(info.needed) + [n for _, n in getattr(info, "extra_loads", ())]
                      + [os.path.basename(h.text) for h in info.library_strings])
    out: list[Finding] = []
    got = resolver.paths.probe(node.realpath or node.path or "")
    for tag, entry, d in resolver.own_dirs(node):
        if got and resolver.is_system_dir(d, got[0], got[2]):
            continue
        found = _denied_in_dir(d, policy, resolver, node.realpath, named)
        if found:
            name, rule = found
            finding = Finding.from_rule(
                rule, policy, "rpath", name, f"{tag} {entry}", chain, in_file=None if len(chain) <= 1 else node.path,
                detail=f"directory {d} holds it; no DT_NEEDED or string of this object names it, but it "
                       f"imports {', '.join(loaders)}: a name built at run time could load it from there")
            finding.severity = "warn"
            out.append(finding)
    return out


def tree_findings(tree: DepNode, resolver: Resolver, policy: Policy) -> tuple[list[Finding], list[str]]:
    """Every node of the tree: a denied or unresolved NEEDED, then the content of each library walked."""
    findings: list[Finding] = []
    errors: list[str] = []
    for node, chain in tree.walk():
        names = [n.label for n in chain]
        depth = len(chain) - 1
        if node.status == "denied":
            rule = policy.rule(node.rule)
            if node.edge == "dlopen":  # a name string that resolved to a denied file
                kind, where = ("dlopen-string" if depth == 1 else "transitive"), f"dlopen string of {chain[-2].name}"
            else:
                kind = "needed" if depth == 1 else "transitive"
                where = (node.request or "DT_NEEDED") + (f" of {chain[-2].name}" if depth > 1 else "")
            if node.how in ("member", "directive"):  # an extraction folder's path; a name judged alone
                detail = node.note
            else:
                how = f"DT_{node.how.upper()} of {node.via}" if node.how in ("rpath", "runpath") else node.how
                detail = f"found at {node.path} ({how})" if node.path else "not found on this system"
                detail += f"; {node.note}" if node.note and node.path else ""
            findings.append(Finding.from_rule(rule, policy, kind, node.name, where, names, detail=detail))
        elif node.status == "unresolved":
            rule = policy.rule(RULE_UNRESOLVED)
            findings.append(Finding.from_rule(rule, policy, "unresolved", node.name,
                                              (node.request or "DT_NEEDED") + (f" of {chain[-2].name}" if depth > 1 else ""),
                                              names))
        elif node.status == "error":
            errors.append(f"dependency {node.name} ({node.path}) could not be parsed: {node.note}")
        if node.info is not None and node.status in ("root", "inspected", "unlisted"):
            if depth > 0:
                more, errs = library_content(node.info, policy, names, node.path, resolver.memo)
                findings += more
                errors += errs
            findings += rpath_findings(node, resolver, policy, names)
    return findings, errors
