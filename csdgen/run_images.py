"""Images of a run: tokens decoded to PIL images at an integer scale, and how many images fit a batch.

:func:`pil_images` (the API's ``csdgen.pil_images``) decodes tokens or a ``GenerationResult``;
:func:`batches` / :func:`generate_batches` cut a run into batches whose images each draw from their
own random stream keyed by ``(seed, image index)``, so the batch size never changes an image;
:func:`builtin_batch_limit` sizes a batch to the memory available.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

__all__ = ["batches", "generate_batches", "MAX_SCALE", "check_scale", "pil_images", "decoded_pixels", "builtin_bytes_per_image", "builtin_batch_limit"]


def batches(indices: int | Sequence[int], batch_size: int) -> list[list[int]]:
    """Image indices per batch: ``indices`` (or ``range(indices)``) cut into runs of ``batch_size``."""
    indices = list(range(indices)) if isinstance(indices, int) else list(indices)
    return [indices[start:start + batch_size] for start in range(0, len(indices), batch_size)]


def generate_batches(model, conditions: Sequence, *, batch_size: int, seed: int, indices: Sequence[int] | None = None,
                     callback=None, **generate_kwargs: Any) -> Iterator[tuple[list[int], Any]]:
    """Generate images batch by batch, yielding ``(indices, GenerationResult)`` per batch.

    Args:
        model: an image-token model.
        conditions: one condition per image of the run (class ids, prompts).
        batch_size: images per :func:`csdgen.generate` call; does not change the images.
        seed: run seed; image ``i`` draws from the random stream keyed by ``(seed, i)``.
        indices: the images to generate (default all; a resumed run passes the missing ones).
        callback: passed to :func:`csdgen.generate`.
        generate_kwargs: method, window, sampling, draft_init, refresh.

    Raises:
        ValueError: at the call, ``batch_size`` not an integer >= 1 (-1 yielded nothing, 0 was
            range()'s error) or ``conditions`` a bare string or condition instead of a list; then
            as :func:`csdgen.generate`.
    """
    from csdgen.engine import check_conditions
    from csdgen.sampling import as_integer

    if as_integer(batch_size) is None or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: allowed an integer >= 1 (images per csdgen.generate call)")
    check_conditions(conditions)
    return _generate_batches(model, conditions, as_integer(batch_size), seed, indices, callback, generate_kwargs)


def _generate_batches(model, conditions, batch_size, seed, indices, callback, generate_kwargs):
    from csdgen.engine import generate

    for batch in batches(len(conditions) if indices is None else indices, batch_size):
        result = generate(model, [conditions[i] for i in batch], seed=seed, image_indices=batch, callback=callback,
                          **generate_kwargs)
        yield batch, result


#: the largest PNG upscaling (``scale``) of :func:`pil_images` / :func:`save_run`: 16 turns the built-in model's
#: 64 x 64 images into 1024 x 1024 (a 1024-pixel checkpoint's into 16384 x 16384)
MAX_SCALE = 16


def check_scale(scale) -> int:
    """``scale`` if it is an integer in ``1 .. MAX_SCALE``, else one ValueError line naming it.

    Raises:
        ValueError: ``"scale=0: allowed an integer in 1..16 (...)"``.
    """
    from csdgen.sampling import as_integer

    if as_integer(scale) is None or not 1 <= scale <= MAX_SCALE:
        raise ValueError(f"scale={scale!r}: allowed an integer in 1..{MAX_SCALE} (nearest-neighbour upscaling of the "
                         f"images; {MAX_SCALE} turns 64 x 64 pixels into {64 * MAX_SCALE} x {64 * MAX_SCALE})")
    return as_integer(scale)  # numpy's integers too


def pil_images(model, result_or_tokens, scale: int = 1, conditions=None) -> list:
    """Decoded images as ``PIL.Image.Image`` (RGB), one per image of a run.

    Args:
        model: the model that generated the tokens (its ``decode_images``).
        result_or_tokens: a :class:`csdgen.GenerationResult` or image tokens ``[B, N]`` int64.
        scale: integer upscaling by nearest neighbour, 1 .. :data:`MAX_SCALE` (16) (the CLI saves the
            built-in model's 64 x 64 images at ``scale=2``, i.e. 128 x 128 pixels).
        conditions: the images' conditions, for a decoder that reads the prompt (GLM-Image's).

    Raises:
        TypeError: ``result_or_tokens`` is neither (e.g. None), naming what was given.
        ValueError: ``scale`` not an integer in 1 .. :data:`MAX_SCALE` (checked before decoding).
    """
    import torch

    scale = check_scale(scale)
    tokens = getattr(result_or_tokens, "tokens", result_or_tokens)
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        what = type(tokens).__name__ if not isinstance(tokens, torch.Tensor) else f"a tensor of shape {list(tokens.shape)}"
        raise TypeError(f"pil_images: got {what}; allowed: a GenerationResult (csdgen.generate's) or image tokens "
                        f"[B, N] int64")
    if len(tokens) == 0:  # no images: none to decode (numpy cannot concatenate an empty list)
        return []
    return _to_pil(decoded_pixels(model, tokens, conditions), scale)


def decoded_pixels(model, tokens, conditions=None):
    """The 8-bit pixels of image tokens ``[B, N]`` int64, as the saved files hold them: ``[B, H, W, 3]`` uint8
    (numpy), decoded image by image. A pixel never depends on the batch it was decoded in (batched
    convolutions round differently), so neither the files nor a score computed on these pixels depends
    on the batch size.

    A model whose decoder reads the prompt too (``decode_takes_prompts``: GLM-Image's glyph encoder)
    gets each image's condition when it is a prompt string."""
    import numpy as np

    from csdgen.evaluation.maps import to_uint8

    def one(i):
        if conditions is not None and getattr(model, "decode_takes_prompts", False) and isinstance(conditions[i], str):
            return model.decode_images(tokens[i : i + 1], prompts=[conditions[i]])
        return model.decode_images(tokens[i : i + 1])

    return np.concatenate([to_uint8(one(i)) for i in range(len(tokens))])


def _to_pil(pixels, scale: int) -> list:
    from PIL import Image

    images = [Image.fromarray(p) for p in pixels]
    if scale != 1:
        images = [im.resize((im.width * scale, im.height * scale), Image.NEAREST) for im in images]
    return images


def builtin_bytes_per_image(model, window: int, guided: bool, tree: tuple[int, int] | None = None) -> int:
    """Estimated decoding memory of one image of the built-in model (a ``ClassConditionalLlama``), in bytes.

    float32, for a forward of ``F`` tokens (``W``; with a draft ``tree`` its ``S`` nodes padded to the
    static engine's width bucket, :func:`csdgen.models.plan.forward_width`): the KV cache,
    ``2 * layers * hidden * (1 + N + F)`` values per sequence, plus one forward's logits and
    probabilities (``4 * F * V``), attention scores (``heads * F * (1 + N + F)``) and MLP activations
    (``4 * F * intermediate``); two sequences per image with guidance.

    Raises:
        ValueError: a bad ``tree`` (:func:`csdgen.trees.check_tree`).
    """
    cfg = model.backbone.config
    N, V = model.num_image_tokens, cfg.vocab_size
    if tree is None:
        F = window
    else:
        from csdgen.models.plan import forward_width

        F = forward_width(window, tree)
    per_sequence = 4 * (2 * cfg.num_hidden_layers * cfg.hidden_size * (1 + N + F) + 4 * F * V
                        + cfg.num_attention_heads * F * (1 + N + F) + 4 * F * cfg.intermediate_size)
    return per_sequence * (2 if guided else 1)


def builtin_batch_limit(model, window: int, guided: bool, available_bytes: int, share: float = 0.5,
                        tree: tuple[int, int] | None = None) -> int:
    """Largest batch of the built-in model that fits in ``share`` of ``available_bytes`` (at least 1);
    see :func:`builtin_bytes_per_image` (``tree``: a draft tree's ``(K, D)``, None: a chain window)."""
    return max(1, int(share * available_bytes // builtin_bytes_per_image(model, window, guided, tree)))
