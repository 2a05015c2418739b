"""Profile: latency of every surviving backend at every tuned batch size, interleaved round by round.

Exactly the tuned sizes (``model.batch_sizes``) are profiled. Graph backends record each tuned size
exactly, so no backend pads there, and a size the router sends by a tuned size T costs at most what
T measured (it pads to a recorded size no larger than T). Compile time and peak memory are
capture's; this stage records each size's first call apart (``first_call_ms``) and reports the
median, p10/p90, sample count and a ``noisy`` flag with its reason for every cell.
"""

from __future__ import annotations

import logging
from typing import List

from pipeline.record import progress
from pipeline.context import RunContext
from pipeline.measure.host import HostGauge, host_drift, host_probe_ms
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
        bar.next(f"bs={bs} ({', '.join(ctx.backends)})")
        inputs = inputs_at(bs)
        return {name: (lambda b=backend: b(**inputs)) for name, backend in ctx.backends.items()}

    def on_cell(name: str, bs: int, m: Measurement) -> None:
        ctx.profile.setdefault(name, {})[bs] = m
        ctx.on_cell(name, bs, m)

    known = {n: per for n, per in ctx.earlier.cells.items() if n in ctx.backends}
    probe_before = host_probe_ms()
    with progress.steps("profile", len(sizes)) as bar:
        ctx.profile.update(profile_sizes(fns_at, sizes, ctx.device, pcfg, device_check=checked, known=known,
                                         host=HostGauge() if pcfg.host_guard else None, on_cell=on_cell))
    ctx.host_probe_ms = {"before": probe_before, "after": host_probe_ms()}
    for name, backend in list(ctx.backends.items()):
        fallback = backend.fallback_reason()
        if fallback:  # its timings are eager's, not its own: drop them rather than route on them
            log.warning("profile: %s excluded: %s", name, fallback)
            ctx.exclude(name, f"not timed: {fallback}")
    drift = host_drift(ctx.host_probe_ms["before"], ctx.host_probe_ms["after"])
    if drift:
        log.warning("profile: %s", drift)
    noisy = []
    for name, per in ctx.profile.items():
        for bs, m in sorted(per.items()):
            s = m.summary()
            log.info("profile %-24s bs=%-4d median %.4f ms  p10 %.4f  p90 %.4f  n=%-4d first %.1f ms%s%s",
                     name, bs, m.median, s["p10_ms"], s["p90_ms"], m.count, m.first_call_ms,
                     f"  device {m.device_ms:.4f} ms" if m.device_ms == m.device_ms else "",
                     f"  NOISY: {m.noise}" if m.noisy else "")
            if m.noisy:
                noisy.append(f"{name} bs={bs} ({m.noise})")
    if noisy:
        log.warning("profile: %d cell(s) stayed noisy after %d repeat(s); the route may rest on them: %s",
                    len(noisy), pcfg.max_repeats, "; ".join(noisy))
