"""Memory plans of the built-in model and of checkpoint folders (the arithmetic is :mod:`csdgen.models.memory`).

:func:`builtin_plan` reads the built-in model's configuration (its weights are small and in
memory already); :func:`checkpoint_plan` reads a checkpoint folder's config only: the model is
built on the ``meta`` device for its parameters, no weight is read.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .memory import MemoryPlan, activation_bytes, module_bytes, planned_weight_bytes

__all__ = ["builtin_plan", "checkpoint_plan", "check_memory", "free_memory", "forward_width"]


def free_memory(device: str | torch.device) -> int:
    """Free bytes of ``device`` (:func:`csdgen.models.memory_check.available_memory`)."""
    from .memory_check import available_memory

    return available_memory(device)


def forward_width(window: int, tree: tuple[int, int] | None = None) -> int:
    """Tokens one window forward feeds per row: ``W + 1`` for a chain window; for a draft tree
    ``(K, D)`` its ``S`` nodes (:func:`csdgen.trees.tree_nodes`: ``1 + K + ... + K^D + (W - 1 - D)``)
    padded to the static engine's width bucket (:func:`csdgen.models._static_shapes.width_bucket`:
    beyond 64 the next power of two), which is what the static engine feeds.

    Raises:
        ValueError: a bad ``tree`` (:func:`csdgen.trees.check_tree`).
    """
    from csdgen.trees import check_tree, tree_nodes

    from ._static_shapes import width_bucket

    tree = check_tree(tree)
    if tree is None:  # K = 1 included: the plain window
        return int(window) + 1
    return width_bucket(tree_nodes(*tree, int(window)))


def engine_cache_positions(prompt_width: int, image_columns: int, tree_columns: int = 0) -> int:
    """Cache positions per row the decoding engine allocates: the static engine's preallocated width
    (:func:`csdgen.models._static.cache_width`: the prompt's bucket, the image columns and room for the widest
    window, rounded up to 64), widened for a tree window of ``tree_columns`` fed columns as the engine widens it
    (``_ensure_width``: the prompt's bucket, the image columns and the tree's columns, rounded up to 64). The eager
    engine's cache grows to about the same (its holes are compacted once they take a quarter of every row), so the
    plan counts this width for both."""
    from ._static import cache_width, prompt_bucket
    from ._static_shapes import _round_up

    bucket = prompt_bucket(max(int(prompt_width), 1))
    return max(cache_width(bucket, int(image_columns)), _round_up(bucket + int(image_columns) + int(tree_columns), 64))


def _window_activations(text_config: Any, rows: int, fed: int, prompt: int, sequence: int, vocab: int,
                        element_size: int) -> int:
    """The larger of a window step's (``fed`` tokens: :func:`forward_width`) and the prefill's (``prompt`` tokens,
    logits of one) activations."""
    step = activation_bytes(text_config, rows, fed, sequence, fed, vocab, element_size)
    prefill = activation_bytes(text_config, rows, prompt, prompt, prompt, vocab, element_size)
    return max(step, prefill)


def builtin_plan(model, *, batch_size: int, window: int, guided: bool = True, quantize: str | None = None,
                 device: str | torch.device = "cpu", free: int | None = None,
                 tree: tuple[int, int] | None = None) -> MemoryPlan:
    """The memory plan of the built-in model (or any :class:`~csdgen.models.llama.ClassConditionalLlama`).

    Weights: the AR model's parameters in its dtype (float32 or bfloat16) with its decoder layers quantised
    as ``quantize`` (:func:`~csdgen.models.memory.planned_weight_bytes`; an AR model already quantised counts
    as it is, float32), plus the VQ decoder and classifier as loaded; its cache and activations in its dtype. Sequence: the class token and the ``N``
    image positions. Window buffers: the engine's float32 logits and target, draft and residual
    distributions over the codebook, ``(rows + 3) * F * V * 4`` for a forward of ``F`` tokens
    (:func:`forward_width`: ``W + 1``; with a draft tree its ``S`` nodes, padded to the width bucket,
    which also widen the cache and make the attention scores grow with ``F`` times the cache width).

    Args:
        free: the device's free bytes (default :func:`free_memory` of ``device``).
        tree: ``(K, D)``, a draft tree at the root of every window (None: a chain window).
        check_positions: refuse a ``prompt_length`` that leaves the image no room in the position table, as a
            run refuses it (``csdgen plan``, which loads no model; a loaded model has checked its prompts).

    Raises:
        ValueError: a bad ``tree``.
    """
    from ._transformers import kv_cache_bytes

    backbone = model.backbone
    cfg = backbone.config
    quantized = any(type(p) not in (torch.Tensor, torch.nn.Parameter) for p in backbone.parameters())
    dtype = torch.float32 if quantized else backbone.dtype
    size = dtype.itemsize
    weights = module_bytes(backbone) if quantized else planned_weight_bytes(backbone, dtype, quantize)
    components = getattr(model, "components", None)
    if components is not None:
        weights += module_bytes(components.vq) + module_bytes(components.classifier)
    rows = 2 if guided else 1
    fed = forward_width(window, tree)
    sequence = engine_cache_positions(1, model.num_image_tokens, fed if tree else 0)  # the class token, then the image
    kv = kv_cache_bytes(cfg, rows, sequence, size)
    buffers = (rows + 3) * fed * model.codebook_size * 4
    activations = _window_activations(cfg, rows, fed, 1, sequence, cfg.vocab_size, size)
    what = "the built-in model" if components is not None else type(model).__name__
    return MemoryPlan(what, torch.device(device).type, str(dtype).removeprefix("torch."), quantize, batch_size, window, rows, weights, kv, buffers,
                      activations, free_memory(device) if free is None else free, tree=_tree_of(tree, window))


def _tree_of(tree, window: int) -> tuple[int, int, int] | None:
    """``(K, D, S)`` of a plan's tree (None without one)."""
    if tree is None:
        return None
    from csdgen.trees import tree_nodes

    K, D = tree
    return int(K), int(D), tree_nodes(int(K), int(D), int(window))


def checkpoint_plan(path: str | os.PathLike, family: str, *, batch_size: int, window: int, dtype: torch.dtype | str,
                    quantize: str | None = None, guided: bool = True, device: str | torch.device = "cpu",
                    free: int | None = None, prompt_length: int | None = None, tree: tuple[int, int] | None = None,
                    check_positions: bool = False, **sizes) -> MemoryPlan:
    """The memory plan of a checkpoint folder (config only; no weight is read), at ``window`` capped at the
    image's token count as a run caps it (the plan's ``window`` says which).

    The KV cache and window buffers are the family's estimate (:func:`csdgen.models.memory_check.estimate_memory`);
    the weights are the model built on ``meta`` with its decoder layers quantised as ``quantize``,
    plus the family's further fixed bytes (e.g. Chameleon's copy of the image rows of ``lm_head``).
    A draft ``tree`` widens the forward to its nodes (:func:`forward_width`), the window buffers and the cache
    with it.

    Args:
        tree: ``(K, D)``, a draft tree at the root of every window (None: a chain window).
        check_positions: refuse a ``prompt_length`` that leaves the image no room in the position table, as a
            run refuses it (``csdgen plan``, which loads no model; a loaded model has checked its prompts).
        sizes: ``height``, ``width``, ``image_size``, ``vqgan_dir`` as :func:`~csdgen.models.memory_check.estimate_memory` takes.

    Raises:
        ValueError / FileNotFoundError: as :func:`~csdgen.models.memory_check.estimate_memory`; with
            ``check_positions``, a prompt too long for the position table.
    """
    from .dtypes import resolve_dtype
    from .memory_check import DEFAULT_PROMPT_LENGTH, estimate_memory, quantized_weight_bytes

    dtype = resolve_dtype(dtype, device)[0]
    estimate = estimate_memory(path, family, window, dtype, guided=guided, prompt_length=prompt_length, **sizes)
    limit = getattr(estimate.text_config, "max_position_embeddings", None)
    if check_positions and prompt_length is not None and limit:  # no plan for a prompt a run refuses
        from ._transformers import check_sequence_length

        check_sequence_length(int(prompt_length), estimate.sequence_length - int(prompt_length), limit)
    extra = estimate.fixed - estimate.parameters * estimate.element_size
    weights = quantized_weight_bytes(path, family, dtype, quantize) + max(extra, 0)
    given = int(window)
    if estimate.image_tokens:  # capped at the image length, as a run caps it (no window holds more slots)
        window = min(given, estimate.image_tokens)
    fed = forward_width(window, tree)
    buffers = (estimate.per_image - estimate.kv_per_image) * fed // (given + 1)  # (rows + 3) * fed * V * 4
    prompt = DEFAULT_PROMPT_LENGTH if prompt_length is None else int(prompt_length)
    positions = engine_cache_positions(prompt, estimate.sequence_length - prompt, fed if tree else 0)
    kv = estimate.kv_per_image * positions // max(estimate.sequence_length, 1)
    text = estimate.text_config
    vocab = text.vocab_size
    activations = _window_activations(text, estimate.rows, fed, prompt, positions, vocab, estimate.element_size)
    what = f"{family} ({path})"
    return MemoryPlan(what, torch.device(device).type, str(dtype).removeprefix("torch."), quantize, batch_size, window,
                      estimate.rows, weights, kv, buffers, activations,
                      free_memory(device) if free is None else free, tree=_tree_of(tree, window),
                      prompt=(prompt, prompt_length is None))


def check_memory(path: str | os.PathLike, family: str, batch_size: int, window: int, dtype: torch.dtype | str | None,
                 *, device: str | torch.device | None = None, height: int | None = None, width: int | None = None,
                 image_size: int | None = None, guided: bool = True, max_memory_bytes: int | None = None,
                 prompt_length: int | None = None, vqgan_dir: str | None = None, quantize: str | None = None,
                 split: bool = False) -> int:
    """Refuse a batch that its memory plan does not fit, before any weight is read; return the plan's peak in bytes.

    The plan is :func:`checkpoint_plan`'s, the one ``csdgen plan`` prints and a run's first line summarises:
    weights (quantised as ``quantize``), the KV cache over the engine's cache width, the window buffers and the
    widest forward's activations, linear in the batch size, which gives the largest batch that fits directly.
    Available memory: ``max_memory_bytes`` when given, else :func:`free_memory` of ``device`` (default
    :func:`~csdgen.models.dtypes.default_device`); the plan may use all but
    :data:`~csdgen.models._transformers.HEADROOM` of it. With ``split`` (a device map: accelerate places what
    does not fit elsewhere) nothing is refused.

    Raises:
        ValueError: one line naming the batch size, window, dtype, prompt length, the plan's peak, the
            available and usable memory, and the largest batch size that fits; ``max_memory_bytes`` not a
            finite number >= 0.
    """
    from ..integers import is_finite_at_least_0
    from .dtypes import FAMILY_GPU_DTYPES, _dtype, default_device
    from .memory import format_bytes
    from .memory_check import DEFAULT_PROMPT_LENGTH

    if max_memory_bytes is not None and not is_finite_at_least_0(max_memory_bytes):
        raise ValueError(f"max_memory_bytes={max_memory_bytes!r}: allowed None (the device's free memory) or a "
                         "number of bytes >= 0 (8e9 is 8 GB)")
    device = device or default_device()
    dtype = _dtype(dtype, device, family if family in FAMILY_GPU_DTYPES else None)
    have = None if split or max_memory_bytes is None else int(max_memory_bytes)
    plan = checkpoint_plan(path, family, batch_size=batch_size, window=window, dtype=dtype, quantize=quantize,
                           guided=guided, device=device, free=0 if split else have, prompt_length=prompt_length,
                           height=height, width=width, image_size=image_size, vqgan_dir=vqgan_dir)
    need = plan.peak()
    if split or plan.fits():
        return need
    fits = min(plan.largest_batch(), batch_size - 1)
    # named both ways: the library's callers pass batch_size=, the commands' users --batch-size
    hint = (f"try batch_size={fits} (--batch-size {fits} on the command line)" if fits >= 1 else
            "even batch size 1 does not fit: try a smaller dtype, image or another device")
    length = DEFAULT_PROMPT_LENGTH if prompt_length is None else prompt_length
    usable = int(plan.free * (1 - plan.headroom))
    raise ValueError(
        f"{family} at batch size {batch_size}, window {plan.window}, {plan.dtype}, prompts of {length} tokens needs about "
        f"{format_bytes(need)} (memory plan: weights, KV cache, window buffers, activations) but {plan.device} has "
        f"{format_bytes(plan.free)} available ({format_bytes(usable)} after keeping {plan.headroom:.0%} free); {hint}"
    )
