"""``window="auto"``: each iteration's width chosen from measured times and acceptance by draft
age (:class:`_AutoWindow`; the algorithm in :mod:`csdgen.engine`)."""

from __future__ import annotations

import torch

__all__ = ["AUTO_MAX_WINDOW"]

#: the widest window ``window="auto"`` considers
AUTO_MAX_WINDOW = 32


class _AutoWindow:
    """Chooses each iteration's width from measured times and acceptance by draft age (:mod:`csdgen.engine`).

    Times ``t(W)``: seconds per iteration (forward, verify and bookkeeping, sync to sync) at
    width W, an exponential average; widths not measured are interpolated linearly between
    measured ones (extrapolated with the last slope, >= 0, beyond them).

    Expected tokens ``E(W)``: a draft's chance to pass depends mostly on its *age*, the forwards
    it has been refined by since it entered the window (a fresh draft is a guess; one drawn from
    the last forward's q given nearly the right prefix usually passes). The loop counts, per age,
    drafts reached and rejected (decayed per iteration so the estimate follows the image); in a
    steady state at width W committing L tokens per forward, the draft at slot j has age
    ``floor((W - 1 - j) / L)``, so ``L = 1 + sum_j prod_{s<j} accept(age_s)`` is solved by a
    damped fixed-point iteration for every W at once. The width maximising ``E(W) / t(W)`` wins.
    """

    DECAY = 0.95  # acceptance counts, per iteration
    PRIOR = 0.5  # acceptance assumed for draft ages not seen
    TIME_WEIGHT = 0.3  # weight of a new time measurement
    EXPLORE_EVERY = 8  # try a neighbouring width this often, when it is predicted close to the best
    EXPLORE_WITHIN = 0.8
    AGES = 16  # ages 0 .. AGES - 1 (older drafts count as AGES - 1)

    def __init__(self, max_width: int):
        self.max_width = max_width
        self.reached = torch.zeros(self.AGES, dtype=torch.float64)
        self.rejected = torch.zeros(self.AGES, dtype=torch.float64)
        self.times: dict[int, float] = {}
        warm = min(8, max_width)
        self.plan = [warm, warm, warm, 1] if warm > 1 else [1]  # three in a row: refined drafts get seen
        self.count = 0

    def accept_by_age(self) -> torch.Tensor:
        """``[AGES]`` float64 estimated acceptance of a reached draft of each age.

        Fresh drafts (age 0) and refined ones (age >= 1) are estimated apart: an age not seen
        takes the nearest seen age of its group, and a group never seen (lately) the prior
        :attr:`PRIOR`, optimistic enough that a width that was not tried gets tried.
        """
        seen = self.reached > 0.5
        rate = (1 - self.rejected / self.reached.clamp(min=1e-9)).clamp(0, 1)
        out = torch.full((self.AGES,), self.PRIOR, dtype=torch.float64)
        if bool(seen[0]):
            out[0] = rate[0]
        index = torch.arange(1, self.AGES)
        seen_at = index[seen[1:]]
        if len(seen_at):
            out[1:] = rate[seen_at[(index[:, None] - seen_at[None]).abs().argmin(1)]]
        return out

    def expected_tokens(self) -> torch.Tensor:
        """``[max_width]`` float64, E(W) for W = 1 .. max_width in the steady state (class docstring)."""
        M = self.max_width
        accept = self.accept_by_age()
        widths = torch.arange(1, M + 1, dtype=torch.float64)[:, None]  # [M, 1]
        slot = torch.arange(max(M - 1, 1), dtype=torch.float64)[None]  # [1, M-1]
        drafts = slot <= widths - 2
        tokens = torch.ones(M, 1, dtype=torch.float64)
        for _ in range(8):
            age = ((widths - 1 - slot) / tokens).floor().clamp(0, self.AGES - 1).long()
            passes = torch.where(drafts, accept[age], torch.zeros_like(slot))
            tokens = 0.5 * tokens + 0.5 * (1 + passes.cumprod(1).sum(1, keepdim=True))
        return tokens[:, 0]

    def cost(self) -> torch.Tensor:
        """``[max_width]`` float64 estimated seconds per iteration at W = 1 .. max_width."""
        ws = sorted(self.times)
        widths = torch.arange(1, self.max_width + 1, dtype=torch.float64)
        if len(ws) == 1:
            return torch.full_like(widths, self.times[ws[0]])
        xs = torch.tensor(ws, dtype=torch.float64)
        ts = torch.tensor([self.times[w] for w in ws], dtype=torch.float64)
        index = torch.searchsorted(xs, widths).clamp(1, len(ws) - 1)
        x0, x1, t0, t1 = xs[index - 1], xs[index], ts[index - 1], ts[index]
        slope = ((t1 - t0) / (x1 - x0)).clamp(min=0)
        t = t0 + slope * (widths - x0)
        return torch.where(widths < xs[0], ts[0], t).clamp(min=1e-9)

    def choose(self, limit: int) -> int:
        """The next width (``<= limit``, the widest window any image can still use)."""
        self.count += 1
        limit = min(limit, self.max_width)
        if self.plan:
            return min(self.plan.pop(0), limit)
        rate = self.expected_tokens()[:limit] / self.cost()[:limit]
        best = int(rate.argmax()) + 1
        if self.count % self.EXPLORE_EVERY == 0:
            other = min(2 * best, limit) if (self.count // self.EXPLORE_EVERY) % 2 else max(1, best // 2)
            if rate[other - 1] >= self.EXPLORE_WITHIN * rate[best - 1]:
                return other
        return best

    def observe(self, width: int, seconds: float, reached: list[float], rejected: list[float]) -> None:
        self.reached = self.DECAY * self.reached + torch.tensor(reached, dtype=torch.float64)
        self.rejected = self.DECAY * self.rejected + torch.tensor(rejected, dtype=torch.float64)
        old = self.times.get(width)
        self.times[width] = seconds if old is None else (1 - self.TIME_WEIGHT) * old + self.TIME_WEIGHT * seconds
