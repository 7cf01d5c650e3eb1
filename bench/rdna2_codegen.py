#!/usr/bin/env python3
"""What the compiler made of the generic flash kernel for RDNA2 (gfx1030).

Given the gfx1030 library (default build/gfx1030/libflash_kernel.so, from
`python3 -m audit build --target gfx1030 --out build`), this script:

1. extracts every AMDGPU code object from the .so's .hip_fatbin (the project's own reader,
   audit/elf/amdgpu.py, finds them; CCOB-compressed bundles are inflated);
2. disassembles each with llvm-objdump --triple=amdgcn-amd-amdhsa --mcpu=gfx1030 and, per flash
   kernel (each dtype x head dim), counts the fp16 dot instructions (v_dot2_f32_f16 and its VOP2
   accumulate form v_dot2c_f32_f16), the other v_dot*, the FMA family (v_fma*/v_fmac*/v_fma_mix*/
   v_pk_fma*/v_mac*/v_mad*_f16|f32) and the private-memory (scratch) instructions, overall and in
   the hot loop;
3. reads the code object metadata (the NT_AMDGPU_METADATA msgpack note: .vgpr_count, .sgpr_count,
   .group_segment_fixed_size, .private_segment_fixed_size, .wavefront_size, spill counts) and the
   64-byte kernel descriptor (<kernel>.kd) as a second source;
4. derives the occupancy each kernel can reach on RDNA2 (see RDNA2 below for the figures and
   where they come from).

Counts are static (instructions in the object), not dynamic (instructions executed).

Scratch instructions: scratch_* (flat-scratch form) and buffer_load/store/atomic_* (MUBUF). HIP
addresses global memory with global_* (or flat_*), so on this target a MUBUF access is a private
(stack/spill) access through the private segment buffer descriptor; the cache controls
buffer_gl0_inv / buffer_gl1_inv are not memory accesses and are not counted. flat_* accesses may
in principle reach private memory (generic pointers) and are counted separately.

The hot loop. A first idea, "the instructions between a backward s_cbranch_*/s_branch and its
target", misreads these objects: the compiler places some blocks after s_endpgm and jumps back
from them (at the kernel's start a s_cbranch_scc0 jumps to a block past the end, which loads the
kernel arguments and s_branch-es back), so an address interval would call the whole kernel a loop.
So the disassembly is cut into basic blocks (a block starts at a branch target and after a
branch, s_endpgm or s_setpc), the control-flow graph is built, dominators are computed, and
every back edge u -> h (h dominates u) gives a natural loop: h plus every block that reaches u
without passing through h. The hot loop is the outermost loop (not inside another) holding the
most dot + FMA instructions: for this kernel it is the loop over K/V tiles, which contains the
inner Q.K (dot) and P.V (FMA) loops and the tile loads. "Scratch in the hot loop" counts scratch
instructions in any block of that loop (inner loops included); "in loops" counts them in any loop.

Run: python3 bench/rdna2_codegen.py [LIB] [--json] [--objdump PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from audit.elf import amdgpu  # noqa: E402
from audit.elf.decompress import DecompressError, inflate  # noqa: E402
from audit.elf.reader import read_elf  # noqa: E402

DEFAULT_LIB = REPO / "build" / "gfx1030" / "libflash_kernel.so"
MCPU = "gfx1030"
LLVM_DIRS = ("/usr/lib/llvm-15/bin",)


class CodegenError(Exception):
    """A one-line, user-facing reason the analysis could not be done."""


# ---- RDNA2 (gfx10.3, wave32) figures for the occupancy estimate ------------------------------
# Sources (docs/perf.md, "The RDNA2 (gfx1030) object", cites them in full):
#  - LLVM AMDGPUBaseInfo.cpp (LLVM 15, the compiler that built the object): getTotalNumVGPRs
#    (gfx10+ wave32: 1024 per SIMD), getVGPRAllocGranule (gfx10.3 wave32: 16), getMaxWavesPerEU
#    (gfx10.3: 16), getEUsPerCU ("for gfx10 in WGP mode the WGP contains two CUs, so a total of
#    four SIMDs"; CU mode: two), getAddressableNumVGPRs (256 per wave).
#  - Mesa src/amd/common/ac_gpu_info.c (AMD's common driver code): "GFX10+: LDS is 128KB in WGP
#    mode and 64KB in CU mode"; lds_alloc_granularity "what the hardware will align the LDS size
#    to" = 256 dwords (1024 bytes) on GFX10.3; max_waves_per_simd 16 on GFX10.3; every wave
#    gets 128 SGPRs on GFX10+ (num_physical_sgprs_per_simd = 128 * max waves), so SGPRs never
#    limit occupancy there.
#  - ROCm "GPU hardware specifications" table: RX 6900 XT (gfx1030) wave 32, LDS 128 KiB,
#    VGPR file 256 KiB (per CU = two SIMDs x 1024 wave32 VGPRs x 32 lanes x 4 bytes).
RDNA2 = {
    "wave_size": 32,
    "vgprs_per_simd": 1024,          # wave32 registers per SIMD
    "vgpr_alloc_granule": 16,        # gfx10.3, wave32
    "max_vgprs_per_wave": 256,
    "max_waves_per_simd": 16,
    "simds_per_cu": 2,
    "cus_per_wgp": 2,
    "lds_per_wgp": 128 * 1024,       # WGP mode: a workgroup may be placed anywhere in it
    "lds_per_cu": 64 * 1024,         # CU mode: the CU's half
    "lds_max_per_workgroup": 64 * 1024,
    "lds_alloc_granule": 1024,
}


def _roundup(x: int, g: int) -> int:
    return -(-x // g) * g


def occupancy(vgprs: int, lds_bytes: int, threads: int = 128, mode: str = "wgp") -> dict:
    """Waves per SIMD a kernel can keep resident on RDNA2, and what limits it.

    Workgroups are placed whole: in WGP mode a workgroup's waves spread over the WGP's 4 SIMDs
    and share its 128 KiB of LDS; in CU mode over one CU's 2 SIMDs and its 64 KiB. Each limit is
    turned into workgroups per WGP (or CU), the smallest wins, and waves per SIMD follow."""
    r = RDNA2
    if mode not in ("wgp", "cu"):
        raise ValueError(f"mode must be 'wgp' or 'cu', not {mode!r}")
    simds = r["simds_per_cu"] * (r["cus_per_wgp"] if mode == "wgp" else 1)
    lds_pool = r["lds_per_wgp"] if mode == "wgp" else r["lds_per_cu"]
    waves_per_wg = -(-threads // r["wave_size"])
    vgpr_alloc = _roundup(max(vgprs, 1), r["vgpr_alloc_granule"])
    if vgpr_alloc > r["max_vgprs_per_wave"]:
        raise ValueError(f"{vgprs} VGPRs exceed the {r['max_vgprs_per_wave']} a wave can address")
    waves_by_vgpr = r["vgprs_per_simd"] // vgpr_alloc  # the wave cap is its own limit below
    lds_alloc = _roundup(lds_bytes, r["lds_alloc_granule"]) if lds_bytes else 0
    if lds_bytes > r["lds_max_per_workgroup"]:
        raise ValueError(f"{lds_bytes} bytes of LDS exceed the {r['lds_max_per_workgroup']} a workgroup may use")
    limits = {
        "waves": r["max_waves_per_simd"] * simds // waves_per_wg,
        "vgpr": waves_by_vgpr * simds // waves_per_wg,
        "lds": lds_pool // lds_alloc if lds_alloc else 10**9,
    }
    wgs = min(limits.values())
    limiter = "+".join(k for k in ("vgpr", "lds", "waves") if limits[k] == wgs)  # every limit that binds
    waves = wgs * waves_per_wg / simds
    return {"mode": mode, "workgroups": wgs, "waves_per_simd": waves,
            "occupancy": waves / r["max_waves_per_simd"], "limiter": limiter,
            "vgpr_alloc": vgpr_alloc, "lds_alloc": lds_alloc, "waves_per_workgroup": waves_per_wg,
            "limits_workgroups": {k: (v if v < 10**9 else None) for k, v in limits.items()}}


# ---- tools -------------------------------------------------------------------------------------

def find_llvm_tool(name: str) -> str | None:
    """llvm-15's tool (it carries the AMDGPU target), then a versioned or plain one on PATH."""
    for d in LLVM_DIRS:
        p = Path(d) / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return shutil.which(f"{name}-15") or shutil.which(name)


# ---- code objects ------------------------------------------------------------------------------

@dataclass
class CodeObject:
    target: str
    bundle_id: str | None
    data: bytes


def _from_ccob(raw: bytes, at: int, bundle_id: str | None) -> bytes:
    """The entry `bundle_id` of the compressed (CCOB) bundle at raw[at:]."""
    version, method = struct.unpack_from("<HH", raw, at + 4)
    if version == 1:
        (usize,), start, total = struct.unpack_from("<I", raw, at + 8), 20, 0
    elif version == 2:
        total, usize = struct.unpack_from("<II", raw, at + 8)
        start = 24
    elif version == 3:
        total, usize = struct.unpack_from("<QQ", raw, at + 8)
        start = 32
    else:
        raise CodegenError(f"CCOB at {at:#x}: unknown version {version}")
    algo = amdgpu.CCOB_METHODS.get(method)
    if algo is None:
        raise CodegenError(f"CCOB at {at:#x}: unknown compression method {method}")
    payload = raw[at + start:at + total] if total else raw[at + start:]
    try:
        bundle, _ = inflate(algo, payload, usize)
    except DecompressError as exc:
        raise CodegenError(f"CCOB at {at:#x}: {exc}") from None
    for off, size, ident, _ in amdgpu._entries(bundle, 0, len(bundle), f"CCOB at {at:#x}"):
        if ident == bundle_id:
            return bundle[off:off + size]
    raise CodegenError(f"CCOB at {at:#x}: no entry {bundle_id!r}")


def code_objects(lib: str | os.PathLike) -> list[CodeObject]:
    """Every AMDGPU code object embedded in `lib`, as bytes (CodegenError if one is unreadable)."""
    lib = Path(lib)
    if not lib.is_file():
        raise CodegenError(f"{lib}: no such file (build it: python3 -m audit build --target gfx1030 --out build)")
    info = read_elf(lib)
    raw = lib.read_bytes()
    out = []
    for d in info.device_code:
        if d.kind != "amdgcn-code-object":
            continue
        if d.error:
            raise CodegenError(f"{lib}: code object {d.target}: {d.error}")
        data = raw[d.offset:d.offset + d.size] if d.compressed is None else _from_ccob(raw, d.offset, d.bundle_id)
        if data[:4] != b"\x7fELF":
            raise CodegenError(f"{lib}: code object {d.target} at {d.offset:#x} is not an ELF")
        out.append(CodeObject(d.target, d.bundle_id, data))
    if not out:
        raise CodegenError(f"{lib}: no AMDGPU code object in .hip_fatbin (not a HIP AMD build?)")
    return out


# ---- metadata: the msgpack note and the kernel descriptors ---------------------------------------

class _Msgpack:
    """The subset of MessagePack that AMDGPU code object metadata uses (maps, arrays, strings,
    integers, booleans, floats, binary)."""

    def __init__(self, data: bytes):
        self.d, self.i = data, 0

    def _take(self, n: int) -> bytes:
        if self.i + n > len(self.d):
            raise CodegenError("metadata note: msgpack data truncated")
        b = self.d[self.i:self.i + n]
        self.i += n
        return b

    def _u(self, fmt: str):
        return struct.unpack(">" + fmt, self._take(struct.calcsize(fmt)))[0]

    def value(self):
        t = self._take(1)[0]
        if t <= 0x7F:
            return t
        if t >= 0xE0:
            return t - 0x100
        if 0x80 <= t <= 0x8F:
            return self._map(t & 0x0F)
        if 0x90 <= t <= 0x9F:
            return [self.value() for _ in range(t & 0x0F)]
        if 0xA0 <= t <= 0xBF:
            return self._take(t & 0x1F).decode("utf-8", "replace")
        simple = {0xC0: None, 0xC2: False, 0xC3: True}
        if t in simple:
            return simple[t]
        ints = {0xCC: "B", 0xCD: "H", 0xCE: "I", 0xCF: "Q", 0xD0: "b", 0xD1: "h", 0xD2: "i", 0xD3: "q",
                0xCA: "f", 0xCB: "d"}
        if t in ints:
            return self._u(ints[t])
        lens = {0xD9: "B", 0xDA: "H", 0xDB: "I"}
        if t in lens:
            return self._take(self._u(lens[t])).decode("utf-8", "replace")
        blens = {0xC4: "B", 0xC5: "H", 0xC6: "I"}
        if t in blens:
            return self._take(self._u(blens[t]))
        if t in (0xDC, 0xDD):
            return [self.value() for _ in range(self._u("H" if t == 0xDC else "I"))]
        if t in (0xDE, 0xDF):
            return self._map(self._u("H" if t == 0xDE else "I"))
        raise CodegenError(f"metadata note: msgpack type byte {t:#04x} not supported")

    def _map(self, n: int) -> dict:
        out = {}
        for _ in range(n):
            k = self.value()
            out[k if isinstance(k, (str, int)) else repr(k)] = self.value()
        return out


def msgpack_decode(data: bytes):
    return _Msgpack(data).value()


NT_AMDGPU_METADATA = 32
SHT_NOTE = 7


def _elf(data: bytes):
    import io

    from elftools.elf.elffile import ELFFile

    return ELFFile(io.BytesIO(data))


def amdgpu_metadata(data: bytes) -> dict:
    """The NT_AMDGPU_METADATA note of a code object, decoded ({"amdhsa.kernels": [...], ...})."""
    elf = _elf(data)
    for sec in elf.iter_sections():
        if sec["sh_type"] != "SHT_NOTE":
            continue
        blob, pos = sec.data(), 0
        while pos + 12 <= len(blob):
            namesz, descsz, ntype = struct.unpack_from("<III", blob, pos)
            pos += 12
            name = blob[pos:pos + namesz].rstrip(b"\0")
            pos += _roundup(namesz, 4)
            desc = blob[pos:pos + descsz]
            pos += _roundup(descsz, 4)
            if name == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
                return msgpack_decode(desc)
    raise CodegenError("code object has no NT_AMDGPU_METADATA note (code object v2?)")


@dataclass
class KernelDescriptor:
    """The fields of the 64-byte amdhsa kernel descriptor that bear on resources (AMDGPUUsage,
    "Kernel Descriptor"): group/private segment sizes, and from COMPUTE_PGM_RSRC1/2 and
    kernel_code_properties the VGPR blocks, WGP mode, scratch enable and wave32."""
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    granulated_workitem_vgpr_count: int
    vgprs_encoded: int          # (granulated + 1) * 8: the VGPRs the hardware allocates from
    wgp_mode: bool
    private_segment_enabled: bool
    wave32: bool


def kernel_descriptors(data: bytes) -> dict[str, KernelDescriptor]:
    """<kernel name> -> its .kd descriptor, read from the symbol table and the section it sits in."""
    elf = _elf(data)
    out = {}
    for sec in elf.iter_sections():
        if sec["sh_type"] not in ("SHT_SYMTAB", "SHT_DYNSYM"):
            continue
        for sym in sec.iter_symbols():
            if not sym.name.endswith(".kd") or sym.name[:-3] in out:
                continue
            shndx = sym["st_shndx"]
            if not isinstance(shndx, int):
                continue
            host = elf.get_section(shndx)
            off = host["sh_offset"] + sym["st_value"] - host["sh_addr"]
            kd = data[off:off + 64]
            if len(kd) != 64:
                raise CodegenError(f"{sym.name}: kernel descriptor runs past the file")
            group, private, kernarg = struct.unpack_from("<III", kd, 0)
            rsrc1, rsrc2 = struct.unpack_from("<II", kd, 48)
            props = struct.unpack_from("<H", kd, 56)[0]
            g = rsrc1 & 0x3F
            out[sym.name[:-3]] = KernelDescriptor(
                group_segment_fixed_size=group, private_segment_fixed_size=private, kernarg_size=kernarg,
                granulated_workitem_vgpr_count=g, vgprs_encoded=(g + 1) * 8 if props & (1 << 10) else (g + 1) * 4,
                wgp_mode=bool(rsrc1 & (1 << 29)), private_segment_enabled=bool(rsrc2 & 1),
                wave32=bool(props & (1 << 10)))
    return out


# ---- disassembly -------------------------------------------------------------------------------

@dataclass
class Insn:
    addr: int
    size: int
    mnemonic: str
    operands: str
    target: int | None = None   # branch target address


_FUNC = re.compile(r"^([0-9a-fA-F]+) <(.+)>:\s*$")
_INSN = re.compile(r"^\s+([a-z_][a-z0-9_]*)(?:\s+(.*?))?\s*//\s*([0-9A-Fa-f]+):\s*((?:[0-9A-Fa-f]{8}\s*)+)"
                   r"(?:<(.+)>)?\s*$")
_SYMOFF = re.compile(r"^(.+?)(?:\+0x([0-9a-fA-F]+))?$")
BRANCHES = re.compile(r"^s_(c)?branch(_[a-z0-9]+)?$")


def disassemble(data: bytes, objdump: str | None = None, mcpu: str = MCPU) -> str:
    """llvm-objdump -d of one code object (text)."""
    objdump = objdump or find_llvm_tool("llvm-objdump")
    if objdump is None:
        raise CodegenError("llvm-objdump not found (apt install llvm-15: /usr/lib/llvm-15/bin/llvm-objdump)")
    with tempfile.TemporaryDirectory() as td:
        co = Path(td) / "code_object.o"
        co.write_bytes(data)
        cp = subprocess.run([objdump, "-d", "--triple=amdgcn-amd-amdhsa", f"--mcpu={mcpu}", str(co)],
                            capture_output=True, text=True)
    if cp.returncode != 0:
        raise CodegenError(f"llvm-objdump failed ({cp.returncode}): {cp.stderr.strip().splitlines()[-1:]}")
    return cp.stdout


def parse_disassembly(text: str) -> dict[str, list[Insn]]:
    """function name -> its instructions, branch targets resolved to addresses."""
    funcs: dict[str, list[Insn]] = {}
    starts: dict[str, int] = {}
    cur = None
    pending: list[tuple[Insn, str | None]] = []
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            cur = m.group(2)
            starts[cur] = int(m.group(1), 16)
            funcs[cur] = []
            continue
        m = _INSN.match(line)
        if not m or cur is None:
            continue
        mnem, ops, addr, words, comment = m.groups()
        ins = Insn(int(addr, 16), 4 * len(words.split()), mnem, (ops or "").strip())
        funcs[cur].append(ins)
        if BRANCHES.match(mnem):
            pending.append((ins, comment))
    for ins, comment in pending:
        ins.target = _branch_target(ins, comment, starts)
    return funcs


def _branch_target(ins: Insn, comment: str | None, starts: dict[str, int]) -> int | None:
    """The target of a SOPP branch: from objdump's <sym+off> comment where present, else from
    the 16-bit signed word offset (target = next instruction + 4 * simm16); the two must agree."""
    from_imm = None
    tok = ins.operands.split(",")[0].strip()
    if re.fullmatch(r"-?\d+|0x[0-9a-fA-F]+", tok):
        v = int(tok, 0) & 0xFFFF
        simm = v - 0x10000 if v & 0x8000 else v
        from_imm = ins.addr + 4 + 4 * simm
    from_sym = None
    if comment:
        m = _SYMOFF.match(comment.strip())
        if m and m.group(1) in starts:
            from_sym = starts[m.group(1)] + int(m.group(2) or "0", 16)
    if from_imm is not None and from_sym is not None and from_imm != from_sym:
        raise CodegenError(f"branch at {ins.addr:#x}: offset gives {from_imm:#x}, objdump says {from_sym:#x}")
    return from_sym if from_sym is not None else from_imm


# ---- control flow and loops --------------------------------------------------------------------

@dataclass
class Block:
    start: int
    insns: list[Insn]
    succs: list[int] = field(default_factory=list)


TERMINATORS = ("s_endpgm", "s_endpgm_saved", "s_setpc_b64", "s_endpgm_ordered_ps_done")


def basic_blocks(insns: list[Insn]) -> dict[int, Block]:
    """Blocks keyed by start address; successors are block starts."""
    if not insns:
        return {}
    leaders = {insns[0].addr}
    addrs = {i.addr for i in insns}
    for k, ins in enumerate(insns):
        is_branch = bool(BRANCHES.match(ins.mnemonic))
        if is_branch and ins.target is not None:
            if ins.target not in addrs:
                raise CodegenError(f"branch at {ins.addr:#x} targets {ins.target:#x}, not an instruction of its function")
            leaders.add(ins.target)
        if (is_branch or ins.mnemonic in TERMINATORS) and k + 1 < len(insns):
            leaders.add(insns[k + 1].addr)
    blocks: dict[int, Block] = {}
    cur = None
    for ins in insns:
        if ins.addr in leaders:
            cur = blocks[ins.addr] = Block(ins.addr, [])
        cur.insns.append(ins)
    starts = sorted(blocks)
    for n, s in enumerate(starts):
        last = blocks[s].insns[-1]
        nxt = starts[n + 1] if n + 1 < len(starts) else None
        if BRANCHES.match(last.mnemonic):
            if last.target is not None:
                blocks[s].succs.append(last.target)
            if last.mnemonic.startswith("s_cbranch") and nxt is not None:
                blocks[s].succs.append(nxt)
        elif last.mnemonic not in TERMINATORS and nxt is not None:
            blocks[s].succs.append(nxt)
    return blocks


def dominators(blocks: dict[int, Block], entry: int) -> dict[int, set[int]]:
    """Iterative dominator sets over the blocks reachable from `entry`."""
    order, seen, stack = [], {entry}, [entry]
    while stack:
        b = stack.pop()
        order.append(b)
        for s in blocks[b].succs:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    preds: dict[int, list[int]] = {b: [] for b in seen}
    for b in seen:
        for s in blocks[b].succs:
            preds[s].append(b)
    dom = {b: set(seen) for b in seen}
    dom[entry] = {entry}
    changed = True
    while changed:
        changed = False
        for b in order:
            if b == entry:
                continue
            ps = [dom[p] for p in preds[b]]
            new = set.intersection(*ps) | {b} if ps else {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


@dataclass
class Loop:
    header: int
    latches: list[int]
    blocks: set[int]
    depth: int = 1

    def span(self) -> tuple[int, int]:
        return min(self.blocks), max(self.blocks)


def natural_loops(blocks: dict[int, Block]) -> list[Loop]:
    """One loop per header (back edges to one header merged), outermost first."""
    if not blocks:
        return []
    entry = min(blocks)
    dom = dominators(blocks, entry)
    preds: dict[int, list[int]] = {b: [] for b in dom}
    for b in dom:
        for s in blocks[b].succs:
            preds[s].append(b)
    loops: dict[int, Loop] = {}
    for u in dom:
        for h in blocks[u].succs:
            if h in dom[u]:  # back edge u -> h
                body, stack = {h, u}, [u]
                while stack:
                    x = stack.pop()
                    if x == h:
                        continue
                    for p in preds[x]:
                        if p not in body:
                            body.add(p)
                            stack.append(p)
                lp = loops.setdefault(h, Loop(h, [], set()))
                lp.latches.append(u)
                lp.blocks |= body
    out = sorted(loops.values(), key=lambda lp: -len(lp.blocks))
    for lp in out:
        lp.depth = sum(1 for o in out if o is not lp and lp.blocks < o.blocks) + 1
    return out


# ---- classification ----------------------------------------------------------------------------

def base_mnemonic(m: str) -> str:
    return re.sub(r"_(e32|e64|sdwa|dpp|dpp8)$", "", m)


DOT2_F16 = ("v_dot2_f32_f16", "v_dot2c_f32_f16")
_FMA = re.compile(r"^v_(pk_)?(fma|fmac|fmaak|fmamk|mac|mad|madak|madmk)(_mix(lo|hi)?)?(_legacy)?_f(16|32)$")
_SCRATCH = re.compile(r"^(scratch_|buffer_(load|store|atomic))")


def is_dot2_f16(m: str) -> bool:
    return base_mnemonic(m) in DOT2_F16


def is_dot(m: str) -> bool:
    return base_mnemonic(m).startswith("v_dot")


def is_fma(m: str) -> bool:
    return bool(_FMA.match(base_mnemonic(m)))


def is_scratch(m: str) -> bool:
    return bool(_SCRATCH.match(m))


def _counts(insns) -> dict:
    c = {"instructions": 0, "dot2_f16": 0, "dot_other": 0, "fma": 0, "scratch": 0, "flat": 0}
    for i in insns:
        c["instructions"] += 1
        if is_dot2_f16(i.mnemonic):
            c["dot2_f16"] += 1
        elif is_dot(i.mnemonic):
            c["dot_other"] += 1
        if is_fma(i.mnemonic):
            c["fma"] += 1
        if is_scratch(i.mnemonic):
            c["scratch"] += 1
        if i.mnemonic.startswith("flat_"):
            c["flat"] += 1
    return c


def analyse_function(insns: list[Insn]) -> dict:
    """Counts over the whole function, its loops and its hot loop."""
    blocks = basic_blocks(insns)
    loops = natural_loops(blocks)
    hist: dict[str, int] = {}
    for i in insns:
        b = base_mnemonic(i.mnemonic)
        if is_dot(i.mnemonic) or is_fma(i.mnemonic) or is_scratch(i.mnemonic):
            hist[b] = hist.get(b, 0) + 1

    def loop_info(lp: Loop) -> dict:
        body = [i for b in sorted(lp.blocks) for i in blocks[b].insns]
        lo, hi = lp.span()
        return {"header": lp.header, "latches": sorted(lp.latches), "depth": lp.depth, "blocks": len(lp.blocks),
                "span": [lo, blocks[hi].insns[-1].addr], **_counts(body)}

    infos = [loop_info(lp) for lp in loops]
    in_loops = {b for lp in loops for b in lp.blocks}
    outer = [x for x in infos if x["depth"] == 1]
    hot = max(outer, key=lambda x: (x["dot2_f16"] + x["dot_other"] + x["fma"], x["instructions"]), default=None)
    return {**_counts(insns), "mnemonics": dict(sorted(hist.items())),
            "scratch_in_loops": sum(1 for b in in_loops for i in blocks[b].insns if is_scratch(i.mnemonic)),
            "blocks": len(blocks), "loops": infos, "hot_loop": hot}


# ---- the report --------------------------------------------------------------------------------

_FLASH = re.compile(r"flash_generic_kernelINS_\d+(F32|F16|BF16)ELi(\d+)E")
DTYPES = {"F16": "fp16", "BF16": "bf16", "F32": "fp32"}


def flash_kernel_key(name: str) -> tuple[str, int] | None:
    """("fp16", 128) for the mangled generic flash kernel instantiation, else None."""
    m = _FLASH.search(name)
    return (DTYPES[m.group(1)], int(m.group(2))) if m else None


def analyse(lib: str | os.PathLike = DEFAULT_LIB, objdump: str | None = None) -> dict:
    """The full report for one library: {"library", "code_objects": [...], "kernels": [...]}."""
    kernels, objects = [], []
    for co in code_objects(lib):
        meta = amdgpu_metadata(co.data)
        kds = kernel_descriptors(co.data)
        funcs = parse_disassembly(disassemble(co.data, objdump))
        objects.append({"target": co.target, "bundle_id": co.bundle_id, "size": len(co.data),
                        "functions": len(funcs)})
        for km in meta.get("amdhsa.kernels", []):
            name = km.get(".name", "")
            key = flash_kernel_key(name)
            if key is None:
                continue
            if name not in funcs:
                raise CodegenError(f"{name}: in the metadata but not in the disassembly")
            kd = kds.get(name)
            md = {k: km.get("." + k) for k in ("vgpr_count", "sgpr_count", "group_segment_fixed_size",
                                                 "private_segment_fixed_size", "wavefront_size",
                                                 "vgpr_spill_count", "sgpr_spill_count",
                                                 "max_flat_workgroup_size")}
            threads = md["max_flat_workgroup_size"] or 128
            occ = {m: occupancy(md["vgpr_count"], md["group_segment_fixed_size"], threads, m) for m in ("wgp", "cu")}
            kernels.append({"name": name, "target": co.target, "dtype": key[0], "head_dim": key[1],
                            "metadata": md, "descriptor": asdict(kd) if kd else None,
                            "occupancy": occ, **analyse_function(funcs[name])})
    kernels.sort(key=lambda k: (["fp16", "bf16", "fp32"].index(k["dtype"]), k["head_dim"]))
    if not kernels:
        raise CodegenError(f"{lib}: no generic flash kernel (flash_generic_kernel<...>) in any code object")
    return {"library": str(lib), "mcpu": MCPU, "rdna2": RDNA2, "code_objects": objects, "kernels": kernels}


def table(report: dict) -> str:
    """A short markdown table, one row per flash kernel."""
    head = ("| kernel | dot2 f16 | FMA | scratch (all / hot loop) | VGPR | SGPR | LDS B | private B | wave |"
            " waves/SIMD WGP mode (limit) | CU mode (limit) |")
    rows = [head, "|" + "---|" * 11]
    for k in report["kernels"]:
        md, hot = k["metadata"], k["hot_loop"] or {}
        w, c = k["occupancy"]["wgp"], k["occupancy"]["cu"]
        rows.append(f"| {k['dtype']} D{k['head_dim']} | {k['dot2_f16']} | {k['fma']} | "
                    f"{k['scratch']} / {hot.get('scratch', 'no loop')} | {md['vgpr_count']} | {md['sgpr_count']} | "
                    f"{md['group_segment_fixed_size']} | {md['private_segment_fixed_size']} | {md['wavefront_size']} | "
                    f"{w['waves_per_simd']:g} of 16 ({w['limiter']}) | {c['waves_per_simd']:g} ({c['limiter']}) |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib", nargs="?", default=str(DEFAULT_LIB), help="the gfx1030 libflash_kernel.so")
    ap.add_argument("--json", action="store_true", help="print the full report as JSON")
    ap.add_argument("--objdump", help="llvm-objdump to use (default: llvm-15's)")
    a = ap.parse_args(argv)
    try:
        rep = analyse(a.lib, a.objdump)
    except (CodegenError, OSError) as exc:
        print(f"rdna2_codegen: {exc}".replace("\n", " "), file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(rep, indent=2, default=str))
        return 0
    print(f"{rep['library']}: {len(rep['code_objects'])} code object(s), "
          f"{', '.join(o['target'] for o in rep['code_objects'])}; static instruction counts")
    for k in rep["kernels"]:
        hot = k["hot_loop"]
        where = (f"hot loop {hot['span'][0]:#x}-{hot['span'][1]:#x} ({hot['blocks']} blocks, "
                 f"{hot['instructions']} insns, {hot['dot2_f16']} dot2, {hot['fma']} FMA)") if hot else "no loop"
        print(f"  {k['dtype']} D{k['head_dim']}: {where}")
    print(table(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
