"""csdgen.folder_kinds: a folder's kind by its marker files, and the refusal of another kind."""

import pytest

from csdgen.folder_kinds import kind_of, refuse_other_kind


def test_each_marker_names_its_kind_and_another_kind_is_refused(tmp_path):
    assert kind_of(tmp_path) == [] and kind_of(tmp_path / "missing") == []
    (tmp_path / "notes.txt").write_text("mine")
    refuse_other_kind(tmp_path, "run")  # a folder of the user's own files: no kind
    for marker, kind in (("record.json", "run"), ("bench.json", "bench"), ("run_csd.json", "cached runs")):
        folder = tmp_path / kind.replace(" ", "_")
        folder.mkdir()
        (folder / marker).write_text("{}")
        assert kind_of(folder) == [kind]
        refuse_other_kind(folder, kind)  # its own kind resumes
        for other in {"run", "bench", "cached runs"} - {kind}:
            with pytest.raises(ValueError, match=rf"holds .* \({marker.replace('csd', '[*]') if kind == 'cached runs' else marker}\); "
                                                 r".* keeps a folder of its own: use another --out"):
                refuse_other_kind(folder, other)
    (tmp_path / "run_x").mkdir()
    (tmp_path / "run_x" / "run_ar.json").mkdir()  # a folder named as a cache is no cache
    assert kind_of(tmp_path / "run_x") == []
