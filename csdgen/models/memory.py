"""The memory plan of a run, before its first forward: weights, KV cache, window buffers, one forward's activations.

All figures are bytes. For ``B`` images of ``rows`` sequences each (2 with classifier-free
guidance, else 1), a window of ``W`` and sequences of ``S`` positions (prompt + image, special
tokens included):

* **weights**: every parameter and buffer at its element size; a quantised linear layer of the
  decoder ``[out, in]`` holds (:func:`linear_bytes`) int8: ``out * in`` + a scale and a zero
  point per output row; int4: ``out * in / 2`` + a scale and a zero point per group of 128;
  fp8: ``out * in`` + a float32 scale per row; nf4: ``out * in / 2`` + a float32 absmax per block
  of 64; bnb8: ``out * in`` + a float32 scale per row. Read from the model built on the
  ``meta`` device (nothing allocated) or from the loaded model's tensors;
* **KV cache**: ``layers * 2 * kv_heads * head_dim * T * rows * B * element_size``, ``T`` the cache
  positions the engine allocates per row (the static engine's preallocated width: the prompt's
  bucket, the image columns and room for the widest window, or a draft tree's fed columns when
  wider, rounded up to 64; :func:`csdgen.models.plan.engine_cache_positions`);
* **window buffers**: the family's float32 logits and distributions of a window
  (:class:`~csdgen.models._transformers.MemoryEstimate`'s per-image bytes beyond the cache), over the
  forward's tokens (a tree's nodes: :func:`csdgen.models.plan.forward_width`);
* **activations** of the widest forward (the window's ``W + 1`` tokens, with a draft tree its ``S``
  nodes padded to the static engine's width bucket, or the prefill's ``P`` prompt tokens):
  per row and token the hidden state, its norm and the residual (``3 * hidden``), the
  attention's queries, keys, values and output (``(2 * heads + 2 * kv_heads) * head_dim``),
  the MLP's gate, up and their product (``3 * intermediate``), and the attention scores and
  their softmax over the attended length (``2 * heads * S``), at the model's element size,
  plus the output logits in float32.

The **peak** is their sum; the largest batch is what fits in the device's free memory (CUDA:
``torch.cuda.mem_get_info``; CPU: ``MemAvailable``) after keeping
:data:`~csdgen.models._transformers.HEADROOM` of it free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ._transformers import HEADROOM
from .quantize import INT4_GROUP, NF4_BLOCK, decoder_layers_prefix

__all__ = ["MemoryPlan", "linear_bytes", "tensor_bytes", "module_bytes", "planned_weight_bytes",
           "activation_bytes", "format_bytes"]


def format_bytes(count: int) -> str:
    """``"1.23 GiB"`` / ``"45.6 MiB"`` / ``"789 KiB"``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if count >= size:
            return f"{count / size:.2f} {unit}" if unit == "GiB" else f"{count / size:.1f} {unit}"
    return f"{count / 1024:.0f} KiB"


def linear_bytes(out_features: int, in_features: int, quantize: str | None, element_size: int) -> int:
    """Bytes of one linear layer's weight ``[out, in]`` quantised as ``quantize`` (None: ``element_size`` each).

    Raises:
        ValueError: an unknown ``quantize``.
    """
    n = out_features * in_features
    if quantize is None:
        return n * element_size
    if quantize == "int8":  # torchao Int8Tensor: int8 data, a scale (the weight's dtype) and an int8 zero point per row
        return n + out_features * (element_size + 1)
    if quantize == "int4":  # torchao int4: packed nibbles, a scale and a zero point per group (bfloat16)
        return n // 2 + 2 * out_features * -(-in_features // INT4_GROUP) * 2
    if quantize == "fp8":  # torchao Float8Tensor: float8 data, a float32 scale per row
        return n + out_features * 4
    if quantize == "nf4":  # bitsandbytes Params4bit: packed nibbles, a float32 absmax per block
        return n // 2 + -(-n // NF4_BLOCK) * 4
    if quantize == "bnb8":  # bitsandbytes Int8Params: int8 data, a float32 scale per row
        return n + out_features * 4
    raise ValueError(f"quantize={quantize!r}: allowed int8, int4, fp8, nf4, bnb8 (or None)")


def tensor_bytes(tensor: torch.Tensor, seen: set | None = None) -> int:
    """Bytes of the storages behind ``tensor`` (a torchao / bitsandbytes tensor: its inner tensors),
    each storage counted once across calls sharing ``seen``."""
    seen = set() if seen is None else seen
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is not None and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name), seen) for name in names)
    total = 0
    for inner in [tensor, *[v for v in vars(tensor).values() if isinstance(v, torch.Tensor)]] \
            if hasattr(tensor, "__dict__") else [tensor]:
        if inner.device.type == "meta":
            continue
        storage = inner.untyped_storage()
        key = (storage.data_ptr(), inner.device)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    quant_state = getattr(tensor, "quant_state", None)  # bitsandbytes 4-bit: absmax and code
    if quant_state is not None:
        for inner in (getattr(quant_state, "absmax", None), getattr(quant_state, "code", None)):
            if isinstance(inner, torch.Tensor):
                total += tensor_bytes(inner, seen)
    return total


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes held by a loaded module's parameters and buffers (after quantisation; shared storages once)."""
    seen: set = set()
    return sum(tensor_bytes(t, seen) for t in [*module.parameters(), *module.buffers()])


def planned_weight_bytes(skeleton: torch.nn.Module, dtype: torch.dtype, quantize: str | None = None) -> int:
    """Bytes the weights of ``skeleton`` (any device, ``meta`` included) take in ``dtype`` once quantised.

    Only the decoder layers' linear layers are quantised (as :func:`csdgen.models.quantize.skipped_modules`
    leaves the rest); tied parameters count once.
    """
    element = torch.empty((), dtype=dtype).element_size()
    prefix = decoder_layers_prefix(skeleton) + "." if quantize is not None else None
    seen: set[int] = set()
    total = 0
    for name, module in skeleton.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if prefix and isinstance(module, torch.nn.Linear) and pname == "weight" and name.startswith(prefix):
                total += linear_bytes(module.out_features, module.in_features, quantize, element)
            else:
                total += param.numel() * (element if param.is_floating_point() else param.element_size())
        for buf in module.buffers(recurse=False):
            total += buf.numel() * buf.element_size()
    return total


def activation_bytes(text_config: Any, rows: int, tokens: int, attended: int, logits_width: int, vocab: int,
                     element_size: int) -> int:
    """Bytes of one forward's activations (the module docstring's count) for ``rows`` sequences of ``tokens``
    new tokens attending to ``attended`` positions, with ``logits_width`` float32 logits rows of ``vocab``."""
    heads = text_config.num_attention_heads
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    per_token = (3 * text_config.hidden_size + (2 * heads + 2 * kv_heads) * head_dim + 3 * text_config.intermediate_size
                 + 2 * heads * attended)
    return rows * tokens * per_token * element_size + rows * logits_width * vocab * 4


@dataclass(frozen=True)
class MemoryPlan:
    """A run's memory, in bytes, before its first forward (module docstring).

    Attributes:
        what: the model in words (``"the built-in model"``, ``"janus (path)"``).
        device: where it runs. dtype: the weights' dtype name. quantize: None or its name.
        batch_size: B. window: W. rows: sequences per image (2 with guidance).
        weights: bytes of the weights (quantised).
        kv_per_image: KV-cache bytes of one image. buffers_per_image: its window buffers.
        activations_per_image: one forward's activations per image.
        free: the device's free bytes (None: unknown).
        tree: ``(K, D, S)`` of the draft tree at the root of every window (S: its nodes, fed in one
            forward), None without one.
        prompt: ``(tokens, assumed)``: the longest prompt row the plan counts, and whether that length was
            assumed (no prompts given); None for a model without text prompts.
    """

    what: str
    device: str
    dtype: str
    quantize: str | None
    batch_size: int
    window: int
    rows: int
    weights: int
    kv_per_image: int
    buffers_per_image: int
    activations_per_image: int
    free: int | None
    headroom: float = HEADROOM
    tree: tuple[int, int, int] | None = None
    prompt: tuple[int, bool] | None = None

    @property
    def per_image(self) -> int:
        """Bytes that grow with each image."""
        return self.kv_per_image + self.buffers_per_image + self.activations_per_image

    def peak(self, batch_size: int | None = None) -> int:
        """Peak bytes of a run of ``batch_size`` images (default: the plan's)."""
        return self.weights + self.per_image * (self.batch_size if batch_size is None else batch_size)

    def largest_batch(self) -> int | None:
        """The largest batch that fits in the free memory after the headroom (None: free memory unknown)."""
        if self.free is None:
            return None
        room = int(self.free * (1 - self.headroom)) - self.weights
        return max(room // max(self.per_image, 1), 0)

    def fits(self) -> bool | None:
        """Whether the plan's batch fits (None: free memory unknown)."""
        largest = self.largest_batch()
        return None if largest is None else self.batch_size <= largest

    def summary(self) -> str:
        """The plan in one clause, for a run's first line: weights, cache, peak, free, largest batch."""
        text = (f"memory plan: weights {format_bytes(self.weights)}, KV cache {format_bytes(self.kv_per_image * self.batch_size)}, "
                f"peak {format_bytes(self.peak())} at batch {self.batch_size}")
        if self.free is not None:
            text += f" of {format_bytes(self.free)} free (largest batch {self.largest_batch()})"
        return text

    def table(self) -> str:
        """The plan as lines for ``csdgen plan``."""
        B = self.batch_size
        rows = [("model", self.what), ("device", self.device),
                ("dtype", self.dtype + (f", decoder layers {self.quantize}" if self.quantize else "")),
                ("batch", f"{B} image{'s' * (B != 1)} x {self.rows} row{'s' * (self.rows != 1)}, window {self.window}"
                          + (f", tree {self.tree[0]},{self.tree[1]} ({self.tree[2]} nodes a forward)" if self.tree else ""))]
        if self.prompt is not None:
            tokens, assumed = self.prompt
            rows.append(("prompt", f"{tokens} tokens, the longest row" + (" (assumed: --prompt-length sets it)"
                                                                          if assumed else "")))
        rows += [("weights", format_bytes(self.weights)),
                ("KV cache", f"{format_bytes(self.kv_per_image * B)} ({format_bytes(self.kv_per_image)} per image)"),
                ("window buffers", f"{format_bytes(self.buffers_per_image * B)}"),
                ("activations", f"{format_bytes(self.activations_per_image * B)} (the widest forward)"),
                ("peak", format_bytes(self.peak()))]
        if self.free is not None:
            largest = self.largest_batch()
            rows += [("free", f"{format_bytes(self.free)} ({self.headroom:.0%} kept free)"),
                     ("fits", "yes" if self.fits() else f"no: the largest batch that fits is {largest}"),
                     ("largest batch", str(largest))]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
