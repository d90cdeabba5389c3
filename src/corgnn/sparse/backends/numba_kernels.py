"""CPU kernels (Numba parallel JIT): row plans, ELLPACK, COO.

Raw kernels: no autograd, no validation, no allocation of outputs; the wrappers in
:mod:`.numba_cpu` (the ``numba`` backend) allocate and call them.

Row-plan kernels (``*_rows``) walk a *row plan* ``(ptr, idx, perm)``: the
compressed-row arrays of ``op(A)`` (``A`` for a CSR, ``A^T`` read from a CSC, ...)
and ``perm``, the position of each walked entry in the caller's value order (an
empty array = identity). So the transposed product ``A^T B`` of a CSR matrix reads
its cached CSC arrays and the CSR-ordered values through ``perm``, and never
materialises ``A^T`` values. Every format can be walked this way.

Format-native kernels: ``*_ell`` walk ELLPACK's ``(n, p)`` column and padded value
matrices row by row, stopping at each row's length; ``spmm_coo`` splits a
row-sorted COO's *entries* evenly over threads (long rows spanning chunks are
summed in private carry rows, no atomics; the hybrid format's COO part uses it in
accumulate mode, while a plain COO's SpMM walks its row plan, measured faster, see
:mod:`corgnn.sparse.ops`); ``sddmm_coo`` is parallel over entries in any order.

Parallel over row chunks of about equal work (``prange`` over ``chunks``, the
row-plan kernels: ids in order of first appearance put the hubs of PubMed's real
graph in the first half, which held 2.6x the second half's entries) or over
entries (``prange``, the COO kernels), inner loops over the
contiguous feature dimension so LLVM vectorises them; SpMM outputs are written by
one thread per row, so there are no atomics and no ``(q x f)`` intermediates;
SDDMM dot products accumulate in float64.

Compile cost. Compiled code is cached on disk (``cache=True``, in ``__pycache__``
or ``$NUMBA_CACHE_DIR``). Measured on the project's 2-core CPU with a cold
``NUMBA_CACHE_DIR`` (machine under load, so upper figures): each kernel compiles on
its first call per dtype and head layout (2-D or semi-batched) in 0.6-3.2 s: CSR
SpMM 1.8 s, CSR SDDMM 1.4 s, COO SDDMM 0.6 s, ELL SpMM 1.3 s, ELL SDDMM 1.1 s, the
COO-part kernel of hybrid SpMM 3.2 s; the single-head float32 SpMM, ``A^T`` SpMM
and SDDMM of all five formats together take 9.4 s (the row-plan kernels are shared
by every format's ``A^T`` product). With a warm cache a new process pays 0.35-0.6 s
on its first kernel (Numba's runtime and thread pool start) and 10-40 ms to load
each further kernel.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.imputils import impl_ret_new_ref
from numba.extending import intrinsic

from .numba_threads import hook_compiles



__all__ = [
    "split_rows",
    "spmm_rows",
    "spmm_rows_serial",
    "spmm_scatter_rows",
    "spmm_rows_heads",
    "sddmm_rows",
    "sddmm_rows_heads",
    "edge_softmax_rows",
    "spmm_ell",
    "spmm_ell_heads",
    "sddmm_ell",
    "sddmm_ell_heads",
    "spmm_coo",
    "spmm_coo_heads",
    "spmm_coo_scatter",
    "spmm_coo_scatter_serial",
    "sddmm_coo",
    "sddmm_coo_heads",
    "dense_row_counts",
    "dense_row_counts_serial",
    "dense_to_csr_fill",
    "dense_to_csr_fill_serial",
]

_JIT = dict(parallel=True, fastmath=True, cache=True, nogil=True)

PREFETCH_DISTANCE = 32
"""Entries ahead whose dense row the gather kernels prefetch (issue 12, lever 3).

A row kernel's time on a graph whose dense operand does not fit in cache is the
latency of its row gathers ``B[idx[j]]``: each is a dependent random access, and the
out-of-order window holds only a few of them. Prefetching every cache line of row
``idx[j + D]`` while row ``idx[j]`` is summed keeps about ``D`` gathers in flight.
``D`` crosses row boundaries on purpose (a thread walks consecutive rows; average
degrees are 3-14 on the paper's graphs). Measured on the OGB-Arxiv stand-in (2
threads, float32, min of 15 calls, one run on a shared machine): CSR SpMM at f = 16 /
64 / 256 took 16.1 / 31.1 / 120 ms without prefetch, 15.9 / 24.0 / 56.2 with D = 16,
8.0 / 15.7 / 52.2 with D = 32 and 7.8 / 15.9 / 62.5 with D = 64; prefetching every
other line (relying on the adjacent-line prefetcher) was slower at every D. On the
idle machine, without vs with D = 32: 3.47 / 13.1 / 56.5 vs 3.23 / 6.4 / 35.4 ms.
Details in ``benchmarks/README.md`` ("Issue 12, lever 3").
"""
PREFETCH_LOCALITY = 2
"""``llvm.prefetch``'s locality of :func:`prefetch_gather` (3: into L1,
``prefetcht0``; 2: into L2, ``prefetcht1``).

Measured 2026-11-28 (AMD Zen 4 VM, 2 threads, min of 7-15 calls, fresh processes
alternating, the same kernels otherwise): 3 -> 2 took the transformer's attention
kernels on Flickr's shape (89k nodes, 893k entries, 8 heads of 8 channels) from
38.6 / 41.4 / 50.9 ms (forward / backward rows / backward columns) to 23.5-25.3 /
25.5-25.8 / 25.4-25.8 ms, and the CSR SpMM on the OGB-Arxiv stand-in at f = 64 / 256
from 30.2-30.7 / 130-138 ms to 22.9-23.7 / 95-97 ms (Flickr's: 7.9-8.7 / 78-80 ->
5.8-6.1 / 53-55 ms; f = 16 within the noise, 4.5-5.5 ms either way). Every
prefetched row is read by this thread a few entries later; into L1, the ~32 rows in
flight (8 lines each in the attention kernels) evicted each other and the data being
summed from its 32 KB; L2 (1 MB here) holds them. Distances 16 and 64 read the same
as 32 with locality 2."""
PREFETCH_MIN_BYTES = 4 * 2**20
"""Gathered operands up to this size (bytes) are not prefetched: they live in the
per-core caches, where the prefetch instructions only cost issue slots (measured on
PubMed's shape, n = 19,717, 2 threads: f = 16 (1.3 MB) 0.24 -> 0.28 ms with
prefetch, f = 64 (5 MB) 0.39 -> 0.40 ms, f = 256 (20 MB) 1.99 -> 1.63 ms)."""
_LINE = 64  # bytes per cache line on x86-64 and most AArch64 cores

HEADS8 = 8
"""The head count the attention helpers (:func:`head_dots`, :func:`head_axpy`,
:func:`head_axpy_shared`, :func:`head_gather`, :func:`head_scatter`,
:func:`head_dot_add`, :func:`head_softmax_backward`, :func:`head_max`,
:func:`exp_shifted`) have a path of their own for: eight values
held in locals, each row's loads before its stores, which LLVM's SLP vectorizer
turns into one vector per step: it is on for the kernel modules that use these
helpers (``COMPILE_WITH_SLP``, :func:`~.numba_threads.hook_compiles`); compiled
without it, the unrolled code runs scalar and slower than the loops. A loop over 8 heads is too short for the loop vectorizer on an
AVX-512 CPU (its vector body needs 16 x 4 floats) and ran scalar; other head
counts keep the loops. Same operations in the same order: equal results.
Measured 2026-11-28 (Zen 4 VM, 2 threads, Flickr's shape, 8 heads of 8 channels,
min of 7): the transformer's forward kernel 51 -> 38 ms, its backward row kernel
51 -> 42 ms.

Each helper's last argument ``unroll8`` (a constant of the kernel's compilation:
``loop is prange``) keeps these paths out of the serial first tiers
(:class:`~.numba_warmup.Tier`), whose point is a short compile: the unrolled code
doubled it (an ``optimize()``d 2-layer, 8-head ``TransformerConv``'s first training
step with an empty Numba cache, Cora-sized graph: 7.2 s before these paths, 11.7-12.9
s with them in every tier, 7.8-8.0 s with them in the parallel tiers only; Numba's
compile of the three serial kernels 11.0 -> 7.3 s). Long runs tier up to the
parallel kernels, which have them."""

hook_compiles()  # (before any of corgnn's kernels compiles, whoever calls it first)


@intrinsic
def empty_array(typingctx, shape, like):
    """``np.empty(shape, dtype)`` inside a kernel: ``shape`` an int or a tuple of ints
    (a negative one raises ``ValueError``, as NumPy's); the dtype is ``like``'s: an
    array's (only its type is read: not ``like.dtype``, whose value Numba builds
    through ``numba.np.npyimpl``, another import at load) or a NumPy scalar type
    (``np.int64``); a C-ordered, uninitialised array.

    NOTE: every corgnn kernel allocates through this instead of ``np.empty`` /
    ``np.zeros`` / ``np.full`` / ``.copy()``. Those are Numba overloads compiled as
    functions of ``numba.np.arrayobj`` with their own environments, which a fresh
    process imports (with ``numba.cpython.unicode`` and ``charseq``, ~50 ms on the
    2-core CI machine) when it loads a kernel using them from Numba's cache (issue 21:
    the first call of a process). This is inlined into the kernel (no environment of
    its own): Numba's runtime allocator (NRT, 64-byte aligned; ``MemoryError`` when
    it fails, as ``np.empty``), and ``arrayobj``'s code generator of the array header, imported only while
    compiling. Passing caller-allocated arrays instead was tried for the graph
    builds: loading was as cheap, but they ran 10-20 % slower (LLVM then cannot
    assume the arrays do not alias)."""
    if isinstance(like, types.Array):
        dt = like.dtype
    elif isinstance(like, types.NumberClass):
        dt = like.instance_type
    else:
        return None
    if isinstance(shape, types.Integer):
        dims_ty = (shape,)
    elif isinstance(shape, types.BaseTuple) and len(shape) and all(isinstance(d, types.Integer) for d in shape):
        dims_ty = tuple(shape)
    else:
        return None
    arrtype = types.Array(dt, len(dims_ty), "C")

    def codegen(context, builder, signature, args):
        from numba.np.arrayobj import populate_array  # (a code generator: compile time only)

        if isinstance(signature.args[0], types.Integer):
            values = [args[0]]
        else:
            values = cgutils.unpack_tuple(builder, args[0], len(dims_ty))
        dims = [context.cast(builder, v, t, types.intp) for v, t in zip(values, dims_ty)]
        for d in dims:  # (as np.empty; a product that overflows is not checked: sizes come from the kernel's operands)
            with builder.if_then(builder.icmp_signed("<", d, context.get_constant(types.intp, 0)), likely=False):
                context.call_conv.return_user_exc(builder, ValueError, ("negative dimensions are not allowed",))
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(dt)))
        strides, size = [], itemsize
        for d in reversed(dims):  # (C order: the last dimension contiguous)
            strides.insert(0, size)
            size = builder.mul(size, d)
        meminfo = context.nrt.meminfo_alloc_aligned(builder, size=size, align=64)
        with builder.if_then(cgutils.is_null(builder, meminfo), likely=False):
            context.call_conv.return_user_exc(builder, MemoryError, ("corgnn: array allocation failed",))
        ary = context.make_array(arrtype)(context, builder)
        data = builder.bitcast(context.nrt.meminfo_data(builder, meminfo), ary.data.type)
        populate_array(ary, data=data, shape=dims, strides=strides, itemsize=itemsize, meminfo=meminfo)
        return impl_ret_new_ref(context, builder, arrtype, ary._getvalue())

    return arrtype(shape, like), codegen


@intrinsic
def _prefetch(typingctx, arr, row, offset):
    """``llvm.prefetch`` (read, locality :data:`PREFETCH_LOCALITY`, data cache) of the
    byte at ``offset`` in row ``row`` of ``arr`` (address ``data + row * strides[0] + offset``).

    A hint: it never faults (an address past the array is ignored by the CPU) and
    never changes a result; LLVM drops it on targets without a prefetch instruction.
    """
    if not isinstance(arr, types.Array) or not isinstance(row, types.Integer) or not isinstance(offset, types.Integer):
        return None
    sig = types.void(arr, row, offset)

    def codegen(context, builder, signature, args):
        aryty, rowty, offty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        stride0 = cgutils.unpack_tuple(builder, ary.strides)[0]
        r = context.cast(builder, args[1], rowty, types.intp)
        o = context.cast(builder, args[2], offty, types.intp)
        byte = builder.add(builder.mul(r, stride0), o)
        i8p = ir.IntType(8).as_pointer()
        addr = builder.gep(builder.bitcast(ary.data, i8p), [byte])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0")
        builder.call(fn, [addr, ir.Constant(i32, 0), ir.Constant(i32, PREFETCH_LOCALITY), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


class _GatherKernel:
    """A gather kernel compiled from one source twice: without prefetching and with
    :data:`PREFETCH_DISTANCE`; a call runs the first when the gathered operand
    (positional argument ``operand``) has at most :data:`PREFETCH_MIN_BYTES`, else
    the second. ``dist`` is a compile-time constant of each compilation, so the plain
    one is the kernel as it was before prefetching (a runtime test of ``dist`` cost
    10-25 % on cache-resident graphs, measured on PubMed's shape at f = 16).

    A ``tiered`` kernel (``factory(dist, loop)``: its task loop ``for t in
    loop(chunks.shape[0] - 1)``, jitted with :func:`tiered_jit` ``(loop)``, its row
    plan ``(ptr, idx, perm, chunks)`` its first arguments) is also compiled serially
    (``loop = range``, Numba's ``parallel`` off) as its first tier
    (:class:`~corgnn.sparse.backends.numba_warmup.Tier`, one per kernel and dtype):
    the attention kernels compile so in 0.45-0.72 s against 1.3-2.4 s in parallel
    (2-core VM), and run the same sums in the same order (equal results). ``loop`` is
    a closure variable, so the two compilations are distinct entries of Numba's cache.
    """

    def __init__(self, factory, operand: int, tiered: bool = False):
        self.operand = operand
        self.__name__ = factory.__name__
        if tiered:
            self.plain, self.prefetching = factory(0, prange), factory(PREFETCH_DISTANCE, prange)
            self.serial = (factory(0, range), factory(PREFETCH_DISTANCE, range))
        else:
            self.plain, self.prefetching = factory(0), factory(PREFETCH_DISTANCE)
            self.serial = None
        self._tiers: dict | None = None
        self.__doc__ = self.plain.py_func.__doc__

    def __call__(self, *args):
        gathered = args[self.operand]
        big = gathered.nbytes > PREFETCH_MIN_BYTES
        if self.serial is None:
            return (self.prefetching if big else self.plain)(*args)
        if self._tiers is None:
            self._tiers = _dtype_tiers(self.__name__)
        self._tiers[gathered.dtype].run(self.prefetching if big else self.plain, self.serial[big], args, args[3].shape[0] - 1)

    def compilations(self, parallel: bool) -> tuple:
        """The kernel's parallel (or serial: empty unless tiered) Numba dispatchers."""
        return (self.plain, self.prefetching) if parallel else (self.serial or ())


def gather_kernel(operand: int, tiered: bool = False):
    """Decorator: ``factory(dist) -> njit kernel`` (``factory(dist, loop)`` when
    ``tiered``) becomes a :class:`_GatherKernel`."""
    return lambda factory: _GatherKernel(factory, operand, tiered)


class _TieredKernel:
    """A parallel kernel with a serial first tier, both compiled from one source
    ``factory(loop)`` (task loop ``for t in loop(...)``, jitted with
    :func:`tiered_jit` ``(loop)``) and run by a
    :class:`~corgnn.sparse.backends.numba_warmup.Tier` per dtype (of the first
    argument), as a tiered :class:`_GatherKernel`; ``tasks(args)`` the parallel
    loop's task count for a call's arguments."""

    def __init__(self, factory, tasks):
        self.parallel, self.serial = factory(prange), factory(range)
        self.tasks = tasks
        self.__name__ = factory.__name__
        self.__doc__ = self.parallel.py_func.__doc__
        self._tiers: dict | None = None

    def __call__(self, *args):
        if self._tiers is None:
            self._tiers = _dtype_tiers(self.__name__)
        self._tiers[args[0].dtype].run(self.parallel, self.serial, args, self.tasks(args))

    def compilations(self, parallel: bool) -> tuple:
        """The kernel's parallel (or serial) Numba dispatcher."""
        return (self.parallel if parallel else self.serial,)


def tiered_kernel(tasks):
    """Decorator: ``factory(loop) -> njit kernel`` becomes a :class:`_TieredKernel`
    whose calls run ``tasks(args)`` parallel tasks."""
    return lambda factory: _TieredKernel(factory, tasks)


def tiered_jit(loop) -> dict:
    """``njit`` options of one compilation of a tiered kernel (:class:`_GatherKernel`,
    :class:`_TieredKernel`): parallel when its task loop is ``prange``."""
    return dict(parallel=loop is prange, fastmath=True, cache=True, nogil=True)


def _dtype_tiers(name: str) -> dict:
    """``{numpy dtype: Tier}`` of kernel ``name`` (:func:`.numba_warmup.tiers`)."""
    from .numba_warmup import tiers

    return {np.dtype(str(dt).removeprefix("torch.")): tier for dt, tier in tiers(name).items()}


@njit(inline="always")
def prefetch_gather(B, idx, lo, hi, dist):
    """Prefetch every cache line of the rows ``B[idx[j + dist]]`` for ``j`` in
    ``[lo, hi)`` (rows of ``B`` contiguous; nothing past the last entry; ``dist = 0``:
    nothing). Called once per row before its accumulation loop, which stays as it
    was (a test inside that loop cost 10-40 % on cache-resident graphs)."""
    if dist > 0:
        for j in range(lo + dist, min(hi + dist, idx.shape[0])):
            c = idx[j]
            for b in range(0, B.strides[0], _LINE):
                _prefetch(B, c, b)


# float32 exp as ``2**n * exp(r)``: ``n = round(x / ln 2)``, ``r = x - n ln 2`` in two
# parts (Cody and Waite: ``n * LN2_HI`` is exact), ``|r| <= ln(2) / 2``, a degree-7
# Taylor polynomial of ``exp(r)`` (truncation < 5e-9) and ``2**n`` built in the exponent
# bits; plain arithmetic, so LLVM vectorizes the loop (``math.exp`` is a scalar libm
# call per element: 7 of the forward kernel's ~30 ms on a 20k-node, 200k-edge graph,
# 8 heads, 1 thread). Relative error below one float32 ulp (9e-8 over [-87, 0.5]; tested).
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693145751953125)  # 11 significant bits: n * _LN2_HI is exact
_LN2_LO = np.float32(1.4286068203094173e-06)
_EXP_MIN = np.float32(-87.33654)  # ln(2**-126), the smallest normal float32: exp underflows to ~0
_HALF = np.float32(0.5)
_P = tuple(np.float32(1.0 / math.factorial(k)) for k in range(8))


@intrinsic
def _float32_bits(typingctx, bits):
    """The float32 whose bit pattern is ``bits`` taken as an int32 (wider integers
    wrap, as a store into an int32 array does; a register bitcast, not
    ``array.view(np.int32)``, whose Numba implementation is a function of
    ``numba.np.arrayobj`` that a fresh process then imports when it loads the kernel
    from the cache: see :func:`empty_array`)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(context.cast(builder, args[0], signature.args[0], types.int32), ir.FloatType())

    return types.float32(bits), codegen


@njit(inline="always")
def _exp32(x):
    """float32 ``exp(x)`` as :func:`exp_shifted` computes it (the polynomial times the
    power of two), for one value."""
    x = max(x, _EXP_MIN)
    nf = np.floor(x * _LOG2E + _HALF)
    r = (x - nf * _LN2_HI) - nf * _LN2_LO
    p = _P[0] + r * (_P[1] + r * (_P[2] + r * (_P[3] + r * (_P[4] + r * (_P[5] + r * (_P[6] + r * _P[7]))))))
    return p * _float32_bits((np.int32(nf) + 127) << 23)


@njit(inline="always")
def head_max(P, j, mx, unroll8):
    """``mx[h] = max(mx[h], P[j, h])`` over heads (eight: one vector, see HEADS8)."""
    if unroll8 and mx.shape[0] == HEADS8:
        m0, m1, m2, m3 = max(mx[0], P[j, 0]), max(mx[1], P[j, 1]), max(mx[2], P[j, 2]), max(mx[3], P[j, 3])
        m4, m5, m6, m7 = max(mx[4], P[j, 4]), max(mx[5], P[j, 5]), max(mx[6], P[j, 6]), max(mx[7], P[j, 7])
        mx[0], mx[1], mx[2], mx[3], mx[4], mx[5], mx[6], mx[7] = m0, m1, m2, m3, m4, m5, m6, m7
        return
    for h in range(mx.shape[0]):
        mx[h] = max(mx[h], P[j, h])


@njit(inline="always")
def exp_shifted(P, T, m, shift, tot, unroll8):
    """``P[j, h] = exp(P[j, h] - shift[h])`` for ``j < m``; ``tot[h] +=`` their sum.

    P (deg, H) float; ``T`` a (deg, H) float32 scratch array (its bits are written
    as ``int32``); shift, tot (H,). float32 ``P`` takes the vectorized polynomial
    (``_P``; an argument below ``_EXP_MIN`` gives ``2**-126``, not 0: softmax weights
    this small are 0 to float32 sums); float64 ``P`` calls ``math.exp``.
    """
    H = P.shape[1]
    if unroll8 and P.itemsize == 4 and H == HEADS8:  # (eight heads: the same arithmetic in locals, one vector; see HEADS8)
        h0, h1, h2, h3, h4, h5, h6, h7 = shift[0], shift[1], shift[2], shift[3], shift[4], shift[5], shift[6], shift[7]
        t0, t1, t2, t3, t4, t5, t6, t7 = tot[0], tot[1], tot[2], tot[3], tot[4], tot[5], tot[6], tot[7]
        for j in range(m):
            v0, v1, v2, v3 = _exp32(P[j, 0] - h0), _exp32(P[j, 1] - h1), _exp32(P[j, 2] - h2), _exp32(P[j, 3] - h3)
            v4, v5, v6, v7 = _exp32(P[j, 4] - h4), _exp32(P[j, 5] - h5), _exp32(P[j, 6] - h6), _exp32(P[j, 7] - h7)
            P[j, 0], P[j, 1], P[j, 2], P[j, 3], P[j, 4], P[j, 5], P[j, 6], P[j, 7] = v0, v1, v2, v3, v4, v5, v6, v7
            t0, t1, t2, t3, t4, t5, t6, t7 = t0 + v0, t1 + v1, t2 + v2, t3 + v3, t4 + v4, t5 + v5, t6 + v6, t7 + v7
        tot[0], tot[1], tot[2], tot[3], tot[4], tot[5], tot[6], tot[7] = t0, t1, t2, t3, t4, t5, t6, t7
    elif P.itemsize == 4:
        for j in range(m):
            for h in range(H):
                x = max(P[j, h] - shift[h], _EXP_MIN)
                nf = np.floor(x * _LOG2E + _HALF)
                r = (x - nf * _LN2_HI) - nf * _LN2_LO
                P[j, h] = _P[0] + r * (_P[1] + r * (_P[2] + r * (_P[3] + r * (_P[4] + r * (_P[5] + r * (_P[6] + r * _P[7]))))))
                T[j, h] = _float32_bits((np.int32(nf) + 127) << 23)
        for j in range(m):
            for h in range(H):
                v = P[j, h] * T[j, h]
                P[j, h] = v
                tot[h] += v
    else:
        for j in range(m):
            for h in range(H):
                v = math.exp(P[j, h] - shift[h])
                P[j, h] = v
                tot[h] += v


@njit(cache=True, nogil=True)
def split_rows(ptr, tasks):
    """Row bounds ``(tasks + 1,)`` (``ptr``'s dtype) of ``tasks`` (``1 <= tasks <= n``) parts of
    about equal ``entries + rows``: bound ``t`` is the first row ``i`` with
    ``ptr[i] + i >= t * (ptr[n] + n) / tasks`` (``0`` and ``n`` at the ends), as a
    ``searchsorted`` of those targets would give. ``ptr (n+1,)`` int64, non-decreasing.

    NOTE (issue 21, measured in a 5-layer GIN's training loop on batches of 128 small
    graphs, 2,452 rows): the NumPy form (eight array calls) took 23 us a row plan in
    the loop (6 us back to back, its code and data cold in the loop), this one pass
    7 us; a mini-batch makes two row plans per training step (``A`` and ``A^T``)."""
    n = ptr.shape[0] - 1
    step = (ptr[n] + n) / tasks
    out = empty_array(tasks + 1, ptr)  # (not np.empty: that loads NumPy's overloads, ~0.2 s in a cold process)
    out[0] = 0
    t = 1
    for i in range(n + 1):
        w = ptr[i] + i
        while t < tasks and w >= t * step:
            out[t] = i
            t += 1
    for u in range(t, tasks + 1):
        out[u] = n
    return out


@njit(inline="always")
def chunk_degree(ptr, chunks, t):
    """The longest row of task ``t`` (at least 1): the size of its row buffers."""
    deg = 1
    for i in range(chunks[t], chunks[t + 1]):
        deg = max(deg, ptr[i + 1] - ptr[i])
    return deg


@njit(inline="always")
def transpose_row(X, i, scale, Xt):
    """``Xt[k, h] = X[i, h, k] * scale``: a row of ``(n, H, C)`` as ``(C, H)``."""
    for h in range(X.shape[1]):
        for k in range(X.shape[2]):
            Xt[k, h] = X[i, h, k] * scale


@njit(inline="always")
def copy_row(Xl, i, Xt, scale=None):
    """``Xt[k, h] = Xl[i, k, h]`` (times ``scale`` when given): a row of a heads-last
    ``(n, C, H)`` array (the :func:`transpose_row` of a row stored that way already)."""
    for k in range(Xl.shape[1]):
        for h in range(Xl.shape[2]):
            Xt[k, h] = Xl[i, k, h] if scale is None else Xl[i, k, h] * scale


@njit(inline="always")
def head_dots(Xt, Yt, c, out, j, unroll8):
    """``out[j, h] = sum_k Xt[k, h] * Yt[c, k, h]``: the per-head dot products of a
    ``(C, H)`` row with row ``c`` of a ``(n, C, H)`` array, vectorized over heads."""
    H = Xt.shape[1]
    if Xt.shape[0] == 0:  # (no channel to start the sum with)
        for h in range(H):
            out[j, h] = 0
        return
    if unroll8 and H == HEADS8:  # (eight heads: the sums in locals, one vector; see HEADS8)
        s0, s1, s2, s3 = Xt[0, 0] * Yt[c, 0, 0], Xt[0, 1] * Yt[c, 0, 1], Xt[0, 2] * Yt[c, 0, 2], Xt[0, 3] * Yt[c, 0, 3]
        s4, s5, s6, s7 = Xt[0, 4] * Yt[c, 0, 4], Xt[0, 5] * Yt[c, 0, 5], Xt[0, 6] * Yt[c, 0, 6], Xt[0, 7] * Yt[c, 0, 7]
        for k in range(1, Xt.shape[0]):
            s0, s1, s2, s3 = s0 + Xt[k, 0] * Yt[c, k, 0], s1 + Xt[k, 1] * Yt[c, k, 1], s2 + Xt[k, 2] * Yt[c, k, 2], s3 + Xt[k, 3] * Yt[c, k, 3]
            s4, s5, s6, s7 = s4 + Xt[k, 4] * Yt[c, k, 4], s5 + Xt[k, 5] * Yt[c, k, 5], s6 + Xt[k, 6] * Yt[c, k, 6], s7 + Xt[k, 7] * Yt[c, k, 7]
        out[j, 0], out[j, 1], out[j, 2], out[j, 3], out[j, 4], out[j, 5], out[j, 6], out[j, 7] = s0, s1, s2, s3, s4, s5, s6, s7
        return
    for h in range(H):
        out[j, h] = Xt[0, h] * Yt[c, 0, h]
    for k in range(1, Xt.shape[0]):
        for h in range(H):
            out[j, h] += Xt[k, h] * Yt[c, k, h]


@njit(inline="always")
def head_axpy(acc, w, j, Yt, c, unroll8):
    """``acc[k, h] += w[j, h] * Yt[c, k, h]`` (acc (C, H)), vectorized over heads."""
    if unroll8 and acc.shape[1] == HEADS8:  # (eight heads: each channel's loads before its stores, one vector; see HEADS8)
        w0, w1, w2, w3, w4, w5, w6, w7 = w[j, 0], w[j, 1], w[j, 2], w[j, 3], w[j, 4], w[j, 5], w[j, 6], w[j, 7]
        for k in range(acc.shape[0]):
            a0, a1, a2, a3 = acc[k, 0] + w0 * Yt[c, k, 0], acc[k, 1] + w1 * Yt[c, k, 1], acc[k, 2] + w2 * Yt[c, k, 2], acc[k, 3] + w3 * Yt[c, k, 3]
            a4, a5, a6, a7 = acc[k, 4] + w4 * Yt[c, k, 4], acc[k, 5] + w5 * Yt[c, k, 5], acc[k, 6] + w6 * Yt[c, k, 6], acc[k, 7] + w7 * Yt[c, k, 7]
            acc[k, 0], acc[k, 1], acc[k, 2], acc[k, 3], acc[k, 4], acc[k, 5], acc[k, 6], acc[k, 7] = a0, a1, a2, a3, a4, a5, a6, a7
        return
    for k in range(acc.shape[0]):
        for h in range(acc.shape[1]):
            acc[k, h] += w[j, h] * Yt[c, k, h]


@njit(inline="always")
def head_axpy_shared(acc, w, j, Y, c, unroll8):
    """``acc[k, h] += w[j, h] * Y[c, k, 0]`` (acc (C, H)): :func:`head_axpy` of a row
    ``Y[c]`` shared by every head (``Y (n, C, 1)``)."""
    if unroll8 and acc.shape[1] == HEADS8:  # (see HEADS8)
        w0, w1, w2, w3, w4, w5, w6, w7 = w[j, 0], w[j, 1], w[j, 2], w[j, 3], w[j, 4], w[j, 5], w[j, 6], w[j, 7]
        for k in range(acc.shape[0]):
            g = Y[c, k, 0]
            a0, a1, a2, a3 = acc[k, 0] + w0 * g, acc[k, 1] + w1 * g, acc[k, 2] + w2 * g, acc[k, 3] + w3 * g
            a4, a5, a6, a7 = acc[k, 4] + w4 * g, acc[k, 5] + w5 * g, acc[k, 6] + w6 * g, acc[k, 7] + w7 * g
            acc[k, 0], acc[k, 1], acc[k, 2], acc[k, 3], acc[k, 4], acc[k, 5], acc[k, 6], acc[k, 7] = a0, a1, a2, a3, a4, a5, a6, a7
        return
    for k in range(acc.shape[0]):
        g = Y[c, k, 0]
        for h in range(acc.shape[1]):
            acc[k, h] += w[j, h] * g


@njit(inline="always")
def head_gather(out, j, X, e, s, scale, unroll8):
    """``out[j, h] = X[e, s, h] * scale`` over heads (out (deg, H), X (q, S, H))."""
    if unroll8 and out.shape[1] == HEADS8:  # (see HEADS8)
        v0, v1, v2, v3 = X[e, s, 0] * scale, X[e, s, 1] * scale, X[e, s, 2] * scale, X[e, s, 3] * scale
        v4, v5, v6, v7 = X[e, s, 4] * scale, X[e, s, 5] * scale, X[e, s, 6] * scale, X[e, s, 7] * scale
        out[j, 0], out[j, 1], out[j, 2], out[j, 3], out[j, 4], out[j, 5], out[j, 6], out[j, 7] = v0, v1, v2, v3, v4, v5, v6, v7
        return
    for h in range(out.shape[1]):
        out[j, h] = X[e, s, h] * scale


@njit(inline="always")
def head_scatter(X, e, s, src, j, sc, unroll8):
    """``X[e, s, h] = src[j, h] * sc[h]`` over heads (X (q, S, H), src (deg, H), sc (H,))."""
    if unroll8 and src.shape[1] == HEADS8:  # (see HEADS8)
        v0, v1, v2, v3 = src[j, 0] * sc[0], src[j, 1] * sc[1], src[j, 2] * sc[2], src[j, 3] * sc[3]
        v4, v5, v6, v7 = src[j, 4] * sc[4], src[j, 5] * sc[5], src[j, 6] * sc[6], src[j, 7] * sc[7]
        X[e, s, 0], X[e, s, 1], X[e, s, 2], X[e, s, 3], X[e, s, 4], X[e, s, 5], X[e, s, 6], X[e, s, 7] = v0, v1, v2, v3, v4, v5, v6, v7
        return
    for h in range(src.shape[1]):
        X[e, s, h] = src[j, h] * sc[h]


@njit(inline="always")
def head_dot_add(D, A, B, j, unroll8):
    """``D[h] += A[j, h] * B[j, h]`` over heads (D (H,), A and B (deg, H))."""
    if unroll8 and D.shape[0] == HEADS8:  # (see HEADS8)
        d0, d1, d2, d3 = D[0] + A[j, 0] * B[j, 0], D[1] + A[j, 1] * B[j, 1], D[2] + A[j, 2] * B[j, 2], D[3] + A[j, 3] * B[j, 3]
        d4, d5, d6, d7 = D[4] + A[j, 4] * B[j, 4], D[5] + A[j, 5] * B[j, 5], D[6] + A[j, 6] * B[j, 6], D[7] + A[j, 7] * B[j, 7]
        D[0], D[1], D[2], D[3], D[4], D[5], D[6], D[7] = d0, d1, d2, d3, d4, d5, d6, d7
        return
    for h in range(D.shape[0]):
        D[h] += A[j, h] * B[j, h]


@njit(inline="always")
def head_softmax_backward(Gd, P, j, D, out, e, scale, unroll8):
    """The softmax backward of entry ``j`` over heads: ``v = P[j, h] * (Gd[j, h] -
    D[h])`` (``P`` the attention, ``Gd`` its gradient, ``D`` the row's ``sum_e P_e
    Gd_e``) written to ``out[e, 0, h]``, and ``Gd[j, h] = v * scale``."""
    if unroll8 and D.shape[0] == HEADS8:  # (see HEADS8)
        v0, v1, v2, v3 = P[j, 0] * (Gd[j, 0] - D[0]), P[j, 1] * (Gd[j, 1] - D[1]), P[j, 2] * (Gd[j, 2] - D[2]), P[j, 3] * (Gd[j, 3] - D[3])
        v4, v5, v6, v7 = P[j, 4] * (Gd[j, 4] - D[4]), P[j, 5] * (Gd[j, 5] - D[5]), P[j, 6] * (Gd[j, 6] - D[6]), P[j, 7] * (Gd[j, 7] - D[7])
        out[e, 0, 0], out[e, 0, 1], out[e, 0, 2], out[e, 0, 3], out[e, 0, 4], out[e, 0, 5], out[e, 0, 6], out[e, 0, 7] = v0, v1, v2, v3, v4, v5, v6, v7
        Gd[j, 0], Gd[j, 1], Gd[j, 2], Gd[j, 3] = v0 * scale, v1 * scale, v2 * scale, v3 * scale
        Gd[j, 4], Gd[j, 5], Gd[j, 6], Gd[j, 7] = v4 * scale, v5 * scale, v6 * scale, v7 * scale
        return
    for h in range(D.shape[0]):
        v = P[j, h] * (Gd[j, h] - D[h])
        out[e, 0, h] = v
        Gd[j, h] = v * scale


@njit(inline="always")
def _spmm_row_range(ptr, idx, val, perm, lo, hi, B, out, bias, dist):
    """Rows ``lo <= i < hi`` of :func:`spmm_rows`: ``out[i] = bias + sum_j val[e_j] *
    B[idx[j]]`` (the body of its parallel tasks and of :func:`spmm_rows_serial`)."""
    f = B.shape[1]
    has_val = val.shape[0] > 0
    has_perm = perm.shape[0] > 0
    has_bias = bias.shape[0] > 0
    for i in range(lo, hi):
        if has_bias:
            for k in range(f):
                out[i, k] = bias[k]
        else:
            for k in range(f):
                out[i, k] = 0
        prefetch_gather(B, idx, ptr[i], ptr[i + 1], dist)
        for j in range(ptr[i], ptr[i + 1]):
            c = idx[j]
            if has_val:
                e = perm[j] if has_perm else j
                v = val[e]
                for k in range(f):
                    out[i, k] += v * B[c, k]
            else:
                for k in range(f):
                    out[i, k] += B[c, k]


@gather_kernel(operand=5)
def spmm_rows(dist):
    @njit(**_JIT)
    def spmm_rows(ptr, idx, val, perm, chunks, B, out, bias):
        """``out[i] = bias + sum_j val[e_j] * B[idx[j]]`` over row ``i``'s entries.

        ptr (n+1,) int64; idx (nnz,) int64; val (nnz,) float or empty (= all ones);
        perm (nnz,) int64 or empty; chunks (T+1,) row bounds of the parallel tasks
        (about equal ``entries + rows`` each, see ``numba_cpu._walk``); B (m, f);
        out (n, f) overwritten; bias (f,) or empty (= none), the row's starting value.
        """
        for t in prange(chunks.shape[0] - 1):
            _spmm_row_range(ptr, idx, val, perm, chunks[t], chunks[t + 1], B, out, bias, dist)
    return spmm_rows


@njit(fastmath=True, cache=True, nogil=True)
def spmm_rows_serial(ptr, idx, val, perm, chunks, B, out, bias):
    """:func:`spmm_rows` on the calling thread, without prefetching (same arguments,
    the same sums in the same order: equal results): the first tier of a process
    whose cache lacks the parallel kernel
    (:class:`~corgnn.sparse.backends.numba_warmup.Tier`). Compiles in ~0.2 s where
    the parallel kernel takes ~0.9 s (2-core VM)."""
    _spmm_row_range(ptr, idx, val, perm, chunks[0], chunks[chunks.shape[0] - 1], B, out, bias, 0)


@njit(**_JIT)
def spmm_scatter_rows(ptr, idx, val, perm, chunks, B, acc):
    """``A^T B`` walking ``A``'s rows: task ``t`` adds ``val[e_j] * B[i]`` into its own
    ``acc[t, idx[j]]`` for the entries ``j`` of its rows ``i``; the caller sums ``acc``
    over tasks.

    ptr (n+1,), idx (nnz,) the column of each entry, val (nnz,) or empty (all ones),
    perm (nnz,) or empty, chunks (T+1,) row bounds of the T tasks, B (n, f),
    acc (T, cols, f) overwritten.

    NOTE: the transposed walk (``spmm_rows`` on ``A^T``'s plan) reads a row of ``B``
    per entry at random; when ``B`` outgrows the caches and ``A`` has few columns
    (sparse input features: PubMed's 19717 x 500, 977k entries) this walk reads ``B``
    once, in order, and scatters into ``acc``, which stays in cache: 6.5 -> 4.3 ms at
    64 columns, 15-25 -> 10 ms at 192 (2 threads), see ``corgnn.sparse.ops``.
    """
    f = B.shape[1]
    has_val = val.shape[0] > 0
    has_perm = perm.shape[0] > 0
    for t in prange(chunks.shape[0] - 1):
        a = acc[t]
        for c in range(a.shape[0]):
            for k in range(f):
                a[c, k] = 0
        for i in range(chunks[t], chunks[t + 1]):
            for j in range(ptr[i], ptr[i + 1]):
                c = idx[j]
                if has_val:
                    v = val[perm[j] if has_perm else j]
                    for k in range(f):
                        a[c, k] += v * B[i, k]
                else:
                    for k in range(f):
                        a[c, k] += B[i, k]


@gather_kernel(operand=5)
def spmm_rows_heads(dist):
    @njit(**_JIT)
    def spmm_rows_heads(ptr, idx, val, perm, chunks, B, out):
        """Semi-batched SpMM: ``out[i, h] = sum_j val[e_j, h] * B[idx[j], h]``.

        val (nnz, H), or empty (0 rows) for an all-ones pattern; B (m, H, f); out (n, H, f)
        overwritten. The head dimension is the middle one so one neighbour's rows for
        all heads are contiguous (paper §Multi-head GAT).
        """
        H = B.shape[1]
        f = B.shape[2]
        has_val = val.shape[0] > 0
        has_perm = perm.shape[0] > 0
        for t in prange(chunks.shape[0] - 1):
            for i in range(chunks[t], chunks[t + 1]):
                for h in range(H):
                    for k in range(f):
                        out[i, h, k] = 0
                prefetch_gather(B, idx, ptr[i], ptr[i + 1], dist)
                for j in range(ptr[i], ptr[i + 1]):
                    c = idx[j]
                    e = perm[j] if has_perm else j
                    for h in range(H):
                        if has_val:
                            v = val[e, h]
                            for k in range(f):
                                out[i, h, k] += v * B[c, h, k]
                        else:
                            for k in range(f):
                                out[i, h, k] += B[c, h, k]
    return spmm_rows_heads


@gather_kernel(operand=6)
def sddmm_rows(dist):
    @njit(**_JIT)
    def sddmm_rows(ptr, idx, val, perm, chunks, B, C, out):
        """``out[e_j] = val[e_j] * <B[i], C[idx[j]]>`` for each entry ``j`` of row ``i``.

        B (n, f) row operand; C (m, f) column operand (``C^T`` of the math, row-major);
        val (nnz,) or empty (= ones); out (nnz,) in the caller's entry order.
        """
        f = B.shape[1]
        has_val = val.shape[0] > 0
        has_perm = perm.shape[0] > 0
        for t in prange(chunks.shape[0] - 1):
            for i in range(chunks[t], chunks[t + 1]):
                prefetch_gather(C, idx, ptr[i], ptr[i + 1], dist)
                for j in range(ptr[i], ptr[i + 1]):
                    c = idx[j]
                    s = 0.0  # accumulate in float64
                    for k in range(f):
                        s += B[i, k] * C[c, k]
                    e = perm[j] if has_perm else j
                    if has_val:
                        s *= val[e]
                    out[e] = s
    return sddmm_rows


@gather_kernel(operand=6)
def sddmm_rows_heads(dist):
    @njit(**_JIT)
    def sddmm_rows_heads(ptr, idx, val, perm, chunks, B, C, out):
        """Semi-batched SDDMM: ``out[e_j, h] = val[e_j, h] * <B[i, h], C[idx[j], h]>``.

        B (n, H, f); C (m, H, f); val (nnz, H) or empty; out (nnz, H).
        """
        H = B.shape[1]
        f = B.shape[2]
        has_val = val.shape[0] > 0
        has_perm = perm.shape[0] > 0
        for t in prange(chunks.shape[0] - 1):
            for i in range(chunks[t], chunks[t + 1]):
                prefetch_gather(C, idx, ptr[i], ptr[i + 1], dist)
                for j in range(ptr[i], ptr[i + 1]):
                    c = idx[j]
                    e = perm[j] if has_perm else j
                    for h in range(H):
                        s = 0.0
                        for k in range(f):
                            s += B[i, h, k] * C[c, h, k]
                        if has_val:
                            s *= val[e, h]
                        out[e, h] = s
    return sddmm_rows_heads


@njit(**_JIT)
def edge_softmax_rows(ptr, perm, logits, out):
    """Softmax of ``logits (nnz, H)`` over each row's entries, max-subtracted.

    out (nnz, H) in the caller's entry order; an empty row writes nothing.
    """
    n = ptr.shape[0] - 1
    H = logits.shape[1]
    has_perm = perm.shape[0] > 0
    for i in prange(n):
        lo = ptr[i]
        hi = ptr[i + 1]
        if hi == lo:
            continue
        mx = empty_array(H, logits)
        mx[:] = -np.inf
        for j in range(lo, hi):
            e = perm[j] if has_perm else j
            for h in range(H):
                if logits[e, h] > mx[h]:
                    mx[h] = logits[e, h]
        s = empty_array(H, logits)
        s[:] = 0
        for j in range(lo, hi):
            e = perm[j] if has_perm else j
            for h in range(H):
                v = math.exp(logits[e, h] - mx[h])
                out[e, h] = v
                s[h] += v
        for j in range(lo, hi):
            e = perm[j] if has_perm else j
            for h in range(H):
                out[e, h] /= s[h]


# --------------------------------------------------------------------------------------
# Format-native kernels: ELLPACK over its padded (n, p) matrices, COO over its entries.
# Each comes as a single-head kernel (2-D operands) and a semi-batched one (heads in
# the middle); the 2-D form is kept because with one head the 3-D loop nest runs about
# 30 % slower (measured on the OGB-Arxiv stand-in, f=64). ``val`` with zero rows
# means an all-ones pattern.
# --------------------------------------------------------------------------------------


@njit(**_JIT)
def spmm_ell(col, lengths, V, B, out):
    """ELLPACK SpMM ``out[i] = sum_{j < lengths[i]} V[i, j] * B[col[i, j]]``.

    col (n, p) int32/int64, padding ``-1`` past ``lengths[i]`` (never read);
    lengths (n,) int64; V (n, p) padded values, or (0, 0) for a pattern;
    B (m, f); out (n, f) overwritten. Parallel over rows; each row reads one
    contiguous run of ``col`` and ``V``.
    """
    n = col.shape[0]
    f = B.shape[1]
    has_val = V.shape[0] > 0
    for i in prange(n):
        for k in range(f):
            out[i, k] = 0
        for j in range(lengths[i]):
            c = col[i, j]
            if has_val:
                v = V[i, j]
                for k in range(f):
                    out[i, k] += v * B[c, k]
            else:
                for k in range(f):
                    out[i, k] += B[c, k]


@njit(**_JIT)
def spmm_ell_heads(col, lengths, V, B, out):
    """Semi-batched :func:`spmm_ell`: V (n, p, H) or (0, 0, H); B (m, H, f); out (n, H, f)."""
    n = col.shape[0]
    H = B.shape[1]
    f = B.shape[2]
    has_val = V.shape[0] > 0
    for i in prange(n):
        for h in range(H):
            for k in range(f):
                out[i, h, k] = 0
        for j in range(lengths[i]):
            c = col[i, j]
            for h in range(H):
                if has_val:
                    v = V[i, j, h]
                    for k in range(f):
                        out[i, h, k] += v * B[c, h, k]
                else:
                    for k in range(f):
                        out[i, h, k] += B[c, h, k]


@njit(**_JIT)
def sddmm_ell(col, lengths, offsets, val, B, C, out):
    """ELLPACK SDDMM: slot ``j < lengths[i]`` of row ``i`` is entry ``e = offsets[i] + j``
    (ELL entry order) and gets ``val[e] * <B[i], C[col[i, j]]>``.

    offsets (n,) int64 (row starts, ``rowptr[:-1]``); val (nnz,) or empty;
    B (n, f); C (m, f) column operand given row-wise; out (nnz,).
    """
    n = col.shape[0]
    f = B.shape[1]
    has_val = val.shape[0] > 0
    for i in prange(n):
        base = offsets[i]
        for j in range(lengths[i]):
            c = col[i, j]
            s = 0.0  # accumulate in float64
            for k in range(f):
                s += B[i, k] * C[c, k]
            if has_val:
                s *= val[base + j]
            out[base + j] = s


@njit(**_JIT)
def sddmm_ell_heads(col, lengths, offsets, val, B, C, out):
    """Semi-batched :func:`sddmm_ell`: val (nnz, H) or empty; B (n, H, f); C (m, H, f); out (nnz, H)."""
    n = col.shape[0]
    H = B.shape[1]
    f = B.shape[2]
    has_val = val.shape[0] > 0
    for i in prange(n):
        base = offsets[i]
        for j in range(lengths[i]):
            c = col[i, j]
            for h in range(H):
                s = 0.0
                for k in range(f):
                    s += B[i, h, k] * C[c, h, k]
                if has_val:
                    s *= val[base + j, h]
                out[base + j, h] = s


@njit(cache=True, nogil=True)
def _chunk_bounds(nnz, nchunks):
    """``nchunks + 1`` boundaries splitting ``nnz`` entries evenly."""
    b = empty_array(nchunks + 1, np.int64)
    for c in range(nchunks + 1):
        b[c] = nnz * c // nchunks
    return b


@gather_kernel(operand=3)
def spmm_coo(dist):
    @njit(**_JIT)
    def spmm_coo(row, col, val, B, out, nchunks, accumulate):
        """COO SpMM over row-sorted entries, split evenly by *entries* (not rows):
        ``out[r] (+)= sum_{e: row[e] = r} val[e] * B[col[e]]``.

        row, col (nnz,) int64 with ``row`` non-decreasing; val (nnz,) or empty;
        B (m, f); out (n, f); ``accumulate``: add into ``out`` (rows without entries are
        left alone) instead of overwriting it (they are zeroed).

        Chunk ``c`` takes entries ``[nnz*c/nchunks, nnz*(c+1)/nchunks)``: the same work
        per thread whatever the degree distribution. A row is written by the chunk that
        holds its first entry; a chunk starting inside a row (a long row spanning
        chunks) sums its share into a private ``carry`` row, added serially at the end
        (at most ``nchunks`` rows), so there are no atomics. Empty rows are zeroed by
        the chunk holding the next entry (the last chunk zeroes the trailing ones).
        """
        nnz = row.shape[0]
        n = out.shape[0]
        f = B.shape[1]
        has_val = val.shape[0] > 0
        if nnz == 0:
            if not accumulate:
                out[:] = 0
            return
        nchunks = max(1, min(nchunks, nnz))
        bounds = _chunk_bounds(nnz, nchunks)
        carry = empty_array((nchunks, f), out)
        carry[:] = 0
        carry_row = empty_array(nchunks, np.int64)
        carry_row[:] = -1
        for ch in prange(nchunks):
            k = bounds[ch]
            end = bounds[ch + 1]
            while k < end:
                r = row[k]
                if k == bounds[ch] and k > 0 and row[k - 1] == r:  # continues the previous chunk's row
                    carry_row[ch] = r
                    dst = carry[ch]
                else:
                    dst = out[r]
                    if not accumulate:
                        for rr in range(row[k - 1] + 1 if k > 0 else 0, r + 1):  # empty rows before r, and r
                            for x in range(f):
                                out[rr, x] = 0
                while k < end and row[k] == r:
                    prefetch_gather(B, col, k, k + 1, dist)
                    c = col[k]
                    if has_val:
                        v = val[k]
                        for x in range(f):
                            dst[x] += v * B[c, x]
                    else:
                        for x in range(f):
                            dst[x] += B[c, x]
                    k += 1
            if ch == nchunks - 1 and not accumulate:
                for rr in range(row[nnz - 1] + 1, n):
                    for x in range(f):
                        out[rr, x] = 0
        for ch in range(nchunks):
            if carry_row[ch] >= 0:
                for x in range(f):
                    out[carry_row[ch], x] += carry[ch, x]
    return spmm_coo


@njit(fastmath=True, cache=True, nogil=True)
def _scatter_rows_range(row, col, val, B, out, lo, hi):
    """``out[r] = sum_{e: row[e] = r} val[e] * B[col[e]]`` for the rows ``lo <= r < hi``
    (zeroed first), reading every entry in order and skipping the others' rows."""
    f = B.shape[1]
    has_val = val.shape[0] > 0
    for r in range(lo, hi):
        for x in range(f):
            out[r, x] = 0
    for e in range(row.shape[0]):
        r = row[e]
        if r < lo or r >= hi:
            continue
        o = out[r]
        b = B[col[e]]
        if has_val:
            v = val[e]
            for x in range(f):
                o[x] += v * b[x]
        else:
            for x in range(f):
                o[x] += b[x]


@njit(fastmath=True, cache=True, nogil=True)
def spmm_coo_scatter_serial(row, col, val, B, out, parts):
    """Unsorted-COO SpMM on the calling thread: ``out[row[e]] += val[e] * B[col[e]]``
    over the entries in their order, ``out`` zeroed first. row, col (nnz,) int64 in
    range (checked by the caller's format); val (nnz,) or empty (ones); B (m, f);
    out (n, f); ``parts`` ignored (:func:`spmm_coo_scatter`'s arguments). Compiles in
    ~0.2 s (no parallel runtime)."""
    _scatter_rows_range(row, col, val, B, out, 0, out.shape[0])


@njit(**_JIT)
def spmm_coo_scatter(row, col, val, B, out, parts):
    """:func:`spmm_coo_scatter_serial` over ``parts`` equal ranges of output rows in
    parallel: each task reads every entry and adds those of its own rows, so no two
    tasks write one row (no atomics, no sort); the index reads repeat per task, the
    ``(nnz, f)`` feature work is split."""
    n = out.shape[0]
    for p in prange(parts):
        _scatter_rows_range(row, col, val, B, out, n * p // parts, n * (p + 1) // parts)


@gather_kernel(operand=3)
def spmm_coo_heads(dist):
    @njit(**_JIT)
    def spmm_coo_heads(row, col, val, B, out, nchunks, accumulate):
        """Semi-batched :func:`spmm_coo`: val (nnz, H) or (0, H); B (m, H, f); out (n, H, f)."""
        nnz = row.shape[0]
        n = out.shape[0]
        H = B.shape[1]
        f = B.shape[2]
        has_val = val.shape[0] > 0
        if nnz == 0:
            if not accumulate:
                out[:] = 0
            return
        nchunks = max(1, min(nchunks, nnz))
        bounds = _chunk_bounds(nnz, nchunks)
        carry = empty_array((nchunks, H, f), out)
        carry[:] = 0
        carry_row = empty_array(nchunks, np.int64)
        carry_row[:] = -1
        for ch in prange(nchunks):
            k = bounds[ch]
            end = bounds[ch + 1]
            while k < end:
                r = row[k]
                if k == bounds[ch] and k > 0 and row[k - 1] == r:
                    carry_row[ch] = r
                    dst = carry[ch]
                else:
                    dst = out[r]
                    if not accumulate:
                        for rr in range(row[k - 1] + 1 if k > 0 else 0, r + 1):
                            out[rr] = 0
                while k < end and row[k] == r:
                    prefetch_gather(B, col, k, k + 1, dist)
                    c = col[k]
                    for h in range(H):
                        if has_val:
                            v = val[k, h]
                            for x in range(f):
                                dst[h, x] += v * B[c, h, x]
                        else:
                            for x in range(f):
                                dst[h, x] += B[c, h, x]
                    k += 1
            if ch == nchunks - 1 and not accumulate:
                for rr in range(row[nnz - 1] + 1, n):
                    out[rr] = 0
        for ch in range(nchunks):
            if carry_row[ch] >= 0:
                out[carry_row[ch]] += carry[ch]
    return spmm_coo_heads


@gather_kernel(operand=4)
def sddmm_coo(dist):
    @njit(**_JIT)
    def sddmm_coo(row, col, val, B, C, out):
        """COO SDDMM, parallel over entries in any order:
        ``out[e] = val[e] * <B[row[e]], C[col[e]]>``.

        row, col (nnz,) int64; val (nnz,) or empty; B (n, f); C (m, f); out (nnz,).
        """
        nnz = row.shape[0]
        f = B.shape[1]
        has_val = val.shape[0] > 0
        for e in prange(nnz):
            prefetch_gather(C, col, e, e + 1, dist)
            r = row[e]
            c = col[e]
            s = 0.0
            for k in range(f):
                s += B[r, k] * C[c, k]
            if has_val:
                s *= val[e]
            out[e] = s
    return sddmm_coo


@gather_kernel(operand=4)
def sddmm_coo_heads(dist):
    @njit(**_JIT)
    def sddmm_coo_heads(row, col, val, B, C, out):
        """Semi-batched :func:`sddmm_coo`: val (nnz, H) or empty; B (n, H, f); C (m, H, f); out (nnz, H)."""
        nnz = row.shape[0]
        H = B.shape[1]
        f = B.shape[2]
        has_val = val.shape[0] > 0
        for e in prange(nnz):
            prefetch_gather(C, col, e, e + 1, dist)
            r = row[e]
            c = col[e]
            for h in range(H):
                s = 0.0
                for k in range(f):
                    s += B[r, h, k] * C[c, h, k]
                if has_val:
                    s *= val[e, h]
                out[e, h] = s


    # ------------------------------------------------------- dense -> CSR (features)
    # (no fastmath: the comparisons with 0 must see every value as it is)
    return sddmm_coo_heads


@njit(inline="always")
def _row_count(X, counts, i):
    c = 0
    for j in range(X.shape[1]):
        c += X[i, j] != 0
    counts[i] = c


@njit(parallel=True, cache=True, nogil=True)
def dense_row_counts(X, counts):
    """Non-zeros of each row of dense ``X (n, m)`` into ``counts (n,)``."""
    for i in prange(X.shape[0]):
        _row_count(X, counts, i)


@njit(cache=True, nogil=True)
def dense_row_counts_serial(X, counts):
    """:func:`dense_row_counts` on the calling thread (its first tier, see :func:`spmm_rows_serial`)."""
    for i in range(X.shape[0]):
        _row_count(X, counts, i)


@njit(inline="always")
def _row_fill(X, ptr, col, val, i):
    p = ptr[i]
    for j in range(X.shape[1]):
        v = X[i, j]
        if v != 0:
            col[p] = j
            val[p] = v
            p += 1


@njit(parallel=True, cache=True, nogil=True)
def dense_to_csr_fill(X, ptr, col, val):
    """Column indices and values of ``X``'s non-zeros in CSR order, row ``i`` from ``ptr[i]``."""
    for i in prange(X.shape[0]):
        _row_fill(X, ptr, col, val, i)


@njit(cache=True, nogil=True)
def dense_to_csr_fill_serial(X, ptr, col, val):
    """:func:`dense_to_csr_fill` on the calling thread (its first tier)."""
    for i in range(X.shape[0]):
        _row_fill(X, ptr, col, val, i)
