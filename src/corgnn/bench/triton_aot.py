"""Ahead-of-time compilation of every Triton kernel specialization, without a GPU
(``corgnn bench triton-aot``).

Triton compiles for a named GPU target on any machine: ``triton.compile`` on a
``triton.compiler.ASTSource`` with ``target=GPUTarget("cuda", 90, 32)`` runs the
front end, LLVM and the ``ptxas`` the triton wheel ships, and returns PTX and a
cubin; ``cuobjdump --dump-resource-usage`` (shipped too) reads each kernel's
registers, stack, local memory and shared memory from the cubin.

Which specializations: the ones the launchers of
:mod:`corgnn.sparse.backends.triton_ops` make. :func:`record_launches` calls every
launcher on tiny CPU tensors over the sweep :func:`sweep` declares (dtype, format,
single/multi-head, values and permutation on/off, the split long-row path, the bias
epilogue, every GAT caching mode, dropout off / on with a 32-bit and a 64-bit
threshold) with ``triton_ops.wrap_triton`` replaced by a recorder, so no kernel runs
and the recorded launches are the launchers' own (their grids and flags come from
the shapes only). Each launch is then specialized as Triton's JIT would specialize
it (``triton.runtime.jit.create_function_from_signature``: argument types,
constexprs, the ``int == 1`` constants and 16-byte divisibility hints), deduplicated,
and compiled for each target.

Widths: the sweep uses the widest blocks the launchers pick (``BLOCK_F`` =
``MAX_BLOCK_F``, ``BLOCK_K`` = ``MAX_BLOCK_K``), the register-heaviest case; narrower
features only shrink the blocks. Integer divisibility hints differ with the real
sizes (a node count divisible by 16 gets one): they change alignment assumptions,
not the kernel's structure.

A spill is ``LOCAL > 0`` or ``STACK > 0`` in the resource usage (the kernels have
no local arrays: local memory and stack are spilled registers); the table marks
every one. ``--check`` fails on a compile error or a spill of more than
:data:`SPILL_TOLERANCE_BYTES`.

NOTE (measured with triton 3.9's ptxas 12.9 / 13.4, no GPU): 25 of the 928
compiled specializations get an 8-byte stack frame (``ptxas -v``: "8 bytes stack
frame, 4 bytes spill stores, 8 bytes spill loads") at 48-64 registers, far from any
register limit, and which ones is erratic: the fp32 ``spmm_chunks_kernel`` on sm_90
has it at 4 warps and not at 2 or 8, on sm_80 at 8 warps and not at 4. One 4-byte
value parked on the stack by the allocator, not register pressure, and no launcher
setting removes it without a GPU to measure the alternative; hence the tolerance of
one 8-byte slot. A real spill (local memory, a larger frame) still fails.

The kernels must be defined for compilation, not for the interpreter: this module
refuses to run under ``TRITON_INTERPRET=1`` (the test suite sets it on CPU, so its
test runs this in a subprocess with ``TRITON_INTERPRET=0``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

__all__ = ["Spec", "Usage", "TARGETS", "SPILL_TOLERANCE_BYTES", "sweep", "record_launches", "specializations", "representative", "compile_spec", "compile_all", "markdown_table", "main"]

SPILL_TOLERANCE_BYTES = 8
"""Stack + local bytes of a specialization that ``--check`` lets pass (see the NOTE above)."""

TARGETS = (80, 90)
"""CUDA compute capabilities compiled for: sm_80 (A100) and sm_90 (H100/H200)."""


@dataclass(frozen=True)
class Spec:
    """One kernel specialization: the kernel's name in :mod:`.triton_kernels`, its
    argument types (``"*fp32"``, ``"i32"``, ``"constexpr"``...), constexpr values and
    attributes (divisibility hints), as Triton's JIT derives them; ``label`` names the
    launch that produced it first."""

    kernel: str
    signature: tuple
    constexprs: tuple
    attrs: tuple
    label: str = field(compare=False, default="")

    def flags(self) -> dict:
        """``{argument: value}`` of the constexpr arguments, plus the pointer dtype of the
        dense operand (``dtype``)."""
        sig = dict(self.signature)
        dense = next(t for n, t in self.signature if n in ("B", "M", "scores", "G"))
        out = {"dtype": dense.lstrip("*")}
        out.update({n: v for n, v in self.constexprs})
        out.update({f"{n}:{t}": True for n, t in sig.items() if t in ("i64",)})  # 64-bit int arguments
        return out

    def describe(self) -> str:
        """The constexprs (and 64-bit int arguments) in one short string."""
        parts = []
        for k, v in self.flags().items():
            if k == "dtype":
                continue
            if v is True:
                parts.append(k)
            elif v is not False:
                parts.append(f"{k}={v}")
        return " ".join(parts)


@dataclass(frozen=True)
class Usage:
    """Resource usage of one compiled specialization on one target."""

    spec: Spec
    arch: int
    registers: int
    stack: int
    local: int
    shared: int
    seconds: float

    @property
    def spill_bytes(self) -> int:
        """Stack + local memory per thread (spilled registers in these kernels)."""
        return self.local + self.stack

    @property
    def spills(self) -> bool:
        return self.spill_bytes > 0


# --------------------------------------------------------------------------- recording


def _ops():
    """The launchers module, refusing the interpreter (its kernels cannot be compiled)."""
    from ..sparse.backends import triton_ops

    if triton_ops.interpreted():
        raise RuntimeError(
            "the Triton kernels were defined for the interpreter (TRITON_INTERPRET=1): "
            "run ahead-of-time compilation in a process with TRITON_INTERPRET=0"
        )
    return triton_ops


class _Recorder:
    """Stands in for ``torch.library.wrap_triton``: ``wrap(kernel)[grid](*args, **kw)``
    appends ``(kernel, args, kw, label)`` instead of launching."""

    def __init__(self):
        self.launches: list = []
        self.label = ""

    def __call__(self, kernel):
        rec = self

        class _Grid:
            def __getitem__(self, grid):
                return lambda *args, **kw: rec.launches.append((kernel, args, kw, rec.label))

        return _Grid()


@contextlib.contextmanager
def _recording(ops):
    rec = _Recorder()
    saved = ops.wrap_triton
    ops.wrap_triton = rec
    try:
        yield rec
    finally:
        ops.wrap_triton = saved


def sweep(ops, dtypes=None):
    """Yield ``(label, launcher, args)``: every launcher configuration the backend can
    be asked to run, on tiny CPU tensors of each dtype (``dtypes``: default float32,
    float64, bfloat16, float16)."""
    import torch

    dtypes = dtypes or (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    F, H, Kh = ops.MAX_BLOCK_F, 4, ops.MAX_BLOCK_K
    n = 10  # nodes (not 1, not a multiple of 16: no constant or divisibility specialization)
    g = torch.Generator().manual_seed(0)

    def graph(q: int):
        row = torch.sort(torch.randint(0, n, (q,), generator=g)).values
        ptr = torch.searchsorted(row, torch.arange(n + 1))
        return ptr, torch.randint(0, n, (q,), generator=g), torch.randperm(q, generator=g), row

    short, long = graph(18), graph(ops.SPLIT_CHUNK + 44)  # the long one takes the split path
    ell_col = torch.randint(0, n, (n, 3), generator=g)
    ell_len = torch.full((n,), 3)
    for dt in dtypes:
        t = f"{str(dt).replace('torch.', '')}"
        dense = {False: torch.randn(n, F, dtype=dt), True: torch.randn(n, H, Kh, dtype=dt)}
        for heads, B in dense.items():
            lay = "multi-head" if heads else "single-head"
            for (ptr, idx, perm, row), length in ((short, "short"), (long, "split")):
                q = idx.numel()
                for use_perm in (False, True):
                    for use_val in (False, True):
                        val = torch.randn((q, H) if heads else (q,), dtype=dt) if use_val else None
                        biases = (None,) if heads else (None, torch.randn(F, dtype=dt))
                        for bias in biases:
                            label = f"spmm_rows {t} {lay} {length}{' perm' if use_perm else ''}{' val' if use_val else ''}{' bias' if bias is not None else ''}"
                            yield label, ops.spmm_rows, (ptr, idx, perm if use_perm else None, val, B, bias)
                        # SDDMM on the same plan
                        yield f"sddmm_rows {t} {lay}{' perm' if use_perm else ''}{' val' if use_val else ''}", ops.sddmm_rows, (ptr, idx, perm if use_perm else None, val, B, B)
                # COO SDDMM, hybrid SpMM (CSR head + row-sorted COO tail) on this plan
                for use_val in (False, True):
                    val = torch.randn((q, H) if heads else (q,), dtype=dt) if use_val else None
                    yield f"sddmm_coo {t} {lay}{' val' if use_val else ''}", ops.sddmm_coo, (row, idx, val, B, B)
                    half = q // 2
                    hptr = torch.searchsorted(row[:half], torch.arange(n + 1))
                    yield f"spmm_hybrid {t} {lay} {length}{' val' if use_val else ''}", ops.spmm_hybrid, (hptr, idx[:half], row[half:], idx[half:], val, B)
            for use_val in (False, True):
                V = torch.randn((n, 3, H) if heads else (n, 3), dtype=dt) if use_val else None
                yield f"spmm_ell {t} {lay}{' val' if use_val else ''}", ops.spmm_ell, (ell_col, ell_len, V, B)
                sv = torch.randn((3 * n, H) if heads else (3 * n,), dtype=dt) if use_val else None
                yield f"sddmm_ell {t} {lay}{' val' if use_val else ''}", ops.sddmm_ell, (ell_col, ell_len, torch.arange(0, 3 * n, 3), sv, B, B)
        # attention: single-head GAT layers are 3-D with one head (H == 1 specializes)
        ptr, idx, perm, _ = short
        q = idx.numel()
        for heads in (1, H):
            lay = "multi-head" if heads > 1 else "single-head"
            M = torch.randn(n, heads, Kh, dtype=dt)
            s, d = torch.randn(n, heads, dtype=dt), torch.randn(n, heads, dtype=dt)
            a = torch.randn(heads * Kh, dtype=dt)
            seed = torch.tensor([12345])
            for use_perm in (False, True):
                pm = perm if use_perm else None
                P = " perm" if use_perm else ""
                yield f"edge_softmax {t} {lay}{P}", ops.edge_softmax_rows, (ptr, pm, torch.randn(q, heads, dtype=dt))
                # p: off, a 32-bit dropout threshold (p < 0.5), a 64-bit one (p >= 0.5)
                for p in (0.0, 0.1, 0.6):
                    D = f" p={p}" if p else ""
                    for want_leaky in (False, True):
                        yield f"gat_attention {t} {lay}{P}{D}{' leaky' if want_leaky else ''}", ops.gat_attention, (ptr, idx, pm, s, d, M, 0.2, p, seed, want_leaky)
                    for cached in (False, True):
                        alpha = torch.rand(q, heads, dtype=dt) if cached else None
                        leaky = torch.rand(q, heads) > 0.5 if cached else None
                        ss, dd = (None, None) if cached else (s, d)
                        yield (
                            f"gat_attention_backward {t} {lay}{P}{D}{' cached' if cached else ' recompute'}",
                            ops.gat_attention_backward,
                            (ptr, idx, pm, ptr, idx, pm, M, M, a, a, alpha, leaky, ss, dd, 0.2, p, seed),
                        )


def record_launches(dtypes=None) -> list:
    """``[(kernel, args, kwargs, label)]``: every Triton launch the launchers make over
    :func:`sweep` (recorded, not run)."""
    ops = _ops()
    with _recording(ops) as rec:
        for label, launcher, args in sweep(ops, dtypes):
            rec.label = label
            launcher(*args)
    return rec.launches


def _specialize(kernel, args, kwargs, backend) -> tuple:
    """``(signature, constexprs, attrs)`` of one launch, as ``JITFunction.run`` derives them."""
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, _ = binder(*args, **kwargs)
    names = [p.name for p in kernel.params]
    signature = tuple((nm, s[0]) for nm, s in zip(names, spec))
    constexprs = tuple((nm, bound[nm]) for nm, s in zip(names, spec) if s[0] == "constexpr")
    attrs = tuple((nm, s[1]) for nm, s in zip(names, spec) if s[0] != "constexpr" and isinstance(s[1], str) and s[1])
    return signature, constexprs, attrs


def specializations(dtypes=None) -> list[Spec]:
    """Every distinct kernel specialization the launchers make, in first-seen order."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", TARGETS[-1], 32))
    seen: dict = {}
    for kernel, args, kwargs, label in record_launches(dtypes):
        sig, cons, attrs = _specialize(kernel, args, kwargs, backend)
        spec = Spec(kernel.__name__, sig, cons, attrs, label)
        seen.setdefault(spec, spec)
    return list(seen.values())


def representative(specs: list[Spec]) -> list[Spec]:
    """A subset covering every ``(kernel, flag, value)`` pair of ``specs`` (dtype and
    64-bit integer arguments counted as flags), greedily, plus for each kernel its
    float64 specialization with the most flags on (the register-heaviest guess)."""
    def pairs(s: Spec):
        return {(s.kernel, k, v) for k, v in s.flags().items()}

    todo = set().union(*(pairs(s) for s in specs)) if specs else set()
    chosen: list[Spec] = []
    for kernel in dict.fromkeys(s.kernel for s in specs):
        f64 = [s for s in specs if s.kernel == kernel and s.flags()["dtype"] == "fp64"]
        if f64:
            heavy = max(f64, key=lambda s: sum(v is True for v in s.flags().values()))
            chosen.append(heavy)
            todo -= pairs(heavy)
    while todo:
        best = max(specs, key=lambda s: len(pairs(s) & todo))
        chosen.append(best)
        todo -= pairs(best)
    return chosen


# --------------------------------------------------------------------------- compiling


def _resource_usage(cubin: bytes) -> dict:
    """``{REG, STACK, SHARED, LOCAL}`` of the one kernel in ``cubin`` (cuobjdump)."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        text = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name], check=True, capture_output=True, text=True
        ).stdout
    finally:
        os.unlink(f.name)
    found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text))
    return {k: int(found[k]) for k in ("REG", "STACK", "SHARED", "LOCAL")}


def compile_spec(spec: Spec, arch: int) -> Usage:
    """Compile ``spec`` for ``sm_<arch>`` and read its resource usage.

    Raises:
        Exception: whatever Triton raises on a compile error (the message names the kernel).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ..sparse.backends import triton_kernels

    _ops()
    kernel = getattr(triton_kernels, spec.kernel)
    index = {nm: i for i, nm in enumerate(p.name for p in kernel.params)}
    target = GPUTarget("cuda", arch, 32)
    backend = triton.compiler.make_backend(target)
    src = ASTSource(
        fn=kernel,
        signature=dict(spec.signature),
        constexprs={(index[nm],): v for nm, v in spec.constexprs},
        attrs={(index[nm],): backend.parse_attr(a) for nm, a in spec.attrs},
    )
    t0 = time.perf_counter()
    compiled = triton.compile(src, target=target)
    seconds = time.perf_counter() - t0
    u = _resource_usage(compiled.asm["cubin"])
    return Usage(spec, arch, u["REG"], u["STACK"], u["LOCAL"], max(u["SHARED"], compiled.metadata.shared), seconds)


def _compile_job(job):
    spec, arch = job
    try:
        return compile_spec(spec, arch), None
    except Exception as e:  # reported per specialization, not lost in the pool
        return None, f"{spec.kernel} [{spec.describe()}] sm_{arch}: {type(e).__name__}: {str(e)[-2000:]}"


def compile_all(specs: list[Spec], archs=TARGETS, workers: int = 1) -> tuple[list[Usage], list[str]]:
    """Compile every spec for every arch (``workers`` processes); ``(usages, errors)``."""
    jobs = [(s, a) for s in specs for a in archs]
    if workers <= 1:
        results = [_compile_job(j) for j in jobs]
    else:
        import multiprocessing

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_env) as pool:
            results = list(pool.map(_compile_job, jobs))
    return [u for u, _ in results if u is not None], [e for _, e in results if e is not None]


def _worker_env() -> None:
    os.environ["TRITON_INTERPRET"] = "0"


# ----------------------------------------------------------------------------- report


def markdown_table(usages: list[Usage]) -> str:
    """One row per specialization: registers / stack+local (spills) / shared memory per target."""
    archs = sorted({u.arch for u in usages})
    by_spec: dict = {}
    for u in usages:
        by_spec.setdefault(u.spec, {})[u.arch] = u
    head = ["kernel", "dtype", "specialization"] + [f"sm_{a} regs / spill B / smem B" for a in archs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec, per in sorted(by_spec.items(), key=lambda kv: (kv[0].kernel, kv[0].flags()["dtype"], kv[0].describe())):
        cells = [spec.kernel, spec.flags()["dtype"], spec.describe() or "-"]
        for a in archs:
            u = per.get(a)
            cells.append("-" if u is None else f"{u.registers} / {u.spill_bytes}{' **SPILL**' if u.spills else ''} / {u.shared}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_arguments(p) -> None:
    p.add_argument("--subset", action="store_true", help="the representative subset only (see representative())")
    p.add_argument("--arch", type=int, action="append", help=f"compute capability to compile for (repeatable; default {' and '.join(map(str, TARGETS))})")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="compile processes (default: every core)")
    p.add_argument("--limit", type=int, default=0, help="compile only the first N specializations (0: all)")
    p.add_argument("--check", action="store_true", help="exit 1 on a compile error or a spill over --max-spill-bytes")
    p.add_argument("--max-spill-bytes", type=int, default=SPILL_TOLERANCE_BYTES, help=f"spill bytes per thread --check allows (default {SPILL_TOLERANCE_BYTES}: see the module's NOTE)")


def run(args) -> int:
    """Print the markdown table of every specialization; errors on stderr."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and "corgnn.sparse.backends.triton_ops" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "0"  # compile, do not interpret (nothing defined yet)
    specs = specializations()
    chosen = representative(specs) if args.subset else specs
    if args.limit:
        chosen = chosen[: args.limit]
    t0 = time.perf_counter()
    usages, errors = compile_all(chosen, tuple(args.arch or TARGETS), args.workers)
    wall = time.perf_counter() - t0
    print(markdown_table(usages))
    spills = [u for u in usages if u.spills]
    print(
        f"\n{len(chosen)} of {len(specs)} specializations x {len(args.arch or TARGETS)} targets: "
        f"{len(usages)} compiled, {len(errors)} errors, {len(spills)} with spills; {wall:.0f} s wall, {args.workers} workers",
    )
    for e in errors:
        print(f"COMPILE ERROR {e}", file=sys.stderr)
    for u in spills:
        print(f"SPILL {u.spec.kernel} [{u.spec.describe()}] {u.spec.flags()['dtype']} sm_{u.arch}: stack {u.stack} B, local {u.local} B", file=sys.stderr)
    over = [u for u in spills if u.spill_bytes > args.max_spill_bytes]
    if over:
        print(f"{len(over)} specializations spill more than {args.max_spill_bytes} bytes", file=sys.stderr)
    return 1 if args.check and (errors or over) else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m corgnn.bench.triton_aot", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
