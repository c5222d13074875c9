"""Compare decoding methods on the same classes and seeds: speed and quality side by side.

The runs themselves (generated batch by batch, cached in the output folder) are
:func:`csdgen.runs.run_method`; this module names the methods, scores runs and makes tables.

Every method runs the same images (classes and per-batch seeds, see
`csdgen.runs`). AR is run twice, with two seeds: the gap between the two AR
rows is the noise floor of every quality score at this image count.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import torch

from csdgen.acceptance import CSD, GSD, Addition, JacobiMatch, Lantern
from csdgen.evaluation.maps import from_uint8
from csdgen.run_images import decoded_pixels
from csdgen.runs import MethodRun

__all__ = ["lantern_preset", "method_presets", "score_run", "table_rows", "to_markdown", "to_csv"]


def lantern_preset(rule) -> dict[str, Any]:
    """LANTERN runs with one-hot drafts: its relaxation adds target mass to q(x) before dividing by
    p(x), so with uniform drafts (p = 1/V) every random draft passes (measured: noise images)."""
    return {"method": rule, "draft_init": "onehot"}


def method_presets(lam: float = 0.5, delta: float = 0.65, addition_c: float = 0.2,
                   codebook: torch.Tensor | None = None, *, entropy_unit: str = "nats",
                   draft_init: str | None = None) -> dict[str, dict[str, Any]]:
    """Named settings for ``generate``: every method csdgen has, the reference ones first.

    GSD and LANTERN (official defaults) are included when the model's ``codebook`` ``[V, D]`` is given.
    Every row names its refresh: ``"independent"`` (the papers'), ``"coupled"`` for the ``-coupled``
    rows, so a row means the same whatever :func:`csdgen.generate`'s default refresh is.
    ``entropy_unit`` goes to the CSD rules, ``draft_init`` to every method whose rule needs no
    drafts of its own (GSD and LANTERN run with one-hot drafts, see :func:`lantern_preset`);
    None: what the rule needs, else uniform.

    Raises:
        ValueError: a bad lambda, delta, c or entropy unit (from the rules).
    """
    presets = {
        "ar": {"method": "ar"},
        "sjd": {"method": "sjd"},
        "sjd-coupled": {"method": "sjd", "refresh": "coupled"},
        "jacobi": {"method": JacobiMatch()},
        "addition": {"method": Addition(c=addition_c)},
        **({} if codebook is None else {"gsd": {"method": GSD(codebook)}, "lantern": lantern_preset(Lantern(codebook))}),
        "csd": {"method": CSD(lam=lam, delta=delta, entropy_unit=entropy_unit)},
        "csd-coupled": {"method": CSD(lam=lam, delta=delta, entropy_unit=entropy_unit), "refresh": "coupled"},
    }
    out = {}
    for name, preset in presets.items():
        needed = getattr(preset["method"], "draft_init", None)
        # every row names its refresh: "sjd" and "csd" are the papers' (independent) whatever generate's default
        out[name] = {"draft_init": draft_init if needed is None else needed, "refresh": "independent", **preset}
    return out


def score_run(model, scorer, run: MethodRun, classes: list, batch: int = 64) -> tuple[dict[str, float], torch.Tensor]:
    """Quality scores of one run (class consistency as mean p(class) and top-1 agreement, Frechet distance, NLL) and its decoded images ``[M, 3, H, W]``.

    The images are scored as their 8-bit files hold them (:func:`~csdgen.run_images.decoded_pixels`), so the
    scores equal those ``csdgen bench`` computes from its PNGs for the same tokens. ``batch``: images per
    NLL forward."""
    images = from_uint8(decoded_pixels(model, run.tokens))
    nll = torch.cat([scorer.nll(run.tokens[i : i + batch], classes[i : i + batch]) for i in range(0, len(classes), batch)])
    scores = {
        "class_consistency": float(scorer.class_consistency(images, classes).mean()),
        "top1_agreement": float(scorer.class_agreement(images, classes).float().mean()),
        "frechet_distance": scorer.frechet_distance(images),
        "nll": float(nll.mean()),
    }
    return scores, images


def table_rows(runs: list[MethodRun], scores: dict[str, dict[str, float]], reference: str = "ar") -> list[dict]:
    """One row per run: speed figures and the quality scores given for it."""
    base = next(r.seconds for r in runs if r.name == reference)
    rows = []
    for r in runs:
        rows.append({
            "method": r.name,
            "images": len(r.steps),
            "steps": sum(r.steps) / len(r.steps),
            "step_compression": sum(r.compression) / len(r.compression),
            "mean_accepted_length": sum(r.accepted) / len(r.accepted),
            "wall_s": r.seconds,
            "speedup_vs_ar": base / r.seconds if r.seconds > 0 else float("nan"),
            **scores.get(r.name, {}),
        })
    return rows


def timing_caveat(runs: list[MethodRun]) -> str | None:
    """A caveat line where the runs' wall times were not all taken by one call of
    :func:`csdgen.method_runs.run_methods` (images kept from an interrupted, smaller or earlier run were
    timed then, at that run's batch size and machine load), else None.

    A speed-up divides one row's time by another's; times taken in different calls can differ by
    the machine's state alone (a resumed AR row ran 2.12x as fast as the same AR at the next seed)."""
    calls = {c for r in runs for c in r.timed_in}
    if len(calls) <= 1:
        return None
    return (f"caveat: the wall times come from {len(calls)} runs of this command (images kept from an interrupted, "
            f"smaller or earlier run were timed there), so wall_s and speedup_vs_ar compare times not taken "
            f"together; for speed, run into a new --out")


_FORMATS = {"latency_s_per_image": "{:.3f}", "steps": "{:.1f}", "step_compression": "{:.2f}", "mean_accepted_length": "{:.2f}", "wall_s": "{:.2f}", "speedup_vs_ar": "{:.2f}x",
            "class_consistency": "{:.3f}", "top1_agreement": "{:.3f}", "frechet_distance": "{:.2f}", "nll": "{:.3f}"}


def _cell(key: str, value) -> str:
    return _FORMATS.get(key, "{}").format(value) if isinstance(value, (int, float)) else str(value)


def runs_markdown(rows: list[dict], runs: list[MethodRun]) -> str:
    """:func:`to_markdown` of ``rows``, then :func:`timing_caveat` of the ``runs`` they were made from, if any
    (compare's and sweep's tables)."""
    caveat = timing_caveat(runs)
    return to_markdown(rows) + (f"\n{caveat}\n" if caveat else "")


def to_markdown(rows: list[dict]) -> str:
    """A Markdown table of :func:`table_rows` output."""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(k, row.get(k, "")) for k in keys) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict]) -> str:
    """CSV text of :func:`table_rows` output (full precision)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
