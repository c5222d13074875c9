"""Prompt sets: the shipped COCO and Parti files, user files, and one-line errors."""

import csv
import json
from pathlib import Path

import pytest

from csdgen.prompts import Prompt, load_prompts

ROOT = Path(__file__).resolve().parents[1]
# ../shared/data beside the project (a worktree sits one level deeper)
SHARED = next((p for p in (ROOT.parent / "shared" / "data", ROOT.parent.parent / "shared" / "data") if p.is_dir()),
              ROOT.parent / "shared" / "data")


def test_coco_is_the_first_caption_of_each_of_the_5000_val_images():
    prompts = load_prompts("coco")
    assert len(prompts) == 5000
    assert len({p.id for p in prompts}) == 5000
    first = prompts[0]
    assert first == Prompt(id="000000000139", text="A woman stands in the dining area at the table.",
                           reference="000000000139.jpg")
    assert all(p.reference == f"{p.id}.jpg" for p in prompts)
    assert all(p.text == " ".join(p.text.split()) and p.text for p in prompts)
    source = SHARED / "coco2017_val_captions.jsonl"
    if not source.is_file():
        pytest.skip("../shared/data is not here")
    full = [json.loads(line) for line in source.read_text().splitlines()]
    assert [p.text for p in prompts] == [" ".join(r["captions"][0].split()) for r in full]
    assert [p.reference for p in prompts] == [r["file_name"] for r in full]


def test_parti_has_1632_prompts_with_categories_in_file_order():
    prompts = load_prompts("parti")
    assert len(prompts) == 1632
    assert prompts[0] == Prompt(id="0001", text="bond", category="Abstract")
    assert prompts[-1].id == "1632"
    source = SHARED / "PartiPrompts.tsv"
    if source.is_file():
        rows = list(csv.DictReader(source.read_text().splitlines(), delimiter="\t"))
        assert [p.text for p in prompts] == [" ".join(r["Prompt"].split()) for r in rows]
        assert [p.category for p in prompts] == [r["Category"] for r in rows]


def test_limit_and_offset_slice_with_stable_ids():
    everything = load_prompts("parti")
    assert load_prompts("parti", limit=3, offset=10) == everything[10:13]
    assert load_prompts("parti", offset=1630) == everything[1630:]
    assert load_prompts("parti", limit=10_000, offset=1631) == everything[1631:]


def test_text_file_skips_blank_lines_and_numbers_ids_by_line(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("a red cube\n\n   a  blue\tsphere  \nthird\n")
    prompts = load_prompts(path)
    assert [(p.id, p.text) for p in prompts] == [("00001", "a red cube"), ("00003", "a blue sphere"), ("00004", "third")]
    assert load_prompts(str(path), offset=1) == prompts[1:]


def test_jsonl_and_tsv_files(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"image_id": 7, "file_name": "x.jpg", "captions": ["first  one", "second"]}) + "\n"
                     + json.dumps({"id": "k-2", "prompt": "a cat", "category": "Animals"}) + "\n")
    assert load_prompts(jsonl) == [Prompt("000000000007", "first one", None, "x.jpg"), Prompt("k-2", "a cat", "Animals")]
    tsv = tmp_path / "p.tsv"
    tsv.write_text("Prompt\tCategory\nan owl\tAnimals\n")
    assert load_prompts(tsv) == [Prompt("0001", "an owl", "Animals")]


@pytest.mark.parametrize("source, kwargs, message", [
    ("cocoa", {}, "unknown prompt set 'cocoa': use one of coco, parti"),
    ("parti", {"offset": 1632}, "offset 1632: allowed an integer in 0..1631"),
    ("parti", {"offset": -1}, "offset -1: allowed an integer in 0..1631"),
    ("parti", {"limit": 0}, "limit 0: allowed a positive integer or None"),
    ("coco", {"limit": 2.5}, "limit 2.5: allowed a positive integer or None"),
])
def test_bad_sets_and_slices_are_one_line_errors(source, kwargs, message):
    with pytest.raises(ValueError) as info:
        load_prompts(source, **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_files_are_one_line_errors(tmp_path):
    cases = {
        "empty.txt": ("\n  \n", "holds no prompts"),
        "empty.jsonl": ("", "holds no prompts"),
        "bad.jsonl": ('{"caption": "ok"}\nnot json\n', "bad.jsonl:2: not a JSON object"),
        "nofield.jsonl": ('{"title": "x"}\n', "nofield.jsonl:1: no prompt"),
        "nohead.tsv": ("an owl\tAnimals\n", "needs a header line with a 'Prompt' column"),
        "dup.jsonl": ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', "id 'a' appears twice"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_text(content)
        with pytest.raises(ValueError) as info:
            load_prompts(path)
        assert message in str(info.value) and "\n" not in str(info.value), name


def test_a_prompts_file_with_invalid_utf8_is_named_and_a_bom_is_dropped(tmp_path):
    from types import SimpleNamespace

    from csdgen.cli.generate import _read_prompts
    from csdgen.prompts import load_prompts

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a red fox\nna\xefve caf\xe9\n")
    for call in (lambda: load_prompts(bad), lambda: _read_prompts(SimpleNamespace(prompts=None, prompts_file=bad))):
        with pytest.raises(ValueError) as info:
            call()
        assert str(bad) in str(info.value) and "not UTF-8" in str(info.value) and "line 2" in str(info.value)
    bom = tmp_path / "bom.txt"
    bom.write_bytes("\ufeffa red fox\na lighthouse\n".encode("utf-8"))
    assert [p.text for p in load_prompts(bom)] == ["a red fox", "a lighthouse"]
    assert _read_prompts(SimpleNamespace(prompts=None, prompts_file=bom)) == ["a red fox", "a lighthouse"]


def test_a_pipe_or_device_as_prompt_file_is_named_so():
    """A new user's try-out: /dev/null and a shell's <(...) were called files that "do not exist"."""
    import os

    from csdgen.prompts import load_prompts

    with pytest.raises(ValueError, match=r"prompt file '/dev/null' is not a regular file \(a pipe or a device\)"):
        load_prompts("/dev/null")
    read, write = os.pipe()
    try:
        with pytest.raises(ValueError, match=r"is not a regular file \(a pipe or a device\)"):
            load_prompts(f"/dev/fd/{read}")
    finally:
        os.close(read)
        os.close(write)
