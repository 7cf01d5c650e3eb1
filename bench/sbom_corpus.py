"""The SBOMs of the real corpus, checked by the ecosystem's own toolchains.

For each input of bench/corpus_expectations.toml found in the cache (wheels; Debian packages'
unpacked folders too), `check --format cyclonedx=... --format spdx=...` runs twice with the same
SOURCE_DATE_EPOCH, and then:
  - both runs' documents must be byte-identical;
  - CycloneDX: cyclonedx-python-lib's JsonStrictValidator (the 1.6 schema) and Bom.from_json;
  - SPDX 2.3: spdx-tools' parse_file and validate_full_spdx_document;
  - the vendor edges are read back through those libraries: every CycloneDX dependency and SPDX
    relationship whose target names a library of a vendor family (cuDNN, cuBLAS, OpenBLAS, MKL, ...).
The table goes to stdout, or replaces docs/sbom.md's "## Corpus" section with --write.

  python3 bench/sbom_corpus.py [--cache CACHE] [--only NAME,...] [--write docs/sbom.md]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import DEFAULT_CACHE, _commit, fetch, load_expectations  # noqa: E402

# the vendor families of policies/sovereign.toml, by the names their components and files carry
VENDOR = re.compile(r"cudnn|cublas|openblas|mkl|cusparse|cusolver|cufft|nvinfer|tensorrt|nccl|onednn|dnnl|"
                    r"accelerate|cutlass|flash.?attention|blis|atlas|lapack|rocsparse|hipsparse|rocblas|hipblas|"
                    r"miopen", re.IGNORECASE)
SECTION = "## Corpus"


def _check(path: Path, out: Path) -> tuple[int, float, str]:
    env = dict(os.environ, SOURCE_DATE_EPOCH="1767225600")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "audit", "check", str(path),
                           "--format", f"cyclonedx={out / 'bom.cdx.json'}", "--format", f"spdx={out / 'bom.spdx.json'}"],
                          capture_output=True, text=True, env=env)
    return proc.returncode, time.monotonic() - t0, (proc.stderr.strip().splitlines() or [""])[-1]


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def validate(out: Path) -> dict:
    """The two documents through cyclonedx-python-lib and spdx-tools: problems and vendor edges."""

    from cyclonedx.model.bom import Bom
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    text = (out / "bom.cdx.json").read_text(encoding="utf-8")
    with _linear_unique_items():
        error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    bom = Bom.from_json(json.loads(text))
    names = {str(c.bom_ref): c.name for c in bom.components}
    for c in bom.components:  # nested components (files inside their wheel)
        for sub in c.get_all_nested_components(include_self=False):
            names[str(sub.bom_ref)] = sub.name
    cdx_edges = {(names.get(str(d.ref), str(d.ref)), names.get(str(t.ref), str(t.ref)))
                 for d in bom.dependencies for t in d.dependencies}
    doc = parse_file(str(out / "bom.spdx.json"))
    problems = _validate_spdx(doc, validate_full_spdx_document)
    pkg = {p.spdx_id: p.name for p in doc.packages}
    # (from, to, is an edge of the linkage graph): its comment names the edge kind; CONTAINS alone
    # is also a container holding a file
    spdx_edges = {(pkg.get(r.spdx_element_id, r.spdx_element_id), pkg.get(str(r.related_spdx_element_id), ""),
                   (r.comment or "").startswith("sovereign-audit:edge=")) for r in doc.relationships}
    vendor = sorted({b for a, b in cdx_edges if VENDOR.search(b)})  # component names: a file's base name, a vendor's
    spdx_vendor = sorted({b for a, b, linkage in spdx_edges if linkage and VENDOR.search(b)})
    return {"cdx": "valid" if error is None else f"invalid: {error}", "spdx": "valid" if not problems else
            f"{len(problems)} problem(s): {problems[0].validation_message[:80]}",
            "components": len(names), "edges": len(cdx_edges), "relationships": len(spdx_edges),
            "vendor": vendor, "spdx_vendor": spdx_vendor}


@contextlib.contextmanager
def _linear_unique_items():
    """jsonschema's uniqueItems compares every pair of objects (its `uniq` cannot hash a dict):
    hours on the 16,000 components of FlashInfer's SBOM. The same answer from canonical JSON text:
    two values with the same text are equal; without floats (1 == 1.0 is the one case where
    different texts are equal), different texts are different; anything else goes to jsonschema."""
    from jsonschema import _keywords, _utils

    original = _utils.uniq

    def uniq(container):
        try:
            texts = [json.dumps(x, sort_keys=True) for x in container]
        except (TypeError, ValueError):
            return original(container)
        if len(set(texts)) < len(texts):
            return False
        return True if not any(_has_float(x) for x in container) else original(container)

    _utils.uniq = _keywords.uniq = uniq
    try:
        yield
    finally:
        _utils.uniq = _keywords.uniq = original


def _has_float(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, dict):
        return any(map(_has_float, x.values()))
    if isinstance(x, list):
        return any(map(_has_float, x))
    return False


def _validate_spdx(doc, validate_full_spdx_document):
    """spdx-tools' full validation, with its "is this SPDX id in the document" answered from one set
    per document: its own answer rebuilds the list of every id for each id it checks (quadratic:
    hours on an SBOM of 16,000 packages). Same answers, same messages; the document is not changed
    while it is validated."""
    from spdx_tools.spdx.validation import spdx_id_validators as ids

    known: dict[int, set[str]] = {}
    original = ids.is_spdx_id_present_in_document

    def present(spdx_id, document):
        if id(document) not in known:
            known[id(document)] = set(ids.get_list_of_all_spdx_ids(document))
        return spdx_id in known[id(document)]

    # and the package check's relationship filters (one pass over every relationship per package)
    # from one index per relationship list: the same lists, in the same order
    from spdx_tools.spdx.validation import package_validator as pv

    index: dict[tuple, dict] = {}

    def indexed(by: str):
        def filter_(relationships, relationship_type, key):
            table = index.get((id(relationships), by))
            if table is None:
                table = index[(id(relationships), by)] = {}
                for r in relationships:
                    end = r.spdx_element_id if by == "origin" else r.related_spdx_element_id
                    table.setdefault((r.relationship_type, end), []).append(r)
            return list(table.get((relationship_type, key), ()))
        return filter_

    saved = pv.filter_by_type_and_origin, pv.filter_by_type_and_target
    ids.is_spdx_id_present_in_document = present
    pv.filter_by_type_and_origin, pv.filter_by_type_and_target = indexed("origin"), indexed("target")
    try:
        return validate_full_spdx_document(doc)
    finally:
        ids.is_spdx_id_present_in_document = original
        pv.filter_by_type_and_origin, pv.filter_by_type_and_target = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="the corpus cache (bench/corpus.py --cache)")
    ap.add_argument("--only", default="", help="comma-separated corpus names")
    ap.add_argument("--write", type=Path, help="replace this document's '## Corpus' section")
    ap.add_argument("--keep", action="store_true",
                    help="with --write: keep the section's rows of inputs not run now (their own commit and date)")
    args = ap.parse_args(argv)
    only = {n for n in args.only.split(",") if n}
    rows, failed = [], 0
    kept = _rows_of(args.write) if args.keep and args.write else {}
    for wheel in load_expectations():
        if only and wheel.name not in only:
            continue
        there = args.cache / "debs" / wheel.file[:-len(".deb")] if wheel.deb else args.cache / wheel.file
        if not there.exists():
            continue  # not fetched: this script audits what the corpus run left in the cache
        path = fetch(wheel, args.cache, [])
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            code, seconds, err = _check(path, Path(a))
            if code not in (0, 1):
                rows.append((wheel.name, code, seconds, {"cdx": f"exit {code}: {err}", "spdx": "-"}, "-"))
                failed += 1
                continue
            _check(path, Path(b))
            same = all(_digest(Path(a) / f) == _digest(Path(b) / f) for f in ("bom.cdx.json", "bom.spdx.json"))
            v = validate(Path(a))
        ok = v["cdx"] == "valid" and v["spdx"] == "valid" and same and v["vendor"] == v["spdx_vendor"]
        failed += not ok
        rows.append((wheel.name, code, seconds, v, "yes" if same else "NO"))
        print(f"{wheel.name}: {v['cdx']}, {v['spdx']}, identical={same}", file=sys.stderr)
        _emit(rows, failed, args.write, False, kept)
    return _emit(rows, failed, args.write, True, kept)


def _rows_of(doc: Path) -> dict[str, str]:
    """{input name: its table line} of the document's "## Corpus" section."""
    text = doc.read_text(encoding="utf-8") if doc.exists() else ""
    start = text.find(SECTION + "\n")
    if start < 0:
        return {}
    end = text.find("\n## ", start + 1)
    lines = text[start:end if end > 0 else None].splitlines()
    return {ln.split("|")[1].strip(): ln + " (earlier run)" * (not ln.endswith("(earlier run)"))
            for ln in lines if ln.startswith("| ") and not ln.startswith("| input ")}


def _emit(rows: list, failed: int, write: Path | None, final: bool, kept: dict[str, str]) -> int:
    """The table (to `write`'s "## Corpus" section after each input, or to stdout at the end)."""
    lines = [SECTION, "",
             f"`python3 bench/sbom_corpus.py --cache CACHE` at {_commit()} "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): each input's two SBOMs from one `check`, "
             "validated by cyclonedx-python-lib (JsonStrictValidator, CycloneDX 1.6) and spdx-tools "
             "(validate_full_spdx_document, SPDX 2.3); \"identical\": a second run gave the same bytes; "
             "vendor edges: the vendor libraries that a CycloneDX dependency reaches, read back with "
             "cyclonedx-python-lib (the SPDX relationships of the linkage graph (DYNAMIC_LINK, STATIC_LINK, CONTAINS for "
             "embedded kernels; their comment names the edge kind) read back with spdx-tools name the same set where the row "
             "passes).", "",
             "| input | exit | check (s) | CycloneDX | SPDX | components | dependencies | relationships | identical | vendor edges |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, code, seconds, v, same in rows:
        vendor = ", ".join(f"`{x}`" for x in v.get("vendor", [])[:4]) or "none"
        more = len(v.get("vendor", [])) - 4
        vendor += f" (+{more})" if more > 0 else ""
        if v.get("vendor") != v.get("spdx_vendor") and "vendor" in v:
            vendor += " (SPDX differs: " + ", ".join(v["spdx_vendor"][:4]) + ")"
        lines.append(f"| {name} | {code} | {seconds:.1f} | {v['cdx']} | {v['spdx']} | {v.get('components', '-')} "
                     f"| {v.get('edges', '-')} | {v.get('relationships', '-')} | {same} | {vendor} |")
    now = {r[0] for r in rows}
    earlier = [ln for name, ln in kept.items() if name not in now]
    lines += earlier
    lines.append("")
    if earlier:
        lines.append(f"{len(earlier)} row(s) marked \"earlier run\" are kept from a run before this one (--keep).")
    lines.append(f"{len(rows) - failed} of {len(rows)} inputs run now: both documents valid, identical run to run, "
                 "the same vendor edges in both.")
    section = "\n".join(lines) + "\n"
    if write:
        old = write.read_text(encoding="utf-8")
        start = old.find(SECTION + "\n")
        if start < 0:
            new = old.rstrip("\n") + "\n\n" + section
        else:
            end = old.find("\n## ", start + 1)
            new = old[:start] + section + ("" if end < 0 else old[end:])
        write.write_text(new, encoding="utf-8")
    elif final:
        print(section)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
