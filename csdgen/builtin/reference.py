"""Write the held-out crops' classifier-feature statistics next to the built-in weights.

Training-time only (needs scikit-image / scikit-learn for the photographs):

    python -m csdgen.builtin.reference [--weights csdgen/builtin/weights] [--n 800]

The file ``reference_features.safetensors`` lets the Frechet distance of
:mod:`csdgen.evaluation.quality` run offline without shipping the real crops.
"""

from __future__ import annotations

import argparse

from . import DEFAULT_WEIGHTS_DIR, load_components
from .data import HELDOUT_SEED, make_crops
from .train import save_safetensors


def write_reference(weights_dir=DEFAULT_WEIGHTS_DIR, n: int = 800) -> dict:
    """Compute and atomically write the reference statistics (as ``train.py`` does at its end); returns them."""
    from csdgen.evaluation.quality import REFERENCE_FILE, reference_feature_states

    components = load_components(weights_dir)
    images, _ = make_crops(n, HELDOUT_SEED)
    states = reference_feature_states(components.classifier, images)
    save_safetensors(states, components.weights_dir / REFERENCE_FILE)
    return states


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="held-out feature statistics for the Frechet distance")
    parser.add_argument("--weights", default=DEFAULT_WEIGHTS_DIR)
    parser.add_argument("--n", type=int, default=800)
    args = parser.parse_args(argv)
    states = write_reference(args.weights, args.n)
    print(f"wrote reference statistics of {int(states['real_features_num_samples'])} held-out crops")


if __name__ == "__main__":
    main()
