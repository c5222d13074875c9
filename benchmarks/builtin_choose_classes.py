"""Choose the built-in model's class set by measurement: emoji the classifier recognises after
the VQ round trip, spread over categories, whose looks differ.

    python benchmarks/builtin_choose_classes.py --out csdgen/builtin/classes.json [--weights DIR]

Steps (the shipped 1,911-class weights judge every candidate):

1. Pool: the emoji of the categories in ``QUOTAS`` (animals and plants, food, travel and
   weather, objects, activities, a few faces), without those with skin-tone variants (their
   pictures are people and hands, many alike), without the 31 clock faces of "time" and the
   "place-map" subcategory (maps and landmarks too detailed for 16 x 16 tokens).
2. Score: ``--views`` augmented views per class (a seed of its own, neither train.py's
   training nor its held-out views), each through the VQ tokenizer (``decode(encode(x))``); a
   class's score is the classifier's top-1 accuracy on those reconstructions among all 1,911
   classes. Classes under ``--min-accuracy`` are dropped: what the tokenizer loses, the AR
   model cannot draw.
3. Pick: per category its quota, greedily the farthest-point way in the classifier's feature
   space (mean feature of the class's reconstructions, cosine distance to every class already
   chosen, any category), seeded with train.py's showcase classes that pass, so the classes
   differ in shape and colour.

Writes the chosen names (package order) and, per class, category and score, with the restricted
classifier's accuracy (logits of the chosen classes only) on the views and reconstructions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from csdgen.builtin import load_components
from csdgen.builtin.emoji import HELDOUT_SEED, base_entries, fetch_package, load_emoji, make_views
from csdgen.builtin.train import SHOWCASE

QUOTAS = {"Animals & Nature": 24, "Food & Drink": 22, "Travel & Places": 20, "Objects": 16,
          "Activities": 8, "Smileys & Emotion": 6}
SKIP_SUBCATEGORIES = {"time", "place-map"}


@torch.no_grad()
def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--weights", type=Path, default=None, help="1,911-class weights (default: shipped)")
    p.add_argument("--views", type=int, default=8, help="augmented views per candidate class")
    p.add_argument("--min-accuracy", type=float, default=0.75)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    comp = load_components(args.weights)
    data = load_emoji()
    if comp.class_names != data.names:
        sys.exit("the weights' classes are not the package's 1,911 emoji in package order")
    entries = base_entries(fetch_package())
    pool = [c for c, e in enumerate(entries)
            if e["category"] in QUOTAS and not e.get("skin_variations")
            and e["subcategory"] not in SKIP_SUBCATEGORIES]
    x, y = make_views(data, args.views, HELDOUT_SEED + 17)
    keep = torch.isin(y, torch.tensor(pool))
    x, y = x[keep], y[keep]
    recon = torch.cat([comp.vq.decode(comp.vq.encode(x[i:i + 256])) for i in range(0, len(x), 256)])
    feats = torch.cat([comp.classifier.features(recon[i:i + 256]) for i in range(0, len(recon), 256)])
    pred = comp.classifier.head(feats).argmax(-1)
    score = {c: float((pred[y == c] == c).float().mean()) for c in pool}
    mean_feat = {c: F.normalize(feats[y == c].mean(0), dim=0) for c in pool}
    passing = [c for c in pool if score[c] >= args.min_accuracy]
    print(f"pool {len(pool)} classes, {len(passing)} with VQ-reconstruction accuracy >= {args.min_accuracy} "
          f"({time.time() - t0:.0f} s)", flush=True)

    chosen: list[int] = [data.names.index(n) for n in SHOWCASE if n in data.names]
    chosen = [c for c in chosen if c in passing]
    count = {cat: sum(entries[c]["category"] == cat for c in chosen) for cat in QUOTAS}
    while any(count[cat] < q for cat, q in QUOTAS.items()):
        best, best_d = None, -1.0
        chosen_feats = torch.stack([mean_feat[c] for c in chosen]) if chosen else None
        for c in passing:
            cat = entries[c]["category"]
            if c in chosen or count[cat] >= QUOTAS[cat]:
                continue
            d = 1.0 if chosen_feats is None else float(1 - (chosen_feats @ mean_feat[c]).max())
            if d > best_d:
                best, best_d = c, d
        if best is None:
            print("warning: not enough passing classes for the quotas", {k: v for k, v in count.items()})
            break
        chosen.append(best)
        count[entries[best]["category"]] += 1
    chosen.sort()

    # the restricted classifier (logits of the chosen classes only) on these views
    sub = torch.tensor(chosen)
    local = {c: i for i, c in enumerate(chosen)}
    in_set = torch.isin(y, sub)
    y_local = torch.tensor([local[int(c)] for c in y[in_set]])
    real_feats = torch.cat([comp.classifier.features(x[in_set][i:i + 256]) for i in range(0, int(in_set.sum()), 256)])
    acc_real = float((comp.classifier.head(real_feats)[:, sub].argmax(-1) == y_local).float().mean())
    acc_recon = float((comp.classifier.head(feats[in_set])[:, sub].argmax(-1) == y_local).float().mean())
    result = {
        "how": (f"benchmarks/builtin_choose_classes.py: pool = categories {sorted(QUOTAS)} without skin-tone "
                f"variants and subcategories {sorted(SKIP_SUBCATEGORIES)} ({len(pool)} classes); kept those the "
                f"shipped 1,911-class classifier recognises on >= {args.min_accuracy} of {args.views} VQ "
                f"reconstructions ({len(passing)}); picked per category quota {QUOTAS} by farthest-point "
                f"selection in the classifier's feature space, seeded with train.py's showcase classes"),
        "classes": [data.names[c] for c in chosen],
        "restricted_classifier_accuracy": {"real_views": acc_real, "vq_reconstructions": acc_recon,
                                           "views_per_class": args.views},
        "per_class": {data.names[c]: {"category": entries[c]["category"], "subcategory": entries[c]["subcategory"],
                                      "vq_reconstruction_accuracy_1911": score[c]} for c in chosen},
    }
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"{len(chosen)} classes -> {args.out}; restricted classifier accuracy real {acc_real:.3f}, "
          f"VQ reconstructions {acc_recon:.3f} ({time.time() - t0:.0f} s)")
    for cat in QUOTAS:
        print(f"  {cat}: " + ", ".join(data.names[c] for c in chosen if entries[c]["category"] == cat))


if __name__ == "__main__":
    main()
