"""corgnn.runtime.reuse_freed_memory (issue 12, lever 4): freed tensors' pages are
reused without page faults while the setting is on, and the command turns it on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import corgnn
from corgnn import runtime

needs_glibc = pytest.mark.skipif(runtime._glibc() is None, reason="the C library is not glibc (mallopt is glibc's)")


FAULTS = """
import resource, torch
from corgnn import runtime

def faulting_rounds(nbytes=64 * 2**20, rounds=8):
    # rounds (of `rounds`, after 3 warm-up ones) whose allocate-touch-free cycle of
    # `nbytes` faulted in more than half of its pages
    def cycle():
        t = torch.empty(nbytes // 4, dtype=torch.float32)
        t.fill_(1.0)
        del t
    for _ in range(3):
        cycle()
    n = 0
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        cycle()
        n += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before > nbytes // 4096 // 2
    return n

off = faulting_rounds()
on_ok = runtime.reuse_freed_memory() and runtime.reuses_freed_memory()
on = faulting_rounds()
off_again = runtime.reuse_freed_memory(False) is False and not runtime.reuses_freed_memory()
print("FAULTS", off, on, on_ok, off_again)
"""


@needs_glibc
def test_reuse_freed_memory_removes_the_page_faults_of_repeated_large_allocations():
    """In a fresh process (the setting is process-wide): with glibc's defaults every
    cycle of allocating, touching and freeing 64 MiB faults its pages in anew; with the
    setting on, the freed blocks are reused (glibc may still grow the heap once or
    twice while small allocations interleave)."""
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    off, on, on_ok, off_again = [x for x in out.stdout.splitlines() if x.startswith("FAULTS")][-1].split()[1:]
    assert on_ok == "True" and off_again == "True"
    assert int(off) == 8
    assert int(on) <= 2


def test_reuse_freed_memory_rejects_a_non_bool():
    with pytest.raises(TypeError, match="enabled"):
        runtime.reuse_freed_memory("yes")


def test_without_glibc_it_warns_and_reports_off(monkeypatch):
    monkeypatch.setattr(runtime, "_glibc", lambda: None)
    with pytest.warns(RuntimeWarning, match="not glibc"):
        assert runtime.reuse_freed_memory() is False
    assert not runtime.reuses_freed_memory()


@needs_glibc
@pytest.mark.parametrize("env,expected", [(None, "reuse-freed"), ("0", "default")])
def test_the_command_turns_it_on_unless_told_not_to(env, expected):
    code = (
        "import sys, corgnn.cli as c, corgnn.runtime as r, corgnn.bench.harness as h\n"
        "c.main(['explain', '--m', '64', '--k', '16', '--n', '100', '--q', '400'])\n"
        "print('ALLOCATOR', h.machine_info()['allocator'], r.reuses_freed_memory())\n"
    )
    envv = dict(os.environ)
    envv.pop("CORGNN_REUSE_FREED_MEMORY", None)
    if env is not None:
        envv["CORGNN_REUSE_FREED_MEMORY"] = env
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=envv, timeout=120)
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stdout.splitlines() if x.startswith("ALLOCATOR")][-1]
    assert line == f"ALLOCATOR {expected} {expected == 'reuse-freed'}"
