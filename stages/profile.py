"""Profile: latency of every surviving backend at every tuned batch size, interleaved round by round.

First a screen (``pipeline.measure.screening``): one short window of every candidate at three tuned
sizes; candidates clearly slower than the best everywhere, and those outside the accuracy budget
(which never serve), are screened out with their numbers. Then exactly the tuned sizes
(``model.batch_sizes``) are profiled for the rest, in ``profile.passes`` passes. Last, a cell flagged
noisy gets another window (up to ``profile.max_repeats``) only where the route rests on it: the
owner's cell and those of challengers within its interval, as the route would be decided now
(``pipeline.route.decision``); a flag elsewhere cannot change the route and is recorded as it is.

Graph backends record each tuned size exactly, so no backend pads there, and a size the router sends
by a tuned size T costs at most what T measured (it pads to a recorded size no larger than T). Compile
time and peak memory are capture's; this stage records each size's first call apart
(``first_call_ms``) and reports the median, its interval, p10/p90, sample count and a ``noisy`` flag
with its reason for every cell.

Where lengths are tuned (``model.seq_lens``), a cell is a (batch size, length) pair: the screen looks at its
three batch sizes at three lengths (the shortest, a middle and the longest), and the profile measures every
tuned batch size at each tuned length, one length after another.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from omegaconf import OmegaConf

from pipeline.context import RunContext
from pipeline.errors import RouteError
from pipeline.measure.contention import Watch
from pipeline.measure.interleaved import measure_interleaved, profile_cells
from pipeline.measure.measurement import Measurement, Settings
from pipeline.measure.screening import screen_settings, screen_sizes, screened_out
from pipeline.route.decision import baseline, contested, decide
from pipeline.seqlen import Key, label

log = logging.getLogger(__name__)
OUTSIDE_BUDGET = "screened out: outside the accuracy budget, so it never serves (timed in the screen only)"

Calls = Callable[[Key, Sequence[str]], Dict[str, Callable[[], Any]]]


def kept_by_rule(ctx: RunContext) -> List[str]:
    """Candidates the screen never drops: the eager baseline, the reference peer (the route is reported against it at
    every tuned cell, so each needs its full number), and the one a non-timed strategy deploys."""
    rcfg, servable = ctx.cfg.route, [n for n in ctx.backends if n not in ctx.failures()]
    keep = [baseline(ctx.candidates), *ctx.references()]
    if rcfg.strategy == "one_backend":
        keep.append(rcfg.backend)
    if rcfg.strategy == "first_wins":
        keep.append(next((n for n in ctx.candidates if n in servable), None))
    return [n for n in keep if n is not None]


def screen(ctx: RunContext, calls: Calls, watch: Watch) -> List[str]:
    """Screen every candidate; the ones left for the full profile, in order."""
    pcfg, names = ctx.cfg.profile, list(ctx.backends)
    failures, keep = ctx.failures(), kept_by_rule(ctx)
    if not pcfg.screen or all(n in keep for n in names):
        return names
    sizes, lengths = screen_sizes(ctx.batch_sizes), screen_sizes(ctx.lengths) if ctx.lengths else []
    known = {n: per for n, per in ctx.earlier.screen.items() if n in ctx.backends}

    def on_cell(name: str, key: Key, m: Measurement) -> None:
        ctx.screen.setdefault(name, {})[key] = m
        ctx.on_cell(name, key, m, "screen")

    with ctx.progress.steps("screen", len(sizes) * max(1, len(lengths))) as bar:
        ctx.screen.update(profile_cells(lambda key: calls(key, names), sizes, lengths, ctx.device,
                                        screen_settings(pcfg), known=known, on_cell=on_cell, watch=watch,
                                        on_step=lambda p, key: bar.next(f"{label(key)} ({len(names)} candidates)")))
    servable = [n for n in names if n not in failures]
    ctx.screened_out = {**screened_out(ctx.screen, servable, keep, pcfg.screen_margin),
                        **{n: OUTSIDE_BUDGET for n in names if n in failures and n not in keep}}
    busy = [n for n in servable if n not in keep and n not in ctx.screened_out
            and any(m.contended for m in ctx.screen.get(n, {}).values())]
    if busy:
        log.info("screen  kept %s: cells measured on a busy host screen nothing out (profile.csv: contended)",
                 ", ".join(busy))
    for name, why in ctx.screened_out.items():
        ctx.backends.pop(name)  # its graphs and compiled code go now, before the profile times the others
        log.info("screen  %-28s %s", name, why)
    log.info("screen  %d of %d candidates go on to the full profile: %s", len(names) - len(ctx.screened_out),
             len(names), ", ".join(n for n in names if n not in ctx.screened_out))
    return [n for n in names if n not in ctx.screened_out]


def remeasure_contested(ctx: RunContext, calls: Calls, on_cell: Callable[[str, Key, Measurement], None],
                        watch: Optional[Watch] = None, pcfg: Any = None,
                        on_step: Callable[[str], None] = lambda label: None) -> int:
    """Another window, up to ``max_repeats`` rounds (of ``pcfg``, default the run's profile), for the noisy cells the
    route rests on at sizes where it is contested (another candidate's interval overlaps the owner's); the windows
    taken. ``on_step`` hears of each cell as it is measured again (the progress bar: on a loaded host a round takes
    minutes, and the log must not go quiet meanwhile)."""
    pcfg = ctx.cfg.profile if pcfg is None else pcfg
    s, taken = Settings.of(pcfg), 0
    for _ in range(s.max_repeats):
        try:
            cells = decide(ctx.race(), ctx.cfg.route).rests_on
        except RouteError:
            return taken  # no route to rest on: the route stage says why
        todo = {key: noisy for key, names in contested(cells).items()
                if (noisy := [n for n in names if ctx.profile[n][key].noisy])}
        if not todo:
            break
        for key, names in sorted(todo.items()):
            on_step(f"{label(key)} again ({', '.join(names)})")
            measured = measure_interleaved(calls(key, names), ctx.device, {**pcfg, "max_repeats": 0},
                                           pass_index=s.passes - 1, watch=watch, what=f"{label(key)} again")
            for name, m in measured.items():
                ctx.profile[name][key].absorb(m, s)
                on_cell(name, key, ctx.profile[name][key])
                taken += 1
    return taken


def within_budget(ctx: RunContext) -> Any:
    """The profile's settings: the run's, or one pass without re-measuring where ``tune.budget_s`` is spent."""
    pcfg, spent = ctx.cfg.profile, ctx.budget_spent()
    if not spent:
        return pcfg
    ctx.profile_reduced = f"{spent}: one pass, no noisy cell measured again"
    log.warning("profile: %s", ctx.profile_reduced)
    return OmegaConf.merge(pcfg, {"passes": 1, "max_repeats": 0})


def run(ctx: RunContext) -> None:
    sizes: List[int] = ctx.batch_sizes
    calls, watch = ctx.calls, ctx.watch()
    timed = screen(ctx, calls, watch)
    pcfg = within_budget(ctx)
    # A call that replays a device graph cannot be captured again, and needs no cross-check.
    checked = ([n for n in timed if not ctx.backends[n].records_cuda_graphs]
               if pcfg.device_check and ctx.device.type == "cuda" else [])

    def on_cell(name: str, key: Key, m: Measurement) -> None:
        ctx.profile.setdefault(name, {})[key] = m
        ctx.on_cell(name, key, m, "profile")

    known = {n: per for n, per in ctx.earlier.cells.items() if n in timed}
    with ctx.progress.steps("profile", pcfg.passes * len(ctx.cells)) as bar:
        ctx.profile.update(profile_cells(
            lambda key: calls(key, timed), sizes, ctx.lengths, ctx.device, {**pcfg, "max_repeats": 0},
            device_check=checked, known=known, on_cell=on_cell, watch=watch,
            on_step=lambda p, key: bar.next(f"pass {p + 1}/{pcfg.passes} {label(key)} ({', '.join(timed)})")))
    with ctx.progress.steps("profile again", None) as bar:
        repeats = remeasure_contested(ctx, calls, on_cell, watch, pcfg, bar.next)
    for name, backend in list(ctx.backends.items()):
        fallback = backend.fallback_reason()
        if fallback:  # its timings are eager's, not its own: drop them rather than route on them
            log.warning("profile: %s excluded: %s", name, fallback)
            ctx.exclude(name, f"not timed: {fallback}")
    for name, outcome in ctx.outcomes.items():
        outcome.cost.screen_s = sum(m.spent_ms for m in ctx.screen.get(name, {}).values()) / 1e3
        outcome.cost.profile_s = sum(m.spent_ms for m in ctx.profile.get(name, {}).values()) / 1e3
    for name, per in ctx.profile.items():
        for key, m in sorted(per.items()):
            s = m.summary()
            log.info("profile %-24s %-12s median %.4f ms (%.4f-%.4f)  p10 %.4f  p90 %.4f  n=%-4d first %.1f ms%s%s%s",
                     name, label(key), m.median, s["ci_lo_ms"], s["ci_hi_ms"], s["p10_ms"], s["p90_ms"], m.count,
                     m.first_call_ms, f"  device {m.device_ms:.4f} ms" if m.device_ms == m.device_ms else "",
                     f"  NOISY: {m.noise}" if m.noisy else "", "  CONTENDED" if m.contended else "")
    for name, per in ctx.screened_medians().items():  # what the screen timed of them, so they are not left out
        log.info("profile %-24s screened out: screen median %s; %s", name,
                 ", ".join(f"{label(key)} {ms:.4f} ms" for key, ms in per.items()) or "no sample",
                 ctx.screened_out[name].removeprefix("screened out: "))
    contended = sum(m.contended for per in ctx.profile.values() for m in per.values())
    if contended:
        log.warning("profile: %d of %d cells were measured on a busy host (profile.csv: contended, and what was seen); "
                    "they settle no choice of the route", contended, sum(len(per) for per in ctx.profile.values()))
    noisy = [(name, key, m) for name, per in ctx.profile.items() for key, m in sorted(per.items()) if m.noisy]
    if noisy:
        total = sum(len(per) for per in ctx.profile.values())
        log.debug("profile: %d of %d cells stayed noisy (%d window(s) re-measured where the route rests on them):\n%s",
                  len(noisy), total, repeats, noise_table(noisy))


def noise_table(cells: List[Tuple[str, Key, Measurement]]) -> str:
    """One line per noisy cell: backend, cell, median, interval and the first reason (and how many more)."""
    width = max(len("backend"), *(len(name) for name, _, _ in cells))
    lines = [f"  {'backend':<{width}}  {'cell':>12}  {'median ms':>10}  {'interval ms':<21}  why"]
    for name, key, m in cells:
        lo, hi = m.interval
        reasons = m.noise.split("; ")
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        lines.append(f"  {name:<{width}}  {label(key):>12}  {m.median:>10.4g}  {f'{lo:.4g}-{hi:.4g}':<21}  "
                     f"{reasons[0]}{more}")
    return "\n".join(lines)
