"""Where a checkpoint is and what its names say: a folder or cached repo id, the Chameleon layout
rule, the size arguments. Shared by the folder loaders (:mod:`csdgen.models.detect`,
:mod:`csdgen.models.memory_check`, :mod:`csdgen.models.auto`) and :mod:`csdgen.models.loaded`
(in-memory models); only the standard library and huggingface_hub (inside the function) are imported.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LUMINA_ARCHITECTURES", "resolve_checkpoint", "layout_rule", "size_arguments", "square_side", "janus_side"]

#: the config ``architectures`` entry of Lumina-mGPT's own class
LUMINA_ARCHITECTURES = ("ChameleonXLLMXForConditionalGeneration",)


def resolve_checkpoint(path_or_id: str | os.PathLike) -> Path:
    """A local folder, or a repo id found in the local Hugging Face cache -> the folder.

    Raises:
        FileNotFoundError: neither an existing folder nor a cached repo id (says how to get it).
        ValueError: an empty path or id (``""``: ``Path("")`` would be the current folder).
    """
    if isinstance(path_or_id, str) and not path_or_id.strip():
        raise ValueError(f"model path {path_or_id!r}: an empty path; allowed: a checkpoint folder or a Hugging Face "
                         f"repo id in the local cache")
    folder = Path(path_or_id).expanduser()
    if folder.is_dir():
        return folder
    if folder.exists():
        raise FileNotFoundError(f"model {str(path_or_id)!r} is a file; give the checkpoint folder (config.json + weights)")
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(str(path_or_id), local_files_only=True))
    except Exception:  # not a valid repo id, or not cached: both mean "not here"
        raise FileNotFoundError(
            f"model {str(path_or_id)!r}: no such folder, and no Hugging Face repo of that id in the local cache "
            f"{constants.HF_HUB_CACHE} (csdgen never downloads). Download it on a machine with network "
            f"(e.g. `hf download <repo id> --local-dir DIR`), copy DIR here and pass --model DIR"
        ) from None


def layout_rule(architectures: list[str] | None, *names: str | os.PathLike | None) -> str:
    """The rule of :func:`csdgen.models.detect.guess_layout` on a config's ``architectures`` and the names given (repo id, path, folder name)."""
    if any(a in LUMINA_ARCHITECTURES for a in architectures or ()):
        return "lumina"
    text = " ".join(str(n) for n in names if n is not None).lower()
    return "anole" if "anole" in text and "lumina" not in text else "lumina"


def size_arguments(height: int | None, width: int | None, image_size: int | None) -> tuple[int | None, int | None]:
    """``(height, width)`` from the size arguments: ``image_size`` for both, or the two sides as given.

    Raises:
        ValueError: ``image_size`` together with ``height`` or ``width``.
    """
    if image_size is not None and (height is not None or width is not None):
        raise ValueError(f"image_size={image_size} together with height/width: give one or the other")
    return (image_size, image_size) if image_size is not None else (height, width)


def square_side(height: int | None, width: int | None, family: str) -> int | None:
    """The one side of a square image of ``family`` (a name for the message, e.g. ``"Liquid"``).

    Raises:
        ValueError: ``height != width`` (naming the family and both sides).
    """
    if height != width:
        raise ValueError(f"{family} makes square images only; got height={height}, width={width}")
    return height


def janus_side(height: int | None, width: int | None) -> int | None:
    """The one side of a Janus image (square only).

    Raises:
        ValueError: ``height != width``.
    """
    return square_side(height, width, "Janus")
