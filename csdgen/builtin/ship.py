"""Make a finished training run into the shipped weights: the classes offered, and every other emoji.

Training-time only (never imported at run time). Needs the emoji package (``npm pack``, see
:mod:`csdgen.builtin.emoji`) and a class-agreement measurement of the run
(``benchmarks/builtin_class_agreement.py --json``):

    python -m csdgen.builtin.ship --run RUN --agreement RUN/classes.json --guidance 3 \\
        --min-agreement 0.5 --source-classifier SRC --out csdgen/builtin/weights

What it writes into ``--out`` (``--out`` may not be ``--run``), all at once: every value is checked
first, the files are made in a folder beside ``--out``, which then takes its place, so a refusal or a
crash leaves ``--out`` as it was:

- the classes offered: those of the run whose AR samples at ``--guidance`` the run's classifier
  judged the asked class at least ``--min-agreement`` of the time. The AR model's class-token rows
  (embedding and output head) are cut to those classes, so the token layout stays
  ``[codes, classes offered, null]`` (``csdgen.builtin``); the classifier's head likewise
  (``train_classifier.restricted_classifier``); the Frechet reference statistics are recomputed on them.
- ``config.json``: the run's, with the classes offered, their emoji characters (``class_emoji``:
  ``--class "🍎"``), the eight ``default_classes`` (the best-drawn class of eight different
  categories), and ``other_classes``: every other emoji of the package with its short names,
  characters and the three offered classes that look most like it (cosine similarity of the
  ``--source-classifier``'s features of the emoji images; :meth:`csdgen.class_names.ClassNames.from_config`
  reads it, so ``--class "green apple"`` names the nearest classes offered);
- ``metrics.json``: the run's, with the class set (how it was chosen, the agreement file's
  figures) and the classifier's accuracy on held-out real views of the offered classes and on
  their VQ reconstructions.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from . import load_components
from .emoji import HELDOUT_SEED, base_entries, class_names, fetch_package, load_emoji, make_views, select_classes
from .train_classifier import classify, restricted_classifier
from .train_common import to_float
from .train_files import save_json, save_safetensors
from .train_vq import decode_u8, encode_all

#: default classes shown: one per category, this many
DEFAULT_COUNT = 8


def emoji_chars(entry: dict) -> list[str]:
    """The characters of an emoji.json entry: its unified and non-qualified code point sequences."""
    out = []
    for key in ("unified", "non_qualified"):
        code = entry.get(key)
        if code:
            out.append("".join(chr(int(h, 16)) for h in code.split("-")))
    return list(dict.fromkeys(out))


def guidance_key(agreement: dict, guidance: str) -> str:
    """The agreement file's key of the guidance scale ``guidance`` (``"3.0"`` finds ``"3"``).

    Raises:
        ValueError: not a number, or the file has no such scale, naming the scales it has."""
    by = agreement["by_guidance"]
    try:
        return next(key for key in by if key == guidance or float(key) == float(guidance))
    except (StopIteration, ValueError):
        raise ValueError(f"--guidance {guidance}: the agreement file has {', '.join(sorted(by))}") from None


def offered_classes(agreement: dict, guidance: str, minimum: float, names: list[str]) -> list[str]:
    """Names (in ``names``' order) whose agreement at ``guidance`` (the file's key: :func:`guidance_key`)
    is at least ``minimum``.

    Raises:
        ValueError: the agreement file misses a class."""
    per = agreement["by_guidance"][guidance]["classes"]
    missing = [n for n in names if n not in per]
    if missing:
        raise ValueError(f"the agreement file lacks classes of the run: {missing[:5]}")
    return [n for n in names if per[n]["hits"] / per[n]["n"] >= minimum]


def default_classes(agreement: dict, guidance: str, kept: list[str], categories: dict[str, str],
                    count: int = DEFAULT_COUNT) -> list[str]:
    """``count`` classes of ``kept``: the best-drawn (hits, then mean probability) class of each category,
    categories ordered by their best class; where there are fewer categories, the next best classes."""
    per = agreement["by_guidance"][guidance]["classes"]
    ranked = sorted(kept, key=lambda n: (-per[n]["hits"] / per[n]["n"], -per[n]["p_class"], n))
    chosen: list[str] = []
    for n in ranked:
        if categories[n] not in {categories[c] for c in chosen}:
            chosen.append(n)
    chosen = chosen[:count]
    chosen += [n for n in ranked if n not in chosen][:count - len(chosen)]
    return chosen


def cut_ar(state: dict[str, torch.Tensor], codebook: int, rows: list[int], old_classes: int) -> dict:
    """The AR model's state with its class-token rows cut to ``rows`` (class indices of the run):
    every tensor whose first dimension is the vocabulary (``codebook + old_classes + 1``) keeps rows
    ``[0, codebook)``, ``codebook + rows`` and the null row."""
    vocab = codebook + old_classes + 1
    keep = torch.tensor(list(range(codebook)) + [codebook + r for r in rows] + [vocab - 1])
    return {k: (v[keep].contiguous() if v.shape and v.shape[0] == vocab else v) for k, v in state.items()}


#: words two emoji names may share without being alike ("dog face" and "grinning face")
STOP_WORDS = frozenset("a an and of the with in on at for face sign symbol".split())


def content_words(name: str) -> set[str]:
    """The words of an emoji name that say what it is: lower case, split at spaces and punctuation,
    :data:`STOP_WORDS` left out."""
    return {w for w in "".join(ch if ch.isalnum() else " " for ch in name.lower()).split() if w not in STOP_WORDS}


@torch.no_grad()
def nearest_offered(source: Path, all_names: list[str], images: torch.Tensor, kept: list[str],
                    groups: dict[str, tuple[str, str]], k: int = 3) -> list[list[int]]:
    """For every class of ``all_names`` (one real image each, ``images`` float [C, 3, 64, 64] in [-1, 1]),
    the indices in ``kept`` of the ``k`` offered classes nearest to it, best first.

    Score of an offered class: 2 if the names share a content word (:func:`content_words`: "green apple"
    and "red apple"), plus 1 in the same subcategory of the emoji data ("food-prepared"), plus 0.5 in
    the same category, plus the cosine similarity of the ``source`` classifier's features of the two
    emoji's images (their look, in [0, 1]: the features are >= 0). ``groups``: name -> (category,
    subcategory)."""
    clf, _ = restricted_classifier(source, all_names, all_names)
    feats = torch.cat([clf.features(images[i:i + 256]) for i in range(0, len(images), 256)])
    feats = F.normalize(feats.float(), dim=-1)
    kept_rows = torch.tensor([all_names.index(n) for n in kept])
    score = feats @ feats[kept_rows].T
    kept_words = [content_words(n) for n in kept]
    for c, name in enumerate(all_names):
        words, (category, sub) = content_words(name), groups[name]
        for j, other in enumerate(kept):
            score[c, j] += (2.0 * bool(words & kept_words[j]) + 1.0 * (groups[other][1] == sub)
                            + 0.5 * (groups[other][0] == category))
    return score.topk(min(k, len(kept)), dim=-1).indices.tolist()


def main(argv=None) -> None:
    """The command line (module docstring). Every refusal is one line (``ship: error: ...``, status 1),
    and nothing is written into ``--out`` until everything is made: the files go to a folder beside it,
    which then takes its place (a file of ``--out`` that ship does not write is kept)."""
    import sys

    try:
        _main(argv)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"ship: error: {exc}") from None
    except KeyboardInterrupt:
        print("ship: interrupted; --out is as it was", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


def _swap_in(made: Path, out: Path) -> None:
    """``made`` (a full weights folder) becomes ``out``; files only ``out`` holds are kept."""
    if out.is_dir():
        for extra in out.iterdir():
            if not (made / extra.name).exists():
                shutil.copy2(extra, made / extra.name) if extra.is_file() else shutil.copytree(extra, made / extra.name)
        old = out.with_name(f".{out.name}.ship-old")
        shutil.rmtree(old, ignore_errors=True)
        out.replace(old)
        try:
            made.replace(out)
        except BaseException:  # --out back as it was
            old.replace(out)
            raise
        shutil.rmtree(old)
    else:
        made.replace(out)


def _main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="the finished run (train.py's --out)")
    p.add_argument("--agreement", type=Path, required=True, help="builtin_class_agreement.py's --json of the run")
    p.add_argument("--guidance", default="3", help="the guidance scale of the agreement to choose by")
    p.add_argument("--min-agreement", type=float, default=0.5)
    p.add_argument("--source-classifier", type=Path, required=True,
                   help="a weights folder whose classifier knows every emoji (the nearest-class table)")
    p.add_argument("--default-classes", default=None,
                   help="comma-separated names of the eight default classes (each must be offered); default: the "
                        "best-drawn class of each category")
    p.add_argument("--training", default="", help="how the run was trained (steps, batch, time, machine), for metrics.json")
    p.add_argument("--heldout-views", type=int, default=4)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.out.resolve() == args.run.resolve():
        raise ValueError(f"--out {str(args.out)!r} is --run (the run's files are read while --out is written); "
                         f"allowed: another folder")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {str(args.out)!r} is a file; allowed: a folder (new, or a weights folder to replace)")
    if not 0 <= args.min_agreement <= 1:
        raise ValueError(f"--min-agreement {args.min_agreement}: allowed a share in [0, 1]")
    for option, folder in (("--run", args.run), ("--source-classifier", args.source_classifier)):
        if not (folder / "config.json").is_file():  # load_components' message names --weights
            raise FileNotFoundError(f"{option} {str(folder)!r} holds no config.json: not a finished run or weights "
                                    f"folder (train.py writes config.json as its run ends)")
    run = load_components(args.run)
    config = dict(run.config)
    names = run.class_names
    from csdgen.jsonio import read_json

    agreement = read_json(args.agreement, what="builtin_class_agreement.py's --json")
    args.guidance = guidance_key(agreement, args.guidance)
    kept = offered_classes(agreement, args.guidance, args.min_agreement, names)
    if len(kept) < 2:
        raise ValueError(f"only {len(kept)} class{'es reach' if len(kept) != 1 else ' reaches'} agreement "
                         f"{args.min_agreement}; lower --min-agreement")
    rows = [names.index(n) for n in kept]
    chosen = None
    if args.default_classes:  # checked before anything is made
        chosen = [n.strip() for n in args.default_classes.split(",") if n.strip()]
        not_offered = [n for n in chosen if n not in kept]
        if not_offered:
            import difflib

            hints = {n: difflib.get_close_matches(n, kept, n=3) for n in not_offered}
            raise ValueError("--default-classes: not offered: " + "; ".join(
                f"{n!r}" + (f" (offered: {', '.join(map(repr, h))})" if h else "") for n, h in hints.items()))
    data = load_emoji()
    known = set(load_components(args.source_classifier).class_names)
    unknown = [n for n in data.names if n not in known]
    if unknown:
        raise ValueError(f"--source-classifier {str(args.source_classifier)!r} does not know {len(unknown)} of the "
                         f"package's {len(data.names)} emoji ({unknown[0]!r}, ...): the nearest-class table needs a "
                         f"classifier of every emoji, as a run trained without --classes makes (the shipped weights' "
                         f"knows the offered classes only)")
    final, args.out = args.out, args.out.with_name(f".{args.out.name}.ship-new")
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    try:
        metrics = _make(args, run, config, names, agreement, kept, rows, chosen, data)
        _swap_in(args.out, final)
    except BaseException:  # a failure or Ctrl-C while making: --out as it was, nothing of this run left
        shutil.rmtree(args.out, ignore_errors=True)
        raise
    print(f"{len(kept)} of {len(names)} classes offered -> {final}; defaults {config['default_classes']}; "
          f"classifier {metrics['classifier']['heldout_accuracy']:.3f} real, "
          f"{metrics['classifier']['heldout_accuracy_vq_reconstructions']:.3f} VQ reconstructions")


def _make(args, run, config: dict, names: list[str], agreement: dict, kept: list[str], rows: list[int],
          chosen: list[str] | None, data) -> dict:
    """Write the weights folder into ``args.out`` (:func:`_main`'s checks done); ``config`` is updated to
    the folder's config.json. Returns the folder's metrics.json."""

    # the AR model and its config
    codebook = run.codebook_size
    state = cut_ar(load_file(str(args.run / "ar.safetensors")), codebook, rows, len(names))
    llama = dict(config["llama"], vocab_size=codebook + len(kept) + 1)
    save_safetensors(state, args.out / "ar.safetensors", dtype=torch.float16)
    shutil.copyfile(args.run / "vq.safetensors", args.out / "vq.safetensors.tmp")
    (args.out / "vq.safetensors.tmp").replace(args.out / "vq.safetensors")

    # the classifier, cut to the offered classes, and its accuracy on them
    clf, clf_cfg = restricted_classifier(args.run, kept, names)
    save_safetensors(clf.state_dict(), args.out / "classifier.safetensors", dtype=torch.float16)
    sub = select_classes(data, kept)
    xho, yho = make_views(sub, args.heldout_views, HELDOUT_SEED, uint8=True)
    recon = decode_u8(run.vq, encode_all(run.vq, xho))
    from csdgen.evaluation.quality import REFERENCE_FILE, reference_feature_states

    save_safetensors(reference_feature_states(clf, to_float(xho)), args.out / REFERENCE_FILE)

    # every emoji: characters, and the offered classes nearest to those not offered
    entries = base_entries(fetch_package())
    all_names = class_names(entries)
    by_name = dict(zip(all_names, entries))
    first_image = torch.stack([torch.from_numpy(data.images[(data.labels == c).nonzero()[0][0]]) for c in
                               range(len(data.names))]).permute(0, 3, 1, 2)
    groups = {n: (by_name[n].get("category", ""), by_name[n].get("subcategory", "")) for n in data.names}
    nearest = nearest_offered(args.source_classifier, data.names, to_float(first_image), kept, groups)
    short = {n: s for n, s in zip(data.names, data.short_names)}
    others = [c for c, n in enumerate(data.names) if n not in kept]
    categories = dict(zip(names, config["class_categories"]))
    chosen_defaults = chosen or default_classes(agreement, args.guidance, kept, categories)
    config.update(
        class_names=kept, class_categories=[categories[n] for n in kept],
        class_short_names=[list(config["class_short_names"][names.index(n)]) for n in kept],
        class_emoji=[emoji_chars(by_name[n]) for n in kept],
        num_classes=len(kept), null_class_id=codebook + len(kept), llama=llama, classifier=clf_cfg,
        default_classes=chosen_defaults,
        other_classes={"how": f"every other emoji of the package, with the {len(nearest[0])} offered classes nearest "
                              f"to it: a shared word in the names, the same subcategory and category, then the "
                              f"look (cosine similarity of a {len(data.names)}-class emoji classifier's features)",
                       "names": [data.names[c] for c in others],
                       "aliases": [list(short[data.names[c]]) + emoji_chars(by_name[data.names[c]]) for c in others],
                       "nearest": [nearest[c] for c in others]})
    per = agreement["by_guidance"][args.guidance]
    config["class_set"] = dict(config.get("class_set", {}),
                               offered=f"the {len(kept)} of the run's {len(names)} classes whose AR samples at "
                                       f"guidance {args.guidance} were judged their class at least "
                                       f"{args.min_agreement:g} of the time ({per['classes'][kept[0]]['n']} samples "
                                       f"per class, benchmarks/builtin_class_agreement.py)")
    save_json(config, args.out / "config.json")

    metrics = json.loads((args.run / "metrics.json").read_text()) if (args.run / "metrics.json").is_file() else {}
    metrics["classes"] = {"offered": len(kept), "trained": len(names), "min_agreement": args.min_agreement,
                          "guidance": float(args.guidance), "samples_per_class": per["classes"][kept[0]]["n"],
                          "agreement_all_trained": per["agreement"],
                          "agreement_offered": sum(per["classes"][n]["hits"] for n in kept)
                          / sum(per["classes"][n]["n"] for n in kept)}
    metrics["classifier"] = {"source": "the run's classifier, its logits of the offered classes",
                             "heldout_accuracy": float((classify(clf, xho) == yho).float().mean()),
                             "heldout_accuracy_vq_reconstructions": float((classify(clf, recon) == yho).float().mean()),
                             "n_heldout": len(yho)}
    metrics.pop("samples", None)  # the run's figure was over all its classes; builtin_report measures the offered
    for key in ("wall_times_s", "steps_done"):  # a resumed run's last leg: not the training's
        metrics.pop(key, None)
    if args.training:
        metrics["training"] = args.training
    metrics["sizes_bytes"] = {f.name: f.stat().st_size for f in sorted(args.out.glob("*.safetensors"))}
    save_json(metrics, args.out / "metrics.json")
    return metrics


if __name__ == "__main__":
    main()
