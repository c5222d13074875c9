"""Write the held-out emoji views' classifier-feature statistics next to the built-in weights.

Training-time only (``train.py`` writes the same file at its end; this reruns that step alone,
e.g. after retraining only the classifier). Needs the emoji package (``npm pack``, see
:mod:`csdgen.builtin.emoji`):

    python -m csdgen.builtin.reference [--weights csdgen/builtin/weights] [--views 2]

The file ``reference_features.safetensors`` lets the Frechet distance of
:mod:`csdgen.evaluation.quality` run offline without shipping the real images.
"""

from __future__ import annotations

import argparse

from . import DEFAULT_WEIGHTS_DIR, load_components
from .emoji import HELDOUT_SEED, load_emoji, make_views
from .train_files import save_safetensors


def write_reference(weights_dir=DEFAULT_WEIGHTS_DIR, views: int | None = None) -> dict:
    """Compute and atomically write the reference statistics of ``views`` held-out augmented views
    per class (default: the training run's ``heldout_views`` in config.json, else 2), with the data
    seed ``train.py`` uses; returns them."""
    from csdgen.evaluation.quality import REFERENCE_FILE, reference_feature_states

    components = load_components(weights_dir)
    if views is None:
        views = int(components.config.get("training", {}).get("heldout_views", 2))
    data = load_emoji()
    if len(data.names) != components.num_classes:
        raise ValueError(f"the emoji package has {len(data.names)} classes, the weights {components.num_classes}")
    images, _ = make_views(data, views, HELDOUT_SEED)
    states = reference_feature_states(components.classifier, images)
    save_safetensors(states, components.weights_dir / REFERENCE_FILE)
    return states


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="held-out feature statistics for the Frechet distance")
    parser.add_argument("--weights", default=DEFAULT_WEIGHTS_DIR)
    parser.add_argument("--views", type=int, default=None, help="held-out views per class (default: the training run's)")
    args = parser.parse_args(argv)
    states = write_reference(args.weights, args.views)
    print(f"wrote reference statistics of {int(states['real_features_num_samples'])} held-out emoji views")


if __name__ == "__main__":
    main()
