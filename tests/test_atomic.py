"""csdgen.atomic: files written whole, with the mode other files get."""

from __future__ import annotations

import os
import stat

import torch


def test_safetensors_files_get_the_mode_other_files_get(tmp_path):
    """safetensors' save_file created ``-rw-------`` files: a scoring job run as another user could
    not read a run's tensors while its PNGs and JSON were ``-rw-r--r--``."""
    from csdgen.atomic import save_safetensors, write_text_atomic

    save_safetensors({"tokens": torch.zeros(2, 3, dtype=torch.long)}, tmp_path / "t.safetensors")
    write_text_atomic(tmp_path / "r.json", "{}")
    mode = stat.S_IMODE(os.stat(tmp_path / "t.safetensors").st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "r.json").st_mode)
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / "t.safetensors"))["tokens"], torch.zeros(2, 3, dtype=torch.long))
