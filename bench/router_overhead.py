"""What the router adds to a call: the loaded routed model against its own backend called directly.

Tunes a model with one backend (so the route has one range), loads the checkpoint as a user would,
and times ``routed(**inputs)`` against ``routed.backends[name](**inputs)`` interleaved round by
round (as the profile stage times), several windows of 2000 calls each. The difference of the medians
is the router's own cost per call. ``checked`` is ``routed.forward``: input binding, the shape
check, the range lookup and the lock on every call, which a call of a one-input model skips (but
the lock) once its shape has passed them.

    python bench/router_overhead.py                        # tiny_mlp, eager, CPU: a few seconds
    python bench/router_overhead.py --device cuda --model mlp --backend graph_inductor
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.route import checkpoint  # noqa: E402
from pipeline.api import compose_config  # noqa: E402
from pipeline.models import make_inputs  # noqa: E402
from pipeline.runner import run  # noqa: E402
from pipeline.measure.interleaved import measure_interleaved# noqa: E402

WINDOW = {"min_samples": 2000, "max_samples": 2000, "budget_ms": 1e9, "rel_precision": 1e-9, "max_repeats": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny_mlp")
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=3)
    parser.add_argument("--windows", type=int, default=3)
    args = parser.parse_args()
    cfg = compose_config([f"model={args.model}", f"backends=[{args.backend}]", f"device={args.device}",
                          "profile=quick", "tracking=off"])
    ctx = run(cfg, Path(tempfile.mkdtemp(prefix="router-overhead-")))
    routed = checkpoint.load(ctx.checkpoint_path, ctx.model, device=ctx.device)
    inputs = make_inputs(ctx.inputs, args.batch_size, ctx.device, cfg.seed)
    direct = routed.backends[args.backend]
    fns = {"routed": lambda: routed(**inputs), "checked": lambda: routed.forward(**inputs),
           "direct": lambda: direct(**inputs)}
    print(f"{args.model} on {args.device}, backend {args.backend}, batch {args.batch_size}: medians of 2000 calls")
    for _ in range(args.windows):
        m = measure_interleaved(fns, ctx.device, WINDOW)
        routed_us, checked_us, direct_us = (m[k].median * 1e3 for k in ("routed", "checked", "direct"))
        print(f"  routed {routed_us:8.2f} us   checked {checked_us:8.2f} us   direct {direct_us:8.2f} us   "
              f"router adds {routed_us - direct_us:5.2f} us ({checked_us - direct_us:5.2f} us checked)")


if __name__ == "__main__":
    main()
