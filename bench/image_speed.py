#!/usr/bin/env python3
"""Benchmark: `check IMAGE.tar` against `check FOLDER` holding the same files.

Builds (once, cached in --work) a `docker save`-style archive of two layers from the torch CPU
wheel: layer 1 a small runtime (the host's libc, libm, libstdc++, libgcc_s, ld.so) and one copy
of the wheel's files; layer 2 more copies under other prefixes (each copy is a site-packages a
real image might hold: venvs, a second Python). The same final tree is written as a folder.
Both are audited with the default policy; wall time, files, findings and the ratio are printed,
and the image audit is checked to write no file (it reads the layers in place).

    python3 bench/image_speed.py [--wheel PATH | --torch-dir DIR] [--work DIR] [--copies 3]
                                 [--compress gzip|zstd] [--jobs N]

--torch-dir takes an installed torch package (site-packages/torch) instead of the wheel.
--hermetic audits the folder with --root FOLDER, so both resolve inside the same files only
(otherwise the folder also resolves against this machine's libraries, e.g. a CUDA install).

Exits 1 if the image audit takes more than --limit (2.0) times the folder's, or its verdicts
differ from the folder's for the wheel's files.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RUNTIME = ["libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2",
           "libpthread.so.0", "libdl.so.2", "librt.so.1"]
HOST_LIB = "/lib/x86_64-linux-gnu"


def default_wheel() -> str | None:
    hits = sorted(glob.glob("/work/cache/wheels/torch-*cpu*.whl"))
    return hits[-1] if hits else None


def prefixes(copies: int) -> list[str]:
    return [f"opt/venv{i}/lib/python3.11/site-packages" for i in range(copies)]


def write_layer(path: Path, items, compress: str | None) -> str:
    """items: (name, size, opener); returns the sha256 of the uncompressed tar (its diff_id)."""
    sha = hashlib.sha256()

    class Tee(io.RawIOBase):
        def __init__(self, out):
            self.out = out

        def writable(self):
            return True

        def write(self, b):
            sha.update(b)
            return self.out.write(b)

    with open(path, "wb") as raw:
        if compress == "gzip":
            import gzip
            sink = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0)
        elif compress == "zstd":
            import zstandard
            sink = zstandard.ZstdCompressor(level=1).stream_writer(raw, closefd=False)
        else:
            sink = raw
        with tarfile.open(fileobj=Tee(sink), mode="w|", format=tarfile.PAX_FORMAT) as tf:
            for name, size, opener in items:
                ti = tarfile.TarInfo(name)
                ti.size, ti.mode, ti.mtime = size, 0o755, 0
                with opener() as fh:
                    tf.addfile(ti, fh)
        if sink is not raw:
            sink.close()
    return sha.hexdigest()


def source_files(source: str) -> list[tuple[str, int, object]]:
    """(name inside site-packages, size, opener) of a wheel's members or a torch folder's files."""
    if os.path.isdir(source):
        top = Path(source).resolve()
        files = sorted(p for p in top.rglob("*") if p.is_file() and not p.is_symlink())
        return [(f"torch/{p.relative_to(top)}", p.stat().st_size, lambda p=p: open(p, "rb")) for p in files]
    zf = zipfile.ZipFile(source)
    return [(m.filename, m.file_size, lambda m=m: zf.open(m)) for m in zf.infolist() if not m.is_dir()]


def build(source: str, work: Path, copies: int, compress: str | None) -> tuple[Path, Path]:
    tag = f"{Path(source).stem[:40]}-{copies}-{compress or 'none'}"
    image, folder = work / f"image-{tag}.tar", work / f"folder-{tag}"
    if image.exists() and folder.exists():
        return image, folder
    work.mkdir(parents=True, exist_ok=True)
    members = source_files(source)

    def wheel_items(prefix):
        return [(f"{prefix}/{name}", size, opener) for name, size, opener in members]

    runtime = [(f"lib/x86_64-linux-gnu/{n}", os.path.getsize(os.path.join(HOST_LIB, n)),
                lambda n=n: open(os.path.join(HOST_LIB, n), "rb")) for n in RUNTIME
               if os.path.exists(os.path.join(HOST_LIB, n))]
    pre = prefixes(copies)
    layers = [runtime + wheel_items(pre[0]), [i for p in pre[1:] for i in wheel_items(p)]]
    tmp = Path(tempfile.mkdtemp(dir=work))
    diff_ids, names = [], []
    for i, items in enumerate(layers):
        diff_ids.append("sha256:" + write_layer(tmp / f"layer{i}", items, compress))
        names.append(f"{hashlib.sha256(diff_ids[-1].encode()).hexdigest()}/layer.tar")
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids},
                         "history": [{"created_by": "COPY runtime + torch wheel /opt/venv0"},
                                     {"created_by": "COPY torch wheel to more venvs"}]}).encode()
    cname = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cname, "RepoTags": ["bench:1"], "Layers": names}]).encode()
    with tarfile.open(image.with_suffix(".part"), "w", format=tarfile.PAX_FORMAT) as out:
        for name, data in ((cname, config), ("manifest.json", manifest)):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            out.addfile(ti, io.BytesIO(data))
        for i, name in enumerate(names):
            out.add(tmp / f"layer{i}", arcname=name)
    shutil.rmtree(tmp)
    image.with_suffix(".part").rename(image)
    # the same final tree as a folder
    for name, _size, opener in [i for items in layers for i in items]:
        dest = folder / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        with opener() as src, open(dest, "wb") as w:
            shutil.copyfileobj(src, w, 1 << 20)
    return image, folder


def audit(path: Path, jobs: int | None, root: Path | None = None):
    from audit.linkage.check import check_paths
    from audit.linkage.judging.policy import load_policy
    from audit.linkage.resolution.ldso import ResolveOptions

    private, saved = tempfile.mkdtemp(prefix="image-speed-"), tempfile.tempdir
    tempfile.tempdir = private  # where an audit would unpack anything (wheels do); must stay empty
    try:
        t0 = time.perf_counter()
        report = check_paths([str(path)], load_policy(None), ResolveOptions.from_cli(root=root), jobs=jobs)
        wall = time.perf_counter() - t0
    finally:
        tempfile.tempdir = saved
    written = os.listdir(private)
    shutil.rmtree(private)
    return report, wall, written


def summary(report, strip: str) -> dict:
    """{path inside the tree: (verdict, sorted finding keys)} for the wheel copies' files."""
    out = {}
    for f in report.files:
        inner = f.path.split(strip, 1)[1].lstrip("/")
        if inner.startswith("opt/"):
            out[inner] = (f.verdict, sorted((g.rule, g.kind, g.subject) for g in f.findings))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", default=default_wheel())
    ap.add_argument("--torch-dir", help="an installed torch package folder instead of the wheel")
    ap.add_argument("--hermetic", action="store_true",
                    help="audit the folder with --root FOLDER: resolved inside it only, as the image is")
    ap.add_argument("--jobs", type=int, default=None, help="check's worker processes (default: one per core)")
    ap.add_argument("--work", default="/work/cache/bench-image")
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--compress", choices=["gzip", "zstd"], default=None)
    ap.add_argument("--limit", type=float, default=2.0)
    args = ap.parse_args()
    source = args.torch_dir or args.wheel
    if not source or not os.path.exists(source):
        print("no torch CPU wheel: pip download torch==2.13.0 --no-deps -d /work/cache/wheels", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    image, folder = build(source, Path(args.work), args.copies, args.compress)
    print(f"image {image} ({image.stat().st_size / 1e9:.2f} GB), built/cached in {time.perf_counter() - t0:.1f} s")
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
    f_report, f_wall, _ = audit(folder, args.jobs, folder if args.hermetic else None)
    i_report, i_wall, written = audit(image, args.jobs)
    ratio = i_wall / f_wall
    for label, rep, wall in (("folder", f_report, f_wall), ("image", i_report, i_wall)):
        s = rep.summary
        print(f"{label:7s} {wall:7.1f} s  {s['files']} ELF files ({s['pass']} pass, {s['fail']} fail, "
              f"{s['error']} error), {s['findings']} findings")
    print(f"image / folder = {ratio:.2f} (limit {args.limit}); files the image audit wrote to its "
          f"temporary folder: {len(written)}")
    fs, is_ = summary(f_report, str(folder)), summary(i_report, f"{image}!")
    same = fs == is_
    print(f"verdicts and findings of the wheel copies identical: {same}")
    for name in sorted(set(fs) | set(is_)):
        if fs.get(name) != is_.get(name):
            a, b = fs.get(name, (None, [])), is_.get(name, (None, []))
            print(f"  {name}: folder {a[0]}, image {b[0]}; folder only {sorted(set(a[1]) - set(b[1]))[:4]}, "
                  f"image only {sorted(set(b[1]) - set(a[1]))[:4]}")
    errors = sorted({f.error for f in i_report.files + f_report.files if f.error})
    for e in errors[:5]:
        print(f"  error: {e[:300]}")
    return 0 if ratio <= args.limit and same and not written else 1


if __name__ == "__main__":
    sys.exit(main())
