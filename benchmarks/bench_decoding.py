"""AR, SJD and CSD at a fixed window and at window="auto", at several batch sizes, interleaved.

Not a test: it times and prints. Run from the project root:

    python benchmarks/bench_decoding.py                       # built-in model, batches 1, 2, 16
    python benchmarks/bench_decoding.py --batches 1,4 --repeats 3 --window 16

For every batch size and method it prints: forwards of the batch (steps), step compression
(mean over images of N / the image's forwards), wall seconds per batch (device synchronised,
after the warm-up round), the wall speed-up over AR at the same batch size, and for fixed windows
the *CPU limit* ``step compression / (t(W) / t(1))``: the speed-up the step compression allows
once a forward of width W costs ``t(W)/t(1)`` forwards of width 1 (``t`` measured on a session
of the same model and batch, median of ``--timing-repeats``). ``auto`` also gets its mean width.

Every cell runs once first on images of its own (the warm-up round, not in the table): no cell's
first timed round pays the process's first calls at its shapes, and ``auto`` starts the rounds
with what it learns in a long run; its first call, where it learns the times per width and the
method's acceptance, is printed on its own line against the fixed window's on the same images.
Every round decodes ``--images`` images (default 16) per cell at every batch size, in
``ceil(images / batch)`` batches, and at least ``--min-batches`` batches (default 4: at batch 16
one call's time moves by about 5 % on the 2-core VM of docs/builtin.md, and with one batch per
round three rounds could not tell auto's gap to AR within 3 %); the cells take turns batch by batch (every other turn in
reverse order; within a turn every ``auto`` cell runs next to AR and to its fixed window), so a
machine shared with other jobs slows all of them alike and a cell's figure
is not one image's content (with one batch per round, batch 1 timed three images per cell, and
the paired gaps' intervals were +-24 %); seconds are per batch, means over rounds. ``--methods CSD`` runs AR and CSD only (a cell checked
over many rounds costs a third less). The last columns time :func:`csdgen.engine.verify` as it runs inside the loop
(``generate(profile=True)``, a separate run: profiling adds syncs): its share of an iteration.

**The goal of ``window="auto"``** (issue 16): never more than 3 % behind the better of AR and
the fixed window, at every batch size. After each batch's table a line says, per method,
whether ``auto`` met it (its mean seconds per batch against the better of the two), and the
same gap paired round by round (each round's auto run against the same round's run of the
better method: same images, minutes apart) with its 95 % interval (Student's t): "met" when the
whole interval lies at or below the tolerance, "missed" when it lies above, else "not told
apart" (three rounds on a machine whose timings move 10 % between runs rarely tell 3 % apart);
the last line counts the cells that met it by the means. Then, per batch and method, the width chooser's own check
(:attr:`csdgen.GenerationResult.auto_log`): per width it chose, the predicted and the measured
tokens per image and forward, seconds per iteration and tokens per second, so a miss can be
traced to the acceptance model (tokens) or the cost model (seconds). Run it on a quiet machine
with one torch thread:

    OMP_NUM_THREADS=1 python benchmarks/bench_decoding.py --batches 1,2,16 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import csdgen
from csdgen.cli._options import count, path, real
from csdgen.sampling import SamplingConfig


def load_model(kind: str, weights: Path | None = None):
    """The built-in model (``weights``: its folder, default the shipped one), or a random Llama of about
    its size (``--model random``: 8 layers against its 10, MLP width 512 against its 768; the same hidden
    size, codebook and grid)."""
    if kind == "builtin":
        from csdgen.models.builtin import load_builtin_model

        return load_builtin_model(weights), "built-in (trained)" if weights is None else f"built-in ({weights})"
    from csdgen.models import ClassConditionalLlama

    model = ClassConditionalLlama.random(codebook_size=1024, num_classes=1911, grid=(16, 16), hidden_size=256, num_layers=8,
                                         num_heads=8)
    with torch.no_grad():
        model.backbone.lm_head.weight.mul_(4.0)
    return model, "random Llama (8 layers, hidden 256, V 1024, 1911 classes, 16x16; the built-in model has 10 layers)"


def forward_times(model, batch: int, widths: list[int], sampling: SamplingConfig, repeats: int) -> dict[int, float]:
    """Median seconds of one forward of each width at half the image (earlier where the widest would pass
    the image's last token), on a session of ``batch`` images."""
    session = model.start([i % getattr(model, "num_classes", 1) for i in range(batch)], None, sampling.guided)
    session.prefill()
    half = max(0, min(model.num_image_tokens // 2, model.num_image_tokens - 1 - max(widths)))
    tokens = torch.randint(model.codebook_size, (batch, model.num_image_tokens), device=model.device)
    session.forward(tokens[:, :half], torch.zeros(batch, dtype=torch.long))
    times = {}
    for width in widths:
        samples = []
        for k in range(repeats + 1):
            _sync(model)
            began = time.perf_counter()
            session.forward(tokens[:, half : half + width], torch.full((batch,), half))
            _sync(model)
            if k:  # the first call warms up
                samples.append(time.perf_counter() - began)
            session.rollback(torch.full((batch,), half))
        times[width] = statistics.median(samples)
    return times


def goal(auto_seconds: float, ar_seconds: float, fixed_seconds: float, tolerance: float = 0.03) -> tuple[bool, float, str]:
    """Whether ``auto`` met its goal: at most ``tolerance`` slower than the better of AR and the fixed window.

    Returns:
        ``(met, gap, best)``: ``gap = auto / best - 1`` (negative: auto was faster), ``best`` the
        name of the better of the two (``"AR"`` or ``"fixed"``).
    """
    best, name = (ar_seconds, "AR") if ar_seconds <= fixed_seconds else (fixed_seconds, "fixed")
    gap = auto_seconds / best - 1
    return gap <= tolerance, gap, name


#: two-sided 95 % quantiles of Student's t by degrees of freedom (1 .. 10; beyond, the normal 1.96 is near enough)
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def paired_gap(auto_seconds: list[float], best_seconds: list[float]) -> tuple[float, float]:
    """The mean and the 95 % half-width of ``auto / best - 1`` over rounds, each round's auto run
    paired with the same round's run of the better method (same seed and images, run minutes
    apart on the same machine, so the machine's drift and the images' content cancel in the
    ratio). Fewer than two rounds: half-width ``inf``."""
    ratios = [a / b - 1 for a, b in zip(auto_seconds, best_seconds)]
    n = len(ratios)
    if n < 2:
        return (ratios[0] if ratios else float("nan")), float("inf")
    half = T95.get(n - 1, 1.96) * statistics.stdev(ratios) / n ** 0.5
    return statistics.mean(ratios), half


def merged_log(outs) -> dict[int, dict[str, float]]:
    """The ``auto_log`` of several results merged: per width, iterations and mean predicted/measured figures."""
    merged: dict[int, dict[str, float]] = {}
    for out in outs:
        for width, entry in out.auto_log.items():
            m = merged.setdefault(width, {"iterations": 0, "predicted_tokens": 0.0, "measured_tokens": 0.0,
                                          "predicted_seconds": 0.0, "measured_seconds": 0.0})
            n = entry["iterations"]
            m["iterations"] += n
            for key in ("predicted_tokens", "measured_tokens", "predicted_seconds", "measured_seconds"):
                m[key] += entry[key] * n
    return {w: {"iterations": m["iterations"], **{k: v / m["iterations"] for k, v in m.items() if k != "iterations"}}
            for w, m in sorted(merged.items())}


def _sync(model) -> None:
    if torch.device(model.device).type == "cuda":
        torch.cuda.synchronize(model.device)


METHODS = {  # name -> generate keyword arguments (window filled in)
    "AR": {"method": "ar"},
    "SJD": {"method": "sjd"},
    "CSD": {"method": "csd"},
}


def _batch_list(text: str) -> list[int]:
    """An argparse type: comma-separated batch sizes, each >= 1."""
    parse = count(1)
    try:
        return [parse(part) for part in text.split(",")]
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error} per batch size, comma-separated (e.g. 1,2,16)") from None


def _method_list(text: str) -> list[str]:
    """An argparse type: comma-separated speculative methods (SJD, CSD; any case), each once."""
    names = [part.strip().upper() for part in text.split(",")]
    allowed = [name for name in METHODS if name != "AR"]
    bad = [name for name in names if name not in allowed]
    if bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed {', '.join(allowed)}, comma-separated, each once "
                                         f"(AR always runs: it is what auto is measured against)")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["builtin", "random"], default="builtin")
    parser.add_argument("--weights", type=path, default=None, help="built-in model weights folder (default: shipped with csdgen)")
    parser.add_argument("--batches", type=_batch_list, default=[1, 2, 16], help="batch sizes (default 1,2,16)")
    parser.add_argument("--window", type=count(2), default=32, help="the fixed window auto is compared with")
    parser.add_argument("--repeats", type=count(1), default=3,
                        help="interleaved rounds (seeds); the paired interval needs at least 2")
    parser.add_argument("--tolerance", type=real(0.0, 1.0, allowed="a fraction in [0, 1) (0.03 = 3 %)"), default=0.03,
                        help="how far auto may be behind the better of AR and the fixed window (default 0.03 = 3 %%)")
    parser.add_argument("--methods", type=_method_list, default=["SJD", "CSD"],
                        help="speculative methods to run at the fixed window and at auto (default SJD,CSD; AR always runs)")
    parser.add_argument("--images", type=count(1, maximum=1000), default=16,
                        help="images each cell decodes per round, in ceil(images / batch) batches, at least --min-batches (default 16, at most 1000: a round's image indices are round * 1000 + i)")
    parser.add_argument("--min-batches", type=count(1), default=4,
                        help="fewest batches each cell decodes per round (default 4), at batch sizes where --images gives fewer")
    parser.add_argument("--timing-repeats", type=count(1), default=5)
    parser.add_argument("--no-profile", action="store_true", help="skip the verify-share runs")
    args = parser.parse_args(argv)
    per_round = {batch: max(-(-args.images // batch), args.min_batches) for batch in args.batches}
    widest = max(args.batches, key=lambda b: per_round[b] * b)
    if per_round[widest] * widest > 1000:
        parser.error(f"--min-batches {args.min_batches} and --images {args.images} with batch size {widest}: "
                     f"{per_round[widest]} batches, {per_round[widest] * widest} images per round; allowed at most 1000 "
                     f"(a round's image indices are round * 1000 + i)")
    model, description = load_model(args.model, args.weights)
    batches = args.batches
    defaults = model.defaults
    sampling = SamplingConfig(guidance_scale=defaults.guidance_scale if defaults else 3.0)
    methods = args.methods
    runs = [("AR", 1)] + [(name, w) for name in methods for w in (args.window, "auto")]
    # the order within a batch size's turn: every auto cell between its fixed window and AR (SJD 32, SJD
    # auto, AR, CSD auto, CSD 32), so each is paired with the runs next to it in time whichever way a turn
    # goes: at batch 16, where the better one is AR and a turn takes 30-40 s, AR then auto with a window-32
    # call between them were 10-25 s apart, and the VM's speed moves by 10 % over that
    half = (len(methods) + 1) // 2
    turn_order = ([(name, w) for name in methods[:half] for w in (args.window, "auto")] + [("AR", 1)]
                  + [(name, w) for name in methods[half:] for w in ("auto", args.window)])
    print(f"model: {description}; N={model.num_image_tokens}, V={model.codebook_size}; guidance {sampling.guidance_scale}; "
          f"batches {batches}; {', '.join(methods)} at window {args.window} and auto; {args.repeats} "
          f"round{'s' if args.repeats != 1 else ''}, each of {', '.join(f'{per_round[b]} batch(es) of {b}' for b in batches)} "
          f"per cell, the cells "
          f"taking turns batch by batch (every other turn in reverse order); engine auto (the static session where the model has one; "
          f"widths below a bucket's top in the logs are windows cut by the image end); "
          f"torch threads {torch.get_num_threads()}; device {model.device}")

    def classes(batch, first=0):
        """Image ``first + i``'s class: the same image index has the same class at every batch size."""
        return [(first + i) % getattr(model, "num_classes", 1) for i in range(batch)]

    # a warm-up round, not timed in the table: every cell once on images of its own (index 10**6 + i),
    # so no cell's first round pays the process's first calls at its shapes, and window="auto" starts
    # the rounds with what a long run has learned (its times per width at this batch size, the
    # method's acceptance); what that learning cost is printed on its own (auto's first call)
    warm: dict[tuple, object] = {}
    for batch in batches:
        for name, window in runs:
            warm[(batch, name, window)] = csdgen.generate(
                model, classes(batch), window=window, sampling=sampling, seed=0,
                image_indices=[10**6 + i for i in range(batch)], **METHODS[name])
    # results[(batch, name, window)][round] = the round's calls (ceil(images / batch) batches of distinct images)
    results: dict[tuple, list[list]] = {}
    cells = []
    verdicts: list[str] = []
    for round_ in range(args.repeats):
        # every round decodes the same number of images at every batch size (--images), so a cell's
        # figure is not one image's content; the cells take turns batch by batch, every other turn in
        # reverse order, so a drift of the machine's speed (up to 25 % between calls on a shared
        # 2-core CPU) falls on every cell alike instead of on the one running at that moment
        order = [(batch, run) for batch in batches for run in turn_order]
        for run_ in order:
            results.setdefault((run_[0], *run_[1]), []).append([])
        for turn in range(max(per_round.values())):
            cells_now = [(b, r) for b, r in order if turn < per_round[b]]
            for batch, (name, window) in cells_now if (round_ + turn) % 2 == 0 else reversed(cells_now):
                first = round_ * 1000 + turn * batch
                out = csdgen.generate(model, classes(batch, first), window=window, sampling=sampling, seed=round_,
                                      image_indices=[first + i for i in range(batch)], **METHODS[name])
                results[(batch, name, window)][round_].append(out)

    def per_batch(key, attr):
        """Per round: the mean of ``attr`` over the round's batches (seconds: per batch)."""
        return [statistics.mean(getattr(o, attr) for o in outs) for outs in results[key]]

    def all_outs(key):
        return [o for outs in results[key] for o in outs]

    for batch in batches:
        times = forward_times(model, batch, [1, args.window], sampling, args.timing_repeats)
        ratio = times[args.window] / times[1]
        ar_seconds = statistics.mean(per_batch((batch, "AR", 1), "seconds"))
        print(f"\nbatch {batch}: t(1) = {times[1] * 1e3:.2f} ms, t({args.window}) = {times[args.window] * 1e3:.2f} ms, "
              f"t({args.window})/t(1) = {ratio:.2f}")
        print(f"{'method':10} {'window':>6} {'steps':>7} {'step compr.':>11} {'s/batch':>8} {'speed-up':>9} "
              f"{'CPU limit':>9} {'mean W':>7}")
        for name, window in runs:
            outs = all_outs((batch, name, window))
            steps = statistics.mean(o.steps for o in outs)
            compression = statistics.mean(o.step_compression for o in outs)
            seconds = statistics.mean(per_batch((batch, name, window), "seconds"))
            limit = f"{compression / ratio:9.2f}" if window == args.window else f"{'':9}"
            widths = [w for o in outs for w in o.widths]
            mean_w = f"{statistics.mean(widths):7.1f}" if window == "auto" else f"{'':7}"
            print(f"{name:10} {str(window):>6} {steps:7.1f} {compression:11.2f} {seconds:8.2f} {ar_seconds / seconds:8.2f}x "
                  f"{limit} {mean_w}")
        for name in methods:
            auto_s = statistics.mean(per_batch((batch, name, "auto"), "seconds"))
            fixed_s = statistics.mean(per_batch((batch, name, args.window), "seconds"))
            met, gap, best = goal(auto_s, ar_seconds, fixed_s, args.tolerance)
            cells.append(met)
            best_name = "AR" if best == "AR" else f"window {args.window}"
            best_key = (batch, "AR", 1) if best == "AR" else (batch, name, args.window)
            mean, half = paired_gap(per_batch((batch, name, "auto"), "seconds"), per_batch(best_key, "seconds"))
            if half == float("inf"):
                verdict, interval = "no interval", "paired gaps: one round, no interval"
            else:
                verdict = ("met" if mean + half <= args.tolerance else "missed" if mean - half > args.tolerance
                           else "not told apart")
                interval = f"mean of the rounds' paired gaps {100 * mean:+.1f} % +- {100 * half:.1f} % (95 %): {verdict}"
            verdicts.append(verdict)
            print(f"goal {name} batch {batch}: auto {auto_s:.2f} s against {best_name} {min(ar_seconds, fixed_s):.2f} s "
                  f"(means over rounds): {100 * gap:+.1f} % -> {'met' if met else 'MISSED'} (at most "
                  f"{100 * args.tolerance:.0f} % behind); {interval}")
    print("\nwindow='auto' in a fresh process (the warm-up round: the first call at each batch size and method learns "
          "the times and the acceptance; not in the goal):")
    for batch in batches:
        for name in methods:
            first, fixed = warm[(batch, name, "auto")], warm[(batch, name, args.window)]
            print(f"  batch {batch:3} {name}: auto {first.seconds:.2f} s against window {args.window} {fixed.seconds:.2f} s "
                  f"({100 * (first.seconds / fixed.seconds - 1):+.1f} %), same images")
    print(f"\ngoal of window='auto' (at most {100 * args.tolerance:.0f} % behind the better of AR and window {args.window}, "
          f"{args.repeats} round{'s' if args.repeats != 1 else ''}): met in {sum(cells)} of {len(cells)} cells by the means; "
          f"by the paired intervals: {verdicts.count('met')} met, {verdicts.count('missed')} missed, "
          f"{len(verdicts) - verdicts.count('met') - verdicts.count('missed')} not told apart")
    print("\nwidth chooser's check (auto runs, all rounds): per chosen width, predicted / measured tokens per image and "
          "forward, ms per iteration, tokens per second")
    for batch in batches:
        for name in methods:
            log = merged_log(all_outs((batch, name, "auto")))
            parts = []
            for width, e in log.items():
                pred_rate = e["predicted_tokens"] / e["predicted_seconds"]
                meas_rate = e["measured_tokens"] / e["measured_seconds"]
                parts.append(f"W{width} x{e['iterations']}: {e['predicted_tokens']:.2f}/{e['measured_tokens']:.2f} tok, "
                             f"{1e3 * e['predicted_seconds']:.1f}/{1e3 * e['measured_seconds']:.1f} ms, "
                             f"{pred_rate:.0f}/{meas_rate:.0f} tok/s")
            print(f"  batch {batch:3} {name}: " + ("; ".join(parts) if parts else "(no choices logged)"))
    if 1 in batches and "CSD" in methods:
        print(f"\nCSD, window {args.window}: the images run alone at batch 1 (index r*1000, class 0) inside larger batches:")
        alone_runs = [outs[0] for outs in results[(1, "CSD", args.window)]]
        alone = [o.images[0] for o in alone_runs]
        for batch in batches:
            runs_b = [outs[0] for outs in results[(batch, "CSD", args.window)]]
            same = [o.images[0] for o in runs_b]
            agree = [float((a.tokens[0] == b.tokens[0]).float().mean()) for a, b in zip(alone_runs, runs_b)]
            print(f"  batch {batch:3}: forwards {[s.steps for s in same]} (alone {[a.steps for a in alone]}), "
                  f"step compression {statistics.mean(s.step_compression for s in same):.2f}, "
                  f"tokens equal to batch 1's: {100 * min(agree):.1f} %")
    if args.no_profile:
        return
    print("\nverify step inside the loop (generate(profile=True), seed 0):")
    for batch in batches:
        for name, window in runs[1:]:
            out = csdgen.generate(model, classes(batch), window=window, sampling=sampling, seed=0, profile=True, **METHODS[name])
            t = out.timings
            share = t["verify"] / (t["forward"] + t["verify"])
            print(f"  batch {batch:3} {name:4} W={str(window):>4}: forward {t['forward']:.3f} s, verify {t['verify']:.3f} s "
                  f"= {100 * share:.1f} % of an iteration")


if __name__ == "__main__":
    main()
