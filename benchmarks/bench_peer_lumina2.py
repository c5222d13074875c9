"""Lumina-mGPT 2.0's own SJD against csdgen's SJD and CSD, on one tiny random Lumina-mGPT 2.0 checkpoint.

Not a test: it times, checks distributions and prints a markdown table. Run from the project root:

    python benchmarks/bench_peer_lumina2.py
    python benchmarks/bench_peer_lumina2.py --size 64 --images 4 --samples 16 --csdgen-samples 64

**The peer** (:class:`StaticJacobiReference`) is csdgen's own re-implementation, written here from
a reading of Alpha-VLLM/Lumina-mGPT-2.0's ``generate_examples/jacobi_utils_static.py``,
``sjds.py`` and ``logit_processor_3dim_static.py`` (the ``generate.py --speculative_jacobi``
path); none of that code is copied or imported (it pins transformers 4.46.2; csdgen needs 5).
Each rule it follows, with the reference's function:

- one forward of ``2`` rows (conditional, unconditional) per iteration over the **full
  vocabulary** (171384 logits per position); the unconditional row hides every prompt token but
  the last (``prepare_cfg_input``: ``attention_mask[B//2:, :prefill_num] = 0``, ``prefill_num``
  = prompt length - 1), positions counted over its visible tokens (``position_ids`` =
  ``cumsum(attention_mask) - 1``);
- the header: the prefill and two single-token forwards produce begin-of-image and the two
  resolution tokens (the reference samples them, unguided for the first 3 forwards:
  ``check_is_force_no_cfg``; here they are forced, as csdgen does, so both decoders see the same
  image part), then one single-token forward for image token 0 (``jacobi_loop_interval_l`` = 3);
- the window: ``output_token_num = max(1, min(16, r - cur_len))`` while ``l <= cur_len < r``,
  ``l`` = prompt + 3, ``r`` = prompt + ``R (C + 1) - 10`` (generate.py's
  ``jacobi_loop_interval_r``), with ``cur_len`` the length *before* the last iteration's tokens
  were appended, as the reference updates it; else 1: the last positions go one per forward;
- inputs: the last committed token, then the previous iteration's unaccepted outputs (its
  Jacobi state; their draft distribution = the target they were sampled from), then uniform
  random image ids (``multi_token_init_scheme='random'``; draft distribution one-hot) up to 16;
- the target of every position (``sampling_logits2tokens`` + ``create_logits_processor``):
  ``u + s (c - u)`` at the constant scale ``s``; image ids only, row ends and end-of-image forced
  at their positions (``MultiTokensVLLogitsProcessor``); top-k 4096
  (``MultiTokensInterleavedTopKLogitsWarper``); top-nσ, n = 1, with sigma = the root mean square
  of the logits above -10000 (``TopnsigmaLogitsWarper3d``: ``get_statistics_with_invalid_values``
  writes its mean to 0 through an expanded view); softmax;
- acceptance (``SpeculativeSampler.get_acc_criterion_mask``): draft ``i`` is accepted when
  ``r_i < min(1, p_{i-1}(x_i) / max(q_i(x_i), 1e-7))``, in order, up to the first rejection;
- after a rejection (``get_reject_sampling_logits``, ``reject_sampling_single_token``): the
  residual ``max(0, p - min(q, 0.99))`` normalised if its mass exceeds ``1 - 1e-7`` (``p`` and
  ``q`` nearly disjoint), else ``p`` itself, then the processors again on its log (mask, top-k,
  top-nσ of the log-probabilities), a sample; that token ends the iteration's commit;
- all drafts accepted: the last position's sample is committed too (16 tokens);
- KV cache: the entries of the accepted inputs are kept, the rest cut (``delete_false_key_value``).

It differs from the reference in: float32 on the CPU (generate.py: bfloat16 on CUDA), one
``torch.Generator`` for its random draws (the reference: the global generators), a vectorised
acceptance scan (the same rule, the reference loops over positions in Python), the header forced.

**One target for both**: the reference SJD script's. csdgen runs it as
``Lumina2ImageModel(uncond_context="last-prompt-token")`` with ``SamplingConfig(guidance_scale=4,
top_k=4096, top_n_sigma=1, top_n_sigma_centered=False)``; the table's first line says the total
variation between the two targets over every image position of one sampled image (teacher
forced). SJD with ``draft_init="onehot"``, CSD with its defaults, AR, window 16.

**The checkpoint** (a temporary folder, the released layout): ``model_type`` chameleon,
``ChameleonXLLMXForConditionalGeneration``, q/k norms per shard, no ``vqmodel``; the release's
ids where the reference hard-codes them: a 171384-id vocabulary, ``<|endoftext|>`` 151643 (the
tokenizer's EOS, no BOS), ``<racm3:break>`` 151665, ``<eoss>`` 151666, ``<reserved08799>``
151670, 16384 ``<MOVQGAN...>`` codes at 155000-171383; hidden 64, 2 layers, 4 heads.

**Measured**: forwards per image (csdgen's prefill holds the header, the reference spends 4
forwards before its first window), step compression (the implementation's own one-token-per-
forward count over its forwards: ``3 + R (C + 1) + 1`` for the reference, which also decodes
the row ends and end-of-image, ``N`` for csdgen), wall seconds per image (interleaved image by
image: reference, csdgen SJD, CSD, AR; one ``generate`` each, one torch thread), and the token
distribution: every sampled image is scored under csdgen's target by teacher forcing, each
token turned into its randomised probability-integral transform ``u = F(x-) + U q(x)`` (tokens
ordered by decreasing ``q``), exactly uniform and independent across positions for an exact
sampler; the table gives the Kolmogorov-Smirnov p-value of the pooled ``u`` against uniform,
the mean ``u`` (0.5 exact; lower = the sampler favours the target's most probable tokens), the
share of tokens the target gives probability 0, and the two-sample KS p-value of the two SJDs.

Writes a JSON record (``--out``) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = ["a red cat on a blue sofa", "a lighthouse at dawn", "two apples on a table", "a small boat on a lake"]
WORDS = ("Generate an image of according to the following prompt: a red cat on blue sofa lighthouse at dawn two apples "
         "table small boat lake").split()
VOCAB_SIZE = 171384
IDS = {"<|endoftext|>": 151643, "<racm3:break>": 151665, "<eoss>": 151666, "<reserved08796>": 151667,
       "<reserved08797>": 151668, "<reserved08798>": 151669, "<reserved08799>": 151670}
FIRST_CODE, CODES = 155000, 16384
WINDOW = 16  # generate.py's max_num_new_tokens


def header_names(size: int) -> list[str]:
    return [f"<reserved{8800 + n:05d}>" for n in range(1, 33)] + ["<reserved08706>", "<|image|>", f"{size}x{size}"]


# ---- the checkpoint ---------------------------------------------------------------------------------


def vocabulary(size: int) -> dict[str, int]:
    vocab = {w: i for i, w in enumerate(dict.fromkeys(WORDS))}
    vocab.update(IDS)
    for i, name in enumerate(header_names(size)):
        vocab[name] = 151671 + i
    vocab.update({f"<MOVQGAN_{v}>": FIRST_CODE + v for v in range(CODES)})
    used = set(vocab.values())
    vocab.update({f"<|t{i}|>": i for i in range(VOCAB_SIZE) if i not in used})
    return vocab


def build_checkpoint(folder: Path, size: int, seed: int = 0) -> Path:
    """A tiny random Lumina-mGPT 2.0 folder with the release's ids (module docstring)."""
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration, PreTrainedTokenizerFast

    vocab = vocabulary(size)
    config = ChameleonConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512, vocabulary_map=vocab,
                             vq_config=dict(embed_dim=8, num_embeddings=64, latent_channels=8, resolution=16,
                                            base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1))
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # peaked targets: drafts are accepted and rejected
        model.model.embed_tokens.weight[FIRST_CODE:FIRST_CODE + CODES] *= 0.3
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.copy_((1 + 0.3 * torch.randn(1, norm.weight.shape[1])).expand_as(norm.weight))
                norm.bias.copy_((0.2 * torch.randn(1, norm.bias.shape[1])).expand_as(norm.bias))
    model.save_pretrained(folder)
    file = folder / "model.safetensors"
    state = {k: v for k, v in load_file(file).items() if not k.startswith("model.vqmodel.")}
    for name in [k for k in state if k.endswith(("q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias"))]:
        state[name] = state[name][:1].clone()
    save_file(state, file, metadata={"format": "pt"})
    raw = json.loads((folder / "config.json").read_text())
    for key in ("bos_token_id", "pad_token_id", "eos_token_id"):
        raw.pop(key, None)
    raw.update(architectures=["ChameleonXLLMXForConditionalGeneration"], z_loss_weight=0.0, model_parallel_size=1)
    (folder / "config.json").write_text(json.dumps(raw))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|t100|>"))
    tok.add_special_tokens(list(IDS) + header_names(size)[:-1])
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<|t100|>").save_pretrained(folder)
    return folder


# ---- the peer: Lumina-mGPT 2.0's static SJD, re-implemented (module docstring) --------------------------


class StaticJacobiReference:
    """Lumina-mGPT 2.0's ``--speculative_jacobi`` decoding over a csdgen :class:`Lumina2ImageModel`'s backbone.

    Args:
        model: a ``Lumina2ImageModel`` (its backbone, layout and prompt rows are used; its session is not).
        guidance_scale: the constant CFG scale ``s``.
        top_k: image top-k (4096 in the reference's scripts).
        n_sigma: top-nσ's ``n`` (1 in ``create_logits_processor``).
        window: ``max_num_new_tokens`` (16 in generate.py).
    """

    def __init__(self, model, guidance_scale: float = 4.0, top_k: int = 4096, n_sigma: float = 1.0,
                 window: int = WINDOW):
        self.model, self.backbone, self.layout = model, model.backbone, model.layout
        self.scale, self.top_k, self.n_sigma, self.window = guidance_scale, top_k, n_sigma, window
        self.rows, self.cols = model.grid
        self.vocab_size = self.backbone.config.vocab_size
        self.image_ids = torch.as_tensor(model.image_ids if hasattr(model, "image_ids") else
                                         range(FIRST_CODE, FIRST_CODE + CODES)).long()
        self.image_mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        self.image_mask[self.image_ids] = True
        self.code_of = torch.full((self.vocab_size,), -1, dtype=torch.long)
        self.code_of[self.image_ids] = torch.arange(len(self.image_ids))

    # the logits processors, for positions ``index`` [n] of the image part (0 = first token after the header)
    def process(self, scores: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``[n, V]`` scores -> ``[n, V]`` processed scores (mask + forced row ends / end, top-k, top-nσ)."""
        C1, end = self.cols + 1, self.rows * (self.cols + 1)
        s = scores.masked_fill(~self.image_mask, float("-inf"))
        forced = torch.where(index == end, self.layout.eoi, self.layout.newline)
        forcing = ((index + 1) % C1 == 0) | (index == end)
        one = torch.full_like(s, float("-inf")).scatter(-1, forced[:, None], 0.0)
        s = torch.where(forcing[:, None], one, s)
        kth = torch.topk(s, min(self.top_k, s.shape[-1]), dim=-1).values[:, -1:]
        s = s.masked_fill(s < kth, float("-inf"))
        valid = (s > -10000) & (s < float("inf"))
        sigma = (torch.where(valid, s, 0.0).square().sum(-1) / valid.sum(-1).clamp(min=1)).sqrt()
        top, arg = s.max(-1)
        drop = s < (top - self.n_sigma * sigma)[:, None]
        drop[torch.arange(len(drop)), arg] = False
        return s.masked_fill(drop, float("-inf"))

    def _forward(self, ids: list[int], cache, mask: torch.Tensor, start: int, hidden: int) -> torch.Tensor:
        """One forward of ``ids`` on both rows: ``[2, n, V]`` float32 logits; ``mask`` grows by ``n`` columns."""
        n = len(ids)
        x = torch.tensor([ids, ids])
        positions = torch.arange(start, start + n)
        pos = torch.stack([positions, (positions - hidden).clamp(min=0)])
        if start == 0:  # the prefill: hidden uncond columns take position 1 (cumsum - 1, masked_fill 1), unused
            pos[1, :hidden] = 1
        out = self.backbone(input_ids=x, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        return out.logits.float()

    def generate(self, prompt: str, generator: torch.Generator) -> tuple[list[int], int, list[int]]:
        """One image: ``(codes [R C] codebook indices, forwards, the sequence after the prompt as ids)``."""
        from transformers import DynamicCache

        prompt_row = [self.layout.bos, *self.model.prompt_ids([prompt])[0]]
        L0 = len(prompt_row)
        hidden = L0 - 1  # prefill_num: the uncond row sees the last prompt token on
        cache = DynamicCache()
        mask = torch.ones(2, L0, dtype=torch.long)
        mask[1, :hidden] = 0
        forwards = 0
        header = [self.layout.boi, *self.layout.resolution_tokens]
        # prefill (-> begin-of-image), begin-of-image (-> height), height (-> width): forced here
        self._forward(prompt_row, cache, mask, 0, hidden)
        forwards += 1
        for t in header[:2]:
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
            self._forward([t], cache, mask, cache.get_seq_length(), hidden)
            forwards += 1
        seq = list(header)  # after the prompt
        left, right = L0 + 3, L0 + self.rows * (self.cols + 1) - 10
        cur_len, n = L0 + 3, 1
        state_tokens = torch.empty(0, dtype=torch.long)
        state_probs = torch.empty(0, self.vocab_size)
        while True:
            fill = n - 1
            keep = fill - len(state_tokens)
            fresh = max(keep, 0)
            kept = len(state_tokens) + min(keep, 0)
            random = self.image_ids[torch.randint(len(self.image_ids), (fresh,), generator=generator)]
            drafts = torch.cat([state_tokens[:kept], random])
            q = torch.cat([state_probs[:kept], torch.zeros(fresh, self.vocab_size).scatter(-1, random[:, None], 1.0)])
            inputs = [seq[-1], *drafts.tolist()]
            mask = torch.cat([mask, torch.ones(2, n, dtype=torch.long)], 1)
            past = cache.get_seq_length()
            logits = self._forward(inputs, cache, mask, past, hidden)
            forwards += 1
            guided = logits[1] + self.scale * (logits[0] - logits[1])  # [n, V]
            T = len(seq) - 3  # image-part tokens committed
            index = torch.arange(T, T + n)
            p = torch.softmax(self.process(guided, index), -1)
            sampled = torch.multinomial(p, 1, generator=generator).squeeze(-1)  # [n]
            if n == 1:
                new, matched = sampled.tolist(), 1
            else:
                x = drafts  # inputs[1:]
                ratio = (p[:-1].gather(-1, x[:, None]).squeeze(-1)
                         / q.gather(-1, x[:, None]).squeeze(-1).clamp(min=1e-7)).clamp(max=1)
                r = torch.rand(n - 1, generator=generator)
                rejected = (r >= ratio).nonzero()
                if len(rejected) == 0:
                    new, matched = [*x.tolist(), int(sampled[-1])], n
                else:
                    j = int(rejected[0])  # drafts 0..j-1 accepted, target j resampled
                    token = self._resample(p[j], q[j], T + j, generator)
                    new, matched = [*x[:j].tolist(), token], j + 1
            state_tokens, state_probs = sampled[matched:], p[matched:]
            if n > matched:
                cache.crop(matched - n)  # transformers 5: the number of entries to drop, negative
            mask = mask[:, : past + matched]  # one column per cached entry
            seq += new
            if left <= cur_len < right:
                n = max(1, min(self.window, right - cur_len))
            else:
                n = 1
            cur_len += matched
            if self.layout.eoi in new:
                break
        body = seq[3: seq.index(self.layout.eoi)]
        codes = [int(self.code_of[t]) for t in body if self.code_of[t] >= 0]
        return codes, forwards, seq

    def _resample(self, p: torch.Tensor, q: torch.Tensor, index: int, generator: torch.Generator) -> int:
        """A rejected position: residual (or ``p``), processors applied again to its log, one sample."""
        delta = (p - q.clamp(max=0.99)).clamp(min=0)
        mass = delta.sum()
        res = delta / mass.clamp(min=1e-10) if mass + 1e-7 > 1 else p
        scores = self.process(res.log()[None], torch.tensor([index]))
        return int(torch.multinomial(torch.softmax(scores, -1), 1, generator=generator))


# ---- the distribution check -----------------------------------------------------------------------------


def target_of(model, sampling, prompt: str, tokens: torch.Tensor) -> torch.Tensor:
    """csdgen's target ``[B, N, V]`` float64 for the images ``tokens`` ``[B, N]`` (teacher forcing)."""
    from csdgen.sampling import target_probs

    B, N = tokens.shape
    session = model.start([prompt] * B, None, True)
    first = session.prefill()
    rest = session.forward(tokens[:, : N - 1], start=0)
    cond = torch.cat([first.cond, rest.cond], 1)
    uncond = torch.cat([first.uncond, rest.uncond], 1)
    return target_probs(cond, uncond, sampling).double()


def pit_values(model, sampling, prompt: str, tokens: torch.Tensor, seed: int):
    """Randomised probability-integral transforms ``[B * N]`` of the images ``tokens`` ``[B, N]`` under the target,
    and ``[B * N]`` bool: tokens the target gives probability 0 (none for a sampler of that target)."""
    B, N = tokens.shape
    q = target_of(model, sampling, prompt, tokens)
    order = torch.sort(q, dim=-1, descending=True, stable=True).indices
    rank = order.argsort(-1).gather(-1, tokens[..., None]).squeeze(-1)
    below = torch.cumsum(q.gather(-1, order), -1) - q.gather(-1, order)
    before = below.gather(-1, rank[..., None]).squeeze(-1)
    qx = q.gather(-1, tokens[..., None]).squeeze(-1)
    v = torch.rand(B, N, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (before + v * qx).reshape(-1), (qx <= 0).reshape(-1)


def target_distance(peer: StaticJacobiReference, model, sampling, prompt: str, seq: list[int]) -> float:
    """Largest total variation, over the image positions of ``seq`` (the peer's sequence after the prompt),
    between the peer's target (one teacher-forced forward, full vocabulary) and csdgen's (over the codebook)."""
    from transformers import DynamicCache

    prompt_row = [peer.layout.bos, *model.prompt_ids([prompt])[0]]
    full = prompt_row + seq[:-1]
    hidden = len(prompt_row) - 1
    mask = torch.ones(2, len(full), dtype=torch.long)
    mask[1, :hidden] = 0
    logits = peer._forward(full, DynamicCache(), mask, 0, hidden)[:, len(prompt_row) + 2:]  # predicting seq[3:]
    index = torch.arange(logits.shape[1])
    p = torch.softmax(peer.process(logits[1] + peer.scale * (logits[0] - logits[1]), index), -1)
    image = ~(((index + 1) % (peer.cols + 1) == 0) | (index == peer.rows * (peer.cols + 1)))
    p_codes = p[image][:, peer.image_ids].double()
    codes = torch.tensor([peer.code_of[t] for t in seq[3:] if peer.code_of[t] >= 0])
    q = target_of(model, sampling, prompt, codes[None])[0]
    return float(0.5 * (p_codes - q).abs().sum(-1).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="image side in pixels (a multiple of 32; 8 px per code)")
    parser.add_argument("--images", type=int, default=8, help="images per method for the timing (interleaved)")
    parser.add_argument("--samples", type=int, default=48, help="further images of the reference for the distribution")
    parser.add_argument("--csdgen-samples", type=int, default=512, help="images of csdgen SJD and AR for the distribution")
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--top-k", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_peer_lumina2.json"))
    args = parser.parse_args()
    if args.size <= 0 or args.size % 32:
        parser.error(f"--size {args.size}: a positive multiple of 32 is allowed")

    from scipy.stats import kstest

    import csdgen
    from csdgen.models.lumina2 import Lumina2ImageModel
    from csdgen.sampling import SamplingConfig

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_checkpoint(Path(tmp) / "Lumina-mGPT-2.0", args.size)
        model = Lumina2ImageModel.from_pretrained(checkpoint, height=args.size, width=args.size,
                                                  uncond_context="last-prompt-token")
    sampling = SamplingConfig(guidance_scale=args.cfg, temperature=1.0, top_k=args.top_k, top_n_sigma=1.0,
                              top_n_sigma_centered=False)
    peer = StaticJacobiReference(model, args.cfg, args.top_k)
    methods = {"csdgen SJD": dict(method="sjd", draft_init="onehot", window=WINDOW),
               "csdgen CSD": dict(method="csd", window=WINDOW), "csdgen AR": dict(method="ar")}
    PEER = "Lumina-mGPT 2.0 SJD (re-implemented)"
    rows = {name: {"forwards": [], "seconds": [], "tokens": []} for name in [PEER, *methods]}
    N = model.num_image_tokens
    sequential = {PEER: 3 + model.grid[0] * (model.grid[1] + 1) + 1, **{name: N for name in methods}}
    with torch.no_grad():
        csdgen.generate(model, PROMPTS[:1], method="ar", sampling=sampling)  # warm-up
        seq0 = None
        for i in range(args.images):  # interleaved, one image at a time
            prompt = PROMPTS[i % len(PROMPTS)]
            began = time.perf_counter()
            codes, forwards, seq = peer.generate(prompt, torch.Generator().manual_seed(i))
            rows[PEER]["seconds"].append(time.perf_counter() - began)
            rows[PEER]["forwards"].append(forwards)
            rows[PEER]["tokens"].append((prompt, codes))
            seq0 = seq0 or (prompt, seq)
            for name, kwargs in methods.items():
                out = csdgen.generate(model, [prompt], sampling=sampling, seed=i, **kwargs)
                rows[name]["forwards"].append(out.images[0].steps)
                rows[name]["seconds"].append(out.seconds)
                rows[name]["tokens"].append((prompt, out.tokens[0].tolist()))
        tv = target_distance(peer, model, sampling, *seq0)
        for i in range(args.images, args.images + args.samples):  # more reference images for the distribution
            prompt = PROMPTS[i % len(PROMPTS)]
            codes, forwards, _ = peer.generate(prompt, torch.Generator().manual_seed(i))
            rows[PEER]["tokens"].append((prompt, codes))
            rows[PEER]["forwards"].append(forwards)
        for name in ("csdgen SJD", "csdgen AR"):  # batched samples for the distribution (CSD is lossy by design)
            for p, prompt in enumerate(PROMPTS):
                count = max(1, args.csdgen_samples // len(PROMPTS))
                out = csdgen.generate(model, [prompt] * count, sampling=sampling, seed=1000 + p, **methods[name])
                rows[name]["tokens"] += [(prompt, t) for t in out.tokens.tolist()]
                rows[name]["forwards"] += [image.steps for image in out.images]
        pit, outside = {}, {}
        for name, row in rows.items():
            bad = [len(t) for _, t in row["tokens"] if len(t) != N]
            if bad:
                raise RuntimeError(f"{name}: images of {bad[:3]} codes, expected {N}")
            values, zero = [], []
            for p, prompt in enumerate(PROMPTS):
                mine = [t for q, t in row["tokens"] if q == prompt]
                if mine:
                    u, z = pit_values(model, sampling, prompt, torch.tensor(mine), seed=7 + p)
                    values.append(u)
                    zero.append(z)
            pit[name], outside[name] = torch.cat(values).numpy(), float(torch.cat(zero).double().mean())
    table = ["| method | forwards per image | step compression | wall s per image (under load) | images scored | "
             "tokens outside the target | PIT KS p vs uniform | mean PIT u |", "|---|---|---|---|---|---|---|---|"]
    record = {"size": args.size, "grid": list(model.grid), "images": args.images, "threads": args.threads,
              "target_total_variation": tv, "methods": {}}
    for name, row in rows.items():
        forwards = sum(row["forwards"]) / len(row["forwards"])
        seconds = sum(row["seconds"]) / len(row["seconds"])
        p_value = kstest(pit[name], "uniform").pvalue if name != "csdgen CSD" or len(pit[name]) else float("nan")
        record["methods"][name] = {"forwards": row["forwards"], "seconds": row["seconds"], "pit_ks_p": p_value,
                                   "pit_mean": float(pit[name].mean()), "images": len(row["tokens"]),
                                   "outside_support": outside[name], "step_compression": sequential[name] / forwards}
        table.append(f"| {name} | {forwards:.1f} | {sequential[name] / forwards:.2f} | {seconds:.3f} | "
                     f"{len(row['tokens'])} | {outside[name]:.2%} | {p_value:.3g} | {pit[name].mean():.3f} |")
    two = kstest(pit[PEER], pit["csdgen SJD"]).pvalue
    record["sjd_two_sample_ks_p"] = two
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(f"tiny Lumina-mGPT 2.0 ({model.grid[0]} x {model.grid[1]} codes, {args.size} px, 16384 codes, 171384-id "
          f"vocabulary, hidden 64, 2 layers), CFG {args.cfg:g} constant, top-k {args.top_k}, top-nσ 1 (RMS), T 1, "
          f"window {WINDOW}, batch 1, {args.threads} thread(s); largest total variation between the two targets "
          f"over one image's positions: {tv:.2g}")
    print("\n".join(table))
    print(f"two-sample KS p (reference SJD vs csdgen SJD PIT values): {two:.3g}")


if __name__ == "__main__":
    main()
