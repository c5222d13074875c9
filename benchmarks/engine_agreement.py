"""What holds across engines and batch sizes on the built-in model: identical images, equal tokens, logit gaps.

Not a test. From the project root (one torch thread unless --threads):

    python benchmarks/engine_agreement.py                         # CSD, window 16, seeds 0-3, 4 class sets of 8
    python benchmarks/engine_agreement.py --dtype bfloat16 --seeds 0,1

Per seed and class set (the classes of ``ClassNames.spread`` from offsets 0, B, 2B, ... and the
set [0, 1, C // 2, C - 1] of the model's C classes padded with the next spread classes), three runs of ``csdgen.generate``
with ``image_indices`` 0..B-1: eager engine at batch B (``--batch``, default 8), static engine at batch B,
and the static engine at batch 1 (each image alone, its own image index). It prints one line per comparison
(eager vs static at batch B; static batch 1 vs batch B): images identical, tokens equal, and the
largest teacher-forced logit difference (:func:`csdgen.evaluation.agreement.teacher_forced_logits`:
the batch-B eager run's tokens fed to both sides, at ``--window``, conditional and unconditional rows),
then the totals and the step compression of each run kind.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import csdgen  # noqa: E402
from csdgen.evaluation.agreement import teacher_forced_logits, token_agreement  # noqa: E402
from csdgen.models.builtin import load_builtin_model  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2,3", help="run seeds, comma-separated (default 0,1,2,3)")
    p.add_argument("--sets", type=int, default=4, help="class sets from the spread order (default 4; plus the fixed set)")
    p.add_argument("--batch", type=int, default=8,
                   help="images per run of the batched engines, 1 .. the model's classes (default 8); the fixed set "
                        "takes its first ones of the classes [0, 1, C // 2, C - 1]")
    p.add_argument("--method", default="csd", help="a csdgen.generate method: ar, sjd, csd, ... (default csd)")
    p.add_argument("--window", type=int, default=16, help="the Jacobi window (default 16)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float64"], default="float32",
                   help="the model's dtype for every run (default float32)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: allowed comma-separated integers")
    if args.sets < 0 or args.window < 1 or args.threads < 1:
        p.error(f"--sets {args.sets}, --window {args.window}, --threads {args.threads}: allowed --sets >= 0, "
                f"--window >= 1, --threads >= 1")
    if args.method not in csdgen.METHODS:
        p.error(f"--method {args.method!r}: allowed {', '.join(csdgen.METHODS)}")
    torch.set_num_threads(args.threads)
    model = load_builtin_model()
    dtype = getattr(torch, args.dtype)
    if dtype != torch.float32:
        import copy

        model = copy.copy(model)
        model.backbone = copy.deepcopy(model.backbone).to(dtype)
    B = args.batch
    C = len(model.classes.names)
    if not 1 <= B <= C:
        p.error(f"--batch {B}: allowed 1..{C} (the model's classes; one class per image)")
    spread = model.classes.spread(B * (args.sets + 1))
    sets = [spread[i * B:(i + 1) * B] for i in range(args.sets)]
    fixed = list(dict.fromkeys([0, 1, C // 2, C - 1]))[:B]  # the first two, the middle and the last class
    sets.append(fixed + [c for c in spread if c not in fixed][: B - len(fixed)])
    guided = model.defaults.guidance_scale != 1.0
    batched = f"b{B}"  # the batched runs' label
    totals = {"eager-static": [0, 0, 0.0, 0], f"b1-{batched}": [0, 0, 0.0, 0]}
    compression = {f"eager {batched}": [], f"static {batched}": [], "static b1": []}
    began = time.perf_counter()
    print(f"built-in model, {args.dtype}, {args.method} window {args.window}, batch {B}, {args.threads} torch thread(s), "
          f"torch {torch.__version__}")
    for seed in seeds:
        for classes in sets:
            kwargs = dict(method=args.method, window=args.window, seed=seed)
            eager = csdgen.generate(model, classes, engine="eager", image_indices=list(range(B)), **kwargs)
            static = csdgen.generate(model, classes, engine="static", image_indices=list(range(B)), **kwargs)
            alone = [csdgen.generate(model, [c], engine="static", image_indices=[i], **kwargs) for i, c in enumerate(classes)]
            alone_tokens = torch.cat([a.tokens for a in alone])
            compression[f"eager {batched}"].append(eager.step_compression)
            compression[f"static {batched}"].append(static.step_compression)
            compression["static b1"].append(sum(a.step_compression for a in alone) / B)
            fed = eager.tokens
            ref = teacher_forced_logits(model, classes, fed, guided=guided, engine="eager", window=args.window)
            stat = teacher_forced_logits(model, classes, fed, guided=guided, engine="static", window=args.window)
            single = [teacher_forced_logits(model, [c], fed[i:i + 1], guided=guided, engine="static", window=args.window)
                      for i, c in enumerate(classes)]

            def gap(a, b):
                return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b) if x is not None)

            gaps = {"eager-static": gap(ref, stat),
                    f"b1-{batched}": max(gap(stat, (torch.cat([s[0] for s in single]),
                                            None if not guided else torch.cat([s[1] for s in single]))), 0.0)}
            for name, (a, b) in {"eager-static": (eager.tokens, static.tokens), f"b1-{batched}": (alone_tokens, static.tokens)}.items():
                images, tokens = token_agreement(a, b)
                t = totals[name]
                t[0] += round(images * B)
                t[1] += B
                t[2] = max(t[2], gaps[name])
                t[3] += round(tokens * a.numel())
                print(f"seed {seed} classes {classes}: {name}: {round(images * B)}/{B} images identical, "
                      f"{100 * tokens:.1f} % tokens equal, max logit gap {gaps[name]:.2e}", flush=True)
    N = model.num_image_tokens
    for name, (same, count, worst, equal) in totals.items():
        print(f"TOTAL {name}: {same}/{count} images identical ({100 * same / count:.1f} %), "
              f"{100 * equal / (count * N):.1f} % tokens equal, max teacher-forced logit gap {worst:.2e}")
    for name, values in compression.items():
        print(f"step compression {name}: mean {sum(values) / len(values):.2f}x (range {min(values):.2f}-{max(values):.2f})")
    print(f"{time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
