"""What every stage of the built-in model's training (:mod:`csdgen.builtin.train`) shares: the
codebook size, bfloat16 autocast, image scaling, progress lines, the learning-rate schedule, the
stage clock (step count or wall budget, and the torch thread count) and the batch order.

Training-time only (never imported at run time).
"""

from __future__ import annotations

import math
import time

import torch

#: codes of the VQ tokenizer: token ids 0 .. CODEBOOK_SIZE - 1 of the AR model
CODEBOOK_SIZE = 1024
#: when training started (this module's import): :func:`log` prints the seconds since
T0 = time.time()


def autocast():
    """bfloat16 autocast on the CPU (1.7-2x faster matmuls and convolutions with AVX-512 BF16)."""
    return torch.autocast("cpu", dtype=torch.bfloat16)


def to_float(images_u8: torch.Tensor) -> torch.Tensor:
    """uint8 [B, 3, H, W] -> float32 [B, 3, H, W] in [-1, 1]."""
    return images_u8.float().div(127.5).sub(1.0)


def log(msg: str) -> None:
    """Print a progress line with elapsed wall seconds since start."""
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def cosine_lr(progress: float, peak: float, warmup: float) -> float:
    """Learning rate at ``progress`` in [0, 1]: linear warmup over the first ``warmup``
    fraction, then cosine decay to 0 at progress 1."""
    if progress < warmup:
        return peak * max(progress, 1e-3) / warmup
    return 0.5 * peak * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup))))


class StageClock:
    """Progress of a training stage: max(step / steps, elapsed / budget).

    The stage ends at the fixed step count or at its wall-clock budget (minutes, 0 = none),
    whichever comes first; the cosine schedule follows this progress so it always anneals.
    Also picks the faster of 1 or 2 torch threads every 50 steps (the machine is shared:
    two threads on a busy core are several times slower than one).
    """

    def __init__(self, stage: str, steps: int, minutes: float, max_threads: int):
        self.stage, self.steps, self.budget = stage, steps, 60 * minutes
        self.start = time.time()
        self.max_threads = max_threads
        torch.set_num_threads(max_threads)
        self.trial: dict[int, float] = {}
        self.t_step = self.start

    def progress(self, step: int) -> float:
        """max(step / steps, elapsed seconds / budget seconds); the stage ends at 1."""
        by_time = (time.time() - self.start) / self.budget if self.budget > 0 else 0.0
        return max(step / self.steps, by_time)

    def tick(self, step: int) -> None:
        """Call at the start of every step: times the previous step, tunes threads."""
        now = time.time()
        dt, self.t_step = now - self.t_step, now
        phase = step % 50
        if self.max_threads < 2 or step == 0:
            return
        # step 50k+1 runs on 2 threads, 50k+2..50k+4 on 1; keep the faster for the rest.
        if phase in (2, 5):
            self.trial[2 if phase == 2 else 1] = dt
            torch.set_num_threads(1 if phase == 2 else 2 if self.trial[2] < self.trial[1] else 1)
        elif phase == 0:
            torch.set_num_threads(2)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group of ``opt`` to ``lr``."""
    for g in opt.param_groups:
        g["lr"] = lr


def batch_indices(n: int, batch: int, steps: int, seed: int):
    """Yield ``steps`` index tensors of size ``batch`` from reshuffled epochs over ``n``."""
    gen = torch.Generator().manual_seed(seed)
    perm, pos = torch.randperm(n, generator=gen), 0
    for _ in range(steps):
        if pos + batch > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        yield perm[pos:pos + batch]
        pos += batch
