"""Janus adapter: time per window forward, and AR vs SJD vs CSD on one image, with RANDOM weights.

Not a test: it builds a random ``JanusForConditionalGeneration`` in memory (no download, no
save), times and prints. Run from the project root:

    python benchmarks/bench_janus.py                          # ~100 M parameters, CPU, float32
    python benchmarks/bench_janus.py --size 1b --device cuda --dtype bfloat16   # GPU only

``--size 1b`` approximates Janus-Pro-1B's language model (24 layers, hidden 2048, 16 heads,
MLP 5632, text vocabulary 102400) and its generation head (V = 16384); too slow for a CPU.

Forward timing: batch 2 = the cond and uncond rows of one image, on top of ~300 cached
positions (prompt + image tokens), for windows 1 .. 32; median of ``--repeats`` after a
warm-up; the cache is rolled back after each call. The decoding table generates one
24 x 24 = 576-token image with guidance 5, temperature 1 (the Janus-Pro reference setting).
Random weights give an almost uniform q; the generation head is scaled (``--head-scale``)
so q is peaked, and the mean entropy of q is printed. Steps and speed-ups on random weights
say nothing about a trained model's acceptance: they only exercise the path.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import JanusConfig, JanusForConditionalGeneration

import csdgen
from csdgen.models.janus import JanusImageModel
from csdgen.sampling import SamplingConfig, entropy, target_probs

BOS, BOI, PAD = 1, 3, 0
SIZES = {
    # language model dims; vq projection = hidden (image_token_embed_dim must equal it)
    "100m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, vocab_size=4096),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16, vocab_size=102400),
}
WINDOWS = (1, 2, 4, 8, 16, 32)


def build(size: str, dtype: torch.dtype, device: str, head_scale: float, seed: int = 0) -> JanusImageModel:
    """A random Janus with 576 image tokens, V = 16384, small vision / VQ parts."""
    text = SIZES[size]
    hidden = text["hidden_size"]
    config = JanusConfig(
        text_config=dict(model_type="llama", num_key_value_heads=text["num_attention_heads"], pad_token_id=PAD,
                         bos_token_id=BOS, max_position_embeddings=4096, **text),
        vision_config=dict(image_size=384, patch_size=16, num_image_tokens=576, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=1, num_attention_heads=2, projection_dim=hidden),
        vq_config=dict(embed_dim=8, num_embeddings=16384, base_channels=32, channel_multiplier=[1, 1, 2, 2, 4],
                       image_token_embed_dim=hidden, projection_dim=hidden, num_patches=24),
        image_token_id=2,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = JanusForConditionalGeneration(config).to(dtype).eval()
    with torch.no_grad():
        model.model.generation_head.vision_head.weight.mul_(head_scale)
    return JanusImageModel(model, bos_token_id=BOS, boi_token_id=BOI, pad_token_id=PAD)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_times(janus: JanusImageModel, prompt: list[int], cached: int, repeats: int) -> dict[int, float]:
    """Median seconds of one ``forward`` of W image tokens at cache length ``cached`` (guided: 2 rows)."""
    session = janus.start([prompt], None, guided=True)
    session.prefill()
    fill = torch.randint(0, janus.codebook_size, (1, cached + max(WINDOWS)), device=janus.device)
    session.forward(fill[:, :cached], 0)
    times = {}
    for window in WINDOWS:
        samples = []
        for r in range(repeats + 2):  # two warm-up calls
            synchronize(janus.device)
            began = time.perf_counter()
            session.forward(fill[:, cached : cached + window], cached)
            synchronize(janus.device)
            samples.append(time.perf_counter() - began)
            session.rollback(cached)
        times[window] = statistics.median(samples[2:])
    return times


def prefill_entropy(janus: JanusImageModel, prompt: list[int], sampling: SamplingConfig) -> float:
    """Entropy (nats) of q at image position 0, to show how peaked the scaled head makes q."""
    logits = janus.start([prompt], None, sampling.guided).prefill()
    return float(entropy(target_probs(logits.cond, logits.uncond, sampling)).mean())


def decoding_rows(janus: JanusImageModel, prompt: list[int], sampling: SamplingConfig, window: int, seed: int):
    rows = []
    for name in ("ar", "sjd", "csd"):
        out = csdgen.generate(janus, [prompt], method=name, window=window, sampling=sampling, seed=seed)
        rows.append((name.upper(), out.seconds, out.steps, out.step_compression, float(out.images[0].entropy.mean())))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="100m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cached", type=int, default=280, help="image tokens cached before the timed window (prompt ~20 on top)")
    parser.add_argument("--window", type=int, default=16, help="SJD / CSD window")
    parser.add_argument("--head-scale", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--skip-decoding", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    janus = build(args.size, dtype, args.device, args.head_scale, args.seed)
    params = sum(p.numel() for p in janus.model.parameters())
    lm_params = sum(p.numel() for p in janus.model.model.language_model.parameters())
    prompt = [BOS] + torch.randint(10, 4096, (18,), generator=torch.Generator().manual_seed(1)).tolist() + [BOI]
    sampling = SamplingConfig(guidance_scale=5.0, temperature=1.0)
    print(f"random Janus '{args.size}': {params / 1e6:.1f} M parameters ({lm_params / 1e6:.1f} M language model), "
          f"V={janus.codebook_size}, {janus.grid[0]}x{janus.grid[1]} tokens, {args.device}, {args.dtype}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"RANDOM WEIGHTS: generation head scaled by {args.head_scale} so q is not uniform; "
          f"entropy of q at token 0: {prefill_entropy(janus, prompt, sampling):.2f} nats (uniform: {torch.log(torch.tensor(16384.)):.2f})")
    cached = len(prompt) + args.cached
    print(f"\nforward of W image tokens, batch 2 (cond + uncond rows), {cached} cached positions, median of {args.repeats}:")
    times = forward_times(janus, prompt, args.cached, args.repeats)
    for window, seconds in times.items():
        print(f"  W={window:>2}: {seconds * 1e3:8.1f} ms   ({seconds / times[1]:.2f} x W=1)")
    if args.skip_decoding:
        return
    print(f"\none image (576 tokens), guidance 5, temperature 1, window {args.window}, seed {args.seed}:")
    rows = decoding_rows(janus, prompt, sampling, args.window, args.seed)
    ar_seconds = rows[0][1]
    print(f"  {'method':<6} {'seconds':>8} {'steps':>6} {'tokens/step':>11} {'speed-up':>8} {'mean H(q)':>9}")
    for name, seconds, steps, compression, h in rows:
        print(f"  {name:<6} {seconds:8.2f} {steps:6d} {compression:11.2f} {ar_seconds / seconds:8.2f} {h:9.2f}")
    print("  (random weights: the acceptance figures exercise the code path, they do not predict a trained model's)")


if __name__ == "__main__":
    main()
