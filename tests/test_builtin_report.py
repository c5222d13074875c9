"""benchmarks/builtin_report.py, the one command after training: bench rows with top-1 class
agreement, the AR noise floor, step compression, the entropy/texture evidence and the grid, on
tiny random built-in weights (2 images, the fewest the report takes; the real emoji row of the grid
replaced by blank tiles, since the npm package is training-time data)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from builtin_fixture import make_tiny_weights

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import builtin_grid  # noqa: E402
import builtin_report  # noqa: E402


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_tiny_weights(tmp_path_factory.mktemp("weights"))


def test_class_agreement_is_the_top1_of_the_classifier(weights):
    from csdgen.evaluation.quality import QualityScorer
    from csdgen.models.builtin import load_builtin_model

    model = load_builtin_model(weights)
    scorer = QualityScorer(model)
    images = torch.rand(6, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        top1 = model.components.classifier(images).argmax(-1)
    assert scorer.class_agreement(images, top1.tolist()).all()
    other = ((top1 + 1) % model.num_classes).tolist()  # control: any other class never agrees
    assert not scorer.class_agreement(images, other).any()
    names = [model.class_names[c] for c in top1.tolist()]
    assert scorer.class_agreement(images, names).all()


def test_report_on_tiny_weights(weights, tmp_path, monkeypatch):
    blank = lambda model, classes: np.full((len(classes), 64, 64, 3), 255, np.uint8)  # noqa: E731
    monkeypatch.setattr(builtin_grid, "real_images", blank)
    out = tmp_path / "report"
    argv = ["--weights", str(weights), "--out", str(out), "--images", "2", "--window", "16",
            "--grid-classes", "dog face,red apple", "--grid-seeds", "0", "--threads", "1", "--docs", str(tmp_path / "docs")]
    assert builtin_report.main(argv) == 0
    report = json.loads((out / "builtin_report.json").read_text())
    assert list(report["rows"]) == ["ar", "sjd", "sjd-coupled", "csd", "ar@seed1"]
    for name, row in report["rows"].items():
        assert row["images"] == 2
        assert 0 <= row["top1_agreement"] <= 1 and 0 <= row["class_probability"] <= 1
        assert row["step_compression"] >= 1.0 - 1e-9
    assert report["rows"]["ar"]["step_compression"] == 1.0
    floor = report["noise_floor"]
    assert floor["floor_row"] == "ar@seed1" and set(floor["methods"]) == {"sjd", "sjd-coupled", "csd"}
    for m in floor["methods"].values():
        assert m["inside"] == (abs(m["gap"]) <= floor["ar_gap"])
    assert set(report["texture"]) == {"sjd", "sjd-coupled", "csd"}
    for t in report["texture"].values():
        assert len(t["relaxed_by_texture"]) == 4 and -1 <= t["spearman_pooled"] <= 1
    assert sum(report["texture"]["sjd"]["relaxed_by_texture"]) == 0  # SJD never relaxes: a check of the columns
    assert report["grid"]["names"] == ["dog face", "red apple"]
    assert [(r["method"], r["seed"]) for r in report["grid"]["rows"]] == [("AR", 0), ("CSD", 0)]
    width, height = Image.open(out / "builtin_grid.png").size
    assert (width, height) == (builtin_grid.LABEL_W + 2 * builtin_grid.CELL, 3 * builtin_grid.CELL + builtin_grid.NAME_H)
    assert (tmp_path / "docs" / "builtin_grid.png").read_bytes() == (out / "builtin_grid.png").read_bytes()
    text = (out / "builtin_report.md").read_text()
    assert "| csd | 2 | 16 |" in text and "Entropy against texture" in text and "--images 2" in text
    # rerun resumes bench (no new images) and gives the same figures
    assert builtin_report.main(argv) == 0
    again = json.loads((out / "builtin_report.json").read_text())
    assert again["rows"] == report["rows"] and again["texture"] == report["texture"]
