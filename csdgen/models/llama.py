"""A class-conditional image-token model on a transformers Llama backbone, with its KV cache.

Sequence layout: ``[class_token, code_0, ..., code_{N-1}]`` where codebook ids are
``0 .. V - 1``, class ``c`` is id ``V + c`` and the null class (for the unconditional rows of
classifier-free guidance) is id ``V + num_classes``. Position ids start at 0 on the class
token. This is the layout of the built-in model; the tests use tiny random instances of it as
"the cached transformer".
"""

from __future__ import annotations

import operator
from typing import Sequence

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from ..class_names import ClassNames, index_text
from ._ragged import RaggedSession
from ._transformers import cache_kwargs
from .base import ImageTokenModel

__all__ = ["ClassConditionalLlama"]


class ClassConditionalLlama(ImageTokenModel):
    """Class-conditional AR image-token model over a ``LlamaForCausalLM``.

    Args:
        backbone: a ``LlamaForCausalLM`` whose vocabulary holds ``V + num_classes + 1`` ids.
        codebook_size: V.
        num_classes: number of classes (the null class comes on top).
        grid: ``(rows, cols)`` of the image tokens.
        class_names: optional names, so conditions may be given by name (any case and spacing,
            :class:`csdgen.class_names.ClassNames`).
        class_categories: optional category per class (for listings).
        class_aliases: optional aliases per class (e.g. the emoji's short names), accepted where no
            class has that name.

    Attributes:
        classes: the :class:`~csdgen.class_names.ClassNames` lookup (``None`` without names):
            ``model.classes.split("red apple,dog face")``, ``.suggest(...)``, ``.listing()``.

    Raises:
        ValueError: if the backbone's vocabulary or positions cannot hold this layout, or two
            class names are the same (ignoring case and spaces).
    """

    def __init__(
        self,
        backbone: LlamaForCausalLM,
        codebook_size: int,
        num_classes: int,
        grid: tuple[int, int],
        class_names: Sequence[str] | None = None,
        class_categories: Sequence[str] | None = None,
        class_aliases: Sequence[Sequence[str]] | None = None,
    ):
        cfg = backbone.config
        if cfg.vocab_size < codebook_size + num_classes + 1:
            raise ValueError(f"backbone vocab_size={cfg.vocab_size} < V + classes + 1 = {codebook_size + num_classes + 1}")
        if cfg.max_position_embeddings < grid[0] * grid[1] + 1:
            raise ValueError(f"backbone max_position_embeddings={cfg.max_position_embeddings} < N + 1 = {grid[0] * grid[1] + 1}")
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(f"{len(class_names)} class names for num_classes={num_classes}")
        self.backbone = backbone.eval()
        self.codebook_size, self.num_classes, self.grid = codebook_size, num_classes, tuple(grid)
        self.num_image_tokens = grid[0] * grid[1]
        self.class_names = list(class_names) if class_names is not None else None
        self.classes = (ClassNames(self.class_names, class_categories, class_aliases)
                        if class_names is not None else None)
        self.device = next(backbone.parameters()).device

    @classmethod
    def random(
        cls,
        codebook_size: int = 32,
        num_classes: int = 4,
        grid: tuple[int, int] = (4, 4),
        hidden_size: int = 32,
        num_layers: int = 2,
        num_heads: int = 4,
        seed: int = 0,
    ) -> "ClassConditionalLlama":
        """A small randomly initialised instance (for tests and benchmarks); deterministic in ``seed``."""
        config = LlamaConfig(
            vocab_size=codebook_size + num_classes + 1,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_heads,
            max_position_embeddings=grid[0] * grid[1] + 1,
        )
        torch.manual_seed(seed)
        return cls(LlamaForCausalLM(config), codebook_size, num_classes, grid)

    def class_ids(self, conditions: Sequence[int | str]) -> list[int]:
        """Resolve class names (any case and spacing, or an alias) or indices to indices.

        Each condition is one class: ``"family: man, boy, boy"`` is one name (to split a
        comma-separated list, :meth:`csdgen.class_names.ClassNames.split` via ``model.classes``).

        Raises:
            ValueError: for an unknown name (one line, with close matches), an index outside
                ``0 .. num_classes - 1``, or anything else (a float such as 1.5, a bool, None); one
                name or index not in a list (``"red apple"``, ``33``).
        """
        if isinstance(conditions, (str, bytes)) or not hasattr(conditions, "__iter__"):
            # a name was read letter by letter ("unknown class 'r'"), an index ended in a TypeError
            raise ValueError(f"conditions={conditions!r}: give a list (one class per image), e.g. [{conditions!r}]")
        ids = []
        for c in conditions:
            if self.classes is not None:
                ids.append(self.classes.index(c))
                continue
            if isinstance(c, str):
                if not index_text(c):
                    raise ValueError(f"unknown class {c!r}: this model has no class names; allowed: 0..{self.num_classes - 1}")
                index = int(c)
            else:
                try:  # an int (numpy and torch integers too), never a float, bool or other object
                    if isinstance(c, bool):
                        raise TypeError
                    index = operator.index(c)
                except TypeError:
                    raise ValueError(f"class {c!r}: allowed a class index 0..{self.num_classes - 1}") from None
            if not 0 <= index < self.num_classes:
                raise ValueError(f"class index {index}: allowed 0..{self.num_classes - 1}")
            ids.append(index)
        return ids

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer restricted to the codebook: ``[..., D]`` hidden states -> ``[..., V]`` logits.

        Equals ``backbone.lm_head(hidden)[..., :V]`` (the class and null ids are never sampled)
        without computing the ``num_classes + 1`` other rows: with 1,911 classes and V = 1024
        (the built-in model) that is two thirds of the output layer's work.
        """
        head = self.backbone.lm_head
        bias = None if head.bias is None else head.bias[: self.codebook_size]
        return torch.nn.functional.linear(hidden, head.weight[: self.codebook_size], bias)

    def token_nll(self, tokens: torch.Tensor, conditions) -> torch.Tensor:
        """Negative log-likelihood of image tokens under the conditional model (no guidance).

        Teacher-forced: one forward over ``[class_token, tokens]``.

        Args:
            tokens: ``[B, N]`` int64 image tokens.
            conditions: ``B`` class indices or names.

        Returns:
            ``[B]`` float32 mean NLL per token, in nats (compare with ``ln V``).
        """
        ids = torch.tensor([self.codebook_size + c for c in self.class_ids(list(conditions))], device=self.device)
        inputs = torch.cat([ids[:, None], tokens[:, :-1].to(self.device)], dim=1)
        with torch.no_grad():
            logits = self.code_logits(self.backbone.model(input_ids=inputs).last_hidden_state).float()
        logp = logits.log_softmax(-1).gather(-1, tokens.to(self.device)[..., None]).squeeze(-1)
        return -logp.mean(-1)

    def start(self, conditions, batch_size, guided):
        if conditions is None:
            raise ValueError("ClassConditionalLlama needs conditions: a list of class indices or names")
        ids = self.class_ids(list(conditions))
        if not ids:
            raise ValueError("conditions is empty; give at least one class")
        if batch_size is not None and batch_size != len(ids):
            raise ValueError(f"batch_size={batch_size} differs from the {len(ids)} conditions given")
        return _LlamaSession(self, ids, guided)


class _LlamaSession(RaggedSession):
    """KV-cached per-row session; cond rows first, then (when guided) the null-class rows.

    Row ``b``'s sequence is ``[class token, code_0, ..., code_{k-1}]`` (no row ends); the per-row
    bookkeeping is :class:`~csdgen.models._ragged.RaggedSession`'s.
    """

    def __init__(self, model: ClassConditionalLlama, class_ids: list[int], guided: bool):
        V, C = model.codebook_size, model.num_classes
        first = torch.tensor([V + c for c in class_ids], device=model.device)
        if guided:
            first = torch.cat([first, torch.full_like(first, V + C)])
        self.model = model
        super().__init__(batch_size=len(class_ids), guided=guided, cache=DynamicCache(config=model.backbone.config),
                         prompt_ids=first[:, None], prompt_valid=torch.ones(len(first), 1, dtype=torch.bool),
                         num_image_tokens=model.num_image_tokens, device=model.device)

    def _logits(self, ids, attention_mask, position_ids, out, prefill):
        with torch.no_grad():
            hidden = self.model.backbone.model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                                               **cache_kwargs(self.kv.cache), use_cache=True).last_hidden_state
            hidden = hidden.gather(1, out[..., None].expand(-1, -1, hidden.shape[-1]))
            return self.model.code_logits(hidden)
