"""Test helpers of the server tests: a tiny float64 class-conditional model with an image decoder,
and a server for it on a free loopback port in this process."""

import copy
import time

import torch

from csdgen.models import ClassConditionalLlama

CLASS_NAMES = ["alpha", "beta gamma", "delta, epsilon", "zeta", "eta"]  # one holds a comma, as emoji names do


class TinyImageModel(ClassConditionalLlama):
    """A ClassConditionalLlama whose 'decoder' paints each token's palette colour into a 2 x 2 cell."""

    def decode_images(self, tokens):
        g = torch.Generator().manual_seed(0)
        palette = torch.rand(self.codebook_size, 3, generator=g) * 2 - 1
        rows, cols = self.grid
        image = palette[tokens.cpu()].reshape(-1, rows, cols, 3).permute(0, 3, 1, 2)
        return image.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3).float()


def tiny_model(cached_model) -> TinyImageModel:
    """The session's cached test transformer (6 x 8 tokens, V = 48, 5 classes) in float64, with names and a decoder."""
    backbone = copy.deepcopy(cached_model.backbone).double()
    return TinyImageModel(backbone, cached_model.codebook_size, cached_model.num_classes, cached_model.grid,
                          class_names=CLASS_NAMES)


class SlowModel(TinyImageModel):
    """TinyImageModel whose forwards take ``delay`` seconds more (so a test can act while images
    decode), and raise RuntimeError while any row of the batch is of class ``poison``."""

    delay = 0.03
    poison: int | None = None

    def start(self, conditions, batch_size, guided):
        session = super().start(conditions, batch_size, guided)
        session.__class__ = _SlowSession
        return session


def _slow_session_class():
    from csdgen.models.llama import _LlamaSession

    class Slow(_LlamaSession):
        def _logits(self, ids, attention_mask, position_ids, out, prefill):
            time.sleep(self.model.delay)
            poison = self.model.poison
            if not prefill and poison is not None and bool((self.prompt_ids == self.model.codebook_size + poison).any()):
                raise RuntimeError(f"boom: class {poison} in the batch")
            return super()._logits(ids, attention_mask, position_ids, out, prefill)

    return Slow


def slow_model(cached_model, delay: float = 0.03) -> SlowModel:
    base = tiny_model(cached_model)
    model = SlowModel(base.backbone, base.codebook_size, base.num_classes, base.grid, class_names=CLASS_NAMES)
    model.delay = delay
    return model


_SlowSession = _slow_session_class()


def metric(url: str, name: str, labels: dict | None = None) -> float:
    """One sample of the server's /metrics (0 when absent)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and (labels is None or all(sample.labels.get(k) == v for k, v in labels.items())):
                return sample.value
    return 0.0


def wait_for(condition, timeout: float = 60.0, every: float = 0.05):
    """Poll ``condition()`` until it is truthy (returns it) or ``timeout`` seconds pass (AssertionError)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s")
