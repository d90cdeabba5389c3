"""Timing and memory harness shared by every ``corgnn bench`` experiment.

Methodology (paper §"Benchmarking", scaled to a CPU run):

* A *step* is one training iteration of a module on fixed inputs: the forward pass,
  then the loss (mean squared error against a fixed random target for full networks,
  a plain sum for single layers, as in the paper) and its backward pass. Gradients
  are dropped (``param.grad = None``) before every step, outside the timed region.
* Warm-up: ``warmup`` untimed steps (the first builds every lazy cache: corgnn's
  adjacency formats, PyG's cached normalisation, Numba and ``torch.compile``
  compilation), then one more untimed step under the memory profiler (below).
* Timed steps: forward and loss+backward are timed separately with
  ``time.perf_counter`` around each phase (with ``torch.cuda.synchronize`` on GPUs),
  one sample per step, Python's garbage collector paused as ``timeit`` does
  (tensors are freed by reference counting; the runner collects cycles between cells).
  The variants compared in one cell (e.g. corgnn and the PyG baselines at one dataset
  and hidden size) are timed *interleaved*, one step of each in turn
  (:func:`time_interleaved`), so load changes on a shared machine affect them
  alike. Steps repeat until both ``min_reps`` samples and ``budget_s`` seconds are
  reached (at most ``max_reps``; a variant whose warm-up step took longer than
  ``slow_step_s`` is timed once, to bound the run time). Reported: the median per step of ``fwd``, ``bwd`` (loss +
  backward) and ``total`` (their per-step sum), and the spread as the interquartile
  range (75th minus 25th percentile) of the same samples.
* Peak memory (bytes) of a step: on CUDA ``torch.cuda.max_memory_allocated`` minus the
  bytes allocated before the step. On CPU, torch keeps no allocator statistics, so
  the step runs under ``torch.profiler.profile(profile_memory=True)``, which records
  every allocation and free of torch's CPU allocator (``[memory]`` events with signed
  byte counts); the peak is the maximum of their running sum. Both count what a step
  allocates beyond what already existed (inputs, parameters and cached graph
  structures are not counted; saved activations, transients, outputs and gradients
  are). This sees corgnn's Numba kernels, whose outputs are allocated with
  ``torch.empty`` and which allocate nothing themselves, PyG's operators and
  ``torch.compile``'s generated code alike. The profiled step is not timed, except
  for variants slower than ``slow_step_s``, whose single timed step is also the
  profiled one (the profiler's overhead is negligible at that scale).
"""

from __future__ import annotations

import gc
import math
import os
import platform
import signal
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

__all__ = [
    "track_peak",
    "TrainStep",
    "Timing",
    "Settings",
    "measure",
    "warm_up",
    "time_interleaved",
    "gc_paused",
    "peak_step_memory",
    "machine_info",
    "default_mem_cap",
    "time_limit",
    "StepTimeout",
    "geomean",
]


@dataclass(frozen=True)
class Settings:
    """How long and how often to measure one cell.

    Attributes:
        warmup: untimed steps before measuring (>= 1; compiled models use more).
        min_reps: fewest timed steps.
        max_reps: most timed steps.
        budget_s: seconds of timed steps to aim for once ``min_reps`` are done.
        memory: also measure the peak memory of a step (one extra, profiled step).
        slow_step_s: a variant whose last warm-up step took longer than this is timed
            once (``reps = 1``, spread 0) to bound the run time; None = never.
    """

    warmup: int = 1
    min_reps: int = 3
    max_reps: int = 30
    budget_s: float = 2.0
    memory: bool = True
    slow_step_s: float | None = None

    def __post_init__(self):
        if self.warmup < 0 or self.min_reps < 0 or self.max_reps < self.min_reps:
            raise ValueError(f"need warmup >= 0 and 0 <= min_reps <= max_reps, got {self}")
        if self.budget_s < 0:
            raise ValueError(f"budget_s must be >= 0, got {self.budget_s}")


class TrainStep:
    """One training step of ``module(*inputs)``: forward, loss, backward.

    Args:
        module: the model or layer (any ``nn.Module`` or callable with parameters).
        inputs: positional arguments of the forward call; ``inputs[0]`` is the
            node feature matrix ``x (n, m)``.
        loss: ``"mse"`` (mean squared error against a fixed random target of the
            output's shape, drawn from ``seed``; full networks) or ``"sum"`` (plain
            sum of the output; single layers).
        input_grad: whether ``x`` requires a gradient (``dL/dx`` is computed).
        seed: seed of the MSE target (a local generator; no global seed is set).

    Raises:
        ValueError: unknown ``loss``.
    """

    def __init__(self, module, inputs: tuple, *, loss: str = "mse", input_grad: bool = False, seed: int = 0):
        if loss not in ("mse", "sum"):
            raise ValueError(f"loss must be 'mse' or 'sum', got {loss!r}")
        self.module = module
        x = inputs[0].detach().requires_grad_(input_grad) if input_grad else inputs[0]
        self.inputs = (x,) + tuple(inputs[1:])
        self.loss_kind = loss
        self.input_grad = input_grad
        self.seed = seed
        self._target = None
        self._params = [p for p in module.parameters() if p.requires_grad] if hasattr(module, "parameters") else []

    def zero_grad(self) -> None:
        for p in self._params:
            p.grad = None
        if self.input_grad:
            self.inputs[0].grad = None

    def forward(self) -> torch.Tensor:
        return self.module(*self.inputs)

    def loss(self, out: torch.Tensor) -> torch.Tensor:
        if self.loss_kind == "sum":
            return out.sum()
        if self._target is None or self._target.shape != out.shape:
            g = torch.Generator(device="cpu").manual_seed(self.seed)
            self._target = torch.randn(out.shape, generator=g, dtype=out.dtype).to(out.device)
        return torch.nn.functional.mse_loss(out, self._target)

    def backward(self, out: torch.Tensor) -> None:
        self.loss(out).backward()

    def __call__(self) -> None:
        self.zero_grad()
        out = self.forward()
        self.backward(out)
        del out


@dataclass
class Timing:
    """Per-step samples (ms) of one cell and its peak memory.

    Attributes:
        fwd, bwd, total: per-step times in ms (``total[i] = fwd[i] + bwd[i]``).
        warmup_ms: wall time of each warm-up step (the first includes lazy setup and
            compilation).
        peak_mem_bytes: peak bytes allocated during one step beyond what existed
            before it (None when not measured).
        memory_pending: the next timed step is to be memory-profiled (slow variants).
    """

    fwd: list[float] = field(default_factory=list)
    bwd: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    warmup_ms: list[float] = field(default_factory=list)
    peak_mem_bytes: int | None = None
    memory_pending: bool = False

    @property
    def reps(self) -> int:
        return len(self.total)

    def is_slow(self, settings: Settings) -> bool:
        """Whether the last warm-up step took longer than ``settings.slow_step_s``."""
        return settings.slow_step_s is not None and bool(self.warmup_ms) and self.warmup_ms[-1] > settings.slow_step_s * 1e3

    def median(self, phase: str) -> float:
        s = getattr(self, phase)
        return statistics.median(s) if s else math.nan

    def spread(self, phase: str) -> float:
        """Interquartile range (ms) of ``phase``'s samples (0 for one sample)."""
        s = sorted(getattr(self, phase))
        if len(s) < 2:
            return 0.0 if s else math.nan
        q = statistics.quantiles(s, n=4, method="inclusive")
        return q[2] - q[0]

    def setup_s(self) -> float:
        """Warm-up time beyond steady-state steps (s): compilation and lazy caches."""
        if not self.warmup_ms:
            return math.nan
        steady = self.median("total") if self.total else min(self.warmup_ms)
        return max(0.0, (sum(self.warmup_ms) - steady * len(self.warmup_ms)) / 1e3)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_of(step: TrainStep) -> torch.device:
    x = step.inputs[0]
    return x.device if isinstance(x, torch.Tensor) else torch.device("cpu")


@contextmanager
def gc_paused():
    """Context manager pausing Python's cyclic garbage collector, as ``timeit`` does
    (tensors are still freed by reference counting)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (C++ log lines) for the duration; Python errors raised
    inside still propagate normally."""
    import sys

    try:
        sys.stderr.flush()
        fd = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)


@contextmanager
def track_peak(device: torch.device):
    """Context manager measuring the peak bytes allocated inside it beyond what was
    allocated on entry; the result is in the yielded object's ``bytes`` after exit.

    CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.
    CPU: maximum running sum of the signed allocation sizes that
    ``torch.profiler`` (``profile_memory=True``) records for torch's CPU allocator.
    See the module docstring for what is and is not counted.
    """
    from types import SimpleNamespace

    result = SimpleNamespace(bytes=None)
    if device.type == "cuda":
        _sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            yield result
        finally:
            _sync(device)
            result.bytes = int(torch.cuda.max_memory_allocated(device) - base)
        return
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False, with_stack=False)
    with _quiet_stderr():  # kineto logs "profiler_start/stop" lines straight to fd 2
        prof.start()
    try:
        yield result
    finally:
        with _quiet_stderr():
            prof.stop()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    events.sort(key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    result.bytes = int(peak)


def peak_step_memory(step: TrainStep) -> int:
    """Peak bytes allocated during one ``step()`` beyond what was allocated before it
    (see :func:`track_peak`)."""
    step.zero_grad()
    with track_peak(_device_of(step)) as peak:
        step()
    return peak.bytes


def warm_up(step: TrainStep, settings: Settings = Settings(), *, warmup: int | None = None, warmup_limit_s: float | None = None) -> Timing:
    """Run the warm-up steps, then (if ``settings.memory``) the profiled memory step.

    A variant slower than ``settings.slow_step_s`` that will get a timed step
    (``settings.max_reps > 0``) skips the separate memory step: its single timed step
    is profiled instead (the profiler's overhead, microseconds per allocation, is
    negligible against a step of seconds).

    Args:
        step: the training step.
        settings: warm-up count and whether to measure memory.
        warmup: override ``settings.warmup`` (compiled models need extra steps).
        warmup_limit_s: raise :class:`StepTimeout` if the warm-up steps together run
            longer (see :func:`time_limit`; meant for ``torch.compile``).

    Returns:
        :class:`Timing` with ``warmup_ms`` and ``peak_mem_bytes`` filled, no samples.

    Raises:
        StepTimeout: the warm-up ran past ``warmup_limit_s``.
        Whatever the step raises (callers record it as a missing point).
    """
    device = _device_of(step)
    t = Timing()
    with time_limit(warmup_limit_s):
        for _ in range(settings.warmup if warmup is None else warmup):
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            t.warmup_ms.append((time.perf_counter() - t0) * 1e3)
    if settings.memory:
        if t.is_slow(settings) and settings.max_reps > 0:
            t.memory_pending = True
        else:
            t.peak_mem_bytes = peak_step_memory(step)
    return t


def _timed_step(step: TrainStep, t: Timing, device) -> None:
    step.zero_grad()
    with track_peak(device) if t.memory_pending else nullcontext() as peak:
        _sync(device)
        t0 = time.perf_counter()
        out = step.forward()
        _sync(device)
        t1 = time.perf_counter()
        step.backward(out)
        _sync(device)
        t2 = time.perf_counter()
        del out
    if t.memory_pending:
        t.peak_mem_bytes, t.memory_pending = peak.bytes, False
    t.fwd.append((t1 - t0) * 1e3)
    t.bwd.append((t2 - t1) * 1e3)
    t.total.append((t2 - t0) * 1e3)


def time_interleaved(steps: dict, timings: dict, settings: Settings = Settings()) -> dict:
    """Timed steps of several warmed-up variants, interleaved round-robin.

    Each round runs one timed step of every variant still measuring, so a change in
    machine load (other processes, frequency scaling) hits all variants of a
    comparison alike instead of whichever happened to run then. A variant stops
    once it has ``settings.min_reps`` samples and ``settings.budget_s`` seconds of
    timed steps, or ``settings.max_reps`` samples; one whose last warm-up step took
    longer than ``settings.slow_step_s`` gets a single sample.

    Args:
        steps: ``{key: TrainStep}``, already warmed up.
        timings: ``{key: Timing}`` from :func:`warm_up`; samples are appended.
        settings: repetitions and time budget.

    Returns:
        ``{key: exception}`` for the variants whose step raised (their samples are
        discarded); the others' ``timings`` hold their samples.
    """
    failed: dict = {}
    spent = {k: 0.0 for k in steps}
    once = {k for k, t in timings.items() if t.is_slow(settings)}

    def more(k) -> bool:
        t = timings[k]
        if k in failed:
            return False
        if k in once:
            return t.reps < 1
        return t.reps < settings.max_reps and (t.reps < settings.min_reps or spent[k] < settings.budget_s)

    with gc_paused():
        while True:
            todo = [k for k in steps if more(k)]
            if not todo:
                break
            for k in todo:
                t0 = time.perf_counter()
                try:
                    _timed_step(steps[k], timings[k], _device_of(steps[k]))
                except Exception as e:  # noqa: BLE001 - reported per variant by the caller
                    failed[k] = e
                    for samples in (timings[k].fwd, timings[k].bwd, timings[k].total):
                        samples.clear()
                spent[k] += time.perf_counter() - t0
    for step in steps.values():
        step.zero_grad()
    return failed


def measure(step: TrainStep, settings: Settings = Settings(), *, warmup: int | None = None, warmup_limit_s: float | None = None) -> Timing:
    """Warm up, optionally measure peak memory, then time ``step`` alone (see the
    module docstring; :func:`warm_up` + :func:`time_interleaved` with one variant).

    Returns:
        :class:`Timing` with per-step samples in ms.

    Raises:
        StepTimeout: the warm-up ran past ``warmup_limit_s``.
        Whatever the step raises.
    """
    t = warm_up(step, settings, warmup=warmup, warmup_limit_s=warmup_limit_s)
    failed = time_interleaved({0: step}, {0: t}, settings)
    if failed:
        raise failed[0]
    return t


class StepTimeout(TimeoutError):
    """A step (usually ``torch.compile``'s first call) ran past its time limit."""


@contextmanager
def time_limit(seconds: float | None):
    """Raise :class:`StepTimeout` in the main thread after ``seconds`` (SIGALRM).

    No-op when ``seconds`` is None/0, off the main thread, or on platforms without
    ``SIGALRM``. Used to turn a ``torch.compile`` that runs too long into a missing
    point (the paper reports compile failures the same way).

    ``torch._dynamo`` may catch an exception raised while it traces and fall back to
    eager execution; so that a timed-out compile is never measured as if it had
    compiled, the limit is also checked on exit: if it fired, :class:`StepTimeout` is
    raised there even when the code inside swallowed the first one.
    """
    import threading

    if not seconds or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = []

    def _raise(signum, frame):
        fired.append(True)
        raise StepTimeout(f"ran past the {seconds:g} s limit")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    if fired:
        raise StepTimeout(f"ran past the {seconds:g} s limit")


def _proc_field(path: str, key: str) -> str | None:
    """The value after ``key ... :`` on the first line of ``path`` (a ``/proc`` file)
    starting with ``key``; None when absent or unreadable."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    return _proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()


def default_mem_cap() -> int:
    """Bytes: half of the currently available RAM (``MemAvailable``), at most 12 GiB
    (8 GiB when unknown)."""
    avail = _proc_field("/proc/meminfo", "MemAvailable:")  # "123456 kB"
    if avail is None:
        return 8 * 2**30
    return min(int(avail.split()[0]) * 1024 // 2, 12 * 2**30)


def machine_info(device: str | torch.device = "cpu") -> dict:
    """CPU model, core and thread counts, library versions, the device and the CPU
    allocator setting (``allocator``: ``"reuse-freed"`` when
    :func:`corgnn.runtime.reuse_freed_memory` is on, as under the ``corgnn`` command;
    it applies to every variant of the run alike), for the results file (same keys on
    every machine)."""
    import numba

    from ..runtime import allocator_label
    import torch_geometric

    device = torch.device(device)
    info = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "torch": torch.__version__,
        "pyg": torch_geometric.__version__,
        "numba": numba.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
        "allocator": allocator_label(),
    }
    return info


def geomean(values) -> float:
    """Geometric mean of the positive finite values (NaN when there are none)."""
    v = [x for x in values if x is not None and math.isfinite(x) and x > 0]
    if not v:
        return math.nan
    return math.exp(sum(math.log(x) for x in v) / len(v))
