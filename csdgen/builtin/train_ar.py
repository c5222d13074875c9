"""The AR stage of the built-in model's training (:mod:`csdgen.builtin.train`): the Llama config,
the inputs ``[class, code_0 .. code_254]`` with condition dropout, the loss, the training loop
with its mid-stage checkpoints (``ar.ckpt.pt``, resumed by ``--resume``) and the held-out NLL.

Token layout (:mod:`csdgen.builtin`): codes ``0 .. CODEBOOK_SIZE - 1``, class ``c`` is
``CODEBOOK_SIZE + c``, the null (unconditional) class is the last id of the vocabulary.
Training-time only (never imported at run time).
"""

from __future__ import annotations

import math
import os
import time

import torch
import torch.nn.functional as F

from . import build_ar_model
from .train_common import CODEBOOK_SIZE, StageClock, autocast, batch_indices, cosine_lr, log, set_lr
from .train_files import load_module


def llama_config_dict(num_classes: int, layers: int = 8, hidden: int = 256, intermediate: int = 768,
                      heads: int = 8) -> dict:
    """LlamaConfig fields of the AR model (vocab = codes + classes + null).

    Raises:
        ValueError: ``hidden`` is not a multiple of ``heads``.
    """
    if hidden % heads:
        raise ValueError(f"--ar-hidden {hidden} must be a multiple of --ar-heads {heads}")
    return dict(
        vocab_size=CODEBOOK_SIZE + num_classes + 1, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, attention_dropout=0.0, initializer_range=0.02,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=True,
    )


def ar_inputs(codes: torch.Tensor, labels: torch.Tensor, null_id: int,
              drop_p: float = 0.0, gen: torch.Generator | None = None) -> torch.Tensor:
    """codes [B, 256], labels [B] -> input ids int64 [B, 256] = [class, code_0..code_254].

    With ``drop_p`` > 0 the class token is replaced by ``null_id`` with that probability.
    """
    cls = labels + CODEBOOK_SIZE
    if drop_p > 0:
        drop = torch.rand(labels.shape, generator=gen) < drop_p
        cls = torch.where(drop, torch.full_like(cls, null_id), cls)
    return torch.cat([cls[:, None], codes[:, :-1]], dim=1)


def ar_loss(model, codes: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Mean NLL (nats) of the 256 codes given [class, code_<i] (full-vocabulary softmax)."""
    with autocast():
        logits = model(input_ids=inputs, use_cache=False).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), codes.reshape(-1))


def train_ar(codes: torch.Tensor, labels: torch.Tensor, llama_cfg: dict, args):
    """Train LlamaForCausalLM on code sequences (10% condition dropout, AdamW, cosine); returns it in
    eval mode.

    codes int64 [N, 256], labels int64 [N] (class indices); ``llama_cfg``: :func:`llama_config_dict`'s.
    ``args``: train.py's options (``seed``, ``ar_lr``, ``ar_steps``, ``ar_batch``, ``max_minutes_ar``,
    ``threads``, ``log_every``, ``out``, ``resume``, ``ar_init``, ``ckpt_every``, ``ckpt_minutes``);
    checkpoints to ``args.out / "ar.ckpt.pt"`` and, with ``args.resume``, continues from it; the
    steps run are recorded in ``args.done_steps["ar"]``."""
    torch.manual_seed(args.seed + 1)
    model = build_ar_model(llama_cfg).train()
    null_id = llama_cfg["vocab_size"] - 1  # the null class: CODEBOOK_SIZE + number of classes
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.ar_lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed + 2)
    idx_iter = batch_indices(len(codes), args.ar_batch, args.ar_steps, args.seed + 3)
    clock = StageClock("ar", args.ar_steps, args.max_minutes_ar, args.threads)
    ckpt_file, first = args.out / "ar.ckpt.pt", 0
    if args.ar_init is not None and not (args.resume and ckpt_file.is_file()):
        load_module(model, args.ar_init).train()  # warm start: a finished run's weights, a new schedule
        log(f"ar: initialised from {args.ar_init}")
    if args.resume and ckpt_file.is_file():  # mid-stage checkpoint: model, optimiser, clock
        ckpt = torch.load(ckpt_file)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        gen.set_state(ckpt["gen"])
        first, clock.start = ckpt["step"], time.time() - ckpt["elapsed_s"]
        log(f"ar: resumed at step {first} ({ckpt['elapsed_s']:.0f} s already spent)")
    last_ckpt = time.time()
    for step, idx in enumerate(idx_iter):
        if step < first:
            continue  # the index stream is replayed so the resumed run sees the same batches
        if clock.progress(step) >= 1.0:
            break
        due = time.time() - last_ckpt >= 60 * args.ckpt_minutes if args.ckpt_minutes > 0 else False
        if step > first and (step % args.ckpt_every == 0 or due):
            tmp = ckpt_file.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                        "step": step, "elapsed_s": time.time() - clock.start}, tmp)
            os.replace(tmp, ckpt_file)
            last_ckpt = time.time()
            log(f"ar: checkpoint at step {step}")
        clock.tick(step)
        args.done_steps["ar"] = step + 1
        set_lr(opt, cosine_lr(clock.progress(step), args.ar_lr, warmup=0.06))
        inputs = ar_inputs(codes[idx], labels[idx], null_id, drop_p=0.1, gen=gen)
        loss = ar_loss(model, codes[idx], inputs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.ar_steps - 1:
            log(f"ar step {step} loss {loss.item():.4f} threads {torch.get_num_threads()} lr {opt.param_groups[0]['lr']:.2e}")
    return model.eval()


@torch.no_grad()
def eval_ar(model, codes: torch.Tensor, labels: torch.Tensor, batch: int = 50) -> dict:
    """Held-out NLL per token (nats), conditional (true class) and unconditional (null), of codes
    int64 [N, 256] with labels int64 [N]; also ln(CODEBOOK_SIZE), the NLL of a uniform guess."""
    null_id = model.config.vocab_size - 1  # the null class: CODEBOOK_SIZE + number of classes
    out = {}
    for name, null in (("cond", False), ("uncond", True)):
        total = 0.0
        for i in range(0, len(codes), batch):
            c, y = codes[i:i + batch], labels[i:i + batch]
            inputs = ar_inputs(c, y, null_id, drop_p=1.0 if null else 0.0)
            total += ar_loss(model, c, inputs).item() * len(c)
        out[f"heldout_nll_per_token_{name}"] = total / len(codes)
    out["ln_codebook_size"] = math.log(CODEBOOK_SIZE)
    return out
