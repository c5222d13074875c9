"""Class names as people type them: case, spacing, commas inside names, aliases, close-match hints.

Used by the class-conditional models (:meth:`csdgen.models.ClassConditionalLlama.class_ids`),
the command line (``--class``, bench's class files), compare/sweep and the demo. Standard library
only (no torch): ``csdgen generate --help`` and ``--list-classes`` use it without loading a model.

Matching: a name is compared after :func:`name_key`, which lower-cases (``str.casefold``),
drops accents, reads curly apostrophes as ``'`` and ``_`` as a space, and ignores extra spaces,
including those around ``,`` and ``:``; so ``"Family:  Man,Boy, boy"`` is the class
``"family: man, boy, boy"``. Aliases (the emoji's short names, ``"apple"`` for
``"red apple"``) are used only where no class has that name.

A comma-separated list (``"red apple,dog face"``) is split by :meth:`ClassNames.split`: since
some names hold commas (``"family: man, boy, boy"``), consecutive pieces are re-joined where
they form a known name, the longest such run first, so ``"family: man, boy, boy,dog face"``
is two classes.
"""

from __future__ import annotations

import operator

import difflib
import errno
import math
import random as _random
import re
import unicodedata
from pathlib import PurePath
from typing import Iterable, Mapping, Sequence

from .integers import as_integer

__all__ = ["ClassNames", "name_key", "RANDOM", "LIST_HINT"]

#: the ``--class`` word for "a class drawn from the seed" (one per image)
RANDOM = "random"

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'", "_": " ",
                              # emoji presentation selectors and the five skin-tone modifiers (U+1F3FB..U+1F3FF):
                              # "\U0001F44D\U0001F3FD" (thumbs up, medium skin tone) is the thumbs-up emoji
                              "\ufe0e": None, "\ufe0f": None, **{0x1F3FB + k: None for k in range(5)}})
#: a skin tone named after an emoji's name, as CLDR names the variants ("waving hand: medium-dark skin tone",
#: two for pairs), in :func:`name_key` form: a name that is not found is looked up again without it
_SKIN_TONE = re.compile(r"(?:[:,](?:light|medium-light|medium|medium-dark|dark) skin tone)+$")


def name_key(text: str) -> str:
    """The form two names are compared in: casefolded, no accents, ``'`` for curly apostrophes,
    ``_`` read as a space, runs of spaces as one, none around ``,`` and ``:``, none at the ends;
    emoji variation selectors (U+FE0E, U+FE0F) and skin-tone modifiers (U+1F3FB..U+1F3FF) dropped.

    >>> name_key("  Family:  Man,Boy , BOY ")
    'family:man,boy,boy'
    >>> name_key("Côte d’Ivoire flag")
    "cote d'ivoire flag"
    """
    text = unicodedata.normalize("NFKD", str(text))
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).translate(_APOSTROPHES).casefold()
    text = " ".join(text.split())
    return re.sub(r" ?([,:]) ?", r"\1", text)


#: the most characters of a given name an error line repeats
def index_text(text: str) -> bool:
    """Whether ``text`` is a class index written out: ASCII digits, an optional leading ``-`` (read,
    then refused as out of range) and spaces around. Other scripts' digits (``"\u0663"``, full-width
    ``"\uff11\uff10"``), which Python's ``int`` also reads, are not indices: they are looked up as names."""
    body = text.strip().lstrip("-")
    return body.isascii() and body.isdigit()


SHOWN_CHARS = 80
#: how an unknown class's error says to list the classes (the command; the server leaves it out)
LIST_HINT = "list them: csdgen generate --list-classes"


def shown(text) -> str:
    """``text`` as an error line shows it: its first :data:`SHOWN_CHARS` characters, then ``...``."""
    text = str(text)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def shown_path(path) -> str:
    """``path`` as an error line shows it: whole up to :data:`SHOWN_CHARS` characters, else its start
    and end around ``...`` (a path's end names the file; a mistyped ``--out`` of thousands of
    characters stays one line)."""
    text = str(path)
    if len(text) <= SHOWN_CHARS:
        return text
    head = SHOWN_CHARS // 2
    return f"{text[:head]}...{text[len(text) - (SHOWN_CHARS - head - 3):]}"


def folder_error(path, exc: OSError) -> str:
    """Why ``path`` could not be made, as an error line says it: ``exc``'s reason, and for a name too
    long (ENAMETOOLONG) the length of the longest name in it, the one a file system limits (often 255
    bytes), not the whole path's."""
    if exc.errno == errno.ENAMETOOLONG:
        longest = max((len(part.encode()) for part in PurePath(path).parts), default=0)
        return f"{exc.strerror}: its longest name has {longest} bytes, the path {len(str(path))} characters"
    return exc.strerror or str(exc)


def _similarity(a: str, b: str) -> float:
    """``difflib.SequenceMatcher(None, a, b).ratio()``: twice the matched characters over both lengths (0..1)."""
    return difflib.SequenceMatcher(None, a, b).ratio()


#: words that tell no name apart ("glas of wine" is 'wine glass')
_STOP_WORDS = frozenset({"a", "an", "the", "of", "with", "and", "in", "on", "at", "for", "to"})


def _words(key: str) -> list[str]:
    """The words of a :func:`name_key`, split at spaces, commas and colons, without :data:`_STOP_WORDS`."""
    return [w for w in re.split(r"[ ,:]", key) if w and w not in _STOP_WORDS]


def _word_similarity(key: str, name: str) -> float:
    """The mean over ``key``'s words of each one's best :func:`_similarity` to a word of ``name`` (both
    :func:`name_key` forms); 0 where either has no word."""
    words, theirs = _words(key), _words(name)
    if not words or not theirs:
        return 0.0
    return sum(max(_similarity(w, t) for t in theirs) for w in words) / len(words)


def _holding_word(key: str, keys) -> list[str]:
    """The name keys of ``keys`` that hold ``key`` (a :func:`name_key`) as a whole word, between the
    start or end and a space, comma or colon (``"apple"`` in ``"red apple"``, not in ``"pineapple"``)."""
    pattern = re.compile(rf"(^|[ ,:]){re.escape(key)}($|[ ,:])")
    return [k for k in keys if pattern.search(k)]


class ClassNames:
    """The class names of a model, with lookup by name (any case and spacing), alias or index.

    Args:
        names: one name per class, in class-index order; names must differ after :func:`name_key`.
        categories: optional category per class (e.g. the emoji's "Food & Drink"), for listings.
        aliases: optional extra names per class: a sequence (one list of aliases per class) or a
            mapping alias -> class index. An alias that equals a class name, or that two classes
            share, is ignored.
        elsewhere: optional names the model knows of but does not draw (and their aliases), each
            mapped to the indices of the classes nearest to it, best first: such a name is still an
            unknown class, and its error names those classes (:meth:`unknown`). A key that is a
            class name or alias is ignored.

    Raises:
        ValueError: two names that are the same after :func:`name_key`, an empty name, or
            ``categories`` / ``aliases`` of another length than ``names``; an ``elsewhere`` index
            outside ``0 .. len(names) - 1``.
    """

    def __init__(self, names: Sequence[str], categories: Sequence[str] | None = None,
                 aliases: Sequence[Sequence[str]] | Mapping[str, int] | None = None,
                 elsewhere: Mapping[str, Sequence[int]] | None = None):
        self.names = [str(n) for n in names]
        if categories is not None and len(categories) != len(self.names):
            raise ValueError(f"{len(categories)} categories for {len(self.names)} class names")
        self.categories = None if categories is None else [str(c) for c in categories]
        self._index: dict[str, int] = {}
        for i, name in enumerate(self.names):
            key = name_key(name)
            if not key:
                raise ValueError(f"class {i} has an empty name")
            if key in self._index:
                raise ValueError(f"classes {self._index[key]} and {i} have the same name {name!r}; "
                                 "class names must differ (ignoring case and spaces)")
            self._index[key] = i
        if aliases is None:
            pairs: Iterable[tuple[str, int]] = ()
        elif isinstance(aliases, Mapping):
            pairs = ((str(a), int(i)) for a, i in aliases.items())
        else:
            if len(aliases) != len(self.names):
                raise ValueError(f"{len(aliases)} alias lists for {len(self.names)} class names")
            pairs = ((str(a), i) for i, group in enumerate(aliases) for a in (group or ()))
        self._alias: dict[str, int] = {}
        shared: set[str] = set()
        for alias, i in pairs:
            key = name_key(alias)
            if not key or key in self._index or not 0 <= i < len(self.names):
                continue
            if key in self._alias and self._alias[key] != i:
                shared.add(key)
            self._alias.setdefault(key, i)
        for key in shared:
            del self._alias[key]
        self._aliases_by_class: dict[int, list[str]] = {}
        for key, i in self._alias.items():
            self._aliases_by_class.setdefault(i, []).append(key)
        # the longest name in commas: no run of more pieces than this can form a name
        self._max_pieces = 1 + max((k.count(",") for k in [*self._index, *self._alias]), default=0)
        self._elsewhere: dict[str, list[int]] = {}
        for name, nearest in (elsewhere or {}).items():
            key = name_key(name)
            near = [int(i) for i in nearest]
            bad = [i for i in near if not 0 <= i < len(self.names)]
            if bad:
                raise ValueError(f"elsewhere[{name!r}]: class index {bad[0]} outside 0..{len(self.names) - 1}")
            if key and key not in self._index and key not in self._alias:
                self._elsewhere.setdefault(key, near)
        self._max_pieces = max(self._max_pieces, 1 + max((k.count(",") for k in self._elsewhere), default=0))
        #: how many things the model knows of without drawing them (``elsewhere``'s names with their
        #: aliases; :meth:`from_config` counts the things)
        self.num_elsewhere = len(self._elsewhere)

    @classmethod
    def from_config(cls, config: Mapping) -> "ClassNames":
        """The class names a model's ``config.json`` describes (the built-in model's layout).

        Keys read: ``class_names`` (required), ``class_categories``, ``class_short_names`` and
        ``class_emoji`` (aliases per class: short names, and the emoji's own characters), and
        ``other_classes``: ``{"names": [...], "aliases": [[...], ...], "nearest": [[class index, ...], ...]}``,
        names the model knows of but does not draw (see ``elsewhere`` above).

        Raises:
            ValueError: a list of another length than ``class_names`` (naming the key).
        """
        names = list(config["class_names"])
        aliases = [[] for _ in names]
        for key in ("class_short_names", "class_emoji"):
            extra = config.get(key)
            if extra is None:
                continue
            if len(extra) != len(names):
                raise ValueError(f"config {key}: {len(extra)} lists for {len(names)} class names")
            for group, more in zip(aliases, extra):
                group.extend(more or ())
        elsewhere: dict[str, list[int]] = {}
        other = config.get("other_classes") or {}
        other_names, nearest = list(other.get("names", [])), list(other.get("nearest", []))
        other_aliases = list(other.get("aliases", [[] for _ in other_names]))
        if not len(other_names) == len(nearest) == len(other_aliases):
            raise ValueError(f"config other_classes: {len(other_names)} names, {len(nearest)} nearest lists and "
                             f"{len(other_aliases)} alias lists; allowed: one of each per name")
        for name, more, near in zip(other_names, other_aliases, nearest):
            for key in (name, *more):
                elsewhere.setdefault(key, near)
        out = cls(names, config.get("class_categories"), aliases, elsewhere or None)
        out.num_elsewhere = len(other_names)
        return out


    def __len__(self) -> int:
        return len(self.names)

    def aliases_of(self, index: int) -> list[str]:
        """The aliases of class ``index``, in their :func:`name_key` form."""
        return list(self._aliases_by_class.get(index, []))

    def find(self, text: str) -> int | None:
        """Class index of a name or alias (any case and spacing), else ``None``. Indices are not read."""
        key = name_key(text)
        found = self._index.get(key)
        if found is None:
            found = self._alias.get(key)
        if found is None and _SKIN_TONE.search(key):  # "thumbs up sign: medium skin tone": the emoji's class
            return self.find(_SKIN_TONE.sub("", key))
        return found

    def nearest_drawn(self, text: str) -> list[int] | None:
        """For a name the model knows of but does not draw (``elsewhere``), the nearest classes it
        draws, best first; else ``None``."""
        key = name_key(text)
        near = self._elsewhere.get(key)
        if near is None and _SKIN_TONE.search(key):
            near = self._elsewhere.get(_SKIN_TONE.sub("", key))
        return None if near is None else list(near)

    def emoji_named_by_word(self, text: str, most: int = 3) -> str | None:
        """The shortest name of an emoji the model knows of but does not draw (``elsewhere``) that holds
        ``text`` as a whole word (``"unicorn"`` -> ``"unicorn face"``), where at most ``most`` such names
        do (``"face"`` names too many to pick one); else ``None``. A CLDR skin tone after the word is
        ignored (``"thumbs up: medium skin tone"`` -> ``"thumbs up sign"``)."""
        key = _SKIN_TONE.sub("", name_key(text))
        if not key:
            return None
        hits = _holding_word(key, self._elsewhere)
        return min(hits, key=lambda k: (len(k), k)) if 0 < len(hits) <= most else None

    #: the least similarity a suggestion needs (``difflib.SequenceMatcher.ratio``, 0..1: twice the matched
    #: characters over both lengths), and how far below the best one's it may be: a name far behind the
    #: best is no help ("red aple": 'red apple' at 0.94, the car's alias "red car" at 0.67)
    SUGGEST_CUTOFF = 0.6
    SUGGEST_SPREAD = 0.1

    def suggest(self, text: str, n: int = 3) -> list[str]:
        """Up to ``n`` class names close to ``text`` (names and aliases), best first: each scored by the
        larger of its similarity to the whole text and, word by word, the mean over the text's words of
        the best similarity to one of its words, times 0.95 (``difflib.SequenceMatcher.ratio``; "pnda" ->
        'panda face', "moon face" -> 'full moon with face'); kept where at least :attr:`SUGGEST_CUTOFF`
        and within :attr:`SUGGEST_SPREAD` of the best. Names holding the text as a whole word come
        after them ("apple" -> 'red apple', 'green apple')."""
        key = name_key(text)
        if not key or len(key) > 2 * max(map(len, self._index), default=0):  # far longer than any name: none is close
            return []  # (and a 1000-character text would cost a second of comparisons)
        scored: dict[int, float] = {}
        for k in list(self._index) + list(self._alias):
            i = self._index.get(k, self._alias.get(k))
            score = max(_similarity(key, k), 0.95 * _word_similarity(key, k))
            if score >= self.SUGGEST_CUTOFF and score > scored.get(i, 0.0):
                scored[i] = score
        best = max(scored.values(), default=0.0)
        close = sorted((i for i, v in scored.items() if v >= best - self.SUGGEST_SPREAD), key=lambda i: (-scored[i], i))
        out: list[str] = []
        for i in close + [self._index[k] for k in sorted(_holding_word(key, self._index), key=len)]:
            if self.names[i] not in out:
                out.append(self.names[i])
        return out[:n]

    def unknown(self, text: str) -> ValueError:
        """The one-line error for a name that is not a class: the name (its first :data:`SHOWN_CHARS`
        characters), close matches, how to list them; for ``random`` (where :meth:`assign` is not the
        caller, e.g. ``csdgen.generate``), where random classes are drawn instead."""
        if self.is_random(text):
            return ValueError(f"class {str(text)!r}: here a class name or index is needed (random draws classes only in "
                              f"csdgen generate --class and csdgen.save_run); draw them with "
                              f"model.classes.assign([{str(text)!r}], n, seed=...) and pass the indices it returns")
        readable = len(str(text)) <= 1000  # longer text is not searched (shown cut)
        near = self.nearest_drawn(text) if readable else None
        read_as = ""
        whole = self.emoji_named_by_word(text) if readable and near is None else None
        if whole is not None:
            near, read_as = self._elsewhere[whole], f" (read as the emoji {whole!r})"
        if near is not None:
            shown_near = ", ".join(repr(self.names[i]) for i in near[:3])
            return ValueError(f"class {shown(text)!r}{read_as} is not one of the {len(self.names)} classes this model "
                              f"draws; the nearest it draws: {shown_near} ({LIST_HINT})")
        hint = self.suggest(text) if readable else []
        close = f"; did you mean {' or '.join(repr(h) for h in hint)}?" if hint else ""
        return ValueError(f"unknown class {shown(text)!r}{close} (any of the {len(self.names)} class names in any "
                          f"case, or an index 0..{len(self.names) - 1}; {LIST_HINT})")

    def index(self, item: int | str) -> int:
        """Class index of a name, alias, index or index as text (digits are an index, not an alias
        made of digits; a class whose own name is digits keeps it).

        Raises:
            ValueError: an unknown name (with close matches) or an index outside ``0 .. len - 1``.
        """
        if isinstance(item, str):
            digits = index_text(item)
            # an index as text is an index, even where an alias is the same digits (the emoji "100"
            # and "1234" short names made --class 100 the class "hundred points symbol", 156)
            found = self._index.get(name_key(item)) if digits else self.find(item)
            if found is not None:
                return found
            if not digits:
                raise self.unknown(item)
        try:  # an int (numpy and torch integers too) or its text, never a float (1.5), bool or other object
            if isinstance(item, bool):
                raise TypeError
            value = int(item) if isinstance(item, str) else operator.index(item)
        except (TypeError, ValueError):
            given = repr(shown(item)) if isinstance(item, str) else repr(item)
            raise ValueError(f"class {given}: expected a class name or an index 0..{len(self.names) - 1}") from None
        if not 0 <= value < len(self.names):
            raise ValueError(f"class index {value}: allowed 0..{len(self.names) - 1}")
        return value

    def split(self, text: str) -> list[str]:
        """A comma-separated list of names -> its items (names, aliases, indices, ``random``).

        The text is cut at every comma; at each position the longest run of consecutive pieces
        that forms a class name or alias (or a name known but not drawn, ``elsewhere``) is taken as
        one item, else the single piece. Empty
        pieces are dropped. Items are returned stripped, not resolved (see :meth:`index`).

        >>> ClassNames(["boy", "family: man, boy", "family: man, boy, boy"]).split("family: man, boy, boy,boy")
        ['family: man, boy, boy', 'boy']
        """
        pieces = str(text).split(",")
        out, i = [], 0
        while i < len(pieces):
            for j in range(min(len(pieces), i + self._max_pieces), i, -1):
                joined = ",".join(pieces[i:j])
                if j == i + 1 or self.find(joined) is not None or self.nearest_drawn(joined) is not None:
                    if joined.strip():
                        out.append(joined.strip())
                    i = j
                    break
        return out

    def resolve(self, items: Sequence[int | str]) -> list[int]:
        """Class indices of names, aliases or indices (see :meth:`index`)."""
        return [self.index(item) for item in items]

    def spread(self, count: int, offset: int = 0) -> list[int]:
        """``count`` class indices from position ``offset`` of a fixed order that visits every class
        once per ``len(self)`` positions and spreads any stretch of it over all the classes (and so
        over the categories, which are contiguous in class order): position ``k`` is class
        ``k * s mod C``, ``s`` the integer nearest ``C (sqrt 5 - 1) / 2`` that is coprime with
        ``C`` (the golden-ratio stride: consecutive positions land far apart).

        For measurements (bench, compare, sweep), where the first classes in turn would all be
        of one kind (the emoji model's first 169 classes are faces).
        """
        n = len(self.names)
        stride = max(1, round(n * (5 ** 0.5 - 1) / 2))
        while math.gcd(stride, n) != 1:
            stride += 1
        return [(k * stride) % n for k in range(offset, offset + count)]

    def assign(self, items: Sequence[int | str] | None, count: int, seed: int = 0,
               default: str = "turn") -> list[int]:
        """One class index per image: ``items`` in turn (default: every class in turn, or with
        ``default="spread"`` the order of :meth:`spread`).

        An item ``"random"`` (any case; unless a class has that name) is a class drawn from the
        seed, a new one for each image it falls on: the draws walk a permutation of all classes
        seeded by ``seed``, so ``assign(["random"], n, seed)`` gives ``n`` different classes
        (while n <= the number of classes) and the same ones for the same seed.

        Raises:
            ValueError: an unknown name, a bad index, an empty ``items`` list, ``count`` not an
                integer >= 0, or ``seed`` not an integer in ``0 .. 2**63 - 1`` (as ``generate``'s).
        """
        if as_integer(count) is None or count < 0:
            raise ValueError(f"count={count!r}: allowed an integer >= 0 (the number of images)")
        if as_integer(seed) is None or not 0 <= seed <= 2**63 - 1:  # random.Random took -1 and refused np.int64
            raise ValueError(f"seed={seed!r}: allowed an integer in 0..{2**63 - 1} (2**63 - 1)")
        count, seed = as_integer(count), as_integer(seed)
        if items is None:
            if default == "spread":
                return self.spread(count)
            return [i % len(self.names) for i in range(count)]
        items = list(items)
        if not items:
            raise ValueError("no class given; give class names, indices or random")
        fixed = [None if self.is_random(it) else self.index(it) for it in items]
        order = list(range(len(self.names)))
        _random.Random(seed).shuffle(order)
        out, drawn = [], 0
        for i in range(count):
            c = fixed[i % len(fixed)]
            if c is None:
                c = order[drawn % len(order)]
                drawn += 1
            out.append(c)
        return out

    def is_random(self, item) -> bool:
        """True for the item ``"random"`` (any case and spacing) where no class has that name:
        what :meth:`assign` draws a class for."""
        return isinstance(item, str) and name_key(item) == RANDOM and self.find(item) is None

    def category_names(self) -> list[str]:
        """The categories in order of first appearance (``[]`` without categories)."""
        return list(dict.fromkeys(self.categories or []))

    def listing(self, category: str | None = None) -> str:
        """The classes grouped by category, one ``index  name`` line each (aliases after ``also:``).

        Args:
            category: only the categories whose name contains this text (any case; "food" ->
                "Food & Drink"); ``None`` or ``""`` for all.

        Raises:
            ValueError: no category matches (naming the categories there are).
        """
        cats = self.categories or ["classes"] * len(self.names)
        groups = list(dict.fromkeys(cats))
        if category:
            want = name_key(category)
            groups = [g for g in groups if want in name_key(g)]
            if not groups:
                raise ValueError(f"no class category matches {category!r}; allowed: "
                                 f"{', '.join(dict.fromkeys(cats))}")
        width = len(str(len(self.names) - 1))
        lines = []
        for group in groups:
            members = [i for i, c in enumerate(cats) if c == group]
            lines.append(f"{group} ({len(members)}):")
            for i in members:
                also = self.aliases_of(i)
                lines.append(f"  {i:>{width}}  {self.names[i]}" + (f"  (also: {', '.join(also)})" if also else ""))
        return "\n".join(lines)
