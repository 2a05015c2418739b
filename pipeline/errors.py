"""The project's errors, on the ground floor: every room raises them and the entry points catch them, so
none of them has to import the room that raised (a config check, a checkpoint load, the route).

:class:`ConfigError` and :class:`RouteError` are ``ValueError``\\ s and :class:`RunFailed` a ``RuntimeError``,
as the bare errors they replace were: a caller that caught those catches these.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A mistake in the user's config or setup. The message is one line naming the problem and the fix.

    Raised by every config check (``pipeline.preflight``); ``python -m pipeline`` prints its one-line message
    and exits 2, keeping tracebacks for tweakpipe's own bugs."""


class RunFailed(RuntimeError):
    """The run ended without the result it was for, for a reason its one-line message states and that is not a
    bug of tweakpipe's (no backend survived capture, a route resting on noise, a validation that failed);
    ``python -m pipeline`` prints it and exits 1, the run directory holding the evidence."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message says why and what to do."""


class RouteError(ValueError):
    """No route can be chosen as asked (nothing profiled to route on, a strategy or ``route.backend`` that cannot
    serve, a latency that is not one); raised by the route code (``pipeline.route``), whose callers say what
    it means for them (the route stage fails the run, a config check names the key)."""


class JobFailed(Exception):
    """A sweep job that ended without its result: ``reason``, the one line a single run would print, and ``code``,
    the exit code it would have had (2: a config mistake, 1: a :class:`RunFailed`). ``python -m pipeline`` raises it
    in a sweep job instead of exiting, so that Hydra records the job FAILED and the sweep goes on to its other jobs
    (``pipeline.record.sweep_jobs``)."""

    def __init__(self, reason: str, code: int) -> None:
        super().__init__(reason, code)  # both in args: it pickles back from a job's own process
        self.reason, self.code = reason, code

    def __str__(self) -> str:
        return self.reason
