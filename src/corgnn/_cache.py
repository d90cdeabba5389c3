"""The one cache primitive: values keyed on tensors by identity and state, held weakly.

Every corgnn cache that reuses work across calls (the graph built for an
``edge_index``, a layer's feature checks and kept ``A'X``) answers the same question:
is this the same tensor, unchanged, as last time? :func:`tensor_state` is the O(1)
fingerprint, :class:`TensorKey` a key over several tensors and plain values, and
:class:`SharedCache` a process-wide, bounded store whose entries disappear with the
tensors they are keyed on.

Rules, the same for every cache:

- A key matches when each keyed tensor is the *same object* (identity, held by a
  weak reference) in the same :func:`tensor_state` (in-place version counter, data
  address, shape, strides, dtype, device), and the plain parts are equal.
- Writes that bypass autograd's version counter (``t.data[...] = v``, NumPy or DLPack
  views, in-place edits of an inference tensor inside ``torch.inference_mode``) are
  not seen: pass a new tensor after such an edit, or call :func:`corgnn.clear_caches`.
- Inference tensors (made under ``torch.inference_mode``) have no version counter:
  their state leaves it out.
- Cached state is never pickled or deep-copied: a copy starts empty
  (:class:`Uncopied`).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import torch

__all__ = ["tensor_state", "TensorKey", "SharedCache", "ContentCache", "Uncopied", "clear_shared_caches", "clear_caches"]


def tensor_state(t: torch.Tensor) -> tuple:
    """O(1) fingerprint of what ``t`` holds now: its in-place version counter (None for
    an inference tensor, which has none), data address, shape, strides, dtype and
    device, and whether ``torch.inference_mode`` is on (what is derived under it is an
    inference tensor, which autograd refuses outside it: a cache never hands it to a
    call outside). It changes on every in-place torch op and when ``t.data`` is
    rebound; it does NOT change on writes that bypass the version counter (see the
    module notes)."""
    version = None if t.is_inference() else t._version
    return (version, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device, torch.is_inference_mode_enabled())


class TensorKey:
    """A key over ``tensors`` (each a tensor or None; held weakly, matched by identity
    and :func:`tensor_state`) and hashable ``extra`` values (matched by equality)."""

    __slots__ = ("refs", "states", "extra")

    def __init__(self, tensors: tuple, extra: tuple = ()):
        self.refs = tuple(None if t is None else weakref.ref(t) for t in tensors)
        self.states = tuple(None if t is None else tensor_state(t) for t in tensors)
        self.extra = extra

    def matches(self, tensors: tuple, extra: tuple = ()) -> bool:
        """Whether ``tensors`` and ``extra`` are what this key was made from, unchanged."""
        if extra != self.extra or len(tensors) != len(self.refs):
            return False
        for ref, state, t in zip(self.refs, self.states, tensors):
            if t is None or ref is None:
                if t is not ref:  # (both None)
                    return False
            elif ref() is not t or state != tensor_state(t):
                return False
        return True


class _ProcessCache:
    """What every process-wide cache shares: ``capacity``, its ``_entries`` under an
    ``RLock``, its registration for :func:`clear_shared_caches`, :meth:`clear`, and
    pickling without its entries."""

    _all: "weakref.WeakSet[_ProcessCache]" = weakref.WeakSet()

    def __init__(self, capacity: int, entries):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries = entries
        self._lock = threading.RLock()  # (a dropped value may free a keyed tensor: its callback re-enters)
        _ProcessCache._all.add(self)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()

    def __reduce__(self):  # (never pickled with its entries)
        return (type(self), (self.capacity,))


class SharedCache(_ProcessCache):
    """A bounded, thread-safe, process-wide map from :class:`TensorKey` to values.

    An entry is dropped when one of its keyed tensors is freed (weak-reference
    callback), when it is the least recently used beyond ``capacity`` entries, or by
    :meth:`clear`. Values must not hold strong references to the keyed tensors, or
    they live until evicted (a :class:`corgnn.Graph` built here holds a detached alias).
    """

    def __init__(self, capacity: int):
        super().__init__(capacity, OrderedDict())  # (ids, extra) -> (TensorKey, value)
        self._last = None  # (TensorKey, value) of the latest hit or put

    def clear(self) -> None:
        with self._lock:
            self._last = None
            self._entries.clear()

    def get(self, tensors: tuple, extra: tuple = ()):
        """The value stored for ``tensors``/``extra`` if the key still matches, else None."""
        # NOTE (issue 21): the latest entry first, without the lock or the LRU update:
        # every layer of a model asks for the graph of the same batch in turn (one
        # key check instead of ~1 us more of bookkeeping, ~5x that in a training loop).
        last = self._last
        if last is not None and last[0].matches(tensors, extra):
            return last[1]
        slot = (tuple(map(id, tensors)), extra)
        with self._lock:
            hit = self._entries.get(slot)
            if hit is None:
                return None
            if not hit[0].matches(tensors, extra):
                del self._entries[slot]
                if self._last is hit:
                    self._last = None
                return None
            self._entries.move_to_end(slot)
            self._last = hit
            return hit[1]

    def put(self, tensors: tuple, value, extra: tuple = ()):
        """Store ``value`` for ``tensors``/``extra`` (replacing an older entry); returns it."""
        slot = (tuple(map(id, tensors)), extra)
        key = TensorKey(tensors, extra)
        me = weakref.ref(self)

        def drop(_ref, slot=slot, key=key):
            cache = me()
            if cache is not None:
                with cache._lock:
                    hit = cache._entries.get(slot)
                    if hit is not None and hit[0] is key:
                        del cache._entries[slot]
                    if cache._last is not None and cache._last[0] is key:
                        cache._last = None

        key.refs = tuple(None if t is None else weakref.ref(t, drop) for t in tensors)
        with self._lock:
            self._entries[slot] = self._last = (key, value)
            self._entries.move_to_end(slot)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return value


class ContentCache(_ProcessCache):
    """A small, thread-safe, process-wide list of values keyed by the *contents* of
    tensors, most recently used first: a lookup compares a tensor with the stored
    keys (shape, dtype and device, then ``torch.equal``), so a new tensor holding
    the same values finds the value stored for an earlier one. The keys are private
    copies (:meth:`put`), so an edit of that earlier tensor, in place or through
    ``.data`` or NumPy, changes no stored key.
    At most ``capacity`` entries (the least recently used dropped); values are held
    strongly until dropped or :meth:`clear` (:func:`clear_shared_caches`).

    :meth:`probes` tells a caller whether a lookup can still pay: after ``capacity``
    misses in a row, only every ``recheck``-th lookup (counting the ones skipped).
    """

    def __init__(self, capacity: int, recheck: int = 8):
        super().__init__(capacity, [])  # (signature, copies, value), most recently used first
        if recheck < 1:
            raise ValueError(f"recheck must be >= 1, got {recheck}")
        self.recheck = recheck
        self._misses = 0  # lookups in a row that found nothing (skipped ones included)

    def __reduce__(self):  # (never pickled with its entries)
        return (type(self), (self.capacity, self.recheck))

    def clear(self) -> None:
        """Drop every entry and the count of misses."""
        super().clear()
        self._misses = 0

    def probes(self) -> bool:
        """Whether to look a new key up (:meth:`get`, then :meth:`put` on a miss), or
        else to count it as a miss and skip both.

        NOTE (issue 21): in a stream of keys that never come back (the shuffled
        mini-batches of a training loop), every lookup misses and stores a copy that
        the next ``capacity`` misses evict unread (the copy, the scan and the
        insertion: ~20 us a batch inside the loop). Once ``capacity`` misses came in a
        row, every entry stored before them is gone, so a skipped lookup can only miss
        a key of the stream itself coming back after more than ``capacity`` others,
        which least-recently-used eviction would have dropped too; every
        ``recheck``-th one still looks up and stores, so a stream that starts to
        repeat is found again (a hit resets the count)."""
        misses = self._misses
        if misses < self.capacity or misses % self.recheck == 0:
            return True
        self._misses = misses + 1
        return False

    @staticmethod
    def _signature(tensors: tuple, extra: tuple) -> tuple:
        """What two equal keys share, compared first (one tuple comparison per stored
        entry: a mini-batch's new graph differs from the stored ones in its edge count,
        and a scan of the entries through ``torch.equal`` calls cost ~1 us each)."""
        return tuple(None if t is None else (t.shape, t.dtype, t.device) for t in tensors) + (extra,)

    def get(self, tensors: tuple, extra: tuple = ()):
        """The value stored for tensors equal to ``tensors`` (and equal ``extra``), else None."""
        sig = self._signature(tensors, extra)
        with self._lock:
            for i, (s, copies, value) in enumerate(self._entries):
                if s == sig and all(c is None or torch.equal(c, t) for c, t in zip(copies, tensors)):
                    self._entries.insert(0, self._entries.pop(i))
                    self._misses = 0
                    return value
            self._misses += 1
        return None

    def put(self, tensors: tuple, value, extra: tuple = ()):
        """Store ``value`` under ``tensors`` (kept as given: pass copies that nothing
        else writes, e.g. the ones ``value`` was built from) and ``extra``; returns it."""
        with self._lock:
            self._entries.insert(0, (self._signature(tensors, extra), tuple(tensors), value))
            del self._entries[self.capacity:]
        return value


def clear_shared_caches() -> None:
    """Drop the entries of every :class:`SharedCache` and :class:`ContentCache` of the process."""
    for cache in list(_ProcessCache._all):
        cache.clear()


class Uncopied:
    """Mixin for per-module cache objects: pickling or deep-copying gives a new, empty
    instance (``type(self)()``), so ``torch.save(model)`` and ``copy.deepcopy`` work at
    any time and the copy rebuilds its caches on its first call."""

    def __reduce__(self):
        return (type(self), ())


def clear_caches(model: torch.nn.Module | None = None) -> None:
    """Drop what corgnn keeps across calls, for after an edit its keys cannot see (a
    write through ``t.data[...]`` or a NumPy view of ``edge_index``, ``edge_weight``
    or ``x``): the process-wide graph store (the Graph of every ``edge_index`` seen),
    and with ``model`` every per-layer cache of its modules (validated features, the
    sparse-feature CSR, a kept ``A'X`` or ``S^K X``). The next call rebuilds them.
    A :class:`corgnn.Graph` you hold keeps its own matrices: build a new one.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
    clear_shared_caches()
    if model is None:
        return
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, Uncopied):
                object.__setattr__(module, name, type(value)())
