"""Which batch sizes the graph backend records, and how a call maps onto them. Pure: no torch.

Like vLLM's graph runner, graphs are recorded for a grid of sizes (1, 2, 4 and every multiple of 8)
rather than every size, besides every tuned size exactly: a call pads up to the smallest recorded size that
holds it, and a batch above the largest recorded size replays in chunks.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from pipeline.config.backend_schema import GraphSettings

DEFAULT_CAP = GraphSettings.max_recorded_batch_size  # the schema holds the default


def default_grid(limit: int) -> List[int]:
    """1, 2, 4 and every multiple of 8, up to ``limit`` (256 gives 35 sizes)."""
    return [s for s in (1, 2, 4) if s <= limit] + list(range(8, limit + 1, 8))


def grid(largest: int, cap: int = DEFAULT_CAP, sizes: Optional[Sequence[int]] = None) -> List[int]:
    """The grid for a backend serving batches up to ``largest``: grid sizes up to the first that holds
    ``largest``, none above ``cap``. ``sizes`` replaces the default grid (1, 2, 4, 8, 16, ...)."""
    if largest < 1:
        raise ValueError(f"largest batch size must be at least 1, got {largest}")
    if cap < 1:
        raise ValueError(f"max_recorded_batch_size must be at least 1, got {cap}")
    if sizes:
        bad = [s for s in sizes if int(s) < 1]
        if bad:
            raise ValueError(f"grid sizes must be positive, got {bad}; e.g. grid=[1,2,4,8,16,32]")
        candidates = sorted({int(s) for s in sizes if int(s) <= cap})
    else:
        candidates = default_grid(cap)
    if not candidates:
        raise ValueError(f"no grid size is at most max_recorded_batch_size={cap}; grid={list(sizes or [])}")
    end = bisect_left(candidates, largest)
    return candidates[: end + 1]


def padded_size(batch_size: int, recorded: Sequence[int]) -> Optional[int]:
    """The smallest recorded size that holds ``batch_size``; None if it needs chunks."""
    i = bisect_left(recorded, batch_size)
    return recorded[i] if i < len(recorded) else None


def padding_table(recorded: Sequence[int]) -> Dict[int, int]:
    """Batch size -> recorded size it pads to, for every size up to the largest recorded one."""
    recorded = sorted(recorded)
    return {bs: padded_size(bs, recorded) for bs in range(1, recorded[-1] + 1)} if recorded else {}


def chunk_plan(batch_size: int, recorded: Sequence[int]) -> List[Tuple[int, int]]:
    """The replays that serve one call, in order, as (real rows, recorded size): full chunks of the
    largest recorded size, then the rest padded to the smallest size that holds it."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    if not recorded:
        raise ValueError("no graph recorded")
    recorded = sorted(recorded)
    largest = recorded[-1]
    full, rest = divmod(batch_size, largest)
    plan = [(largest, largest)] * full
    if rest:
        plan.append((rest, padded_size(rest, recorded)))
    return plan


def sizes_to_record(batch_sizes: Iterable[int], cap: int = DEFAULT_CAP, sizes: Optional[Sequence[int]] = None,
                    exact: Iterable[int] = ()) -> List[int]:
    """The sizes to record to serve ``batch_sizes``: every ``exact`` (tuned) size among them, served without
    padding, also above the cap, and the grid sizes (none above the cap) the other sizes pad or chunk to.

    The cap bounds the grid of untuned sizes, not the sizes the user tuned: a tuned 1000 past a cap of 256
    is one graph, not four chunks of 256 (which lost 1.21x to the user's own compile on a launch-bound MLP).
    A size routed by a tuned size T (those up to T, down to the tuned size below) pads to a recorded size no
    larger than T, so it costs at most what T measured; only sizes past the largest tuned one replay in chunks.
    """
    wanted = sorted({int(b) for b in batch_sizes})
    if not wanted:
        raise ValueError("no batch sizes to serve")
    tuned = {int(b) for b in exact if int(b) <= wanted[-1]}
    candidates = sorted(set(grid(wanted[-1], cap, sizes)) | tuned)
    needed = {size for bs in wanted if bs not in tuned for _, size in chunk_plan(bs, candidates)}
    return sorted(needed | tuned)
