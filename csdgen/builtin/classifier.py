"""Small CNN classifier over 64 x 64 images (runtime module, torch only): the built-in model's emoji classifier.

Used for a class-consistency score of generated images and as the feature extractor of
a Frechet distance (``features`` gives the penultimate-layer embedding).
"""

from __future__ import annotations

import torch
from torch import nn


def _block(cin: int, cout: int) -> nn.Sequential:
    """conv3x3-BN-ReLU twice then 2x max-pool: [B, cin, H, W] -> [B, cout, H/2, W/2]."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class CropClassifier(nn.Module):
    """Images float [B, 3, 64, 64] in [-1, 1] -> logits over ``num_classes`` classes."""

    def __init__(self, num_classes: int = 20, width: int = 32, feature_dim: int = 128):
        super().__init__()
        self.num_classes = num_classes
        self.feature_dim = feature_dim
        w = width
        self.trunk = nn.Sequential(
            _block(3, w), _block(w, 2 * w), _block(2 * w, 4 * w),   # 64 -> 8 px
            nn.Conv2d(4 * w, feature_dim, 3, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(feature_dim, num_classes))

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """images float [B, 3, 64, 64] in [-1, 1] -> features float [B, feature_dim] (>= 0)."""
        return self.trunk(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images float [B, 3, 64, 64] in [-1, 1] -> logits float [B, num_classes]."""
        return self.head(self.features(images))
