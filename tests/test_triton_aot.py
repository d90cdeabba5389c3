"""Ahead-of-time compilation of the Triton kernels for sm_80 and sm_90, on this
machine, no GPU needed (:mod:`corgnn.bench.triton_aot`).

Every kernel specialization the launchers make is recorded from the launchers
themselves; the main run compiles a representative subset (every kernel, dtype and
flag value at least once, plus each kernel's heaviest float64 variant: 28 of 464
specializations, about 30 s cold on 2 cores); the exhaustive run (all 464 x 2
targets, about 3 min with 2 workers on 2 loaded cores, 6+ with one) is opt-in with
``CORGNN_AOT=all``. Both fail on a compile error or a spill over the tolerance.

The test suite defines the kernels for Triton's interpreter on CPU (conftest), and
interpreted kernels cannot be compiled: the compilation runs in a subprocess with
``TRITON_INTERPRET=0``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="the triton package is not installed")

ENV = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")


def _python(*args, timeout=900):
    return subprocess.run([sys.executable, *args], env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def recorded():
    """What the launchers make: per specialization its kernel, flags and label, and
    the representative subset's indices."""
    code = (
        "import json\n"
        "from corgnn.bench import triton_aot as A\n"
        "from corgnn.sparse.backends import triton_kernels as K\n"
        "s = A.specializations(); r = A.representative(s)\n"
        "kernels = sorted(n for n in dir(K) if n.endswith('_kernel'))\n"
        "print(json.dumps(dict(kernels=kernels, specs=[dict(kernel=x.kernel, flags=x.flags(), label=x.label) for x in s],"
        " subset=[s.index(x) for x in r])))\n"
    )
    out = _python("-c", code)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_kernel_and_flag_value_is_specialized(recorded):
    specs = recorded["specs"]
    assert {s["kernel"] for s in specs} == set(recorded["kernels"])  # every Triton kernel is launched
    for kernel in recorded["kernels"]:
        mine = [s["flags"] for s in specs if s["kernel"] == kernel]
        assert {f["dtype"] for f in mine} == {"fp32", "fp64", "bf16", "fp16"}, kernel
        for flag in {k for f in mine for k, v in f.items() if isinstance(v, bool)}:  # both values of every switch
            assert {f.get(flag) for f in mine} >= {True, False} or flag.endswith(":i64"), (kernel, flag)
        if kernel != "spmm_chunks_kernel":  # single-head (H == 1 specialized as a constant) and multi-head launches
            assert any(f.get("H") == 1 for f in mine) and any("H" not in f for f in mine), kernel
    # the paths the issue names: split long rows, the bias epilogue, ELL, hybrid's accumulate,
    # every GAT caching mode, dropout off / 32-bit / 64-bit threshold
    rows = [s["flags"] for s in specs if s["kernel"] == "spmm_rows_kernel"]
    for flag in ("SPLIT", "HAS_BIAS", "ELL", "ACCUMULATE", "HAS_PERM", "HAS_VAL", "MULTI_HEAD"):
        assert any(f[flag] for f in rows), flag
    assert {f["MODE"] for f in recorded_flags(specs, "sddmm_kernel")} == {0, 1, 2}
    back = recorded_flags(specs, "gat_backward_rows_kernel")
    assert {(f["CACHED"], f["DROP"], f["WRITE_AD"]) for f in back} == {(True, False, False), (True, True, True), (False, False, True), (False, True, True)}
    fwd = recorded_flags(specs, "gat_forward_kernel")
    assert any(f["DROP"] and f.get("thresh:i64") for f in fwd) and any(f["DROP"] and not f.get("thresh:i64") for f in fwd)


def recorded_flags(specs, kernel):
    return [s["flags"] for s in specs if s["kernel"] == kernel]


def test_representative_subset_covers_every_flag_value(recorded):
    specs, subset = recorded["specs"], recorded["subset"]
    pairs = lambda s: {(s["kernel"], k, json.dumps(v)) for k, v in s["flags"].items()}  # noqa: E731
    assert set().union(*(pairs(s) for s in specs)) == set().union(*(pairs(specs[i]) for i in subset))
    assert len(subset) < len(specs) / 10


def _check(args):
    out = _python("-m", "corgnn.bench.triton_aot", "--check", "--workers", "2", *args)
    table = [ln for ln in out.stdout.splitlines() if ln.startswith("| ") and not ln.startswith("| kernel")]
    summary = re.search(r"(\d+) of (\d+) specializations x 2 targets: (\d+) compiled, (\d+) errors", out.stdout)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-6000:])
    assert summary and summary[4] == "0" and int(summary[3]) == 2 * int(summary[1]) == 2 * len(table)
    for row in table:  # registers, spill bytes, shared memory per target, all read from the cubins
        cells = [c.strip() for c in row.strip("|").split("|")]
        for c in cells[3:]:
            regs, spill, smem = (int(x.split()[0]) for x in c.split("/"))
            assert 0 < regs <= 255 and spill >= 0 and smem >= 0
    return table


def test_representative_specializations_compile_for_sm80_sm90():
    table = _check(["--subset"])
    assert {row.split("|")[1].strip() for row in table} >= {"spmm_rows_kernel", "gat_backward_rows_kernel", "sddmm_kernel"}


@pytest.mark.skipif(os.environ.get("CORGNN_AOT") != "all", reason="exhaustive AOT run (464 specializations x 2 targets, ~3 min on 2 cores with 2 workers): opt-in with CORGNN_AOT=all; the main run compiles the representative subset above")
def test_every_specialization_compiles_for_sm80_sm90():
    assert len(_check([])) > 400
