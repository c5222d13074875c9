"""Speed-quality sweeps: every method over its relaxation parameter, measured the same way.

A sweep is a list of :class:`Setting` (a method, the value of its parameter, a window and a
drafting scheme); each runs on the same classes and seeds as every other (see
:mod:`csdgen.runs`) and becomes one table row. :func:`frontier_plot` draws step
compression against each quality score with one curve per method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and the rules are imported where used: the CLI reads SweepGrid without them
    import torch

__all__ = ["BASELINES", "SweepGrid", "Setting", "settings", "frontier_plot"]

#: the methods a sweep can run without a parameter
BASELINES = ("ar", "sjd", "sjd-coupled")


#: CSD's default delta: its settings keep the names they had before a delta was named alone
_CSD_DELTA = 0.65


@dataclass
class SweepGrid:
    """Parameter values to sweep per method (an empty list leaves the method out)."""

    csd_lam: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.25, 0.5, 1.0])
    csd_delta: list[float] = field(default_factory=lambda: [_CSD_DELTA])
    addition_c: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.4])
    gsd_radius: list[int] = field(default_factory=lambda: [1, 3, 7])
    lantern_delta: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.2, 0.4])
    windows: list[int] = field(default_factory=lambda: [16])
    draft_inits: list[str] = field(default_factory=lambda: ["uniform"])
    baselines: list[str] = field(default_factory=lambda: ["ar", "sjd", "sjd-coupled"])


@dataclass
class Setting:
    """One point of a sweep."""

    #: unique file-safe name: the method, its parameter and value (CSD's delta too where several are swept
    #: or it is not CSD's default), ``W<window>`` and the draft initialisation (``csd_lam0.5_W16_uniform``)
    name: str
    method: str  #: curve label
    parameter: str  #: swept parameter name ("" for baselines)
    value: Any
    window: int
    draft_init: str
    preset: dict  #: keyword arguments of ``csdgen.generate`` besides window/sampling/seed


def _methods(grid: SweepGrid, codebook: torch.Tensor | None, entropy_unit: str) -> list[tuple[str, str, Any, dict]]:
    from csdgen.acceptance import CSD, GSD, Addition, Lantern

    from .compare import lantern_preset

    out: list[tuple[str, str, Any, dict]] = []
    baselines = {"sjd": {"method": "sjd"}, "sjd-coupled": {"method": "sjd", "refresh": "coupled"}}
    out += [(b, "", "", baselines[b]) for b in grid.baselines if b != "ar"]
    for delta in grid.csd_delta:
        # the delta is named where several are swept or it is not CSD's default: the tables and curves tell them apart
        label = "csd" if len(grid.csd_delta) == 1 and delta == _CSD_DELTA else f"csd (delta {delta})"
        out += [(label, "lam", lam, {"method": CSD(lam=lam, delta=delta, entropy_unit=entropy_unit)})
                for lam in grid.csd_lam]
    out += [("addition", "c", c, {"method": Addition(c=c)}) for c in grid.addition_c]
    if codebook is not None:
        out += [("gsd", "radius", r, {"method": GSD(codebook, radius=r)}) for r in grid.gsd_radius]
        out += [("lantern", "delta", d, lantern_preset(Lantern(codebook, delta=d))) for d in grid.lantern_delta]
    return out


def settings(grid: SweepGrid, codebook: torch.Tensor | None = None, entropy_unit: str = "nats") -> list[Setting]:
    """Every setting of the grid (AR once, at window 1); GSD and LANTERN only with a codebook ``[V, D]``,
    once per window and value (they always draft one-hot, whatever ``draft_inits`` lists).

    ``entropy_unit`` goes to every CSD rule.

    Raises:
        ValueError: an unknown baseline name, no draft initialisation (every method but AR runs once per
            entry of ``draft_inits``), or a bad parameter value (from the rules).
    """
    if not grid.draft_inits:
        from csdgen.drafting import DRAFT_INITS

        raise ValueError(f"draft_inits=[]: every method but AR runs once per draft initialisation; allowed: at least "
                         f"one of {', '.join(DRAFT_INITS)}")
    unknown = [b for b in grid.baselines if b not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baselines {', '.join(map(repr, unknown))}; allowed: {', '.join(BASELINES)}")
    # AR has no drafts: its draft_init is empty
    points = [Setting("ar", "ar", "", "", 1, "", {"method": "ar"})] if "ar" in grid.baselines else []
    for window in grid.windows:
        for init in grid.draft_inits:
            for method, parameter, value, preset in _methods(grid, codebook, entropy_unit):
                tag = f"{method.split(' ')[0]}{'_' + parameter + str(value) if parameter else ''}"
                if method.startswith("csd ("):
                    # a delta other than CSD's default is named even alone: a rerun with another one into the
                    # same folder is then other settings, not the earlier ones' records under the same name
                    tag += f"_delta{preset['method'].delta}"
                needed = getattr(preset["method"], "draft_init", None)  # GSD, LANTERN: one-hot drafts
                # the refresh is named (the papers' independent one unless the setting says coupled), so a
                # setting means the same whatever generate's default refresh is
                preset = {"draft_init": init if needed is None else needed, "refresh": "independent", **preset}
                name = f"{tag}_W{window}_{preset['draft_init']}"
                if any(point.name == name for point in points):  # GSD, LANTERN: one-hot whatever --draft-inits
                    continue
                points.append(Setting(name, method, parameter, value, window, preset["draft_init"], preset))
    return points


def frontier_plot(rows: list[dict], path, scores=("class_consistency", "frechet_distance", "nll")) -> None:
    """Step compression (x) against each quality score (one panel each), one curve per method.

    Args:
        rows: sweep rows with keys ``method``, ``value``, ``step_compression`` and the scores.
        path: PNG file to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    better = {"class_consistency": "higher is better", "frechet_distance": "lower is better", "nll": "lower is better",
              "clip": "higher is better", "fid": "lower is better"}
    fig, axes = plt.subplots(1, len(scores), figsize=(5.2 * len(scores), 4.2), squeeze=False)
    axes = axes[0]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for ax, score in zip(axes, scores):
        for method in methods:
            pts = sorted((r["step_compression"], r[score], r["value"]) for r in rows if r["method"] == method)
            style = "o-" if len(pts) > 1 else "s"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=method, markersize=5)
            for x, y, v in pts:
                if v != "":
                    ax.annotate(str(v), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        ax.set_xlabel("step compression (image tokens per forward)")
        ax.set_ylabel(f"{score.replace('_', ' ')} ({better.get(score, '')})")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
