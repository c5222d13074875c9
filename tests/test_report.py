"""The benchmark report: the paper's columns, the noise floor row, plots, atomic files, one-line errors."""

import csv
import io
import json

import pytest
import torch
from PIL import Image

from csdgen.evaluation.report import SCHEMA, accepted_length_histogram, read_records, row_key, table_rows, to_markdown, write_report
from csdgen.evaluation.texture import SpeedSources


def record(method, seed, prompt, latency, steps, *, tokens=16, clip=None, nll=None, hist=None, memory=None, **extra):
    out = {"schema": SCHEMA, "method": method, "seed": seed, "prompt_id": f"{prompt:04d}", "prompt_index": prompt,
           "prompt": f"prompt {prompt}", "image": f"images/{method}/{seed}/{prompt:04d}.png",
           "settings": {"window": 16 if method != "ar" else 1, "guidance": 3.0}, "num_tokens": tokens, "steps": steps,
           "step_compression": tokens / steps, "latency_s": latency, "batch_size": 1, "peak_memory_bytes": memory,
           "accepted_length_histogram": hist if hist is not None else [0, tokens], "device": "cpu"}
    out.update({k: v for k, v in {"clip": clip, "nll": nll}.items() if v is not None}, **extra)
    return out


def records():
    """AR at seeds 0 and 1 (the noise floor), CSD at seed 0; two prompts each."""
    return [
        record("ar", 0, 0, 2.0, 16, clip=30.0, nll=3.0, memory=2**30),
        record("ar", 0, 1, 4.0, 16, clip=32.0, nll=3.2, memory=2**31),
        record("csd", 0, 0, 0.5, 4, clip=29.0, nll=3.5, hist=[0, 1, 0, 1, 3]),  # 1 + 3 + 12 = 16 tokens in 5 steps
        record("csd", 0, 1, 1.0, 8, clip=31.0, nll=3.7, hist=[0, 4, 6]),
        record("ar", 1, 0, 2.2, 16, clip=30.4, nll=3.1),
        record("ar", 1, 1, 3.8, 16, clip=31.0, nll=3.1),
    ]


def test_rows_have_the_papers_columns_with_known_values():
    rows = {row["method"]: row for row in table_rows(records(), scores={"csd": {"fid": 21.5}, "ar": {"fid": 20.0},
                                                                        "ar@seed1": {"fid": 20.7}})}
    assert list(rows) == ["ar", "csd", "ar@seed1"]  # primary seed first, the noise floor last
    ar, csd, floor = rows["ar"], rows["csd"], rows["ar@seed1"]
    assert ar["latency_s_per_image"] == pytest.approx(3.0) and ar["acceleration"] == pytest.approx(1.0)
    assert csd["latency_s_per_image"] == pytest.approx(0.75) and csd["acceleration"] == pytest.approx(4.0)
    assert floor["acceleration"] == pytest.approx(3.0 / 3.0)
    assert csd["step_compression"] == pytest.approx((16 / 4 + 16 / 8) / 2) and csd["steps"] == pytest.approx(6)
    assert csd["mean_accepted_length"] == pytest.approx((1 + 3 + 12 + 4 + 12) / (5 + 10))
    assert ar["mean_accepted_length"] == pytest.approx(1.0)
    assert csd["clip"] == pytest.approx(30.0) and csd["nll"] == pytest.approx(3.6) and csd["fid"] == 21.5
    assert ar["peak_memory_gib"] == pytest.approx(2.0) and csd["peak_memory_gib"] is None
    assert floor["seed"] == 1 and floor["images"] == 2 and floor["fid"] == 20.7
    assert row_key("ar", 1, 0) == "ar@seed1" and row_key("csd", 0, 0) == "csd"


def test_given_scores_override_record_means_and_unknown_rows_or_scores_fail():
    rows = table_rows(records(), scores={"csd": {"clip": 33.3}})
    assert rows[1]["clip"] == 33.3
    with pytest.raises(ValueError, match="scores given for 'lantern', which has no records"):
        table_rows(records(), scores={"lantern": {"fid": 1.0}})
    with pytest.raises(ValueError, match="unknown score 'hpsv2' for 'csd'"):
        table_rows(records(), scores={"csd": {"hpsv2": 1.0}})


def test_markdown_leaves_out_empty_columns_and_marks_missing_values():
    bare = [record("sjd", 0, 0, 1.0, 8), record("sjd", 0, 1, 1.0, 8)]
    text = to_markdown(table_rows(bare))
    assert "CLIP" not in text and "FID" not in text and "peak memory" not in text
    assert "| sjd | 0 | 2 | 1.000 | — | 8.0 | 2.00 | 1.00 |" in text  # no AR: acceleration unknown


def test_write_report_files(tmp_path):
    sources = SpeedSources()
    g = torch.Generator().manual_seed(0)
    sources.add(torch.randint(0, 4, (2, 16), generator=g), torch.rand(2, 16, generator=g), torch.rand(2, 3, 8, 8, generator=g), (4, 4))
    written = write_report(records(), tmp_path / "report", scores={"csd": {"fid": 21.5}, "ar": {"fid": 20.0}},
                           texture={"csd": sources.summary()}, notes=["machine: test"])
    assert set(written) == {"report.md", "report.csv", "acceptance_lengths.csv", "speed_quality_clip.png",
                            "speed_quality_fid.png", "speed_quality_nll.png", "texture.csv"}
    md = written["report.md"].read_text()
    for header in ("latency (s/image)", "acceleration (latency)", "step compression", "CLIP", "FID", "NLL (nats/token)"):
        assert header in md
    assert "| csd | 0 | 2 | 0.750 | 4.00x |" in md
    assert "Noise floor: ar, ar@seed1" in md and "- machine: test" in md
    assert "## Where the speed comes from" in md and "![FID](speed_quality_fid.png)" in md
    assert '`csd`: `{"guidance": 3.0, "window": 16}`' in md
    rows = list(csv.DictReader(io.StringIO(written["report.csv"].read_text())))
    assert [r["method"] for r in rows] == ["ar", "csd", "ar@seed1"]
    assert float(rows[1]["acceleration"]) == pytest.approx(4.0) and rows[2]["fid"] == ""
    lengths = list(csv.reader(io.StringIO(written["acceptance_lengths.csv"].read_text())))
    assert ["csd", "0", "4", "3"] in lengths and ["csd", "0", "2", "6"] in lengths and ["ar", "0", "1", "32"] in lengths
    with Image.open(written["speed_quality_fid.png"]) as image:
        assert image.size[0] > 300 and image.format == "PNG"
    assert len(list(csv.DictReader(io.StringIO(written["texture.csv"].read_text())))) == 8
    assert not list((tmp_path / "report").glob(".*.tmp"))  # atomic writes leave no temporary files


def test_a_later_report_in_the_same_folder_removes_the_plots_and_texture_table_it_does_not_write(tmp_path):
    """bench --methods ar after bench --methods ar,sjd,csd --clip-model ... in the same --out left the first
    command's texture.csv (sjd and csd rows) and speed_quality_clip.png / _fid.png beside the new report,
    which docs/bench.md says hold this command's methods (new-user try-out)."""
    sources = SpeedSources()
    g = torch.Generator().manual_seed(0)
    sources.add(torch.randint(0, 4, (2, 16), generator=g), torch.rand(2, 16, generator=g), torch.rand(2, 3, 8, 8, generator=g), (4, 4))
    folder = tmp_path / "report"
    write_report(records(), folder, scores={"csd": {"fid": 21.5}}, texture={"csd": sources.summary()})
    assert {"texture.csv", "speed_quality_clip.png", "speed_quality_fid.png"} <= {p.name for p in folder.iterdir()}
    ar_only = [{k: v for k, v in r.items() if k != "clip"} for r in records() if r["method"] == "ar"]
    written = write_report(ar_only, folder)
    assert {p.name for p in folder.iterdir()} == set(written) == {"report.md", "report.csv", "acceptance_lengths.csv",
                                                                 "speed_quality_nll.png"}


def test_rank_files_merge_and_bad_records_are_one_line_errors(tmp_path):
    data = records()
    (tmp_path / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data[0::2]))
    (tmp_path / "rank1.jsonl").write_text("\n".join(json.dumps(r) for r in data[1::2]) + "\n\n")
    merged = read_records([tmp_path / "rank0.jsonl", tmp_path / "rank1.jsonl"])
    assert table_rows(merged) == table_rows(data)
    written = write_report([tmp_path / "rank0.jsonl", tmp_path / "rank1.jsonl"], tmp_path / "out")
    assert "report.md" in written
    bad = {
        "lacks.jsonl": (json.dumps({k: v for k, v in data[0].items() if k != "latency_s"}), "lacks.jsonl:1: bench record lacks 'latency_s'"),
        "type.jsonl": (json.dumps({**data[0], "steps": "16"}), "'steps' must be int, got '16'"),
        "schema.jsonl": (json.dumps({**data[0], "schema": "other"}), "schema 'other' is not 'csdgen.bench.v1'"),
        "json.jsonl": ("{oops", "json.jsonl:1: not JSON"),
        "hist.jsonl": (json.dumps({**data[0], "accepted_length_histogram": [1, -2]}), "must be a list of counts >= 0"),
        "clip.jsonl": (json.dumps({**data[0], "clip": "high"}), "'clip' must be a number or null, got 'high'"),
    }
    for name, (line, message) in bad.items():
        (tmp_path / name).write_text(line + "\n")
        with pytest.raises(ValueError) as info:
            read_records([tmp_path / name])
        assert message in str(info.value) and "\n" not in str(info.value), name
    with pytest.raises(ValueError, match="two records for method 'ar', seed 0, prompt '0000'"):
        table_rows(data + data[:1])
    with pytest.raises(ValueError, match="no bench records"):
        table_rows([])


def test_unequal_image_counts_are_flagged(tmp_path):
    written = write_report(records()[:-1], tmp_path)
    assert "Rows cover different numbers of images (1, 2)" in written["report.md"].read_text()


def test_accepted_length_histogram_counts_steps_by_tokens_committed():
    assert accepted_length_histogram([1, 3, 1, 4]) == [0, 2, 0, 1, 1]
    assert accepted_length_histogram([]) == []
    committed = [1, 5, 2, 2, 6]
    histogram = accepted_length_histogram(committed)
    assert sum(histogram) == len(committed) and sum(L * c for L, c in enumerate(histogram)) == sum(committed)
    with pytest.raises(ValueError, match="must be >= 0, got -1"):
        accepted_length_histogram([1, -1])


def test_the_reports_sampling_line_is_words():
    """bench's report header printed ``sampling {'guidance_scale': 3.0, 'temperature': 1.0, ...}``."""
    from csdgen.cli.bench import sampling_text
    from csdgen.sampling import SamplingConfig

    assert sampling_text(SamplingConfig(guidance_scale=3.0, top_k=None)) == \
        "guidance scale 3, temperature 1, top-k none, top-p none"
    assert sampling_text(SamplingConfig(top_k=100, top_p=0.9, top_n_sigma=2.0)) == \
        "guidance scale 1, temperature 1, top-k 100, top-p 0.9, top n sigma 2"


def test_a_score_on_fewer_images_than_it_needs_gets_a_caveat_and_the_speed_floor_is_ar_over_ar():
    from csdgen.evaluation.report import few_images_notes, speed_noise_floor

    rows = [{"method": "ar", "images": 16, "latency_s_per_image": 2.0, "fid": 40.0},
            {"method": "csd", "images": 16, "latency_s_per_image": 1.0, "fid": 41.0},
            {"method": "ar@seed1", "images": 16, "latency_s_per_image": 2.1, "fid": None}]
    assert few_images_notes(rows, {"fid": 2048}) == [
        "FID rests on too few images to mean anything: 16 per row (FID needs >= 2048); compare only rows of equal "
        "counts, never with published figures."]
    assert few_images_notes(rows, {"fid": 16}) == [] and few_images_notes(rows, {}) == []
    assert speed_noise_floor(rows) == pytest.approx({"ar@seed1": 1.05})
    assert speed_noise_floor(rows[:2]) == {}
