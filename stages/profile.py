"""Profile: latency of every surviving backend at every tuned batch size, interleaved round by round."""

from __future__ import annotations

import csv
import logging

from pipeline.context import RunContext
from pipeline.models import make_inputs
from pipeline.timing import measure_interleaved, saturated

log = logging.getLogger(__name__)

COLUMNS = ["backend", "batch_size", "median_ms", "p10_ms", "p90_ms", "samples", "rel_ci95",
           "first_call_ms", "repeats", "throughput_per_s", "noisy"]


def run(ctx: RunContext) -> None:
    pcfg = ctx.cfg.profile
    throughputs = {name: [] for name in ctx.backends}
    active = list(ctx.backends)
    for bs in ctx.batch_sizes:
        if not active:
            log.info("profile: every backend saturated before batch size %d", bs)
            break
        inputs = make_inputs(ctx.inputs, bs, ctx.device, ctx.cfg.seed)
        fns = {name: (lambda b=ctx.backends[name]: b(**inputs)) for name in active}
        results = measure_interleaved(fns, ctx.device, pcfg)
        for name, m in results.items():
            ctx.profile.setdefault(name, {})[bs] = m
            throughputs[name].append(bs / (m.median / 1e3))
            flag = "  (noisy)" if m.noisy else ""
            log.info("profile %-28s bs=%-4d median %.4f ms  p10 %.4f  p90 %.4f  n=%d%s",
                     name, bs, m.median, m.quantile(0.1), m.quantile(0.9), m.count, flag)
        active = [n for n in active
                  if not saturated(throughputs[n], pcfg.saturation_cutoff, pcfg.saturation_backoff)]
    path = ctx.run_dir / "profile.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for name, per in ctx.profile.items():
            for bs, m in sorted(per.items()):
                s = m.summary()
                writer.writerow({"backend": name, "batch_size": bs, **{k: s[k] for k in COLUMNS if k in s},
                                 "throughput_per_s": bs / (m.median / 1e3), "noisy": m.noisy})
    ctx.tracker.log_profile(ctx.profile, path)
