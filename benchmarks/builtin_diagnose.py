"""Where the built-in model's class agreement is lost: the classifier on real views, on their VQ
reconstructions (the ceiling), on teacher-forced continuations and on free AR samples.

    python benchmarks/builtin_diagnose.py [--weights DIR] [--classes 64] [--per-class 2] \
        [--guidance 1,3,6] [--prefix-rows 2,4,8] [--json FILE]

For a fixed set of classes (``--classes`` of the model's classes in the spread order of
:meth:`csdgen.class_names.ClassNames.spread`, so they cover the categories) and ``--per-class``
held-out augmented views of each (train.py's held-out views: seed ``HELDOUT_SEED``), prints one
table row per measure: the classifier's top-1 and top-5 agreement with the requested class and
its mean probability, for

- the real views and their VQ reconstructions (``decode(encode(x))``, the ceiling of any sample),
- teacher-forced continuations: the first k rows of a real view's codes given, the other rows
  sampled (guidance ``--tf-guidance``),
- free AR samples at each ``--guidance`` (temperature 1, and one row at temperature 0.7),

plus the held-out NLL per token (nats) with the true class, the null class and a wrong class (a
permutation of the classes): the gap true - null says how much the class token tells the model.
CPU, float32; plain AR with a KV cache and classifier-free guidance (``uncond + g (cond - uncond)``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from safetensors.torch import load_file

from csdgen.builtin import BuiltinComponents, build_ar_model, load_components
from csdgen.builtin.classifier import CropClassifier
from csdgen.builtin.vq import VQConfig, VQTokenizer
from csdgen.builtin.emoji import HELDOUT_SEED, load_emoji, make_views
from csdgen.class_names import ClassNames


def parse_floats(text: str) -> list[float]:
    return [float(t) for t in text.split(",") if t.strip()]


@torch.no_grad()
def sample_codes(model, class_tokens: torch.Tensor, null_id: int, codebook: int, guidance: float,
                 temperature: float = 1.0, seed: int = 0, prefix: torch.Tensor | None = None,
                 n_tokens: int = 256) -> torch.Tensor:
    """class_tokens int64 [B] (token ids), prefix int64 [B, k] (given codes) or None ->
    codes int64 [B, n_tokens] (the prefix followed by sampled codes).

    Classifier-free guidance when ``guidance != 1`` (a null-class branch in the same batch).
    """
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    b = class_tokens.shape[0]
    prefix = prefix if prefix is not None else torch.zeros(b, 0, dtype=torch.long)
    guided = guidance != 1.0
    first = torch.cat([class_tokens[:, None], prefix], dim=1)
    if guided:
        first = torch.cat([first, torch.cat([torch.full_like(class_tokens[:, None], null_id), prefix], 1)])
    cache = DynamicCache(config=model.config)
    tokens, pos, out = first, 0, [prefix]
    for _ in range(prefix.shape[1], n_tokens):
        length = tokens.shape[1]
        position_ids = torch.arange(pos, pos + length)[None].expand(tokens.shape[0], length)
        logits = model(input_ids=tokens, cache=cache, position_ids=position_ids,
                       use_cache=True).logits[:, -1, :codebook].float()
        pos += length
        if guided:
            cond, uncond = logits[:b], logits[b:]
            logits = uncond + guidance * (cond - uncond)
        nxt = torch.multinomial(F.softmax(logits / temperature, dim=-1), 1, generator=gen)
        out.append(nxt)
        tokens = torch.cat([nxt, nxt]) if guided else nxt
    return torch.cat(out, dim=1)


@torch.no_grad()
def nll_per_token(model, codes: torch.Tensor, class_tokens: torch.Tensor, batch: int = 64) -> float:
    """Mean NLL (nats per token) of codes int64 [N, 256] after class_tokens int64 [N]."""
    total = 0.0
    for i in range(0, len(codes), batch):
        c, t = codes[i:i + batch], class_tokens[i:i + batch]
        inputs = torch.cat([t[:, None], c[:, :-1]], dim=1)
        logits = model(input_ids=inputs, use_cache=False).logits.float()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), c.reshape(-1), reduction="sum").item()
    return total / codes.numel()


@torch.no_grad()
def judge(classifier, images: torch.Tensor, labels: torch.Tensor) -> dict:
    """images float [N, 3, 64, 64] in [-1, 1], labels int64 [N] -> top-1, top-5, mean p(label)."""
    probs = torch.cat([F.softmax(classifier(images[i:i + 128]).float(), -1) for i in range(0, len(images), 128)])
    top5 = probs.topk(min(5, probs.shape[1]), dim=-1).indices
    return {"top1": float((probs.argmax(-1) == labels).float().mean()),
            "top5": float((top5 == labels[:, None]).any(-1).float().mean()),
            "p_class": float(probs.gather(1, labels[:, None]).mean())}


def from_checkpoint(folder: Path, checkpoint: Path) -> BuiltinComponents:
    """A running train.py's components: tokenizer, classifier and config.json from its ``--out``
    ``folder`` (written before the AR stage when the classifier is given), the AR model from its
    mid-stage ``checkpoint`` (``ar.ckpt.pt``: float32 state under ``"model"``)."""
    config = json.loads((folder / "config.json").read_text())
    state = lambda name: {k: v.float() for k, v in load_file(str(folder / name)).items()}
    vq = VQTokenizer(VQConfig(**config["vq"]))
    vq.load_state_dict(state("vq.safetensors"))
    clf = CropClassifier(**config["classifier"])
    clf.load_state_dict(state("classifier.safetensors"))
    ar = build_ar_model(config["llama"])
    ar.load_state_dict(torch.load(checkpoint, weights_only=False)["model"])
    return BuiltinComponents(vq=vq.eval(), ar=ar.eval(), classifier=clf.eval(), config=config, weights_dir=folder)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", type=Path, default=None, help="weights folder (default: the shipped weights)")
    p.add_argument("--judge", type=Path, default=None,
                   help="judge with this weights folder's classifier, on its classes (e.g. a subset model's, "
                        "to measure the 1,911-class weights on the subset's classes)")
    p.add_argument("--ar-checkpoint", type=Path, default=None,
                   help="measure this AR checkpoint of a running train.py (its ar.ckpt.pt; --weights: the run's --out)")
    p.add_argument("--classes", type=int, default=64, help="classes measured (spread order)")
    p.add_argument("--per-class", type=int, default=2, help="held-out views (and samples) per class")
    p.add_argument("--guidance", type=parse_floats, default=[1.0, 3.0, 6.0])
    p.add_argument("--prefix-rows", type=lambda s: [int(t) for t in s.split(",")], default=[2, 4, 8],
                   help="token rows (of 16) given from the real view in the teacher-forced rows")
    p.add_argument("--tf-guidance", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()

    comp = load_components(args.weights) if args.ar_checkpoint is None else from_checkpoint(args.weights, args.ar_checkpoint)
    vq, ar, clf = comp.vq, comp.ar, comp.classifier
    names = comp.class_names
    codebook, null_id = comp.codebook_size, comp.null_class_id
    cols = vq.grid[1]
    judged = names  # the classes the classifier chooses among, in its order
    if args.judge is not None:  # another model's (restricted) classifier and its classes
        jconf = json.loads((args.judge / "config.json").read_text())
        judged = list(jconf["class_names"])
        clf = CropClassifier(**jconf["classifier"])
        clf.load_state_dict({k: v.float() for k, v in load_file(str(args.judge / "classifier.safetensors")).items()})
        clf.eval()
        missing = [n for n in judged if n not in names]
        if missing:
            raise SystemExit(f"--judge {args.judge}: classes the model does not have: {missing[:5]}")
    data = load_emoji()
    xho, yho = make_views(data, max(2, args.per_class), HELDOUT_SEED)
    pick = [names.index(judged[j]) for j in ClassNames(judged).spread(min(args.classes, len(judged)))]
    views, labels = [], []
    for c in pick:
        full = data.names.index(names[c])
        views.append(xho[(yho == full).nonzero().flatten()[:args.per_class]])
        labels += [c] * args.per_class
    x = torch.cat(views)
    cls_tokens = torch.tensor(labels) + codebook
    y = torch.tensor([judged.index(names[c]) for c in labels])  # the classifier's labels
    codes = vq.encode(x).flatten(1)

    print(f"weights {comp.weights_dir}; {len(pick)} classes x {args.per_class} (of {len(names)} classes){', judged by ' + str(args.judge) if args.judge else ''}{', AR ' + str(args.ar_checkpoint) if args.ar_checkpoint else ''}, "
          f"{args.threads} thread(s)\n| measure | top-1 | top-5 | mean p(class) | s |\n|---|---|---|---|---|", flush=True)
    rows: dict[str, dict] = {}

    def row(name: str, images: torch.Tensor, t: float) -> None:
        r = rows[name] = judge(clf, images, y)
        print(f"| {name} | {r['top1']:.3f} | {r['top5']:.3f} | {r['p_class']:.3f} | {time.time() - t:.0f} |", flush=True)

    wrong = torch.tensor(pick)[torch.randperm(len(pick), generator=torch.Generator().manual_seed(1))]
    wrong_y = wrong.repeat_interleave(args.per_class)
    nll = {"true class": nll_per_token(ar, codes, cls_tokens),
           "null class": nll_per_token(ar, codes, torch.full_like(y, null_id)),
           "wrong class": nll_per_token(ar, codes, wrong_y + codebook)}
    print("| held-out NLL per token (nats) | " + " | ".join(f"{k} {v:.3f}" for k, v in nll.items()) + " |", flush=True)
    t = time.time()
    row("real held-out views", x, t)
    row("VQ reconstructions (ceiling)", vq.decode(codes), t)
    for g in args.guidance:
        t = time.time()
        got = sample_codes(ar, cls_tokens, null_id, codebook, g, seed=args.seed + 100)
        row(f"AR samples, g {g:g}, T 1", vq.decode(got), t)
    for k in sorted(args.prefix_rows, reverse=True):
        t = time.time()
        got = sample_codes(ar, cls_tokens, null_id, codebook, args.tf_guidance, seed=args.seed + k,
                           prefix=codes[:, :k * cols])
        row(f"teacher-forced {k}/16 rows, g {args.tf_guidance:g}", vq.decode(got), t)
    t = time.time()
    got = sample_codes(ar, cls_tokens, null_id, codebook, 3.0, temperature=0.7, seed=args.seed + 200)
    row("AR samples, g 3, T 0.7", vq.decode(got), t)
    print(f"total {time.time() - t0:.0f} s")
    result = {"weights": str(comp.weights_dir), "classes": [names[c] for c in pick], "per_class": args.per_class,
              "rows": rows, "nll_per_token": nll, "seconds": time.time() - t0}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
