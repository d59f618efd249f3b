"""The one cache loop of every compiled wrapper: ``SignatureCache``.

``lucid.compile``'s ``CompiledModule``, the training steps (``make_step``, ``fused_step``, the
step ``compile_optimizer`` installs) and the callables ``load_compiled`` returns all serve calls
the same way: a key computed from the call's signature picks a cached entry (an executable with
its binding plan); a miss compiles one, logging why against the nearest cached key; a signature
the compiler cannot serve is remembered as eager-only with the reason; an entry whose feeds no
longer fit (a parameter changed dtype or layout behind the wrapper's back) is rebuilt once.
``SignatureCache`` holds that state and those rules; each wrapper keeps only what its calls
bind and return.

The hit path stays a plain dict lookup: ``cache.entries`` is an ``LRU`` (a dict), which a
wrapper may read directly (``entries.get(key)``) without a method call.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from lucid.compile import _recompile

__all__ = ["HISTORY", "LRU", "TICK", "RecompileLog", "SignatureCache", "max_entries"]

logger = logging.getLogger("lucid.compile")

HISTORY = 64  # recompile explanations kept per wrapper

DEFAULT_MAX_ENTRIES = 32


def max_entries() -> int:
    """The per-wrapper entry cap: ``LUCID_COMPILE_MAX_CACHE`` (the native executable cache's cap
    too), default 32."""
    value = os.environ.get("LUCID_COMPILE_MAX_CACHE", "").strip()
    if not value:
        return DEFAULT_MAX_ENTRIES
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"LUCID_COMPILE_MAX_CACHE must be a positive integer, got {value!r}")
    return n


# Recency ticks: a hit stamps its entry with ``next(TICK)`` (cheaper than re-hashing the key to
# reorder a dict on the hot path); eviction, on the miss path only, scans for the oldest stamp.
TICK = itertools.count()


class LRU(dict):
    """A dict of at most ``cap`` entries. ``put`` stamps the value's ``last_used`` and evicts the
    least recently used (a hit restamps ``value.last_used = next(TICK)``; values that take no
    attributes are evicted oldest first). ``on_evict(key, value)`` runs for each eviction."""

    def __init__(self, cap: int, on_evict: Any = None):
        super().__init__()
        self.cap = cap
        self.on_evict = on_evict
        self.evictions = 0

    def put(self, key: Any, value: Any) -> None:
        try:
            value.last_used = next(TICK)
        except AttributeError:
            pass
        self[key] = value
        while len(self) > self.cap:
            old_key = min(self, key=lambda k: getattr(self[k], "last_used", -1))
            old = self.pop(old_key)
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(old_key, old)


def _verbose() -> bool:
    value = os.environ.get("LUCID_COMPILE_VERBOSE", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


class RecompileLog:
    """Why each new signature of one wrapper compiled while others were cached: one
    explanation per compile against the nearest cached key (logged at INFO, WARNING with
    ``LUCID_COMPILE_VERBOSE``), and past ``LUCID_COMPILE_RECOMPILE_LIMIT`` one warning naming
    what varies. ``prefix`` starts each message (a training step's name)."""

    def __init__(self, prefix: str = "", differ: Callable[[tuple, tuple], list] | None = None):
        self.prefix = prefix
        self.differ = differ
        self.history: list[dict[str, Any]] = []
        self.n_compiled = 0
        self.warned = False

    def note(self, key: tuple, cached: Iterable[tuple], owner: str = "") -> dict[str, Any] | None:
        """Count one compile of ``key`` and explain it against ``cached``; the explanation
        (None when nothing was cached)."""
        self.n_compiled += 1
        cached = list(cached)
        if not cached:
            return None
        info = _recompile.explain(key, cached, self.differ)
        self.history.append(info)
        del self.history[:-HISTORY]
        level = logging.WARNING if _verbose() else logging.INFO
        logger.log(level, "lucid.compile: %s%s", self.prefix, info["message"])
        limit = _recompile.recompile_limit()
        if self.n_compiled > limit and not self.warned:
            self.warned = True
            varying = Counter(v for r in self.history for v in r["varying"])
            hints = sorted({h for r in self.history for h in r["hints"]})
            logger.warning(
                "lucid.compile: %s%d signatures compiled%s (LUCID_COMPILE_RECOMPILE_LIMIT=%d); "
                "what varies: %s%s",
                self.prefix,
                self.n_compiled,
                f" on {owner}" if owner else "",
                limit,
                ", ".join(f"{v} ({n}x)" for v, n in varying.most_common(3)) or "unknown",
                (". Hint: " + "; ".join(hints)) if hints else "",
            )
        return info

    def rows(self) -> list[dict[str, Any]]:
        """The explanations kept, as copies (``cache_info()["recompiles"]``)."""
        return [dict(r) for r in self.history]


class SignatureCache:
    """Key -> compiled entry, for one wrapper: an LRU of entries (``LUCID_COMPILE_MAX_CACHE``),
    the eager-only keys with their reasons (an LRU too), the calls counted per key, the
    recompile log, and the rebuild-once rule.

    Entries are any objects with ``last_used`` (the recency stamp; a hit restamps it) and
    optionally ``n_hits`` (hits counted by the entry itself, so the hit path does not update a
    dict; ``call_counts`` adds them in). ``clear`` forgets entries, eager-only keys and counts,
    but keeps the recompile log (it explains the wrapper's whole life)."""

    def __init__(
        self,
        cap: int | None = None,
        *,
        recompiles: RecompileLog | None = None,
    ):
        self.cap = max_entries() if cap is None else cap
        self.recompiles = recompiles if recompiles is not None else RecompileLog()
        self.n_calls: dict[Any, int] = {}
        self.entries: LRU = LRU(self.cap, self._forget)
        self.eager_only: LRU = LRU(self.cap, self._forget)

    @classmethod
    def holding(cls, entries: dict[Any, Any]) -> SignatureCache:
        """A cache of exactly ``entries`` (key -> entry), none ever evicted (the cap is their
        number): the signatures a saved file holds."""
        cache = cls(max(len(entries), 1))
        for key, entry in entries.items():
            cache.put(key, entry)
        return cache

    def _forget(self, key: Any, _: Any) -> None:
        # An evicted signature stops being counted (cache_info stays consistent).
        if key not in self.entries and key not in self.eager_only:
            self.n_calls.pop(key, None)

    # --- entries ---------------------------------------------------------------------------------
    def get(self, key: Any) -> Any:
        """The entry of ``key`` (restamped as most recently used), or None."""
        entry = self.entries.get(key)
        if entry is not None:
            entry.last_used = next(TICK)
        return entry

    def put(self, key: Any, entry: Any) -> None:
        """Store ``entry`` under ``key``, evicting the least recently used past the cap."""
        self.entries.put(key, entry)

    def pop(self, key: Any) -> Any:
        """Remove and return the entry of ``key`` (None if absent); the calls it served stay
        counted under ``key``."""
        old = self.entries.pop(key, None)
        if old is not None:
            hits = getattr(old, "n_hits", 0)
            if hits:
                self.n_calls[key] = self.n_calls.get(key, 0) + hits
        return old

    def move_calls(self, old: Any, new: Any) -> None:
        """The calls counted under ``old`` now count under ``new`` (a key that changed when
        the wrapper re-read its parameters)."""
        if old != new:
            moved = self.n_calls.pop(old, 0)
            if moved:
                self.n_calls[new] = self.n_calls.get(new, 0) + moved

    def count(self, key: Any) -> None:
        """One call of ``key`` not served by an entry's own ``n_hits``."""
        n_calls = self.n_calls
        n_calls[key] = n_calls.get(key, 0) + 1

    def call_counts(self) -> dict[Any, int]:
        """Calls per key: the counted ones plus the hits each live entry served."""
        counts = dict(self.n_calls)
        for k, e in list(self.entries.items()):
            counts[k] = counts.get(k, 0) + getattr(e, "n_hits", 0)
        return counts

    # --- eager-only signatures -------------------------------------------------------------------
    def mark_eager(self, key: Any, reason: str) -> None:
        """``key`` runs eagerly from now on (its entry, if any, dropped), for ``reason``."""
        self.pop(key)
        self.eager_only.put(key, reason)

    def eager_reason(self, key: Any) -> str | None:
        """Why ``key`` runs eagerly, or None when it does not."""
        return self.eager_only.get(key)

    # --- misses ----------------------------------------------------------------------------------
    def note_compile(self, key: Any, owner: str = "") -> dict[str, Any] | None:
        """A compile of ``key`` starts: explain it against every key cached or eager-only."""
        return self.recompiles.note(key, [*self.entries, *self.eager_only], owner)

    def rebuild_once(
        self,
        key: Any,
        entry: Any,
        run: Callable[[Any, Any], Any],
        rebuild: Callable[[], tuple[Any, Any]],
        errors: tuple[type[BaseException], ...],
        before_rebuild: Callable[[BaseException], None] | None = None,
    ) -> tuple[Any, Any, Any]:
        """``(key, entry, run(key, entry))``; when the run raises one of ``errors`` (its feeds
        no longer fit the entry), the entry is dropped, ``before_rebuild(error)`` runs,
        ``rebuild()`` gives a fresh ``(key, entry)`` (the key may change: the wrapper re-reads
        what it binds) and that entry runs once; a second failure propagates."""
        try:
            return key, entry, run(key, entry)
        except errors as e:
            self.pop(key)
            if before_rebuild is not None:
                before_rebuild(e)
            key, entry = rebuild()
            return key, entry, run(key, entry)

    def clear(self) -> None:
        """Forget every entry, eager-only key and call count (the eviction counters restart).
        In place: a wrapper may hold ``entries`` itself (its hit path reads it directly)."""
        self.n_calls.clear()
        for table in (self.entries, self.eager_only):
            table.clear()
            table.evictions = 0

    # --- introspection ---------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """The fields of ``cache_info()`` every wrapper shares: ``entries``, ``max_entries``,
        ``evictions``, ``keys``, ``eager_only``, ``reasons`` and ``recompiles``."""
        return {
            "entries": len(self.entries),
            "max_entries": self.entries.cap,
            "evictions": self.entries.evictions,
            "keys": tuple(self.entries),
            "eager_only": tuple(self.eager_only),
            "reasons": dict(self.eager_only),
            "recompiles": self.recompiles.rows(),
        }
