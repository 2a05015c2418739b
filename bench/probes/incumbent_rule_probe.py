"""Probe (issue 56, 2026-12-06): which archived routes the router's incumbent rule of ae9183e changes, and by how much.

Reads every ``route.json`` in ``bench/results/raw/*.tar.xz`` (and in the run archives inside them) that a batch-size
router decided with intervals, rebuilds each incumbent's route from the tune's own medians and intervals with the
current ``pipeline.route.policy.owners_with``, and picks the incumbent twice: fewest ranges first (the rule before
ae9183e) and fewest sizes left behind first (``policy.left_behind``, the rule since). A route whose rebuilt choice
differs from what the run shipped under its own code is flagged ``(rebuilt != shipped)``: the rebuild is then not
the run's rule. On the archives up to 2026-12-06 (3.5 s): 44 routes (GPU and CPU), every rebuild equal to the
route its run shipped; 40 unchanged by the rule; 4 changed, each to a route 1.000 from the fastest by the tune's
medians, from 1.027-1.120: DistilBertForMaskedLM with forced attention kernels (call AS, two copies of one run: the
max-autotune reference at every size, 12% slower than the device graph at batch 1 within overlapping intervals) and
mobilenet_v3_small on the 16-core CPU table (calls BF and BG).

Run from the repository root: ``python bench/probes/incumbent_rule_probe.py``."""

from __future__ import annotations

import ast
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from pipeline.route import policy  # noqa: E402

ARCHIVES = ("tar.xz", "tgz", "tar.gz")


def routes_in(data: bytes, name: str) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """Every route.json in an archive's bytes, nested archives too, as (member path, its JSON)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            if not member.isfile():
                continue
            content = archive.extractfile(member).read()
            if member.name.endswith(ARCHIVES):
                yield from routes_in(content, f"{name}:{member.name}")
            elif member.name.endswith("route.json"):
                yield f"{name}:{member.name}", json.loads(content)


def literal(value: Any) -> Any:
    """route.json's older fields were written as Python reprs."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def compare(route: Dict[str, Any]) -> Tuple[str, str, Dict[str, Dict[int, str]], Dict[str, Dict[int, float]], bool]:
    """The incumbents the two rules pick, every incumbent's owners, the medians, and whether the new rule's rebuilt
    route is the one the run shipped."""
    medians = {b: {int(k): v for k, v in per.items()} for b, per in literal(route["profile_medians_ms"]).items() if per}
    intervals = {b: {int(k): tuple(v) for k, v in per.items()}
                 for b, per in literal(route["profile_intervals_ms"]).items() if per}
    excluded = literal(route.get("excluded") or {}) or {}
    order = [b for b in medians if b not in excluded]
    competing = {b: medians[b] for b in order}
    references = [b for b in (literal(route.get("reference") or {}) or {}).get("candidates") or [] if b in order]
    baseline, gain = ("eager" if "eager" in order else None), route.get("min_gain", 0.1)
    owners = {b: policy.owners_with(b, competing, order, gain, baseline, intervals, references) for b in order}

    def before(b: str) -> tuple:
        return (len(policy.ranges_from_owners(owners[b])), policy.route_regret(owners[b], competing),
                -policy.peak_throughput(competing[b]), order.index(b))

    old = min(owners, key=before)
    new = min(owners, key=lambda b: (policy.left_behind(owners[b], competing, gain, intervals), *before(b)))
    shipped = [(r["lo"], r["hi"], r["backend"]) for r in route["ranges"]]
    rebuilt = [(r.lo, r.hi, r.backend) for r in policy.ranges_from_owners(owners[new])]
    return old, new, owners, competing, shipped == rebuilt


def main() -> None:
    seen = changed = 0
    for path in sorted((ROOT / "bench/results/raw").glob("*.tar.xz")):
        for name, route in routes_in(path.read_bytes(), path.name):
            if route.get("strategy") != "router" or not route.get("profile_intervals_ms"):
                continue
            try:
                old, new, owners, medians, same = compare(route)
            except ValueError:  # a (batch size x length) table: keys are not batch sizes
                print(f"length table, not compared: {name}")
                continue
            seen += 1
            if old == new:
                print(f"same     {name}" + ("" if same else "  (rebuilt != shipped)"))
                continue
            changed += 1
            print(f"CHANGED  {name}")
            for label, b in (("before", old), ("since", new)):
                ranges = [(r.lo, r.hi, r.backend) for r in policy.ranges_from_owners(owners[b])]
                print(f"    {label}: {ranges}, regret {policy.route_regret(owners[b], medians):.3f}")
    print(f"{seen} routes, {changed} changed")


if __name__ == "__main__":
    main()
