"""Class by class: how often the built-in model's AR samples are judged the class they were asked for.

    python benchmarks/builtin_class_agreement.py --weights RUN --per-class 4 --guidance 3,5 --json out.json
    python benchmarks/builtin_class_agreement.py --weights RUN --ar-checkpoint RUN/ar.ckpt.pt ...

For every class of the weights folder (train.py's ``--out``) and every ``--guidance``: ``--per-class``
plain AR samples (temperature 1, classifier-free guidance ``uncond + g (cond - uncond)``, seeds fixed),
decoded by the VQ tokenizer and judged by the folder's classifier. Prints the overall top-1 agreement
per guidance scale and the classes from worst to best; ``--json`` keeps, per guidance and class, the
samples' top-1 hits and mean probability of the class (what ``csdgen.builtin.ship`` reads to choose
the classes it offers). CPU, float32.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from builtin_diagnose import from_checkpoint, parse_floats, sample_codes  # noqa: E402

from csdgen.builtin import load_components  # noqa: E402


@torch.no_grad()
def class_agreement(comp, per_class: int, guidance: float, seed: int = 0, batch: int = 96) -> dict:
    """Per class: ``{"hits": int, "n": int, "p_class": float}`` of ``per_class`` AR samples at ``guidance``.

    Returns a dict class name -> that record, in class order."""
    names = comp.class_names
    labels = torch.arange(len(names)).repeat_interleave(per_class)
    hits = torch.zeros(len(names), dtype=torch.long)
    p_sum = torch.zeros(len(names), dtype=torch.float64)
    for start in range(0, len(labels), batch):
        y = labels[start:start + batch]
        codes = sample_codes(comp.ar, y + comp.codebook_size, comp.null_class_id, comp.codebook_size, guidance,
                             seed=seed + start)
        images = comp.vq.decode(codes.reshape(-1, *comp.vq.grid))
        probs = F.softmax(comp.classifier(images).float(), -1)
        hits.index_add_(0, y, (probs.argmax(-1) == y).long())
        p_sum.index_add_(0, y, probs.gather(1, y[:, None])[:, 0].double())
    return {n: {"hits": int(hits[c]), "n": per_class, "p_class": float(p_sum[c] / per_class)}
            for c, n in enumerate(names)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", type=Path, required=True, help="weights folder (train.py's --out)")
    p.add_argument("--ar-checkpoint", type=Path, default=None, help="a running train.py's ar.ckpt.pt instead of "
                                                                    "the folder's ar.safetensors")
    p.add_argument("--per-class", type=int, default=4)
    p.add_argument("--guidance", type=parse_floats, default=[3.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    comp = load_components(args.weights) if args.ar_checkpoint is None else from_checkpoint(args.weights,
                                                                                           args.ar_checkpoint)
    result = {"weights": str(args.weights), "ar_checkpoint": str(args.ar_checkpoint or ""),
              "per_class": args.per_class, "seed": args.seed, "threads": args.threads, "by_guidance": {}}
    for g in args.guidance:
        t = time.time()
        per = class_agreement(comp, args.per_class, g, args.seed)
        total = sum(r["hits"] for r in per.values()) / sum(r["n"] for r in per.values())
        result["by_guidance"][f"{g:g}"] = {"agreement": total, "classes": per, "seconds": time.time() - t}
        order = sorted(per, key=lambda n: (per[n]["hits"], per[n]["p_class"]))
        print(f"guidance {g:g}: agreement {total:.3f} over {len(per)} classes x {args.per_class} "
              f"({time.time() - t:.0f} s)", flush=True)
        print("  worst: " + ", ".join(f"{n} {per[n]['hits']}/{per[n]['n']}" for n in order[:12]))
        print("  best:  " + ", ".join(f"{n} {per[n]['hits']}/{per[n]['n']}" for n in order[::-1][:12]))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
