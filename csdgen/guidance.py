"""Guidance schedules: the classifier-free guidance scale as a function of the image position.

Some families change the guidance scale while an image is generated (Lumina-mGPT 2.0 lowers it
as the image fills, ``inference_solver.py``'s CFG processor). A schedule here is a function of
the **image position** ``i`` only (``0 .. N - 1``), computed once per run as a table
``scales[i]``; the progress of position ``i`` is ``i / N``, the image tokens committed before it
over the image length. Never a function of the iteration, the window or the batch: the target
distribution ``q`` at a position is then the same whether the position is sampled alone (AR)
or drafted anywhere in a window, so the lossless acceptance rules stay exact (the joint law
is the product of the per-position targets along the sequence, as for a constant scale).

A schedule applies only to guided runs (guidance scale != 1); the scale it starts from is
:attr:`csdgen.sampling.SamplingConfig.guidance_scale`. Schedules are frozen dataclasses, so a
:class:`~csdgen.sampling.SamplingConfig` holding one stays hashable and comparable, and
:meth:`GuidanceSchedule.options` gives what a run records.

Family-specific schedules (the exact Lumina-mGPT 2.0 recursion) live with their adapter and
subclass :class:`GuidanceSchedule`; the engine knows only this interface.
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass

import torch

from .integers import as_integer, is_finite_at_least_0
from .tensor_checks import is_integer_tensor

__all__ = ["GuidanceSchedule", "LinearGuidance", "guidance_table", "guidance_at"]


def check_guidance_scale(value, name: str = "guidance_scale") -> None:
    """ValueError unless ``value`` is a finite number >= 0 (:class:`csdgen.sampling.SamplingConfig`'s rule and
    message, which it uses)."""
    if not is_finite_at_least_0(value):
        raise ValueError(f"{name}={value!r}: must be a finite number >= 0")


class GuidanceSchedule(ABC):
    """The guidance scale at every image position (see the module docstring).

    Attributes:
        name: what records and the CLI call it.
    """

    name: str = "schedule"

    @abstractmethod
    def scales(self, scale: float, num_image_tokens: int, grid: tuple[int, int]) -> torch.Tensor:
        """``[N]`` float64 CPU: the guidance scale of the target at image position ``i``.

        Args:
            scale: the run's guidance scale (the schedule's start); num_image_tokens: N;
            grid: ``(rows, cols)`` of the raster order (for schedules that count row ends).
        """

    def options(self) -> dict:
        """``{"name": ..., **parameters}`` for a run's record (tuples as lists, as JSON holds them)."""
        return {"name": self.name, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}}


@dataclass(frozen=True)
class LinearGuidance(GuidanceSchedule):
    """``s_i = max(floor, s (1 - i / N))``: guidance falling linearly with the progress ``i / N``.

    A closed form close to Lumina-mGPT 2.0's schedule (``max(4, cfg * (1 - progress))``: the same floor and a
    scale falling with the progress); that family's code compounds its factor token by token, which
    :class:`csdgen.models.lumina2.Lumina2Guidance` reproduces exactly.

    Attributes:
        floor: the lowest scale (>= 0).

    Raises:
        ValueError: a negative or non-finite floor.
    """

    floor: float = 1.0
    name = "linear"

    def __post_init__(self) -> None:
        if isinstance(self.floor, bool) or not isinstance(self.floor, numbers.Real) or not 0 <= float(self.floor) < float("inf"):
            raise ValueError(f"floor={self.floor!r}: allowed a finite number >= 0")
        if type(self.floor) not in (int, float):  # numpy's numbers as Python's: a run's record is JSON
            object.__setattr__(self, "floor", float(self.floor))

    def scales(self, scale: float, num_image_tokens: int, grid: tuple[int, int]) -> torch.Tensor:
        progress = torch.arange(num_image_tokens, dtype=torch.float64) / num_image_tokens
        return (scale * (1 - progress)).clamp(min=float(self.floor))


def guidance_table(schedule: GuidanceSchedule | None, scale: float, num_image_tokens: int, grid: tuple[int, int],
                   device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The run's ``[N]`` float32 table of scales on ``device``, or None (constant ``scale``: no table).

    Called once per run (it reads the table's values to check them: one host sync, outside the loop).

    Args:
        schedule: a :class:`GuidanceSchedule`, or None (no schedule: the constant ``scale``).
        scale: the run's guidance scale (:attr:`csdgen.sampling.SamplingConfig.guidance_scale`), a
            finite number >= 0, where the schedule starts; 1.0 means unguided: no table.
        num_image_tokens: N, an integer >= 1.
        grid: ``(rows, cols)`` of the model's raster order (``rows * cols = N``), passed to the
            schedule as given.
        device: where the table is put.

    Returns:
        ``[N]`` float32 on ``device``: the scale of the target at image position ``i``; or None.

    Raises:
        ValueError: ``schedule`` is neither None nor a :class:`GuidanceSchedule`; ``scale`` is not a
            finite number >= 0; ``num_image_tokens`` is not an integer >= 1; the schedule gives a table
            of another shape, or one holding a negative or non-finite scale.
    """
    if schedule is not None and not isinstance(schedule, GuidanceSchedule):
        raise ValueError(f"schedule={schedule!r}: must be None or a csdgen.guidance.GuidanceSchedule "
                         f"(e.g. LinearGuidance(floor=1.0))")
    check_guidance_scale(scale, "scale")
    if as_integer(num_image_tokens) is None or num_image_tokens < 1:
        raise ValueError(f"num_image_tokens={num_image_tokens!r}: allowed an integer >= 1")
    if schedule is None or scale == 1.0:
        return None
    table = schedule.scales(float(scale), num_image_tokens, grid)
    if not isinstance(table, torch.Tensor) or tuple(table.shape) != (num_image_tokens,):
        raise ValueError(f"guidance schedule {schedule.name!r} gave {getattr(table, 'shape', table)!r}; "
                         f"allowed: a tensor of {num_image_tokens} scales, one per image position")
    if not bool(torch.isfinite(table).all()) or bool((table < 0).any()):
        raise ValueError(f"guidance schedule {schedule.name!r} gave a negative or non-finite scale; allowed: finite >= 0")
    return table.to(device=device, dtype=torch.float32)


def guidance_at(table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Scales ``[..., 1]`` of the targets at image ``positions``: ``table[positions]``.

    Args:
        table: ``[N]`` float, a run's :func:`guidance_table`.
        positions: ``[...]`` integer tensor (int64) of image positions on ``table``'s device. A
            position past the image (a window's padding slots) reads the last scale, a negative one
            the first: positions are clamped to ``0 .. N - 1``, not checked (that would read them: a
            host sync).

    Returns:
        ``[..., 1]`` of ``table``'s dtype.

    Raises:
        ValueError: ``table`` is not a 1-d tensor, or ``positions`` is not an integer tensor.
    """
    if not isinstance(table, torch.Tensor) or table.dim() != 1:
        got = f"shape {list(table.shape)}" if isinstance(table, torch.Tensor) else type(table).__name__
        raise ValueError(f"table: got {got}; allowed a [N] tensor of scales (guidance_table's)")
    if not is_integer_tensor(positions):
        got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ValueError(f"positions: got {got}; allowed an integer tensor (int64) of image positions")
    return table[positions.clamp(0, table.shape[0] - 1)].unsqueeze(-1)
