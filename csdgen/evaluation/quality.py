"""Offline quality scores for the built-in model, the analogues of CLIP score and FID.

* **class consistency**: the built-in emoji classifier's probability of the requested class
  (as CLIP score measures agreement with the prompt);
* **Frechet distance**: torchmetrics' ``FrechetInceptionDistance`` with the classifier's
  penultimate features (``config["classifier"]["feature_dim"]``, 256 for the emoji model) in place
  of Inception, against held-out augmented views of the real emoji, whose
  feature statistics ship with the weights (``reference_features.safetensors``);
* **NLL**: the target model's own negative log-likelihood of the generated tokens, in nats
  per token (teacher-forced, conditional, no guidance).

The Frechet distance on a few dozen images is biased upwards (the covariance of few samples
is noisy): compare methods at the same image count, and against the AR-vs-AR noise floor.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

__all__ = ["ClassifierFeatures", "QualityScorer", "reference_feature_states"]

REFERENCE_FILE = "reference_features.safetensors"


class ClassifierFeatures(nn.Module):
    """Feature module for torchmetrics FID: images ``[B, 3, H, W]`` float in [0, 1] -> ``[B, D]``."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier
        self.num_features = int(classifier.feature_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.classifier.features(images.float() * 2 - 1).double()


def reference_feature_states(classifier: nn.Module, real_images: torch.Tensor, batch: int = 200) -> dict[str, torch.Tensor]:
    """Feature sums of real images, in the layout of torchmetrics' FID states.

    Args:
        classifier: the built-in classifier (with ``features``).
        real_images: ``[M, 3, 64, 64]`` float in [-1, 1].

    Returns:
        ``{"real_features_sum" [D], "real_features_cov_sum" [D, D], "real_features_num_samples" []}`` float64/int64.
    """
    feats = torch.cat([ClassifierFeatures(classifier)((real_images[i : i + batch] + 1) / 2) for i in range(0, len(real_images), batch)])
    return {
        "real_features_sum": feats.sum(0),
        "real_features_cov_sum": feats.t().mm(feats),
        "real_features_num_samples": torch.tensor(len(feats)),
    }


class QualityScorer:
    """Quality scores of built-in-model images.

    Args:
        model: a :class:`csdgen.models.builtin.BuiltinModel`.

    Raises:
        FileNotFoundError: if the reference feature statistics are missing from the weights folder.
    """

    def __init__(self, model):
        from safetensors.torch import load_file
        from torchmetrics.image.fid import FrechetInceptionDistance

        self.model = model
        self.classifier = model.components.classifier
        path = Path(model.components.weights_dir) / REFERENCE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no reference features at {path}; run python -m csdgen.builtin.reference")
        self._reference = load_file(str(path))
        self._fid_class = FrechetInceptionDistance

    def class_consistency(self, images: torch.Tensor, classes) -> torch.Tensor:
        """Probability of the requested class per image.

        Args:
            images: ``[B, 3, 64, 64]`` float in [-1, 1].
            classes: ``B`` class indices or names.

        Returns:
            ``[B]`` float32 in [0, 1].
        """
        ids = torch.tensor(self.model.class_ids(list(classes)))
        with torch.no_grad():
            probs = self.classifier(images.float()).softmax(-1)
        return probs.gather(-1, ids[:, None]).squeeze(-1)

    def class_agreement(self, images: torch.Tensor, classes) -> torch.Tensor:
        """Whether the classifier's top-1 class is the requested class, per image (the measure of
        train.py's ``classifier_agreement``; its mean is the top-1 class consistency).

        Args:
            images: ``[B, 3, 64, 64]`` float in [-1, 1].
            classes: ``B`` class indices or names.

        Returns:
            ``[B]`` bool.
        """
        ids = torch.tensor(self.model.class_ids(list(classes)))
        with torch.no_grad():
            return self.classifier(images.float()).argmax(-1) == ids

    def frechet_distance(self, images: torch.Tensor) -> float:
        """Frechet distance in classifier-feature space to the held-out real images.

        Args:
            images: ``[M, 3, 64, 64]`` float in [-1, 1], M >= 2.

        Raises:
            ValueError: fewer than 2 images.
        """
        if len(images) < 2:
            raise ValueError(f"the Frechet distance needs at least 2 images, got {len(images)}")
        metric = self._fid_class(feature=ClassifierFeatures(self.classifier), normalize=True, reset_real_features=False)
        for name, value in self._reference.items():
            setattr(metric, name, value.clone())
        metric.update((images.float() + 1) / 2, real=False)
        return float(metric.compute())

    def nll(self, tokens: torch.Tensor, classes) -> torch.Tensor:
        """``[B]`` mean NLL per token in nats of ``tokens`` ``[B, N]`` under the target model."""
        return self.model.token_nll(tokens, classes)
