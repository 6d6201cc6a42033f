"""Entities from a token-classification head's logits: what transformers'
`pipeline("token-classification")` answers for the same text and strategy, in plain Python.

Rules, as the pipeline applies them:
- A token's scores are the softmax of its logits; special tokens ([CLS], </s>) are skipped.
- `start`, `end`: the fast tokenizer's offsets, code points into the caller's text.
- A token's `word` is its vocabulary entry (`##son`, `Ġparis`), or the text it covers when
  it is the unknown token; a group's is the tokenizer's decoder over its tokens' words.
- A token continues the word before it (a subword) when the tokenizer is word-aware (its
  model has a continuing-subword prefix, as WordPiece's `##`) and its entry is not as long
  as the text it covers; otherwise when it does not start the text and neither it nor the
  character before it is a space. The unknown token never continues a word.
- `none`: every token, labelled with its best score. `simple`: tokens in a row merged into
  one group while they share a tag (the label without its `B-`/`I-` prefix; a label
  without one is a tag of its own, continuing) and the later one is not a `B-`.
  `first`, `average`, `max`: each word (a token and the subwords after it) is first given
  one label (its first token's best; the best of its tokens' averaged scores; the best of
  its best-scoring token), then words are merged as in `simple`.
- A group is named by its first label after the first `-` (`B-PER` -> `PER`) and scored
  with the mean of its members' scores; it spans its first member's start to its last's end.
- `ignore_labels` drops what it names: tokens by their full label under `none`, groups by
  their name under the other strategies (so `O` drops the groups of `O` tokens).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs

STRATEGIES = ("none", "simple", "first", "average", "max")
DEFAULT_STRATEGY = "simple"
DEFAULT_IGNORE = ("O",)


@attrs.frozen
class TokenWords:
    """What the tokenizer says about its tokens as words (read once per model)."""

    entry: Callable[[int], str | None]  # id -> its vocabulary entry
    join: Callable[[list[str]], str]  # words of a group -> one string (the decoder)
    word_aware: bool  # a continuing-subword prefix marks subwords (WordPiece's ##)
    unk_id: int | None

    @classmethod
    def of(cls, tokenizer) -> TokenWords:
        """From a `tokenizers.Tokenizer` (the model's tokenizer.json)."""
        model = tokenizer.model
        decoder = tokenizer.decoder
        unk = getattr(model, "unk_token", None)
        unk_id = tokenizer.token_to_id(unk) if unk else None
        if unk_id is None:  # Unigram (XLM-R) names its unknown token by position
            found = json.loads(tokenizer.to_str()).get("model", {}).get("unk_id")
            unk_id = found if isinstance(found, int) else None
        return cls(
            entry=tokenizer.id_to_token,
            join=decoder.decode if decoder is not None else " ".join,
            word_aware=bool(getattr(model, "continuing_subword_prefix", None)),
            unk_id=unk_id,
        )


class _Token:
    """One non-special token of a row: its scores, place and whether it is a subword."""

    __slots__ = ("end", "index", "scores", "start", "subword", "word")

    def __init__(self, word, scores, start, end, index, subword) -> None:
        self.word, self.scores, self.start, self.end = word, scores, start, end
        self.index, self.subword = index, subword


def entities(
    text: str,
    tokens: Sequence[tuple[int, int, int, bool]],
    logits: Sequence[Sequence[float]],
    labels: Sequence[str],
    words: TokenWords,
    strategy: str = DEFAULT_STRATEGY,
    ignore: Sequence[str] = DEFAULT_IGNORE,
) -> list[dict[str, Any]]:
    """The entities of one row: `tokens` are each row position's (id, start, end, special),
    `logits` its logits, in the row's order."""
    found = _tokens(text, tokens, logits, words)
    if strategy in ("none", "simple"):
        tagged = [_labelled(token, labels) for token in found]
    else:
        tagged = _words(found, strategy, labels, words)
    if strategy != "none":
        tagged = _groups(tagged, words)
    ignored = set(ignore)
    if not ignored:
        return tagged
    key = "entity" if strategy == "none" else "entity_group"
    return [entity for entity in tagged if entity[key] not in ignored]


def _tokens(text, tokens, logits, words: TokenWords) -> list[_Token]:
    found = []
    for index, ((token_id, start, end, special), row) in enumerate(
        zip(tokens, logits, strict=True)
    ):
        if special:
            continue
        word = words.entry(token_id) or ""
        covered = text[start:end]
        if words.word_aware:
            subword = len(word) != len(covered)
        else:
            subword = start > 0 and " " not in text[start - 1 : start + 1]
        if token_id == words.unk_id:
            word, subword = covered, False
        found.append(_Token(word, _softmax(row), start, end, index, subword))
    return found


def _softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = math.fsum(exps)
    return [e / total for e in exps]


def _best(scores: list[float]) -> int:
    return max(range(len(scores)), key=scores.__getitem__)  # the first best, as argmax


def _labelled(token: _Token, labels: Sequence[str]) -> dict[str, Any]:
    best = _best(token.scores)
    return {
        "entity": labels[best],
        "score": token.scores[best],
        "index": token.index,
        "word": token.word,
        "start": token.start,
        "end": token.end,
    }


def _words(found: list[_Token], strategy: str, labels, words: TokenWords) -> list[dict]:
    """One labelled entry per word: a token and the subwords after it."""
    grouped: list[list[_Token]] = []
    for token in found:
        if grouped and token.subword:
            grouped[-1].append(token)
        else:
            grouped.append([token])
    return [_word(group, strategy, labels, words) for group in grouped]


def _word(group: list[_Token], strategy: str, labels, words: TokenWords) -> dict[str, Any]:
    if strategy == "first":
        scores = group[0].scores
    elif strategy == "max":
        scores = max(group, key=lambda token: max(token.scores)).scores
    elif strategy == "average":
        columns = zip(*(token.scores for token in group), strict=True)
        scores = [math.fsum(column) / len(group) for column in columns]
    else:
        raise ValueError(f"aggregation strategy {strategy!r} is not a word strategy")
    best = _best(scores)
    return {
        "entity": labels[best],
        "score": scores[best],
        "word": words.join([token.word for token in group]),
        "start": group[0].start,
        "end": group[-1].end,
    }


def _tag(label: str) -> tuple[str, str]:
    """(B or I, tag): `B-PER` -> (B, PER); a label without a prefix continues (I)."""
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def _groups(tagged: list[dict], words: TokenWords) -> list[dict[str, Any]]:
    """Adjacent entries of one tag merged, a B- starting a new group."""
    groups: list[dict[str, Any]] = []
    members: list[dict] = []
    last_tag = None
    for entity in tagged:
        bi, tag = _tag(entity["entity"])
        if members and not (tag == last_tag and bi != "B"):
            groups.append(_group(members, words))
            members = []
        members.append(entity)
        last_tag = tag
    if members:
        groups.append(_group(members, words))
    return groups


def _group(members: list[dict], words: TokenWords) -> dict[str, Any]:
    return {
        "entity_group": members[0]["entity"].split("-", 1)[-1],
        "score": math.fsum(m["score"] for m in members) / len(members),
        "word": words.join([m["word"] for m in members]),
        "start": members[0]["start"],
        "end": members[-1]["end"],
    }
