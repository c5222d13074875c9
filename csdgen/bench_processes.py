"""The processes of a bench: torchrun's rank and world (NCCL on GPUs, gloo on CPUs), the barrier
before the first process reports, and the machine and device names a report states.
"""

from __future__ import annotations

import os
import platform

__all__ = ["distributed", "barrier", "leave", "machine", "device_name"]


def device_name(device) -> str:
    """``"cpu"`` or the accelerator's name (e.g. ``"NVIDIA H200"``)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def distributed(device_type: str) -> tuple[int, int, int]:
    """``(rank, world size, local rank)``; under ``torchrun`` (``WORLD_SIZE`` > 1) joins the process
    group first (NCCL for CUDA, gloo otherwise, 12 h timeout: the barrier waits for the slowest process).
    A single process needs no ``torchrun``: ``(0, 1, 0)``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", timeout=timedelta(hours=12))
    return dist.get_rank(), dist.get_world_size(), local


def barrier() -> None:
    """Wait for every process (no-op in a single process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def leave() -> None:
    """Leave the process group (no-op in a single process). The first process scores after
    leaving it: torchmetrics' metrics would otherwise try to gather their states from every process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def machine() -> str:
    """A one-line description of this machine for the report."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread{'s' if torch.get_num_threads() != 1 else ''})"
