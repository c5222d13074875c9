"""Codebook neighbour tables for latent-proximity acceptance rules (LANTERN, GSD).

A table holds, for every codebook entry, its ``k`` nearest entries by squared Euclidean
distance of the codebook vectors (itself excluded), nearest first, as ``[V, k]`` int32 ids
(65 MB at V = 16384, k = 1000). It is computed once per codebook in row chunks written into
the preallocated table, so memory stays ``O(V k)`` plus one ``[chunk, V]`` block, never a
``V x V`` matrix, and cached per process keyed by the codebook's content.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

__all__ = ["NeighbourTable", "neighbour_table"]

_CACHE: dict[tuple, "NeighbourTable"] = {}


@dataclass(frozen=True)
class NeighbourTable:
    """Nearest codebook neighbours.

    Attributes:
        ids: ``[V, k]`` int32, neighbour ids of each entry, nearest first (the entry itself excluded).
        embeddings: ``[V, D]`` float32 codebook vectors the table was built from.
    """

    ids: torch.Tensor
    embeddings: torch.Tensor

    @property
    def k(self) -> int:
        return self.ids.shape[1]

    def neighbours(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[...]`` token ids -> ``[..., k]`` int64 neighbour ids, nearest first."""
        return self.ids.to(tokens.device)[tokens].long()

    def distances(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[...]`` token ids -> ``[..., k]`` float32 squared distances to their neighbours, ascending."""
        emb = self.embeddings.to(tokens.device)
        return (emb[self.neighbours(tokens)] - emb[tokens][..., None, :]).pow(2).sum(-1)


def _fingerprint(embeddings: torch.Tensor, k: int) -> tuple:
    digest = hashlib.sha1(embeddings.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()
    return (tuple(embeddings.shape), k, digest, str(embeddings.device))


def neighbour_table(embeddings: torch.Tensor, k: int, chunk: int = 512) -> NeighbourTable:
    """The ``k`` nearest neighbours of every codebook entry (cached per codebook and ``k``).

    Args:
        embeddings: ``[V, D]`` float codebook vectors.
        k: neighbours per entry, ``1 <= k < V``.
        chunk: rows of the distance matrix computed at a time.

    Returns:
        a :class:`NeighbourTable`.

    Raises:
        ValueError: ``k`` outside ``1 .. V - 1`` or embeddings not 2-D.
    """
    if embeddings.dim() != 2:
        raise ValueError(f"codebook embeddings must be [V, D], got shape {tuple(embeddings.shape)}")
    V = embeddings.shape[0]
    if not 1 <= k < V:
        raise ValueError(f"k={k}: neighbours per codebook entry must lie in 1..{V - 1}")
    key = _fingerprint(embeddings, k)
    if key not in _CACHE:
        emb = embeddings.detach().float()
        sq = (emb * emb).sum(-1)
        ids = torch.empty(V, k, dtype=torch.int32, device=emb.device)
        for start in range(0, V, chunk):
            rows = emb[start : start + chunk]
            d = (sq[start : start + chunk, None] - 2 * rows @ emb.t() + sq[None]).clamp_min_(0)  # [chunk, V]
            d[torch.arange(len(rows)), torch.arange(start, start + len(rows))] = float("inf")  # exclude self
            ids[start : start + len(rows)] = torch.topk(d, k, dim=-1, largest=False).indices  # nearest first
        _CACHE[key] = NeighbourTable(ids, emb)
    return _CACHE[key]
