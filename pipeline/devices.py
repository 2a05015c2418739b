"""Device resolution and synchronisation: the one place that knows about cuda, xpu and cpu."""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Iterator, Optional

import torch

from pipeline.errors import ConfigError

KNOWN = ("cpu", "cuda", "xpu")


def available(kind: str) -> bool:
    """Whether this machine's torch can run on a device type."""
    if kind == "cpu":
        return True
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return False


def resolve(requested: str) -> torch.device:
    """``auto`` picks cuda, then xpu, then cpu; a named device that is absent fails before any work."""
    if requested == "auto":
        for kind in ("cuda", "xpu"):
            if available(kind):
                return torch.device(kind)
        return torch.device("cpu")
    kind = requested.split(":")[0]
    if kind not in KNOWN:
        raise ConfigError(f"unknown device {requested!r}; use auto, cpu, cuda or xpu")
    if not available(kind):
        raise ConfigError(
            f"device={requested} was asked for, but this machine's torch ({torch.__version__}) sees no {kind} device; "
            f"use device=auto or device=cpu"
        )
    return torch.device(requested)


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device``. On XPU, sync the stream: a device sync after a graph replay crashed on some drivers."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.current_stream(device).synchronize()


def name(device: torch.device) -> str:
    """Human-readable device name for reports and checkpoints."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "xpu":
        return torch.xpu.get_device_name(device)
    import platform

    return platform.processor() or platform.machine() or "cpu"


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory since the last reset (0 on CPU, where torch does not track it)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type == "xpu":
        return int(torch.xpu.max_memory_allocated(device))
    return 0


def kept_bytes(device: torch.device) -> int:
    """Device memory the process keeps from other processes and later allocations: its caching allocator's reserve
    once the unused part is given back (live tensors, and device graph pools whole: a recorded graph's intermediates
    are free blocks of its pool, still reserved while it lives). 0 on CPU, where torch does not count. Before and
    after a candidate's build: what that candidate keeps."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return int(torch.cuda.memory_reserved(device))
    if device.type == "xpu":
        torch.xpu.empty_cache()
        return int(torch.xpu.memory_reserved(device))
    return 0


def available_memory_bytes(device: torch.device) -> Optional[int]:
    """Memory a run can still take: the device's free memory, or the host's available RAM for cpu; None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "xpu" and hasattr(torch.xpu, "mem_get_info"):
        return int(torch.xpu.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def release_memory(device: torch.device) -> int:
    """Give the memory no live tensor holds back to the device (a garbage collection first, so that cycles
    holding a dropped backend's weights, outputs and graph pools go too), and return what stays reserved.

    A compile worker calls it after each job: its caching allocator would otherwise keep every candidate's
    peak reserved for the worker's life, and the run's own candidates, built beside it on the same device,
    then fail with out-of-memory (DistilBERT's masked-LM head at batch 256 on the H200: 67 GiB held by one
    worker, every graph candidate of the run out of memory)."""
    gc.collect()
    return kept_bytes(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif device.type == "xpu":
        torch.xpu.reset_peak_memory_stats(device)


@contextlib.contextmanager
def graph_capture_workspace(device: torch.device) -> Iterator[None]:
    """Around recording a device graph: cuBLAS's own workspace must be allocated in, and forgotten
    with, the graph's memory pool.

    cuBLAS keeps one persistent workspace per stream, and every ``torch.cuda.graph`` records on the
    same capture stream. Without this, the first graph ever recorded allocates that workspace in its
    private pool and every later graph bakes in its address; once the first graph's owner is freed
    and Inductor's CUDA-graph trees clear the workspaces (as they do around their own recordings),
    the pool's memory goes back to the driver and those graphs' matmuls write into unmapped memory:
    the second model tuned in one process died with "illegal memory access" / "unspecified launch
    failure". Clearing before and after a recording (as Inductor does) gives each recording a
    workspace inside its own pool, alive exactly as long as its graphs.
    """
    if device.type != "cuda":
        yield
        return
    torch._C._cuda_clearCublasWorkspaces()
    try:
        yield
    finally:
        torch._C._cuda_clearCublasWorkspaces()


@contextlib.contextmanager
def cpu_threads(threads: Optional[int]) -> Iterator[int]:
    """Run the block with ``threads`` CPU threads for PyTorch (``torch.set_num_threads``; None keeps the
    current count), yielding the count in force. The previous count comes back after, so tuning leaves
    the caller's process as it found it. Inductor bakes the count into the kernels it compiles inside."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)
