"""The benchmark report: the paper's table in Markdown and CSV, and a speed-quality plot per score.

Input: **bench records**, one JSON object a line, one per (prompt, method, seed), as the
bench runner writes them (each rank its own file; this module reads and merges any number).

Record schema ``csdgen.bench.v1`` (``*`` = required; optional fields may be absent or null;
other fields are kept and ignored):

- ``schema`` * (str): ``"csdgen.bench.v1"``.
- ``method`` * (str): method preset name (``"ar"``, ``"sjd"``, ``"csd"``, ...).
- ``seed`` * (int): run seed; the same prompt, method and seed give the same image.
- ``prompt_id`` * (str): :attr:`csdgen.prompts.Prompt.id`; (method, seed, prompt_id) is unique.
- ``prompt_index`` (int): run-wide index of the prompt (the key of the image's random stream).
- ``prompt`` (str): the prompt text.
- ``image`` (str): the PNG's path, relative to the output folder.
- ``settings`` * (object): the generation settings (``GenerationResult.settings``: window,
  guidance scale, temperature, top-k/p, the acceptance rule and its parameters).
- ``num_tokens`` * (int): image tokens N.
- ``steps`` * (int): target forwards until the image was complete (prefill included).
- ``step_compression`` * (float): ``num_tokens / steps`` (1.0 for AR).
- ``latency_s`` * (float): seconds of decoding per image: the wall time of the ``generate``
  call that made the image (device synchronised, after one warm-up call) divided by the
  images in that call.
- ``batch_size`` (int): images decoded together in that call.
- ``peak_memory_bytes`` (int): peak accelerator memory during that call
  (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``); null on a CPU.
- ``accepted_length_histogram`` (list of int): entry ``L`` counts the image's steps that
  committed ``L`` tokens (entry 0: steps that committed none); :func:`accepted_length_histogram`
  makes it from ``ImageStats.committed_per_step``.
- ``device`` (str): e.g. ``"NVIDIA H200"`` or ``"cpu"``.
- ``torch_threads`` (int): ``torch.get_num_threads()`` of the process that made the image (float
  summation order depends on it, so images are reproduced bit for bit at the same count).
- ``clip`` (float): CLIP score of the image (:mod:`csdgen.evaluation.clip_score`).
- ``nll`` (float): target NLL of the image's tokens, nats per token.
- ``class_consistency`` (float): built-in model only, its classifier's probability of the
  requested class (:mod:`csdgen.evaluation.quality`).

Rows of the table are (method, seed) pairs. The **primary seed** is the seed of the first
record (a bench writes its records in job order, so that is the first ``--seeds`` value, as the
noise floor's default seed is counted from it); a row at another seed is labelled ``method@seedS`` (:func:`row_key`): AR at a
second seed is the **noise floor**, the spread of every score between two runs of the same
method; a quality gap smaller than the AR-AR gap is not a measured difference.

Columns (the paper's, plus counts): ``images``, ``latency_s_per_image`` (mean),
``acceleration`` (the reference method's mean latency at the primary seed over this row's:
the papers' "acceleration in latency"), ``steps`` (mean),
``step_compression`` (mean over images of N / steps), ``mean_accepted_length`` (mean over images
of the record's own: tokens committed per forward after the prefill forward, ``(N - 1) / (steps -
1)``, as :attr:`csdgen.ImageStats.mean_accepted_length` and compare's table; from the row's
histograms, pooled, for records without it), ``peak_memory_gib`` (max), ``clip``
(mean per-image CLIP score), ``fid`` (given per row, since FID is a set statistic), ``nll``
(mean); on the built-in model ``class_consistency`` (mean) and ``frechet_distance`` (per
row). Per-row scores passed to :func:`write_report` override record means.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from csdgen.jsonio import json_lines

__all__ = ["SCHEMA", "REQUIRED", "SCORES", "row_key", "accepted_length_histogram", "read_records", "table_rows", "to_markdown", "to_csv", "write_report"]

SCHEMA = "csdgen.bench.v1"
#: Fields every record must have, and their JSON types.
REQUIRED = {"schema": str, "method": str, "seed": int, "prompt_id": str, "settings": dict, "num_tokens": int,
            "steps": int, "step_compression": (int, float), "latency_s": (int, float)}
#: Quality scores: column -> (Markdown header, format, higher is better).
SCORES = {"clip": ("CLIP", "{:.2f}", True), "fid": ("FID", "{:.2f}", False), "nll": ("NLL (nats/token)", "{:.3f}", False),
          # the built-in model's offline analogues of CLIP and FID (csdgen.evaluation.quality)
          "class_consistency": ("class consistency", "{:.3f}", True),
          "frechet_distance": ("Frechet distance (classifier features)", "{:.2f}", False)}

_COLUMNS = {  # CSV key -> (Markdown header, format)
    "method": ("method", "{}"),
    "seed": ("seed", "{}"),
    "images": ("images", "{}"),
    "latency_s_per_image": ("latency (s/image)", "{:.3f}"),
    "acceleration": ("acceleration (latency)", "{:.2f}x"),
    "steps": ("steps", "{:.1f}"),
    "step_compression": ("step compression", "{:.2f}"),
    "mean_accepted_length": ("mean accepted length", "{:.2f}"),
    "peak_memory_gib": ("peak memory (GiB)", "{:.2f}"),
    **{k: (v[0], v[1]) for k, v in SCORES.items()},
}


def row_key(method: str, seed: int, primary_seed: int) -> str:
    """The table's name for a (method, seed) row: ``method`` at the primary seed, else ``method@seedS``."""
    return method if seed == primary_seed else f"{method}@seed{seed}"


def _check(record: Any, where: str) -> dict:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a bench record must be a JSON object, got {type(record).__name__}")
    for name, kind in REQUIRED.items():
        value = record.get(name)
        if value is None:
            raise ValueError(f"{where}: bench record lacks {name!r} (schema {SCHEMA}, see csdgen.evaluation.report)")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{where}: {name!r} must be {getattr(kind, '__name__', 'a number')}, got {value!r}")
    if record["schema"] != SCHEMA:
        raise ValueError(f"{where}: schema {record['schema']!r} is not {SCHEMA!r}")
    for name in ("clip", "nll", "class_consistency", "peak_memory_bytes"):
        value = record.get(name)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ValueError(f"{where}: {name!r} must be a number or null, got {value!r}")
    histogram = record.get("accepted_length_histogram")
    if histogram is not None and (not isinstance(histogram, list)
                                  or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in histogram)):
        raise ValueError(f"{where}: 'accepted_length_histogram' must be a list of counts >= 0, got {histogram!r}")
    return record


def accepted_length_histogram(committed_per_step: Iterable[int]) -> list[int]:
    """The record's ``accepted_length_histogram`` from an image's tokens committed per step
    (``ImageStats.committed_per_step``): entry ``L`` counts the steps that committed ``L`` tokens.

    Example: ``[1, 3, 1, 4]`` -> ``[0, 2, 0, 1, 1]``.
    """
    histogram: list[int] = []
    for length in committed_per_step:
        length = int(length)
        if length < 0:
            raise ValueError(f"tokens committed in a step must be >= 0, got {length}")
        histogram.extend([0] * (length + 1 - len(histogram)))
        histogram[length] += 1
    return histogram


def read_records(paths: Iterable[str | os.PathLike]) -> list[dict]:
    """Bench records from JSON-line files (e.g. one per rank), in file order; blank lines skipped.

    Raises:
        ValueError: a line that is not JSON or not a valid record (one line naming file and line).
        FileNotFoundError: a missing file.
    """
    records = []
    for path in paths:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        for number, record in json_lines(lines, str(path), objects=False):
            records.append(_check(record, f"{path}:{number}"))
    return records


def _mean_accepted_length(group: list[dict], histogram: list[int]) -> float | None:
    """The row's mean accepted length: the mean over images of each record's own (tokens per
    forward after the prefill), as compare's table and the record (one name, one definition); a
    row with a record lacking it (hand-made) falls back to ``histogram`` pooled over the row's steps."""
    if all(isinstance(r.get("mean_accepted_length"), (int, float)) for r in group):
        return _mean([r["mean_accepted_length"] for r in group])
    steps = sum(histogram)
    return sum(length * count for length, count in enumerate(histogram)) / steps if steps else None


def _mean(values: list[float]) -> float | None:
    values = [float(v) for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _group(records: list[dict]) -> tuple[dict[tuple[str, int], list[dict]], int]:
    if not records:
        raise ValueError("no bench records: nothing to report")
    groups: dict[tuple[str, int], list[dict]] = {}
    seen: set[tuple[str, int, str]] = set()
    for i, record in enumerate(records):
        _check(record, f"record {i}")
        key = (record["method"], int(record["seed"]), record["prompt_id"])
        if key in seen:
            raise ValueError(f"two records for method {key[0]!r}, seed {key[1]}, prompt {key[2]!r}: merge rank files once")
        seen.add(key)
        groups.setdefault(key[:2], []).append(record)
    primary = next(iter(groups))[1]  # the first record's seed
    order = sorted(groups, key=lambda k: (k[1] != primary, list(groups).index(k)))
    return {k: groups[k] for k in order}, primary


def _histogram(records: list[dict]) -> list[int]:
    total: list[int] = []
    for record in records:
        for length, count in enumerate(record.get("accepted_length_histogram") or []):
            total.extend([0] * (length + 1 - len(total)))
            total[length] += int(count)
    return total


def table_rows(records: list[dict], scores: Mapping[str, Mapping[str, float]] | None = None,
               reference: str = "ar") -> list[dict]:
    """One row per (method, seed): the report's columns as plain numbers (None where unknown).

    Args:
        records: bench records (:data:`SCHEMA`).
        scores: optional per-row scores, keyed by :func:`row_key` (e.g. ``{"csd": {"fid": 21.3}}``);
            they override the means of per-image ``clip`` / ``nll`` fields.
        reference: the method whose latency at the primary seed defines acceleration 1.

    Returns:
        Rows in record order of methods, the primary seed first, then other seeds.

    Raises:
        ValueError: no records, an invalid record, duplicates, or an unknown score name.
    """
    groups, primary = _group(records)
    scores = dict(scores or {})
    keys = {row_key(m, s, primary) for m, s in groups}
    for key, values in scores.items():
        if key not in keys:
            raise ValueError(f"scores given for {key!r}, which has no records (rows: {', '.join(sorted(keys))})")
        unknown = set(values) - set(SCORES)
        if unknown:
            raise ValueError(f"unknown score {sorted(unknown)[0]!r} for {key!r}: scores are {', '.join(SCORES)}")
    base = groups.get((reference, primary))
    base_latency = _mean([r["latency_s"] for r in base]) if base else None
    rows = []
    for (method, seed), group in groups.items():
        latency = _mean([r["latency_s"] for r in group])
        histogram = _histogram(group)
        memory = [r["peak_memory_bytes"] for r in group if r.get("peak_memory_bytes") is not None]
        row = {
            "method": row_key(method, seed, primary),
            "seed": seed,
            "images": len(group),
            "latency_s_per_image": latency,
            "acceleration": base_latency / latency if base_latency and latency else None,
            "steps": _mean([r["steps"] for r in group]),
            "step_compression": _mean([r["step_compression"] for r in group]),
            "mean_accepted_length": _mean_accepted_length(group, histogram),
            "peak_memory_gib": max(memory) / 2**30 if memory else None,
            "clip": _mean([r.get("clip") for r in group]),
            "fid": None,
            "nll": _mean([r.get("nll") for r in group]),
            "class_consistency": _mean([r.get("class_consistency") for r in group]),
            "frechet_distance": None,
        }
        row.update({k: (None if v is None else float(v)) for k, v in scores.get(row["method"], {}).items()})
        rows.append(row)
    return rows


def _cell(key: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return _COLUMNS[key][1].format(value) if key in _COLUMNS else str(value)


def to_markdown(rows: list[dict]) -> str:
    """A Markdown table of :func:`table_rows` output; optional columns (accepted length, memory,
    scores) with no value in any row are left out, the speed columns always shown."""
    always = ("method", "seed", "images", "latency_s_per_image", "acceleration", "steps", "step_compression")
    keys = [k for k in _COLUMNS if k in always or any(row.get(k) is not None for row in rows)]
    lines = ["| " + " | ".join(_COLUMNS[k][0] for k in keys) + " |", "|" + "|".join("---" for _ in keys) + "|"]
    lines += ["| " + " | ".join(_cell(k, row.get(k)) for k in keys) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict]) -> str:
    """CSV text of :func:`table_rows` output: every column, full precision, empty where unknown."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows([{k: ("" if row.get(k) is None else row[k]) for k in _COLUMNS} for row in rows])
    return buffer.getvalue()


def _atomic_write(path: Path, data: str | bytes) -> None:
    from csdgen.atomic import write_atomic

    write_atomic(path, lambda tmp: tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data))


def _plot(rows: list[dict], score: str, reference: str) -> bytes:
    """PNG bytes: score against acceleration, one labelled point per row, the AR-AR gap as a band."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    header, _, higher_better = SCORES[score]
    points = [(row["acceleration"], row[score], row["method"]) for row in rows
              if row.get(score) is not None and row.get("acceleration") is not None]
    figure = Figure(figsize=(5.5, 4), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    floor = [row[score] for row in rows if row["method"].split("@")[0] == reference and row.get(score) is not None]
    if len(floor) >= 2:
        axes.axhspan(min(floor), max(floor), color="0.85", label=f"noise floor ({reference} at two seeds)")
    for x, y, label in points:
        axes.scatter([x], [y], color="tab:blue" if "@" not in label else "0.4", zorder=3)
        axes.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes.set_xlabel(f"acceleration in latency over {reference} (x)")
    axes.set_ylabel(f"{header} ({'higher' if higher_better else 'lower'} is better)")
    axes.set_title(f"Speed and quality: {header}")
    axes.grid(alpha=0.3)
    if len(floor) >= 2:
        axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _texture_section(texture: Mapping[str, Any]) -> tuple[str, str]:
    lines = ["", "## Where the speed comes from", "",
             "Share of tokens sampled / accepted / relaxed / resampled per quartile of local texture (mean "
             "pixel-gradient magnitude under the token; 1 = smoothest) and of target entropy (1 = lowest), "
             "with the Spearman rank correlation of entropy with texture (csdgen.evaluation.texture).", ""]
    rows_csv = []
    for method, summary in texture.items():
        lines += [f"**{method}**: {summary.num_images} images, {summary.num_tokens} tokens; Spearman(entropy, texture) "
                  f"{summary.spearman_pooled:+.2f} pooled, {summary.spearman_within_image:+.2f} within images.", "",
                  "| by | quartile | tokens | mean texture | mean entropy (nats) | sampled | accepted | relaxed | resampled |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in summary.rows():
            lines.append(f"| {row['by']} | {row['quartile']} | {row['tokens']} | {row['mean_texture']:.4f} | "
                         f"{row['mean_entropy_nats']:.2f} | {row['sampled']:.1%} | {row['accepted']:.1%} | "
                         f"{row['relaxed']:.1%} | {row['resampled']:.1%} |")
            rows_csv.append({"method": method, **row, "spearman_pooled": summary.spearman_pooled,
                             "spearman_within_image": summary.spearman_within_image})
        lines.append("")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows_csv[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows_csv)
    return "\n".join(lines), buffer.getvalue()


def speed_noise_floor(rows: list[dict], reference: str = "ar") -> dict[str, float]:
    """Latency of ``reference`` at each other seed over its latency at the primary seed (the first
    row of ``reference``), keyed by row name (e.g. ``{"ar@seed1": 1.012}``): how far two runs of one
    method differ in speed on this machine. Empty when ``reference`` has fewer than two rows."""
    floor = [row for row in rows if row["method"].split("@")[0] == reference and row.get("latency_s_per_image")]
    if len(floor) < 2:
        return {}
    base = floor[0]["latency_s_per_image"]
    return {row["method"]: row["latency_s_per_image"] / base for row in floor[1:]}


def few_images_notes(rows: list[dict], min_images: Mapping[str, int]) -> list[str]:
    """One caveat line per score some row holds on fewer images than ``min_images[score]``, e.g.
    ``FID rests on too few images to mean anything: 16 per row (FID needs >= 2048); ...``."""
    notes = []
    for score, minimum in min_images.items():
        counts = sorted({row["images"] for row in rows if row.get(score) is not None and row["images"] < minimum})
        if counts:
            name = SCORES[score][0]
            notes.append(f"{name} rests on too few images to mean anything: {', '.join(map(str, counts))} per row "
                         f"({name} needs >= {minimum}); compare only rows of equal counts, never with published figures.")
    return notes


def write_report(records: list[dict] | Iterable[str | os.PathLike], out_dir: str | os.PathLike, *,
                 scores: Mapping[str, Mapping[str, float]] | None = None, texture: Mapping[str, Any] | None = None,
                 reference: str = "ar", title: str = "csdgen bench", notes: Iterable[str] = (),
                 min_images: Mapping[str, int] | None = None) -> dict[str, Path]:
    """Write ``report.md``, ``report.csv``, ``acceptance_lengths.csv``, ``speed_quality_<score>.png``
    for each score some row has, and ``texture.csv`` when ``texture`` is given. Every file is
    written atomically (temporary file, then rename), so a reader never sees half a report. A
    ``speed_quality_<score>.png`` or ``texture.csv`` of an earlier report in ``out_dir`` that this
    one does not write is removed.

    Args:
        records: bench records, or paths of JSON-line files holding them (e.g. one per rank).
        out_dir: folder for the report (created).
        scores: per-row scores keyed by :func:`row_key` (see :func:`table_rows`).
        texture: per-method :class:`~csdgen.evaluation.texture.SpeedSourceSummary`, keyed by row name.
        reference: the method of acceleration 1 and of the noise floor.
        title: the Markdown title.
        notes: extra lines for the Markdown header (machine, prompt set, command, ...).
        min_images: per score (``"fid"``, ``"frechet_distance"``), the images a row needs for that
            score to mean anything; a row scored on fewer gets a caveat line naming the score, its
            count and the minimum (:func:`few_images_notes`).

    Returns:
        ``{name: path}`` of the files written.

    Raises:
        ValueError: see :func:`table_rows` and :func:`read_records`.
    """
    records = list(records)
    if records and not isinstance(records[0], dict):
        records = read_records(records)
    rows = table_rows(records, scores, reference)
    groups, primary = _group(records)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}

    def put(name: str, data: str | bytes) -> None:
        _atomic_write(out / name, data)
        written[name] = out / name

    floor = [row for row in rows if row["method"].split("@")[0] == reference]
    md = [f"# {title}", "", *[f"- {note}" for note in notes],
          f"- {len(records)} records; rows are (method, seed); primary seed {primary}; acceleration is in latency "
          f"over {reference} at seed {primary}.", ""]
    if len(floor) >= 2:
        md.insert(-1, f"- Noise floor: {', '.join(r['method'] for r in floor)} are the same method at different seeds; "
                      "quality gaps smaller than theirs are not measured differences.")
        speed = speed_noise_floor(rows, reference)
        if speed:
            md.insert(-1, "- Speed noise floor: latency " + ", ".join(f"{name} / {reference} = {ratio:.3f}"
                                                                   for name, ratio in speed.items())
                      + " (the same method at another seed, timed interleaved with every method: latency gaps within "
                        "this of 1 are not measured differences).")
    for note in few_images_notes(rows, min_images or {}):
        md.insert(-1, f"- {note}")
    counts = {row["images"] for row in rows}
    if len(counts) > 1:
        md.insert(-1, f"- Rows cover different numbers of images ({', '.join(map(str, sorted(counts)))}): "
                      "an incomplete run; compare rows of equal counts.")
    md += [to_markdown(rows), "## Settings", ""]
    for (method, seed), group in groups.items():
        settings = [json.dumps(r["settings"], sort_keys=True) for r in group]
        shown = settings[0] if len(set(settings)) == 1 else f"{len(set(settings))} different settings; first: {settings[0]}"
        md.append(f"- `{row_key(method, seed, primary)}`: `{shown}`")
    plots = [score for score in SCORES if any(row.get(score) is not None for row in rows)]
    if plots:
        md += ["", "## Speed and quality", ""] + [f"![{SCORES[s][0]}](speed_quality_{s}.png)\n" for s in plots]
    texture_csv = None
    if texture:
        section, texture_csv = _texture_section(texture)
        md.append(section)
    put("report.csv", to_csv(rows))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["method", "seed", "accepted_length", "steps"])
    for (method, seed), group in groups.items():
        writer.writerows([row_key(method, seed, primary), seed, length, count]
                         for length, count in enumerate(_histogram(group)) if count)
    put("acceptance_lengths.csv", buffer.getvalue())
    for score in plots:
        put(f"speed_quality_{score}.png", _plot(rows, score, reference))
    if texture_csv is not None:
        put("texture.csv", texture_csv)
    # the files an earlier report in this folder wrote that this one does not (a score or a method it has not):
    # left in place they would show another command's rows as this one's
    stale = [f"speed_quality_{score}.png" for score in SCORES if score not in plots]
    stale += [] if texture_csv is not None else ["texture.csv"]
    for name in stale:
        (out / name).unlink(missing_ok=True)
    put("report.md", "\n".join(md).rstrip() + "\n")
    return written
