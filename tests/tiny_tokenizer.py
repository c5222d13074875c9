"""The word-level tokenizer the tiny checkpoints of the family tests save (whitespace-split words,
every special token known as an added token)."""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast


def word_level_tokenizer(vocab: dict[str, int], specials: list[str], *, unk_token: str = "<unk>",
                         prepend_bos: str | None = None, **kwargs) -> PreTrainedTokenizerFast:
    """A fast tokenizer over ``vocab`` (word -> id) splitting on white space; ``specials`` are added as
    special tokens; ``prepend_bos``: a token put before every text (as a checkpoint's tokenizer adds
    its BOS); ``kwargs`` go to :class:`PreTrainedTokenizerFast` (``bos_token``, ``pad_token``, ...)."""
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk_token))
    tok.add_special_tokens(list(specials))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if prepend_bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{prepend_bos} $A",
                                                           special_tokens=[(prepend_bos, vocab[prepend_bos])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk_token, **kwargs)
