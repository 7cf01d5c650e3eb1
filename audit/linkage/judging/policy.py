"""The deny-list policy: model, TOML loading and validation, `extends`, exceptions.

A policy file (see docs/policy.md) has top-level `name`, `description`, `extends`, a
`[settings]` table, an `[allow]` table (`trusted`: allowed and not descended; `inspected`:
allowed and descended), `[[rules]]` and `[[exceptions]]`. Anything else is an error that names
the file and the key (exit 2): a typo in a deny-list must never silently weaken it.
Shipped policies are package data (`audit.policies`), found through importlib.resources.
"""

from __future__ import annotations

import bisect
import datetime as _dt
import functools
import hashlib
import re
import stat
from dataclasses import dataclass, field
from itertools import filterfalse, repeat
from operator import methodcaller
from pathlib import Path

import tomllib

from audit.resources import data_root
from audit.errors import PolicyError, printable
from audit.files import read_regular_file
from audit.linkage.judging.patterns import (
    PatternError,
    combined_bytes_regex,
    compile_globs,
    covering_globs,
    glob_to_regex,
    literal_prefixes,
    newlapack_bases,
    soname_matches,
)

DEFAULT_POLICY = "sovereign"
_MAX_EXTENDS = 8
# Every pattern becomes part of a regex compiled when the policy loads, and Python's compile
# time grows faster than the pattern count: past these a policy is refused (exit 2) instead of
# stalling a CI job. The shipped policy has ~200 patterns, ~120 symbol forms and one affix each.
MAX_PATTERNS = 2048  # globs in a policy, extends merged (rules, allow, exceptions)
MAX_SYMBOL_FORMS = 4096  # symbol globs with their symbol-prefixes/-suffixes forms
MAX_AFFIXES = 8  # entries of symbol-prefixes, and of symbol-suffixes
MAX_POLICY_BYTES = 16 << 20  # a policy file or a symbol list (the shipped ones: < 100 KiB)
MAX_NAME_FORMS = 1 << 20  # symbol-list names with their affixed forms (shipped: ~20k)
# Marker strings (a rule's `markers`): text only the vendor's own code holds, looked for in every
# data section of every file read, one bytes.find per marker: few, and long enough not to be common.
MAX_MARKERS = 64  # markers in a policy, extends merged
MARKER_MIN = 8  # characters of a marker before its optional trailing '*'
MARKER_MAX = 200
_RULE_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# Findings that do not come from a deny rule; their severity is a setting.
RULE_UNRESOLVED = "linkage.unresolved"
RULE_MISMATCH = "linkage.needed-verneed-mismatch"
_BUILTIN_TEXT = {
    RULE_UNRESOLVED: (
        "Unresolved library",
        "A DT_NEEDED library could not be found the way ld.so would find it, so what it loads "
        "cannot be audited.",
        "Ship the library and point DT_RUNPATH at it ($ORIGIN), or audit with --root/--ldpath.",
    ),
    RULE_MISMATCH: (
        "NEEDED and verneed disagree",
        "A .gnu.version_r entry names a file that is not in DT_NEEDED: the dependency was hidden "
        "(e.g. patchelf --remove-needed) but the object still binds versioned symbols from it.",
        "Rebuild without the hidden dependency instead of editing DT_NEEDED.",
    ),
}
_SEVERITIES = ("fail", "warn")
_SETTINGS = {"unresolved": "warn", "needed-verneed-mismatch": "fail"}
_TOP_KEYS = {"name", "description", "extends", "settings", "allow", "rules", "exceptions", "symbol-prefixes",
             "symbol-suffixes"}
_AFFIX = re.compile(r"^[A-Za-z0-9_]{1,32}$")
_RULE_KEYS = {"id", "family", "name", "reason", "use-instead", "sonames", "symbols", "symbol-lists", "strings", "kernels",
              "shared-kernels", "markers"}
_LIST_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,1023}$")  # a C/Fortran/mangled symbol name
_LIST_SUFFIX = ".names"
_EXC_KEYS = {"file", "rule", "reason", "expires"}
_ALLOW_KEYS = {"trusted", "inspected"}
# The lazily compiled regexes (Policy's and each Rule's) that only judging device kernels uses.
_DEVICE_ONLY = ("by_kernels", "by_shared", "kernels", "shared_kernels", "device")


@dataclass
class Rule:
    id: str
    reason: str
    family: str = ""
    name: str = ""
    use_instead: str | None = None
    sonames: tuple[str, ...] = ()
    symbols: tuple[str, ...] = ()
    strings: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    # Kernel name families that several vendor libraries ship (NVIDIA's xmma GEMM kernels are in
    # cuBLAS, cuDNN and TensorRT): attributed to the denied library that ships them, else to this rule.
    shared_kernels: tuple[str, ...] = ()
    # Text only the vendor's own code holds, as a whole NUL-terminated string in the data: the
    # string itself ("BLIS_ARCH_TYPE"), or with a trailing '*' any string starting with it
    # ("libblis: *"). Printable ASCII, no other wildcard.
    markers: tuple[str, ...] = ()
    # Closed lists of exact symbol names (CBLAS, LAPACKE, ...): where they came from (a shipped
    # list's name, or a file's absolute path) and the names they hold.
    symbol_lists: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()
    source: str = ""  # the policy file that defined it
    builtin: bool = False
    _re: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    match_symbols: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)
    match_names: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def compile(self, prefixes: tuple[str, ...] = (), suffixes: tuple[str, ...] = ()) -> None:
        self.match_symbols = affixed(self.symbols, prefixes, suffixes)
        self.match_names = affixed_names(self.names, prefixes, suffixes)
        recipes = {k: functools.partial(compile_globs, getattr(self, k))
                   for k in ("sonames", "strings", "kernels", "shared_kernels")}
        recipes["symbols"] = functools.partial(compile_globs, self.match_symbols)
        # Device kernel names are mangled like host symbols: symbol patterns apply to them too.
        recipes["device"] = functools.partial(compile_globs, self.kernels + self.symbols)
        self._re = LazyRegexes(recipes)

    def matches_soname(self, name: str) -> bool:
        return soname_matches(self._re.get("sonames"), name)

    def matches_symbol(self, name: str) -> bool:
        r = self._re.get("symbols")
        return name in self.match_names or bool(r and r.match(name))

    def matches_string(self, text: str) -> bool:
        r = self._re.get("strings")
        return bool(r and r.match(text)) or self.matches_soname(text)

    def marker_for(self, text: str) -> str | None:
        """The first of this rule's markers that the whole string `text` (from the data) is."""
        return next((m for m in self.markers if (text.startswith(m[:-1]) if m.endswith("*") else text == m)), None)

    def matches_kernel(self, name: str) -> bool:
        r = self._re.get("device")
        return name in self.match_names or bool(r and r.match(name))

    def to_dict(self) -> dict:
        return {
            "id": self.id, "family": self.family, "name": self.name, "reason": self.reason,
            "use_instead": self.use_instead, "sonames": list(self.sonames), "symbols": list(self.symbols),
            "symbol_lists": list(self.symbol_lists), "symbol_list_names": len(self.names),
            "strings": list(self.strings), "kernels": list(self.kernels), "shared_kernels": list(self.shared_kernels),
            "markers": list(self.markers), "source": self.source, "builtin": self.builtin,
        }


class LazyRegexes(dict):
    """Regexes by name, each compiled from its recipe on first use (`[key]` or `.get`): a run
    that meets no device code never needs the kernel patterns, and compiling every rule's
    patterns up front is a good part of loading a policy."""

    def __init__(self, recipes: dict):
        super().__init__()
        self._recipes = dict(recipes)

    def __missing__(self, key):
        if key not in self._recipes:
            raise KeyError(key)
        value = self[key] = self._recipes[key]()
        del self._recipes[key]
        return value

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def make_all(self, skip: tuple[str, ...] = ()) -> None:
        for key in list(self._recipes):
            if key not in skip:
                self[key]


def affixed(patterns: tuple[str, ...], prefixes: tuple[str, ...], suffixes: tuple[str, ...]) -> tuple[str, ...]:
    """The patterns plus their renamed forms: a build that prefixes or suffixes every C symbol
    (OpenBLAS's SYMBOLPREFIX/SYMBOLSUFFIX: scipy-openblas's `scipy_dgemm_`, `cblas_dgemm64_`)
    still exports the vendor API. C++ names (`_Z...`) are never renamed so; a pattern that
    already ends in `*` needs no suffix form."""
    out = list(patterns)
    for pat in patterns:
        if pat.startswith(("_Z", "*")):
            continue
        ends = [""] + ([] if pat.endswith("*") else list(suffixes))
        out += [pre + pat + suf for pre in ("",) + tuple(prefixes) for suf in ends if pre or suf]
    return tuple(dict.fromkeys(out))


LIST_PREFIX_MIN = 8  # names of a list that share a namespace prefix before it is read as the list's


def list_prefixes(names) -> list[str]:
    """The namespace prefixes of a closed symbol list: the text up to and including a name's
    first '_' (not its last character, 4 bytes or more), where LIST_PREFIX_MIN names or more
    share it (CBLAS's `cblas_`, LAPACKE's `LAPACKE_`). Fortran names (`dgemm_`) have none: no
    3-byte head of them is specific enough to search every data string for."""
    counts: dict[str, int] = {}
    for name in names:
        cut = name.find("_")
        if cut >= 3 and cut < len(name) - 1 and not name.startswith("_Z"):
            counts[name[:cut + 1]] = counts.get(name[:cut + 1], 0) + 1
    return sorted(p for p, n in counts.items() if n >= LIST_PREFIX_MIN)


def affixed_names(names: frozenset[str], prefixes: tuple[str, ...], suffixes: tuple[str, ...]) -> frozenset[str]:
    """frozenset(affixed(names)) for exact names (no `*` in them), made a whole list at a time:
    the shipped BLAS/LAPACK lists hold ~5k names, each in four forms."""
    out = set(names)
    plain = list(filterfalse(methodcaller("startswith", "_Z"), names))
    for pre in ("",) + tuple(prefixes):
        for suf in ("",) + tuple(suffixes):
            if pre or suf:
                out.update(map(str.__add__, map(pre.__add__, plain), repeat(suf, len(plain))))
    return frozenset(out)


@dataclass
class PolicyException:
    file: str  # glob over the reported path; without '/', over the file name
    rule: str
    reason: str
    expires: _dt.date | None = None
    source: str = ""

    def expired(self, today: _dt.date) -> bool:
        return self.expires is not None and self.expires < today

    def matches(self, path: str, rule_id: str) -> bool:
        if rule_id != self.rule:
            return False
        target = path if "/" in self.file else path.rsplit("/", 1)[-1]
        return bool(re.match(glob_to_regex(self.file) + r"\Z", target))

    def to_dict(self) -> dict:
        return {"file": self.file, "rule": self.rule, "reason": self.reason,
                "expires": self.expires.isoformat() if self.expires else None, "source": self.source}


@dataclass
class Policy:
    name: str
    description: str = ""
    sources: list[dict] = field(default_factory=list)  # [{"path", "sha256"}], base first
    settings: dict[str, str] = field(default_factory=lambda: dict(_SETTINGS))
    trusted: tuple[str, ...] = ()
    inspected: tuple[str, ...] = ()
    symbol_prefixes: tuple[str, ...] = ()  # put before every C symbol by some builds (scipy_)
    symbol_suffixes: tuple[str, ...] = ()  # put after them (64_ for ILP64 builds)
    rules: list[Rule] = field(default_factory=list)
    exceptions: list[PolicyException] = field(default_factory=list)
    _re: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def finalize(self) -> Policy:
        """Ready for use. Only what reading a file needs first (the reader's bulk filter) is made
        here; every other regex is compiled on first use, or all at once by `prepare` (which
        `check` runs while the reader's helper processes read: see audit.elf.reader)."""
        for rule in self.rules:
            rule.compile(self.symbol_prefixes, self.symbol_suffixes)
        recipes = {"trusted": functools.partial(compile_globs, self.trusted),
                   "inspected": functools.partial(compile_globs, self.inspected)}
        # Single lookups (strings, kernels): one regex per evidence type, a named group per
        # rule in policy order, so the first rule that matches wins.
        # (symbols are classified with each rule's own regex, which judging makes anyway)
        for kind, attrs in (("strings", ("strings",)), ("shared", ("shared_kernels",))):
            recipes["by_" + kind] = functools.partial(self._by_rule_regex, attrs)
        recipes["by_kernels"] = functools.partial(self._kernel_plan, ("kernels", "symbols"))
        self._re = LazyRegexes(recipes)
        # The reader's bulk filter: the patterns, and for the name lists a few covering globs
        # (first three characters, last one): a superset, checked exactly afterwards.
        self._re["symbols"] = combined_bytes_regex([p for r in self.rules for p in r.match_symbols]
                                                   + covering_globs(n for r in self.rules for n in r.match_names))
        self._by_id = {r.id: r for r in self.all_rules()}
        # Exact names: the first rule (policy order) that lists each one.
        self._name_owner: dict[str, int] = {}
        for i in reversed(range(len(self.rules))):  # an earlier rule's entry overwrites a later one's
            self._name_owner.update(dict.fromkeys(self.rules[i].match_names, i))
        self._prefixes_made: list | None = None
        self._prefix_tuples_made: list | None = None
        return self

    def prepare(self, device_code: bool = True) -> None:
        """Compile now every regex finalize left for first use (the same regexes either way);
        without `device_code`, those only device kernels need stay left for first use (they
        are half the work, and a file without device code never asks for them)."""
        skip = () if device_code else _DEVICE_ONLY
        for lazy in [self._re] + [r._re for r in self.rules]:
            lazy.make_all(skip)
        self._prefixes  # noqa: B018  (made and kept)

    def _by_rule_regex(self, attrs: tuple[str, ...], keep=None) -> re.Pattern[str] | None:
        alts = []
        for i, r in enumerate(self.rules):
            pats = [p for a in attrs for p in getattr(r, a) if keep is None or keep(p)]
            if pats:
                alts.append(f"(?P<r{i}>" + "|".join(glob_to_regex(p) for p in pats) + ")")
        return re.compile("(?:" + "|".join(alts) + r")\Z") if alts else None

    @property
    def _prefixes(self) -> list:
        """Bulk symbol classification: each rule's literal prefixes (cublas, _ZN7cutlass, sgemm_ ...),
        prefix-free. A prefix whose pattern rest is "*" (e.g. _ZN4dnnl*) needs no regex check per name."""
        if self._prefixes_made is None:
            made = []
            for r in self.rules:
                parts = [(lit, rest) for p in r.match_symbols for lit, rest in literal_prefixes(p)]
                lits = sorted({lit for lit, _ in parts})
                free = {lit for lit, rest in parts if rest == "*"}
                made.append([(x, x not in free) for x in _prefix_free(lits)])
            self._prefixes_made = made
        return self._prefixes_made

    def _kernel_plan(self, attrs: tuple[str, ...]) -> _KernelPlan:
        """Kernel patterns split for speed: those anchored at the name's start (Cijk_*, _ZN7cutlass*)
        in one regex that rejects a name in a character or two, and those that float (a vendor
        type anywhere in the signature: _Z*[0-9]rocsparse_*), each asked only when a literal it
        needs is in the name. One regex over all would try every floating pattern along every
        name: ~50 us a name, seconds for librocsparse's 88k kernels."""
        floating = []
        for i, r in enumerate(self.rules):
            for p in dict.fromkeys(p for a in attrs for p in getattr(r, a)):
                if _floats(p):
                    floating.append((_needed_literal(p), i, re.compile(glob_to_regex(p) + r"\Z")))
        return _KernelPlan(self._by_rule_regex(attrs, keep=lambda p: not _floats(p)), floating)

    def _classify(self, kind: str, name: str) -> Rule | None:
        rx = self._re.get("by_" + kind)
        if kind == "kernels":
            at = rx.first(name)
        else:
            m = rx.match(name) if rx else None
            at = int(m.lastgroup[1:]) if m else None
        if kind in ("symbols", "kernels"):
            listed = self._name_owner.get(name)
            if listed is not None and (at is None or listed < at):
                at = listed
        return None if at is None else self.rules[at]

    def classify_symbols(self, names) -> dict[str, Rule]:
        """name -> the first rule (policy order) whose symbol patterns match it, for many names."""
        return {n: rule for rule, members in self.symbol_groups(names) for n in members}

    def symbol_groups(self, names) -> list[tuple[Rule, list[str]]]:
        """classify_symbols grouped: (rule, the names it claims) in policy order, rules that
        claim none left out; each list is a few sorted runs (cheap to sort again).

        Names are sorted once; each rule then looks only at the contiguous range of names that
        start with one of its literal prefixes, so 85k vendor names cost ~one regex match each.
        """
        # (a dict's keys in first-seen order sort faster than a set's, in hash order: a symbol
        # table's names come in runs that the sort takes as they are)
        unique = names if isinstance(names, (set, frozenset, dict)) else dict.fromkeys(names)
        suffixed = [n for n in unique if "$NEWLAPACK" in n] if any("$" in n for n in unique) else []
        ordered = sorted(unique)
        claimed: set[str] = set()
        out = []
        for rule, prefixes in zip(self.rules, self._prefixes):
            got = sorted(n for n in rule.match_names.intersection(unique) if n not in claimed) if rule.match_names else []
            claimed.update(got)
            rx = rule._re.get("symbols")
            if rx is not None:
                # the prefixes are prefix-free (finalize): their ranges do not overlap
                for lit, check in prefixes:
                    lo = bisect.bisect_left(ordered, lit)
                    hi = bisect.bisect_left(ordered, lit + "\U0010ffff") if lit else len(ordered)
                    fresh = filterfalse(claimed.__contains__, ordered[lo:hi])
                    got += filter(rx.match, fresh) if check else fresh
            if got:
                claimed.update(got)
                out.append((rule, got))
        if suffixed:  # Accelerate's new-LAPACK names, by the name they stand for (newlapack_bases)
            by_rule = {}
            for n in suffixed:
                rule = None if n in claimed else self.rule_for_symbol(n)
                if rule is not None:
                    by_rule.setdefault(rule.id, []).append(n)
            if by_rule:
                order = {r.id: i for i, r in enumerate(self.rules)}
                known = {r.id: (r, got) for r, got in out}
                for rid, extra in by_rule.items():
                    if rid in known:
                        known[rid][1].extend(sorted(extra))
                    else:
                        known[rid] = (self.rules[order[rid]], sorted(extra))
                out = sorted(known.values(), key=lambda rg: order[rg[0].id])
        return out

    def rule_for_symbol(self, name: str) -> Rule | None:
        """The first rule (policy order) whose symbol patterns or names list match the whole name.
        Each rule's own regex is asked, only where the name starts with one of its literal
        prefixes: one regex over every rule would be compiled for the few names asked about.
        A name with an Accelerate new-LAPACK suffix (`dgetrf$NEWLAPACK`) is matched as the names
        it stands for (patterns.newlapack_bases: `dgetrf`, then `dgetrf_`), the first that a
        rule matches deciding."""
        bases = newlapack_bases(name)
        if bases:
            return next(filter(None, map(self._rule_for_plain, bases)), None)
        return self._rule_for_plain(name)

    def _rule_for_plain(self, name: str) -> Rule | None:
        listed = self._name_owner.get(name)
        for i, (rule, prefixes) in enumerate(zip(self.rules, self._prefix_tuples)):
            if listed is not None and listed <= i:
                return self.rules[listed]
            if prefixes and name.startswith(prefixes):
                rx = rule._re.get("symbols")
                if rx is not None and rx.match(name):
                    return rule
        return None

    @property
    def _prefix_tuples(self) -> list[tuple[str, ...]]:
        """Each rule's literal prefixes (_prefixes) as one tuple, for str.startswith."""
        if self._prefix_tuples_made is None:
            self._prefix_tuples_made = [tuple(lit for lit, _ in made) for made in self._prefixes]
        return self._prefix_tuples_made

    def rule_for_kernel(self, name: str, shipper: Rule | None = None) -> Rule | None:
        """The rule a device kernel belongs to: the first whose kernel (or symbol) patterns, the
        name's own markers, match it (`shipper`, the denied library the kernel is inside, if its
        markers are among them); else, for a kernel of a family several libraries ship
        (`shared-kernels`), `shipper`, else the first rule that lists the family."""
        rule = self._classify("kernels", name)
        if rule is not None:
            if shipper is not None and shipper is not rule and shipper.matches_kernel(name):
                return shipper  # the name marks two libraries: the one that ships it decides
            return rule
        family = self._classify("shared", name)
        return shipper if family is not None and shipper is not None else family

    def rule_for_string(self, text: str) -> Rule | None:
        """The first rule whose string patterns, or soname globs, match a library-name string."""
        rule = self._classify("strings", text)
        return rule or self.deny_rule_for_soname(text)

    def rule_for_marker(self, text: str) -> Rule | None:
        """The first rule (policy order) one of whose markers is the whole string `text`."""
        return next((r for r in self.rules if r.markers and r.marker_for(text)), None)

    # -- queries used by the checker --
    @property
    def markers(self) -> tuple[bytes, ...]:
        """The literal text of every rule's markers (a trailing '*' left off), for the reader:
        it keeps each whole string in the data that starts with one of them (rule_for_marker
        then judges it)."""
        return tuple(sorted({m.rstrip("*").encode("ascii") for r in self.rules for m in r.markers}))

    @property
    def api_prefixes(self) -> tuple[bytes, ...]:
        """Literal prefixes (3 bytes or more) of the rules' C symbol patterns, and the namespace
        prefixes of their symbol lists (`cblas_`, `LAPACKE_`: list_prefixes), each also behind
        the policy's symbol-prefixes: what the reader looks for among the strings an object
        hands to dlsym. A string kept is a rule's only where it is a whole name the rule
        matches (a list's names exactly)."""
        if not hasattr(self, "_api_prefixes"):
            lits = {lit for r in self.rules for p in r.match_symbols if not p.startswith("_Z")
                    for lit, _ in literal_prefixes(p) if len(lit) >= 3}
            lists = {pre + lit for r in self.rules for lit in list_prefixes(r.names)
                     for pre in ("",) + self.symbol_prefixes}
            self._api_prefixes = tuple(sorted(x.encode("ascii") for x in lits | lists))
        return self._api_prefixes

    @property
    def symbol_pattern(self) -> re.Pattern[bytes]:
        """All rules' symbol patterns as ONE bytes regex, for read_elf's bulk filter."""
        return self._re["symbols"]

    def deny_rule_for_soname(self, name: str) -> Rule | None:
        # remembered: a run asks about the same few hundred names (NEEDED, directory entries)
        # thousands of times, and each answer tries every rule's globs
        memo = self._re.setdefault("soname_memo", {})
        if name not in memo:
            if len(memo) > 100_000:
                memo.clear()
            memo[name] = next((r for r in self.rules if r.matches_soname(name)), None)
        return memo[name]

    def is_trusted(self, name: str) -> bool:
        return soname_matches(self._re.get("trusted"), name)

    def is_inspected(self, name: str) -> bool:
        return soname_matches(self._re.get("inspected"), name)

    def severity(self, rule_id: str) -> str:
        if rule_id == RULE_UNRESOLVED:
            return self.settings["unresolved"]
        if rule_id == RULE_MISMATCH:
            return self.settings["needed-verneed-mismatch"]
        return "fail"

    def all_rules(self) -> list[Rule]:
        """Deny rules then the built-in checks (for SARIF rule tables, JUnit cases)."""
        return self.rules + [builtin_rule(rid) for rid in _BUILTIN_TEXT]

    def rule(self, rule_id: str) -> Rule | None:
        by_id = getattr(self, "_by_id", None) or {r.id: r for r in self.all_rules()}
        return by_id.get(rule_id)

    def to_dict(self) -> dict:
        return {
            "name": self.name, "description": self.description, "sources": self.sources,
            "settings": dict(self.settings), "allow": {"trusted": list(self.trusted), "inspected": list(self.inspected)},
            "symbol_prefixes": list(self.symbol_prefixes), "symbol_suffixes": list(self.symbol_suffixes),
            "rules": [r.to_dict() for r in self.rules], "exceptions": [e.to_dict() for e in self.exceptions],
        }


def _floats(pattern: str) -> bool:
    """A pattern whose fixed part can sit anywhere in the name: `*...` or `_Z*...`."""
    return pattern.startswith("*") or (pattern.startswith("_Z*"))


def _needed_literal(pattern: str) -> str:
    """The longest run of plain characters that every name `pattern` matches contains ("" if none)."""
    runs = re.split(r"\*|\?|\[[^]]*\]", pattern.replace("[!", "[").replace("[^", "["))
    return max(runs, key=len, default="")


class _KernelPlan:
    """Policy._kernel_plan: the first rule (policy order) whose kernel or symbol patterns match."""

    def __init__(self, anchored: re.Pattern[str] | None, floating: list[tuple[str, int, re.Pattern[str]]]):
        self.anchored = anchored
        self.floating = floating  # (a literal the name must contain, rule index, the pattern), in rule order

    @property
    def pattern(self) -> str:
        """What it matches, as text (two plans from the same policy have the same)."""
        return "\n".join([self.anchored.pattern if self.anchored is not None else ""]
                         + [f"r{i} {rx.pattern}" for _, i, rx in self.floating])

    def first(self, name: str) -> int | None:
        m = self.anchored.match(name) if self.anchored is not None else None
        at = int(m.lastgroup[1:]) if m else None
        for lit, i, rx in self.floating:
            if at is not None and i >= at:
                break
            if lit in name and rx.match(name):
                return i
        return at


def _prefix_free(lits: list[str]) -> list[str]:
    """The sorted `lits` that have no other of them as a prefix, in one pass: every name between
    a prefix and a name it starts is sorted between them, so the last one kept is the only
    candidate (comparing each with all is quadratic: minutes for a policy of 100k patterns)."""
    kept: list[str] = []
    for x in lits:
        if not kept or not x.startswith(kept[-1]):
            kept.append(x)
    return kept


def builtin_rule(rule_id: str) -> Rule:
    name, reason, use = _BUILTIN_TEXT[rule_id]
    rule = Rule(id=rule_id, reason=reason, family="linkage", name=name, use_instead=use, builtin=True)
    rule.compile()
    return rule


# ---------------------------------------------------------------- loading


def shipped_policies() -> list[str]:
    """Names of the policies installed with the package (`audit.policies/*.toml`)."""
    root = data_root("policies")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def _read_source(ref: str, base_dir: Path | None) -> tuple[str, bytes]:
    """(display name, bytes) of a policy named `ref`: a shipped name or a file path."""
    local = Path(ref) if base_dir is None or Path(ref).is_absolute() else base_dir / ref
    if _NAME.match(ref) and not ref.endswith(".toml") and not local.is_file():
        res = data_root("policies").joinpath(f"{ref}.toml")
        if not res.is_file():
            raise PolicyError(f"no shipped policy named '{ref}' (shipped: {', '.join(shipped_policies())})")
        return f"{ref} (shipped)", res.read_bytes()
    path = Path(ref)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    try:
        _fits(path, MAX_POLICY_BYTES, f"policy {path}")
        return str(path), read_regular_file(path)
    except OSError as exc:
        raise PolicyError(f"cannot read policy {path}: {exc.strerror or exc}") from None


def _fits(path: Path, limit: int, what: str) -> None:
    """PolicyError if the regular file at `path` is larger than `limit` (read whole otherwise)."""
    st = path.stat()
    if stat.S_ISREG(st.st_mode) and st.st_size > limit:
        raise PolicyError(f"{what}: {st.st_size} bytes; at most {limit >> 20} MiB")


def load_policy(path_or_none: str | Path | None = None) -> Policy:
    """The effective policy: `path_or_none` (a file, or a shipped policy's name), default sovereign.

    Raises PolicyError (exit 2) naming the file and key for anything invalid.
    """
    ref = DEFAULT_POLICY if path_or_none is None else str(path_or_none)
    if not ref.strip():  # `--policy ""`: a path of "" would be read as the current folder
        raise PolicyError(f"the policy is empty: give a policy file or a shipped policy's name "
                          f"({', '.join(shipped_policies())})")
    policy = _load(ref, None, [])
    _validate_exceptions(policy)
    _check_size(policy)
    return policy.finalize()


def _check_size(policy: Policy) -> None:
    where = policy.sources[-1]["path"] if policy.sources else policy.name
    for key in ("symbol_prefixes", "symbol_suffixes"):  # each file's own list is checked as it is read
        if len(getattr(policy, key)) > MAX_AFFIXES:
            raise PolicyError(f"{where}: {len(getattr(policy, key))} {key.replace('_', '-')} with the policies "
                              f"it extends; at most {MAX_AFFIXES}")
    count = len(policy.trusted) + len(policy.inspected) + len(policy.exceptions) + sum(
        len(getattr(r, k)) for r in policy.rules for k in ("sonames", "symbols", "strings", "kernels", "shared_kernels"))
    if count > MAX_PATTERNS:
        raise PolicyError(f"{where}: {count} patterns; a policy may have at most {MAX_PATTERNS}")
    markers = sum(len(r.markers) for r in policy.rules)
    if markers > MAX_MARKERS:
        raise PolicyError(f"{where}: {markers} markers with the policies it extends; at most {MAX_MARKERS}")
    per_name = (len(policy.symbol_prefixes) + 1) * (len(policy.symbol_suffixes) + 1)
    names = sum(len(r.names) for r in policy.rules) * per_name  # an upper bound: C++ names keep one form
    if names > MAX_NAME_FORMS:
        raise PolicyError(f"{where}: symbol lists of {names} names with their symbol-prefixes/-suffixes forms; "
                          f"a policy may have at most {MAX_NAME_FORMS}")
    forms = sum(len(affixed(r.symbols, policy.symbol_prefixes, policy.symbol_suffixes)) for r in policy.rules)
    if forms > MAX_SYMBOL_FORMS:
        raise PolicyError(f"{where}: {forms} symbol patterns with their symbol-prefixes/-suffixes forms; "
                          f"a policy may have at most {MAX_SYMBOL_FORMS}")


def _load(ref: str, base_dir: Path | None, chain: list[str]) -> Policy:
    label, data = _read_source(ref, base_dir)
    if label in chain:
        raise PolicyError(f"{label}: extends loops back ({' -> '.join(chain + [label])})")
    if len(chain) >= _MAX_EXTENDS:
        raise PolicyError(f"{label}: extends chain deeper than {_MAX_EXTENDS}")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise PolicyError(f"{label}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{label}: invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise PolicyError(f"{label}: invalid TOML: arrays or tables nested too deeply") from None
    _unknown(label, "", doc, _TOP_KEYS)
    here = None if label.endswith("(shipped)") else Path(label).parent
    parent_ref = doc.get("extends")
    if parent_ref is not None:
        if not isinstance(parent_ref, str) or not parent_ref:
            raise PolicyError(f"{label}: extends: must be a policy name or a path")
        policy = _load(parent_ref, here, chain + [label])
    else:
        policy = Policy(name="")
    policy.sources.append({"path": label, "sha256": hashlib.sha256(data).hexdigest()})
    name = doc.get("name", ref if label.endswith("(shipped)") else Path(label).stem)
    policy.name = _str(label, "name", name)
    policy.description = _str(label, "description", doc.get("description", policy.description))
    settings = _table(label, "settings", doc.get("settings", {}))
    _unknown(label, "settings.", settings, set(_SETTINGS))
    for key, value in settings.items():
        if value not in _SEVERITIES:
            raise PolicyError(f"{label}: settings.{key}: must be one of {', '.join(_SEVERITIES)}")
        policy.settings[key] = value
    allow = _table(label, "allow", doc.get("allow", {}))
    _unknown(label, "allow.", allow, _ALLOW_KEYS)
    policy.trusted = tuple(dict.fromkeys(policy.trusted + _globs(label, "allow.trusted", allow.get("trusted", []))))
    policy.inspected = tuple(dict.fromkeys(policy.inspected + _globs(label, "allow.inspected", allow.get("inspected", []))))
    for key in ("symbol-prefixes", "symbol-suffixes"):
        attr = key.replace("-", "_")
        setattr(policy, attr, tuple(dict.fromkeys(getattr(policy, attr) + _affixes(label, key, doc.get(key, [])))))
    for i, raw in enumerate(_array(label, "rules", doc.get("rules", []))):
        rule = _rule(label, i, raw, here)
        for j, old in enumerate(policy.rules):
            if old.id == rule.id:
                if old.source == label:
                    raise PolicyError(f"{label}: rules[{i}].id: duplicate rule id '{rule.id}'")
                policy.rules[j] = rule  # a child policy redefines an inherited rule
                break
        else:
            policy.rules.append(rule)
    for i, raw in enumerate(_array(label, "exceptions", doc.get("exceptions", []))):
        policy.exceptions.append(_exception(label, i, raw))
    return policy


def _rule(label: str, i: int, raw, base_dir: Path | None) -> Rule:
    where = f"rules[{i}]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{label}: {where}: must be a table")
    _unknown(label, f"{where}.", raw, _RULE_KEYS)
    rid = raw.get("id")
    if not isinstance(rid, str) or not _RULE_ID.match(rid):
        raise PolicyError(f"{label}: {where}.id: missing or invalid (lower-case letters, digits, '.', '_', '-')")
    if rid in _BUILTIN_TEXT:
        raise PolicyError(f"{label}: {where}.id: '{rid}' is a built-in check (set it in [settings])")
    where = f"rules[{i}] (id '{rid}')"
    reason = raw.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise PolicyError(f"{label}: {where}: missing required key 'reason'")
    use = raw.get("use-instead")
    if use is not None:
        _str(label, f"{where}.use-instead", use)
    rule = Rule(
        id=rid, reason=reason.strip(), family=_str(label, f"{where}.family", raw.get("family", "")),
        name=_str(label, f"{where}.name", raw.get("name", rid)), use_instead=use,
        sonames=_globs(label, f"{where}.sonames", raw.get("sonames", [])),
        symbols=_globs(label, f"{where}.symbols", raw.get("symbols", [])),
        strings=_globs(label, f"{where}.strings", raw.get("strings", [])),
        kernels=_globs(label, f"{where}.kernels", raw.get("kernels", [])),
        shared_kernels=_globs(label, f"{where}.shared-kernels", raw.get("shared-kernels", [])),
        markers=_markers(label, f"{where}.markers", raw.get("markers", [])), source=label,
    )
    refs = raw.get("symbol-lists", [])
    if not isinstance(refs, list) or not all(isinstance(r, str) and r for r in refs):
        raise PolicyError(f"{label}: {where}.symbol-lists: must be an array of list names or paths")
    lists = [_read_names(label, f"{where}.symbol-lists[{j}]", ref, base_dir) for j, ref in enumerate(refs)]
    rule.symbol_lists = tuple(ref for ref, _ in lists)
    rule.names = frozenset().union(*(names for _, names in lists))
    if not (rule.sonames or rule.symbols or rule.names or rule.strings or rule.kernels or rule.shared_kernels
            or rule.markers):
        raise PolicyError(f"{label}: {where}: needs at least one of sonames, symbols, symbol-lists, strings, "
                          "kernels, shared-kernels, markers")
    return rule


def shipped_name_lists() -> list[str]:
    """Names of the symbol lists installed with the package (`audit.policies/*.names`)."""
    root = data_root("policies")
    return sorted(p.name[:-len(_LIST_SUFFIX)] for p in root.iterdir() if p.name.endswith(_LIST_SUFFIX))


def _read_names(label: str, key: str, ref: str, base_dir: Path | None) -> tuple[str, frozenset[str]]:
    """(reference to write back, the names) of a symbol list: a shipped list's name (`cblas`)
    or a file path, relative to the policy file. One name per line; `#` starts a comment."""
    local = Path(ref) if base_dir is None or Path(ref).is_absolute() else base_dir / ref
    if _NAME.match(ref) and not local.is_file():
        res = data_root("policies").joinpath(ref + _LIST_SUFFIX)
        if not res.is_file():
            raise PolicyError(f"{label}: {key}: no shipped symbol list named '{ref}' "
                              f"(shipped: {', '.join(shipped_name_lists())})")
        shown, data = ref, res.read_bytes()
    else:
        try:
            _fits(local, MAX_POLICY_BYTES, f"{label}: {key}: {local}")
            shown, data = str(local.resolve()), read_regular_file(local)
        except OSError as exc:
            raise PolicyError(f"{label}: {key}: cannot read {local}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"{label}: {key}: {shown}: not UTF-8 text") from None
    names = set()
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not _LIST_NAME.match(line):
            raise PolicyError(f"{label}: {key}: {shown} line {n}: not a symbol name (letters, digits, '_')")
        names.add(line)
        if len(names) > MAX_NAME_FORMS:
            raise PolicyError(f"{label}: {key}: {shown}: more than {MAX_NAME_FORMS} names")
    return shown, frozenset(names)


def _exception(label: str, i: int, raw) -> PolicyException:
    where = f"exceptions[{i}]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{label}: {where}: must be a table")
    _unknown(label, f"{where}.", raw, _EXC_KEYS)
    for key in ("file", "rule", "reason"):
        value = raw.get(key)
        if not isinstance(value, str) or not value.strip():
            raise PolicyError(f"{label}: {where}: missing required key '{key}'")
    try:
        glob_to_regex(raw["file"])
    except PatternError as exc:
        raise PolicyError(f"{label}: {where}.file: bad pattern '{_shown(raw['file'])}': {exc}") from None
    expires = raw.get("expires")
    if expires is not None:
        if isinstance(expires, _dt.datetime):
            expires = expires.date()
        elif isinstance(expires, str):
            try:
                expires = _dt.date.fromisoformat(expires)
            except ValueError:
                raise PolicyError(f"{label}: {where}.expires: not a date (YYYY-MM-DD)") from None
        elif not isinstance(expires, _dt.date):
            raise PolicyError(f"{label}: {where}.expires: not a date (YYYY-MM-DD)")
    return PolicyException(file=raw["file"], rule=raw["rule"], reason=raw["reason"].strip(),
                           expires=expires, source=label)


def _validate_exceptions(policy: Policy) -> None:
    known = {r.id for r in policy.all_rules()}
    for exc in policy.exceptions:
        if exc.rule not in known:
            i = [e for e in policy.exceptions if e.source == exc.source].index(exc)
            raise PolicyError(f"{exc.source}: exceptions[{i}].rule: unknown rule id '{exc.rule}'")


def _unknown(label: str, prefix: str, table: dict, allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            raise PolicyError(f"{label}: {prefix}{key}: unknown key (allowed: {', '.join(sorted(allowed))})")


def _str(label: str, key: str, value) -> str:
    if not isinstance(value, str):
        raise PolicyError(f"{label}: {key}: must be a string")
    return value


def _table(label: str, key: str, value) -> dict:
    if not isinstance(value, dict):
        raise PolicyError(f"{label}: {key}: must be a table")
    return value


def _array(label: str, key: str, value) -> list:
    if not isinstance(value, list):
        raise PolicyError(f"{label}: {key}: must be an array of tables ([[{key}]])")
    return value


def _affixes(label: str, key: str, value) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise PolicyError(f"{label}: {key}: must be an array of strings")
    if len(value) > MAX_AFFIXES:
        raise PolicyError(f"{label}: {key}: {len(value)} entries; at most {MAX_AFFIXES}")
    for j, text in enumerate(value):
        if not isinstance(text, str) or not _AFFIX.match(text):
            raise PolicyError(f"{label}: {key}[{j}]: must be 1-32 letters, digits or '_'")
    return tuple(value)


def _shown(pattern: str) -> str:
    """A pattern as an error message quotes it: a long one cut to its start."""
    return pattern if len(pattern) <= 80 else pattern[:80] + "..."


def _globs(label: str, key: str, value) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise PolicyError(f"{label}: {key}: must be an array of strings")
    if len(value) > MAX_PATTERNS:  # refused before each one is translated
        raise PolicyError(f"{label}: {key}: {len(value)} patterns; a policy may have at most {MAX_PATTERNS}")
    for j, pat in enumerate(value):
        if not isinstance(pat, str):
            raise PolicyError(f"{label}: {key}[{j}]: must be a string")
        try:
            glob_to_regex(pat)
        except PatternError as exc:
            raise PolicyError(f"{label}: {key}[{j}]: bad pattern '{_shown(pat)}': {exc}") from None
    return tuple(value)


_MARKER_TEXT = re.compile(r"[\x20-\x7e]+")


def _markers(label: str, key: str, value) -> tuple[str, ...]:
    """A rule's `markers`: printable ASCII, MARKER_MIN to MARKER_MAX characters before an optional
    trailing '*' (the only wildcard), at most MAX_MARKERS."""
    if not isinstance(value, list):
        raise PolicyError(f"{label}: {key}: must be an array of strings")
    if len(value) > MAX_MARKERS:
        raise PolicyError(f"{label}: {key}: {len(value)} markers; a policy may have at most {MAX_MARKERS}")
    for j, m in enumerate(value):
        if not isinstance(m, str):
            raise PolicyError(f"{label}: {key}[{j}]: must be a string")
        text = m[:-1] if m.endswith("*") else m
        if not _MARKER_TEXT.fullmatch(m):
            raise PolicyError(f"{label}: {key}[{j}]: bad marker '{printable(_shown(m))}': printable ASCII only")
        if "*" in text:
            raise PolicyError(f"{label}: {key}[{j}]: bad marker '{_shown(m)}': '*' may only end it "
                              "(any string starting with the text before it)")
        if not MARKER_MIN <= len(text) <= MARKER_MAX:
            raise PolicyError(f"{label}: {key}[{j}]: bad marker '{_shown(m)}': {len(text)} characters before any "
                              f"trailing '*'; {MARKER_MIN} to {MARKER_MAX}")
    return tuple(dict.fromkeys(value))


# ---------------------------------------------------------------- showing


def _toml_str(value: str) -> str:
    out = ['"']
    for ch in value:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    # `##[` is a CI runner's command anywhere in a line: written as the same string, escaped
    return "".join(out).replace("##[", "##\\u005b")


def _toml_list(values) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"


def to_toml(policy: Policy) -> str:
    """The effective policy (extends resolved) as TOML that load_policy reads back unchanged."""
    lines = ["# effective policy, merged from: " + printable(" <- ".join(s["path"] for s in policy.sources)),
             f"name = {_toml_str(policy.name)}", f"description = {_toml_str(policy.description)}",
             f"symbol-prefixes = {_toml_list(policy.symbol_prefixes)}",
             f"symbol-suffixes = {_toml_list(policy.symbol_suffixes)}", "", "[settings]"]
    lines += [f"{k} = {_toml_str(v)}" for k, v in policy.settings.items()]
    lines += ["", "[allow]", f"trusted = {_toml_list(policy.trusted)}", f"inspected = {_toml_list(policy.inspected)}"]
    for r in policy.rules:
        lines += ["", "[[rules]]", f"id = {_toml_str(r.id)}", f"family = {_toml_str(r.family)}",
                  f"name = {_toml_str(r.name)}", f"reason = {_toml_str(r.reason)}"]
        if r.use_instead is not None:
            lines.append(f"use-instead = {_toml_str(r.use_instead)}")
        for key in ("sonames", "symbols", "symbol_lists", "strings", "kernels", "shared_kernels", "markers"):
            if getattr(r, key):
                lines.append(f"{key.replace('_', '-')} = {_toml_list(getattr(r, key))}")
    for e in policy.exceptions:
        lines += ["", "[[exceptions]]", f"file = {_toml_str(e.file)}", f"rule = {_toml_str(e.rule)}",
                  f"reason = {_toml_str(e.reason)}"]
        if e.expires:
            lines.append(f"expires = {e.expires.isoformat()}")
    return "\n".join(lines) + "\n"
