"""Steps, step compression and wall time of AR, SJD and CSD; cost of the acceptance step vs a forward.

Not a test: it times and prints. Run from the project root:

    python benchmarks/bench_decoding.py                 # built-in model if installed, else a random Llama
    python benchmarks/bench_decoding.py --model random --seeds 5 --batch 4

The "acceptance step" is everything the loop does per iteration besides the model forward:
guidance and warping to q, the rule's acceptance probabilities, the residual, the samples,
the vectorised first-rejection walk and the draft refresh.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import csdgen
from csdgen.acceptance import first_rejection, make_rule
from csdgen.drafting import refresh_drafts
from csdgen.models import ClassConditionalLlama
from csdgen.sampling import SamplingConfig, sample, target_probs


def load_model(kind: str):
    """The built-in model (if its weights are installed) or a random Llama of the same size."""
    if kind in ("auto", "builtin"):
        try:
            from csdgen.models.builtin import load_builtin_model

            return load_builtin_model(), "built-in (trained)"
        except (ImportError, FileNotFoundError) as exc:
            if kind == "builtin":
                raise
            print(f"built-in model unavailable ({exc}); using a random Llama")
    model = ClassConditionalLlama.random(codebook_size=512, num_classes=20, grid=(16, 16), hidden_size=256, num_layers=6, num_heads=8)
    with torch.no_grad():
        model.backbone.lm_head.weight.mul_(4.0)  # random weights give near-uniform q otherwise
    return model, "random Llama (6 layers, hidden 256, V 512, 16x16)"


def time_call(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` in seconds after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def decoding_table(model, classes, sampling, seeds, window):
    rows = []
    for name, method in (("AR", "ar"), ("SJD", "sjd"), ("CSD", "csd")):
        steps, compression, seconds = [], [], []
        for seed in range(seeds):
            out = csdgen.generate(model, classes, method=method, window=window, sampling=sampling, seed=seed)
            steps.append(out.steps)
            compression.append(out.step_compression)
            seconds.append(out.seconds)
        rows.append((name, statistics.mean(steps), statistics.mean(compression), statistics.mean(seconds)))
    ar_seconds = rows[0][3]
    print(f"\n{'method':8} {'steps':>8} {'step compression':>17} {'seconds':>8} {'speed-up':>9}")
    for name, steps, compression, seconds in rows:
        print(f"{name:8} {steps:8.1f} {compression:17.2f} {seconds:8.3f} {ar_seconds / seconds:8.2f}x")


def acceptance_cost(model, classes, sampling, window, repeats):
    session = model.start(classes, None, sampling.guided)
    session.prefill()
    K = model.num_image_tokens // 2
    session.forward(torch.randint(model.codebook_size, (len(classes), K)), start=0)
    window_tokens = torch.randint(model.codebook_size, (len(classes), window))

    def forward():
        session.forward(window_tokens, start=K)
        session.rollback(K)

    logits = session.forward(window_tokens, start=K)
    session.rollback(K)
    B, V = len(classes), model.codebook_size
    p = torch.rand(B, window, V).softmax(-1)
    u = torch.rand(6, B, window, dtype=torch.float64)
    print(f"\nper iteration at window {window}, batch {B}, V {V} (median of {repeats}):")
    t_forward = time_call(forward, repeats)
    print(f"  model forward            {t_forward * 1e3:8.3f} ms")
    for name in ("sjd", "csd"):
        rule = make_rule(name)

        def step():
            q = target_probs(logits.cond, logits.uncond, sampling)
            y = sample(q, u[0])
            b = rule.acceptance_probability(window_tokens, p, q, y)
            first_rejection(u[1] < b)
            sample(rule.residual(p, q, y), u[2])
            refresh_drafts("independent", window_tokens, p, q, y, u[4], u[5])

        t = time_call(step, repeats)
        print(f"  acceptance step ({name:3})   {t * 1e3:8.3f} ms  = {100 * t / t_forward:5.1f} % of a forward")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["auto", "builtin", "random"], default="auto")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--guidance-scale", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, description = load_model(args.model)
    classes = list(range(args.batch))
    sampling = SamplingConfig(guidance_scale=args.guidance_scale)
    print(f"model: {description}; N={model.num_image_tokens}, V={model.codebook_size}; "
          f"batch {args.batch}, window {args.window}, guidance {args.guidance_scale}, seeds {args.seeds}, "
          f"torch threads {torch.get_num_threads()}")
    decoding_table(model, classes, sampling, args.seeds, args.window)
    acceptance_cost(model, classes, sampling, args.window, args.repeats)


if __name__ == "__main__":
    main()
