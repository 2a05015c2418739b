"""Profile: latency of every surviving backend at every tuned batch size, interleaved round by round.

Exactly the tuned sizes (``model.batch_sizes``) are profiled, in ``profile.passes`` passes. Graph
backends record each tuned size exactly, so no backend pads there, and a size the router sends by a
tuned size T costs at most what T measured (it pads to a recorded size no larger than T). Compile
time and peak memory are capture's; this stage records each size's first call apart
(``first_call_ms``) and reports the median, its interval, p10/p90, sample count and a ``noisy`` flag
with its reason for every cell.
"""

from __future__ import annotations

import logging
from typing import List, Tuple

from pipeline.record import progress
from pipeline.context import RunContext
from pipeline.measure.interleaved import profile_sizes
from pipeline.measure.measurement import Measurement

log = logging.getLogger(__name__)


def run(ctx: RunContext) -> None:
    pcfg = ctx.cfg.profile
    sizes: List[int] = ctx.batch_sizes
    # A call that replays a device graph cannot be captured again, and needs no cross-check.
    checked = ([n for n, b in ctx.backends.items() if not b.records_cuda_graphs]
               if pcfg.device_check and ctx.device.type == "cuda" else [])

    _, inputs_at = ctx.input_sources()[0]  # the batches capture checked

    def fns_at(bs: int) -> dict:
        inputs = inputs_at(bs)
        return {name: (lambda b=backend: b(**inputs)) for name, backend in ctx.backends.items()}

    def on_cell(name: str, bs: int, m: Measurement) -> None:
        ctx.profile.setdefault(name, {})[bs] = m
        ctx.on_cell(name, bs, m)

    known = {n: per for n, per in ctx.earlier.cells.items() if n in ctx.backends}
    with progress.steps("profile", pcfg.passes * len(sizes)) as bar:
        ctx.profile.update(profile_sizes(
            fns_at, sizes, ctx.device, pcfg, device_check=checked, known=known, on_cell=on_cell,
            on_step=lambda p, bs: bar.next(f"pass {p + 1}/{pcfg.passes} bs={bs} ({', '.join(ctx.backends)})")))
    for name, backend in list(ctx.backends.items()):
        fallback = backend.fallback_reason()
        if fallback:  # its timings are eager's, not its own: drop them rather than route on them
            log.warning("profile: %s excluded: %s", name, fallback)
            ctx.exclude(name, f"not timed: {fallback}")
    for name, per in ctx.profile.items():
        for bs, m in sorted(per.items()):
            s = m.summary()
            log.info("profile %-24s bs=%-4d median %.4f ms (%.4f-%.4f)  p10 %.4f  p90 %.4f  n=%-4d first %.1f ms%s%s",
                     name, bs, m.median, s["ci_lo_ms"], s["ci_hi_ms"], s["p10_ms"], s["p90_ms"], m.count,
                     m.first_call_ms, f"  device {m.device_ms:.4f} ms" if m.device_ms == m.device_ms else "",
                     f"  NOISY: {m.noise}" if m.noisy else "")
    noisy = [(name, bs, m) for name, per in ctx.profile.items() for bs, m in sorted(per.items()) if m.noisy]
    if noisy:
        total = sum(len(per) for per in ctx.profile.values())
        log.warning("profile: %d of %d cells stayed noisy (%d pass(es), up to %d repeat(s) each); route.json says "
                    "whether the route rests on them:\n%s", len(noisy), total, pcfg.passes, pcfg.max_repeats,
                    noise_table(noisy))


def noise_table(cells: List[Tuple[str, int, Measurement]]) -> str:
    """One line per noisy cell: backend, batch size, median, interval and the first reason (and how many more)."""
    width = max(len("backend"), *(len(name) for name, _, _ in cells))
    lines = [f"  {'backend':<{width}}  {'bs':>5}  {'median ms':>10}  {'interval ms':<21}  why"]
    for name, bs, m in cells:
        lo, hi = m.interval
        reasons = m.noise.split("; ")
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        lines.append(f"  {name:<{width}}  {bs:>5}  {m.median:>10.4g}  {f'{lo:.4g}-{hi:.4g}':<21}  {reasons[0]}{more}")
    return "\n".join(lines)
