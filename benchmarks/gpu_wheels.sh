#!/usr/bin/env bash
# The wheels csdgen's server needs on the GPU machine, downloaded here into .whl/ (default) or $1.
#
# The GPU machine runs its own image (Python 3.12, torch, transformers, accelerate, safetensors, numpy,
# pillow, tqdm, pyyaml, matplotlib, torchmetrics, prometheus-client, huggingface-hub, pytest,
# hypothesis, httpx) and reaches no network. It lacks what `csdgen serve` and the server tests import:
# fastapi (with starlette, pydantic), uvicorn and openai. This script downloads cp312 manylinux wheels
# of those and of their dependencies, at the versions constraints.txt pins (the ones csdgen is tested
# with); about 7 MB. gradio (csdgen demo) is left out: with its dependencies it is larger than what a
# device run can carry beside the working tree, and no device check needs it.
#
# On the GPU machine (docs/engine.md, "Running on a GPU"):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
#   python3 benchmarks/gpu_check.py --out $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -c constraints.txt -d "$dest" fastapi uvicorn openai
echo "$(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
