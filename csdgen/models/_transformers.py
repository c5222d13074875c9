"""What the adapters built on transformers share (Janus, Emu3, Chameleon; the class-conditional Llama uses some).

One place each for:

* checkpoint folders: :func:`check_checkpoint` (one exception type, FileNotFoundError, for a
  missing folder, config or weights), :func:`resolve_dtype`, :func:`movqgan_token_ids` (what tells
  a Lumina-mGPT 2.0 vocabulary from a Lumina-mGPT / Anole one);
* tokenizers: :func:`load_tokenizer` (None when the folder has no tokenizer files) and
  :func:`token_id` (a special token's id by NAME, checked between the tokenizer and the
  checkpoint's vocabulary; config ids such as ``bos_token_id`` are never trusted);
* prompts: :func:`format_prompt` (``{prompt}``, ``{width}``, ``{height}`` templates) and
  :func:`check_sequence_length` (the refusal of a prompt too long for the position table);
* left-padded rows: :class:`PaddedRows` (ids, attention mask, position ids of the prompt rows
  and of the image region after them);
* row ends: :class:`RowEnds` (an end-of-line token after every image row: image positions <->
  sequence positions, and the window with the end-of-line tokens inserted);
* memory: :class:`MemoryEstimate` (bytes, linear in the batch size, with :data:`HEADROOM`) and
  :func:`estimate_memory`;
* sessions: the per-row session over a ``DynamicCache`` is :class:`csdgen.models._ragged.RaggedSession`;
  :func:`cache_kwargs`, the keyword a model's forward takes that cache by in the installed
  transformers.

Only torch is imported here (no transformers model code; :func:`cache_kwargs` reads transformers'
version).
"""

from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch


__all__ = [
    "cache_kwargs",
    "DTYPES",
    "WEIGHT_FILES",
    "TOKENIZER_FILES",
    "HEADROOM",
    "resolve_dtype",
    "check_checkpoint",
    "MOVQGAN_PREFIX",
    "movqgan_token_ids",
    "load_tokenizer",
    "check_tokenizer",
    "TOKENIZER_PROBE",
    "token_id",
    "format_prompt",
    "check_sequence_length",
    "check_token_ids",
    "encode_each_once",
    "left_pad",
    "PaddedRows",
    "RowEnds",
    "kv_cache_bytes",
    "parameter_count",
    "meta_parameter_count",
    "MemoryEstimate",
    "estimate_memory",
]

#: dtype names accepted wherever a checkpoint is loaded
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: weight files of a transformers checkpoint folder (``*.safetensors`` shards count too)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
#: files whose presence means the folder holds a tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
#: fraction of the available memory the memory check keeps free: the CUDA context and allocator
#: fragmentation (the memory plan counts one forward's activations itself)
HEADROOM = 0.10


_CACHE_KEYWORD: str | None = None


def _cache_keyword() -> str:
    # memoised in a plain global, not functools.lru_cache: torch.compile traces through cache_kwargs and
    # warned about the lru_cache wrapper (with a code excerpt) on every `csdgen generate --compile`
    global _CACHE_KEYWORD
    if _CACHE_KEYWORD is None:
        import re

        import transformers

        major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", transformers.__version__).groups())
        _CACHE_KEYWORD = "cache" if (major, minor) >= (5, 24) else "past_key_values"
    return _CACHE_KEYWORD


def cache_kwargs(cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for a transformers model's forward: ``cache`` since transformers 5.24,
    ``past_key_values`` before it (5.24 renamed it and accepts the old name with a deprecation
    warning). A name the forward does not know goes into its ``**kwargs`` unseen and the model
    runs without the cache, so every adapter passes its cache through this."""
    return {_cache_keyword(): cache}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A name of :data:`DTYPES` or one of its torch dtypes -> the torch dtype.

    Raises:
        ValueError: any other dtype.
    """
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype={dtype!r}: allowed {', '.join(DTYPES)} (or the torch dtypes)")


def check_checkpoint(path: str | os.PathLike, family: str) -> Path:
    """The checkpoint folder, checked: it exists, has config.json and weights.

    Args:
        path: the folder; family: the family's name for the messages (``"Janus"``, ``"Emu3"``).

    Raises:
        FileNotFoundError: (one type for all three cases) no such folder, no config.json, no weights.
        ValueError: a weight file cut short or not a safetensors file (:func:`check_weight_files`).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{family} checkpoint folder {str(path)!r} does not exist (give a local folder; no downloads)")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{str(path)!r} has no config.json: not a transformers {family} checkpoint")
    if not any((folder / name).is_file() for name in WEIGHT_FILES) and not any(folder.glob("*.safetensors")) \
            and not any(folder.glob("pytorch_model*.bin")):
        raise FileNotFoundError(f"{str(path)!r} holds no weights; expected one of {', '.join(WEIGHT_FILES)} or *.safetensors shards")
    check_weight_files(folder)
    return folder


def check_weight_files(folder: Path) -> None:
    """The folder's weight files are whole and the shards its index names are there; a file cut short by a
    download or a copy is named here, in one line, not by a traceback from the loader after the rest has been
    read. The files checked are those transformers reads: the safetensors files (their headers read and their
    data present), else, in a folder without them, the ``pytorch_model*.bin`` files (a zip archive, torch's
    format since 1.6, must end with its central directory: a copy cut short does not).

    Raises:
        FileNotFoundError: a shard ``model.safetensors.index.json`` or ``pytorch_model.bin.index.json`` names is missing.
        ValueError: such an index without a ``weight_map`` object (naming it).
        ValueError: a safetensors file whose header cannot be read or whose data is shorter than its header says;
            a ``.bin`` zip archive without its end (cut short).
    """
    import zipfile

    files = sorted(folder.glob("*.safetensors"))
    named = _indexed_shards(folder / "model.safetensors.index.json")
    if named is not None:  # the shards it names are what the loader reads (another .safetensors beside them is not)
        files = named
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    for file in files:
        _check_safetensors(file)
    if files:
        return
    bins = _indexed_shards(folder / "pytorch_model.bin.index.json")
    if bins is None:
        bins = [folder / "pytorch_model.bin"] if (folder / "pytorch_model.bin").is_file() else []
    for file in bins:
        with open(file, "rb") as f:
            zipped = f.read(4) == b"PK\x03\x04"  # else torch's older pickle format: nothing to check cheaply
        if zipped and not zipfile.is_zipfile(file):
            raise ValueError(f"{str(file)!r} is not a whole torch weight file: a zip archive of {file.stat().st_size} "
                             f"bytes without its end (cut short); copy or download it again")


def _indexed_shards(index: Path) -> list[Path] | None:
    """The shard files a ``*.index.json`` names (None: no such index).

    Raises:
        FileNotFoundError: a shard it names is not in the folder. ValueError: no ``weight_map`` object in it."""
    if not index.is_file():
        return None
    shards = sorted(set(_weight_map(index).values()))
    missing = [name for name in shards if not (index.parent / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{str(index)!r} names {len(missing)} shard(s) not in the folder: "
                                f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}; copy every shard")
    return [index.parent / name for name in shards]


def _weight_map(index: Path) -> dict:
    """The ``weight_map`` object of a ``*.index.json`` (tensor name -> shard file).

    Raises:
        ValueError: not JSON, or no ``weight_map`` object in it (naming the file)."""
    from csdgen.jsonio import read_json

    weight_map = read_json(index, what="a weight index").get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError(f"{str(index)!r} has no weight_map object (tensor name -> shard file); expected the index "
                         f"saved with the shards")
    return weight_map


def _check_safetensors(file: Path) -> None:
    """One safetensors file: its header read, its data as long as the header says (ValueError naming it)."""
    size = file.stat().st_size
    length, header = _safetensors_header(file)
    try:
        end = max((int(v["data_offsets"][1]) for v in header.values()), default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        _refuse_safetensors(file, "its header is not a safetensors header")
    if 8 + length + end > size:
        _refuse_safetensors(file, f"it holds {size} bytes, its header promises {8 + length + end}: cut short")


def _refuse_safetensors(file: Path, problem: str):
    raise ValueError(f"{str(file)!r} is not a whole safetensors file: {problem}; copy or download it again")


def _safetensors_header(file: Path) -> tuple[int, dict[str, Any]]:
    """``(header bytes, {tensor name: entry})`` of one safetensors file, ``__metadata__`` left out (the format: an
    8-byte little-endian header length, then that many bytes of JSON; safetensors' own specification).

    Raises:
        ValueError: the header cannot be read or is not a JSON object, or the name is a folder's (naming it).
    """
    import json

    if file.is_dir():
        raise ValueError(f"{str(file)!r} is a folder, not a safetensors file; allowed: the weight files a model's "
                         f"save_pretrained wrote")
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else None
        if length is None or length > size - 8:
            _refuse_safetensors(file, f"its header cannot be read ({size} bytes)")
        try:
            header = json.loads(f.read(length))
        except ValueError:
            header = None
    if not isinstance(header, dict):
        _refuse_safetensors(file, "its header is not a safetensors header")
    return length, {k: v for k, v in header.items() if k != "__metadata__"}


def checkpoint_tensor_names(folder: str | os.PathLike, *, index: bool = True, read_bin: bool = True) -> set[str]:
    """Names of the tensors a checkpoint folder's weights hold, nothing but names read.

    Args:
        folder: the checkpoint folder.
        index: take the names from ``model.safetensors.index.json`` or ``pytorch_model.bin.index.json``'s
            ``weight_map`` where the folder has one (False: from the files themselves).
        read_bin: in a folder without ``*.safetensors`` files, read ``pytorch_model*.bin`` files (memory-mapped,
            their tensors not read); False: such a folder has no names.

    Without an index the files read are ``model.safetensors`` where the folder has it, else every
    ``*.safetensors`` file (then ``pytorch_model.bin``, else every ``pytorch_model*.bin``): a stray file beside
    the one transformers reads does not lend its names.

    Returns:
        The names (empty: no weight files).

    Raises:
        ValueError: an index whose ``weight_map`` is not an object, a safetensors file whose header cannot be
            read, or a ``.bin`` file that is not a torch state dict (naming it). OSError: a file that cannot be opened.
    """
    folder = Path(folder)
    if index:
        for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            if (folder / name).is_file():
                return set(_weight_map(folder / name))
    names: set[str] = set()
    files = _read_files(folder, "model.safetensors", "*.safetensors")
    for file in files:
        names.update(_safetensors_header(file)[1])
    if not files and read_bin:
        for file in _read_files(folder, "pytorch_model.bin", "pytorch_model*.bin"):
            try:
                state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:  # torch's errors for a file that is not its format: RuntimeError, pickle's, ...
                raise ValueError(f"{str(file)!r} is not a torch weight file ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else 'unreadable'}); copy or download it "
                                 f"again") from None
            if not isinstance(state, dict):
                raise ValueError(f"{str(file)!r} holds a {type(state).__name__}, not a state dict (tensor name -> "
                                 f"tensor); expected the weights a model's save_pretrained wrote")
            names.update(state)
    return names


def _read_files(folder: Path, single: str, shards: str) -> list[Path]:
    """The one weight file transformers reads where the folder has it (another file beside it is not the
    model's), else every file ``shards`` matches."""
    return [folder / single] if (folder / single).is_file() else sorted(folder.glob(shards))


#: the text the tokenizer check encodes (issue 16: "a red cat")
TOKENIZER_PROBE = "a red cat"

#: how Lumina-mGPT 2.0 names its image tokens (MoVQGAN codes) in config.json's ``vocabulary_map``
#: (its ``ChameleonImageVocabularyMapping.get_image_tokens``); Lumina-mGPT 1.0 / Anole use ``IMGIMG...``
MOVQGAN_PREFIX = "<MOVQGAN"


def movqgan_token_ids(vocab: dict[str, int] | None) -> list[int]:
    """Sorted ids of the vocabulary's ``<MOVQGAN...`` names: Lumina-mGPT 2.0's image tokens ([] for other vocabularies).

    Args:
        vocab: a Chameleon-format config's ``vocabulary_map`` (name -> id), or None.
    """
    return sorted(int(i) for name, i in (vocab or {}).items() if name.startswith(MOVQGAN_PREFIX))


def load_tokenizer(folder: str | os.PathLike, loader: Any = None):
    """The folder's tokenizer (``loader.from_pretrained``, default ``AutoTokenizer``), or None without tokenizer files.

    The result (a processor's ``tokenizer``) is checked by :func:`check_tokenizer` against the
    folder's tokenizer.json.

    Raises:
        ValueError: the loaded tokenizer does not encode as its tokenizer.json (see :func:`check_tokenizer`), or
            ``loader`` cannot be built from the folder's files (a processor asking its tokenizer for a special
            token that a missing tokenizer_config.json would define: transformers' AttributeError), naming the
            folder.
        FileNotFoundError: the folder has other tokenizer files but no tokenizer.json, and the tokenizer cannot be
            built from them, naming the folder.
    """
    folder = Path(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    check_json_files(folder)
    if loader is None:
        from transformers import AutoTokenizer as loader
    try:
        loaded = loader.from_pretrained(folder)
    except AttributeError as exc:
        present = [name for name in TOKENIZER_JSON_FILES if (folder / name).is_file()]
        raise ValueError(f"{str(folder)!r}: its tokenizer files ({', '.join(present)}) do not make a "
                         f"{getattr(loader, '__name__', 'tokenizer')} ({exc}); copy the checkpoint's tokenizer_config.json "
                         f"and special_tokens_map.json into it") from None
    except (ValueError, OSError) as exc:
        if (folder / "tokenizer.json").is_file():
            raise
        # transformers' five lines name no folder and suggest installing sentencepiece: the file is what is missing
        present = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
        raise FileNotFoundError(f"{str(folder)!r}: no tokenizer.json beside {', '.join(present)}, so no tokenizer can be "
                                f"built ({str(exc).splitlines()[0][:100]}); copy the checkpoint's tokenizer.json there") from None
    check_tokenizer(getattr(loaded, "tokenizer", loaded), folder)
    return loaded


#: the JSON files a tokenizer or processor folder may hold (each read by transformers without naming it on an error)
TOKENIZER_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                        "processor_config.json", "preprocessor_config.json", "chat_template.json")


def check_json_files(folder: str | os.PathLike) -> None:
    """Each of :data:`TOKENIZER_JSON_FILES` in ``folder`` is a JSON object: a file cut short is one ValueError line
    naming it (transformers' own error names only the line and column of the JSON it could not read).
    """
    from csdgen.jsonio import read_json

    for name in TOKENIZER_JSON_FILES:
        if (Path(folder) / name).is_file():
            read_json(Path(folder) / name, what="a tokenizer or processor file")


def _pre_tokenizer_type(tokenizer: Any) -> str | None:
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    pre = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    return pre.get("type")


def check_tokenizer(tokenizer: Any, folder: str | os.PathLike | None = None) -> None:
    """Refuse a tokenizer whose transformers class replaced the pre-tokenizer of its tokenizer.json.

    transformers 5 loads a ``tokenizer_class`` ``LlamaTokenizer`` (what Chameleon's converter
    writes, and DeepSeek's tokenizers declare) with a Metaspace pre-tokenizer whatever the file
    says; on a byte-level vocabulary the spaces are then lost (transformers issue #45488).
    AutoTokenizer 5.24 routes byte-level files around it, ``LlamaTokenizer.from_pretrained`` and
    older releases do not. Check: the tokenizer encodes :data:`TOKENIZER_PROBE` (no special
    tokens) to the ids the folder's ``tokenizer.json`` gives through the ``tokenizers`` library;
    without that file, a Metaspace pre-tokenizer over a vocabulary with no ``▁`` pieces is refused.

    Raises:
        ValueError: one line naming the folder, both id lists (or the missing ``▁`` pieces), and
            the fix.
    """
    if tokenizer is None or getattr(tokenizer, "backend_tokenizer", None) is None:
        return
    import transformers

    kind = f"{type(tokenizer).__name__} (pre-tokenizer {_pre_tokenizer_type(tokenizer)}, transformers {transformers.__version__})"
    fix = ('set "tokenizer_class": "TokenizersBackend" in its tokenizer_config.json, or load it with '
           'PreTrainedTokenizerFast.from_pretrained, which keeps the file\'s pre-tokenizer')
    file = None if folder is None else Path(folder) / "tokenizer.json"
    if file is not None and file.is_file():
        from tokenizers import Tokenizer

        expected = Tokenizer.from_file(str(file)).encode(TOKENIZER_PROBE, add_special_tokens=False).ids
        got = list(tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"])
        if got != list(expected):
            raise ValueError(f"the tokenizer of {str(folder)!r} loads as {kind} and encodes {TOKENIZER_PROBE!r} as {got}, "
                             f"but its tokenizer.json gives {list(expected)}; {fix}")
    elif _pre_tokenizer_type(tokenizer) == "Metaspace" and not any(t.startswith("\u2581") for t in tokenizer.get_vocab()):
        raise ValueError(f"the tokenizer loads as {kind}, but its vocabulary has no '\u2581' pieces (a byte-level "
                         f"vocabulary): prompts would lose their spaces; {fix}")


def token_id(name: str, vocab: dict[str, int] | None, tokenizer: Any = None, what: str = "special token") -> int:
    """The id of the token called ``name``, from the checkpoint's vocabulary and/or tokenizer.

    Args:
        name: the token's text (``"<s>"``, ``"<racm3:break>"``); vocab: the config's name -> id
            map (None when the config has none); tokenizer: checked against ``vocab`` when both exist.

    Raises:
        ValueError: the name is in neither, or the two disagree on its id.
    """
    ids = []
    if vocab:
        if name in vocab:
            ids.append(int(vocab[name]))
    if tokenizer is not None:
        tid = tokenizer.convert_tokens_to_ids(name)
        unk = getattr(tokenizer, "unk_token_id", None)
        if tid is not None and (tid != unk or name == getattr(tokenizer, "unk_token", None)):
            ids.append(int(tid))
    if not ids:
        raise ValueError(f"{what} {name!r} is not in the checkpoint's vocabulary: not a checkpoint of this family?")
    if len(set(ids)) > 1:
        raise ValueError(f"{what} {name!r}: the tokenizer says id {ids[1]}, the config's vocabulary {ids[0]}; allowed: equal ids")
    return ids[0]


def format_prompt(template: str, prompt: str, width: int, height: int) -> str:
    """``template.format(prompt=, width=, height=)`` (pixels).

    Raises:
        ValueError: a template without a ``{prompt}`` field, with other fields, or reaching into a field
            (``{prompt.__class__}``, ``{prompt[0]}``: format's attribute and index access).
    """
    allowed = "allowed fields: {prompt}, {width}, {height}"
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:  # "Single '}' encountered in format string"
        raise ValueError(f"prompt template {template!r}: {exc!s}; {allowed} (double other braces)") from None
    reaching = [name for name in names if name not in ("prompt", "width", "height") and
                re.split(r"[.\[]", name, maxsplit=1)[0] in ("prompt", "width", "height")]
    if reaching:
        raise ValueError(f"prompt template {template!r}: {{{reaching[0]}}} reaches into a field; {allowed} as they are")
    if "prompt" not in names:
        raise ValueError(f"prompt template {template!r} has no {{prompt}}; {allowed}")
    try:
        return template.format(prompt=prompt, width=width, height=height)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"prompt template {template!r}: {exc!s}; allowed fields: {{prompt}}, {{width}}, {{height}} "
                         "(double other braces)") from None


def check_sequence_length(prompt_length: int, image_length: int, limit: int, what: str = "image") -> None:
    """Refuse a sequence longer than the position table.

    Args:
        prompt_length: tokens of the longest prompt row (BOS and template included);
        image_length: positions the image part takes (image tokens, row ends, special tokens);
        limit: ``max_position_embeddings``.

    Raises:
        ValueError: naming both lengths, their sum, the limit and the longest prompt allowed; or, where the image
            part alone leaves no room for a prompt, naming it and the limit (the size is to change, not the prompt).
    """
    if image_length >= limit:  # no prompt fits: the size is what is wrong, whatever the prompt
        raise ValueError(f"{what} of {image_length} positions leaves no room for a prompt within "
                         f"max_position_embeddings={limit}; allowed: a smaller size, whose image part takes at most "
                         f"{limit - 1} positions")
    if prompt_length + image_length > limit:
        raise ValueError(
            f"prompt of {prompt_length} tokens + {what} of {image_length} positions = {prompt_length + image_length} "
            f"> max_position_embeddings={limit}; allowed: prompts up to {max(limit - image_length, 0)} tokens"
        )


def check_token_ids(ids: Sequence[int] | torch.Tensor, vocab_size: int) -> list[int]:
    """A token-id condition -> list of ints.

    Raises:
        ValueError: an empty list or an id outside ``0 .. vocab_size - 1``.
    """
    ids = [int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
    if not ids or not all(0 <= i < vocab_size for i in ids):
        raise ValueError(f"token ids {ids[:8]}{'...' if len(ids) > 8 else ''}: allowed a non-empty list of ids in 0..{vocab_size - 1}")
    return ids


def encode_each_once(encode: Any, conditions: Sequence) -> list[list[int]]:
    """``[encode(c) for c in conditions]``, encoding each distinct condition (string or id list) once.

    Batches often repeat a prompt (``-n`` cycles the prompts; the exact-distribution tests run one
    prompt thousands of times); the tokenizer and chat template then run once per distinct prompt.
    """
    done: dict = {}
    rows = []
    for c in conditions:
        key = c if isinstance(c, str) else tuple(int(t) for t in (c.tolist() if isinstance(c, torch.Tensor) else c))
        if key not in done:
            done[key] = encode(c)
        rows.append(list(done[key]))
    return rows


def left_pad(rows: list[list[int]], pad: int, device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists: ``([R, P] int64 ids, [R, P] int64 mask)``, 1 on the real tokens."""
    padded = PaddedRows(rows, pad, device)
    return padded.ids, padded.mask


class PaddedRows:
    """Prompt rows of different lengths, left-padded, and the image region after them.

    Row ``r`` holds ``rows[r]`` right-aligned in ``[R, P]``; ``visible[r][j]`` (default all
    True) hides tokens inside a row too (Chameleon's unconditional rows). Position ids count
    the visible tokens only, so a row reads exactly as an unpadded forward of its visible
    tokens (rotary embeddings, causal mask).

    Attributes:
        ids: ``[R, P]`` int64; mask: ``[R, P]`` int64, 1 on visible tokens;
        positions: ``[R, P]`` int64 position ids (pads clamped to 0, they are masked);
        lengths: ``[R]`` int64 visible tokens per row = position id of the row's first region token;
        padded: whether any prompt token is masked (else plain causal attention, mask None).

    The region after the prompt has one length for all rows here (scalar ``start``); per-row
    region lengths are the generalisation (csdgen/models/_ragged.py).
    """

    def __init__(self, rows: list[list[int]], pad: int, device: Any = None, visible: list[list[bool]] | None = None):
        width = max(len(r) for r in rows)
        self.ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], dtype=torch.long, device=device)
        vis = visible or [[True] * len(r) for r in rows]
        self.mask = torch.tensor([[0] * (width - len(r)) + [int(v) for v in m] for r, m in zip(rows, vis)],
                                 dtype=torch.long, device=device)
        self.positions = (self.mask.cumsum(1) - 1).clamp(min=0)
        self.lengths = self.mask.sum(1)
        self.padded = not bool(self.mask.all())

    @property
    def width(self) -> int:
        """P, the padded prompt length."""
        return self.ids.shape[1]

    def region_positions(self, offset: int, width: int) -> torch.Tensor:
        """``[R, width]`` position ids of region slots ``offset .. offset + width - 1``."""
        return self.lengths[:, None] + offset + torch.arange(width, device=self.ids.device)

    def attention_mask(self, region: int) -> torch.Tensor | None:
        """``[R, P + region]`` mask over the prompt and ``region`` region slots; None without masked tokens."""
        if not self.padded:
            return None
        return torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], region)], dim=1)


class RowEnds:
    """An end-of-line token after every row of ``cols`` image tokens (Lumina-mGPT, Emu3), or none.

    The end-of-line tokens are forced: the model's output at a row's last image token is not
    used, the end-of-line token's output predicts the next row's first token. So image token
    ``i`` sits at region slot ``i + i // cols`` and its prediction comes from the slot after it
    when it ends a row.

    Args:
        cols: image tokens per row; token: the end-of-line id, or None for a layout without row ends.
    """

    def __init__(self, cols: int, token: int | None):
        self.cols, self.token = cols, token

    def region_length(self, k: int) -> int:
        """Region slots holding image tokens ``0 .. k - 1`` (with the row end of every complete row)."""
        return k + (k // self.cols if self.token is not None else 0)

    def is_row_end(self, i: int) -> bool:
        """Whether an end-of-line token follows image token ``i``."""
        return self.token is not None and i % self.cols == self.cols - 1

    def insert(self, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Window ids ``[R, W]`` of image positions ``start ..`` -> ``([R, W + e] ids, [W] output slots)``.

        Output slot ``j`` is where the distribution of image position ``start + j + 1`` is read:
        the token's own slot, or its end-of-line token's. Vectorised (no loop over the window).
        """
        W = ids.shape[1]
        if self.token is None:
            return ids, torch.arange(W, device=ids.device)
        ends = ((start + torch.arange(W, device=ids.device) + 1) % self.cols == 0).long()  # [W]
        out = torch.arange(W, device=ids.device) + ends.cumsum(0)  # slot of the token, or of its row end
        seq = ids.new_full((ids.shape[0], W + (W + start % self.cols) // self.cols), self.token)
        seq[:, out - ends] = ids
        return seq, out


def kv_cache_bytes(text_config: Any, rows: int, length: int, element_size: int) -> int:
    """Bytes of a KV cache: ``layers * 2 * rows * length * kv_heads * head_dim * element_size``.

    ``head_dim`` is the config's, else ``hidden_size // num_attention_heads``; ``kv_heads`` is
    ``num_key_value_heads``, else ``num_attention_heads``.
    """
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    kv_heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    return text_config.num_hidden_layers * 2 * rows * length * kv_heads * head_dim * element_size


def parameter_count(model: torch.nn.Module) -> int:
    """Number of parameters (elements) of ``model``."""
    return sum(p.numel() for p in model.parameters())


def meta_parameter_count(model_class: type, config: Any) -> int:
    """Parameters of ``model_class(config)``, built on the ``meta`` device (nothing allocated)."""
    with torch.device("meta"):
        return parameter_count(model_class(config))


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run needs: ``fixed + per_image * batch_size`` (linear in the batch size).

    Attributes:
        fixed: bytes that do not grow with the batch (parameters, copies of head rows).
        per_image: bytes per image (its KV cache rows, its logits and probability buffers).
        headroom: fraction of the available memory kept free (:data:`HEADROOM`).
    """

    fixed: int
    per_image: int
    headroom: float = HEADROOM
    #: what the memory plan (:mod:`csdgen.models.memory`) splits the figures by: the KV-cache bytes of one
    #: image, the longest row's positions, the rows per image, the parameters counted in ``fixed``, the
    #: element size, and the decoder's config (None where an estimate was made without them)
    kv_per_image: int = 0
    sequence_length: int = 0
    rows: int = 1
    parameters: int = 0
    element_size: int = 0
    text_config: Any = field(default=None, compare=False, repr=False)
    #: N, the image tokens a run decodes (the widest window it opens); 0 where an estimate was made without it
    image_tokens: int = 0

    def bytes(self, batch_size: int) -> int:
        """Estimated bytes for ``batch_size`` images."""
        return self.fixed + self.per_image * batch_size

    def usable(self, available: int) -> int:
        """Bytes of ``available`` the estimate may use: ``floor(available * (1 - headroom))``."""
        return int(available * (1 - self.headroom))

    def largest_batch(self, available: int) -> int:
        """The largest batch size that fits ``available`` bytes with the headroom (0 if none)."""
        room = self.usable(available) - self.fixed
        return max(room // self.per_image, 0) if self.per_image else (1 << 30 if room >= 0 else 0)


def estimate_memory(parameters: int, element_size: int, text_config: Any, sequence_length: int, codebook_size: int,
                    window: int, guided: bool = True, extra_fixed: int = 0, image_tokens: int = 0) -> MemoryEstimate:
    """Memory of one decoding run, the same formula for every family.

    Args:
        parameters: parameter count (elements); element_size: bytes per element of the weights'
            dtype (also the KV cache's); text_config: the decoder's config (layers, heads);
        sequence_length: the longest row: prompt tokens + image positions (row ends and special
            tokens included); codebook_size: V; window: W;
        guided: two rows per image (conditional and unconditional) instead of one;
        extra_fixed: further batch-independent bytes (e.g. a copy of the image rows of lm_head);
        image_tokens: N, the image's tokens (kept as the estimate's ``image_tokens``: a plan caps its window there).

    Returns:
        fixed = ``parameters * element_size + extra_fixed``; per image =
        ``kv_cache_bytes(text_config, rows, sequence_length)`` + ``(rows + 3) * (W + 1) * V * 4``
        (float32 logits of the image's rows over a window, plus target, draft and residual
        distributions), rows = 2 guided, 1 otherwise. Activations of one forward are not
        counted: :data:`HEADROOM` covers them.
    """
    rows = 2 if guided else 1
    kv = kv_cache_bytes(text_config, rows, sequence_length, element_size)
    per_image = kv + (rows + 3) * (window + 1) * codebook_size * 4
    return MemoryEstimate(parameters * element_size + extra_fixed, per_image, kv_per_image=kv, sequence_length=sequence_length,
                          rows=rows, parameters=parameters, element_size=element_size, text_config=text_config,
                          image_tokens=int(image_tokens))
