"""The routed model's own figures, computed once, where the route is decided: what tweakpipe ships, beside the
figures of each backend it chose among. Pure.

Per-backend metrics (``latency_ms/<backend>/bs<N>``) say how each candidate did; a compare view of runs needs the
model a run ships. Per tuned cell (``bs<N>``, or ``bs<N>/len<L>`` where lengths are tuned):

- ``latency_ms/auto/<cell>``: the profiled median of the backend the route serves that cell with;
- ``speedup_vs_eager/<cell>``: plain eager's median over it (``pipeline.route.decision.baseline``);
- ``speedup_vs_best_single/<cell>``: the median of the one backend ``route=highest_throughput`` would deploy for every
  cell, over it: what routing per cell gains over deploying the single best backend (1.0 where the route is that);
- ``speedup_vs_compile/<cell>``: the best reference peer's median over it (route.json's ``reference``,
  ``pipeline.route.versus``).

``.../geomean`` (and ``speedup_vs_compile/worst``): one figure per run over its cells, whatever they are (the
experiment's primary metric is ``speedup_vs_eager/geomean``: ``pipeline.record.store.PRIMARY_METRIC``).

A speed-up that rests on a cell measured on a busy host (either side's: ``pipeline.measure.contention``) is named
``contended_<figure>/<cell>`` and is in no geometric mean: where every cell is contended there is no ``geomean``, so
the primary metric never shows a busy machine's number as the model's.
"""

from __future__ import annotations

from typing import Any, Collection, Dict, Mapping, Optional, Tuple

from pipeline.route.versus import geomean
from pipeline.seqlen import Key, metric_suffix

AUTO = "auto"  # the routed model's name among the backends, in metrics and the report's rows
CONTENDED = "contended_"  # the prefix of a speed-up metric that rests on a cell measured on a busy host


def figure_name(figure: str, contended: bool) -> str:
    """A speed-up's metric name: ``contended_<figure>`` where it rests on a cell measured on a busy host, so that no
    figure a compare view, the primary metric or the report reads as a result stands on one
    (``pipeline.measure.contention``)."""
    return f"{CONTENDED}{figure}" if contended else figure


def routed_figures(owners: Mapping[Key, Optional[str]], medians: Mapping[str, Mapping[Key, float]],
                   eager: Optional[str], single: Optional[str], contended: Collection[Tuple[str, Key]]
                   ) -> Dict[str, float]:
    """The routed model's latency and its speed-ups over ``eager`` and the best ``single`` backend per tuned cell
    (``owners``: each cell -> the backend the route serves it with), and their geometric means."""
    figures: Dict[str, float] = {}
    for key, owner in owners.items():
        if owner is None or key not in medians.get(owner, {}):
            continue
        cell, ms = metric_suffix(key), medians[owner][key]
        figures[f"latency_ms/{AUTO}/{cell}"] = ms
        for figure, other in (("speedup_vs_eager", eager), ("speedup_vs_best_single", single)):
            if other is not None and key in medians.get(other, {}):
                busy = (owner, key) in contended or (other, key) in contended
                figures[f"{figure_name(figure, busy)}/{cell}"] = medians[other][key] / ms
    for figure in ("speedup_vs_eager", "speedup_vs_best_single"):  # one figure per run, whatever its cells
        ratio = geomean([v for k, v in figures.items() if k.startswith(figure + "/")])
        if ratio is not None:
            figures[f"{figure}/geomean"] = ratio
    return figures


def reference_figures(versus: Optional[Mapping[str, Any]]) -> Dict[str, float]:
    """Auto's speed-up over the user's best own compile (route.json's ``reference``): ``speedup_vs_compile/bs<N>``
    (``/len<L>``) per tuned cell, and its worst and geometric mean, which the compare view sorts by. A cell measured
    on a busy host is named ``contended_speedup_vs_compile/...`` and is in neither summary, which are left out where
    every cell is."""
    if not versus or not versus.get("cells"):
        return {}
    figures = {f"{figure_name('speedup_vs_compile', c['contended'])}/{metric_suffix(cell_key(c))}": float(c["speedup"])
               for c in versus["cells"]}
    summary = {f"speedup_vs_compile/{k}": float(versus[f"{k}_speedup"]) for k in ("worst", "geomean")
               if versus[f"{k}_speedup"] is not None}
    return {**figures, **summary}


def cell_fields(key: Key) -> Dict[str, int]:
    """A cell as route.json, profile.csv and cells.jsonl name it: ``batch_size``, and ``seq_len`` where lengths are
    tuned."""
    return {"batch_size": key} if isinstance(key, int) else {"batch_size": key[0], "seq_len": key[1]}


def cell_key(entry: Mapping[str, Any]) -> Key:
    """A cell's key back from :func:`cell_fields`: its batch size, and its length where lengths are tuned."""
    bs = int(entry["batch_size"])
    return (bs, int(entry["seq_len"])) if entry.get("seq_len") is not None else bs
