"""Sentencepiece-style vocabularies (pieces with scores) as `tokenizers` BPE models.

Sentencepiece's BPE, llama.cpp's and llama2.c's encoders all repeatedly merge the adjacent pair whose
concatenation is the best-scoring piece (ties: the leftmost pair) until no pair forms a piece. A BPE
model applies the lowest-ranked merge present (ties: the leftmost). So ranking every split
(left, right) of every scored piece by that piece's score, best first, gives the same merges in the
same order: the conversion transformers' GGUF / sentencepiece converters use. Pieces of equal score
(rare: 16 of Llama 2's 32000) are ranked by the ids of their halves, as transformers ranks them; the
golden tests pin the result.

Characters without a piece become their UTF-8 bytes as <0xNN> tokens (byte fallback).
"""

from __future__ import annotations


def score_ordered_merges(pieces: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Every (left, right) with both halves in `pieces` whose concatenation is in `scores`, best
    score first; equal scores by the ids of the halves, as transformers orders them."""
    ranked = []
    for piece, score in scores.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in pieces and right in pieces:
                ranked.append((-score, pieces[left], pieces[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def score_bpe_model(vocab: dict[str, int], pieces: dict[str, int], scores: dict[str, float],
                    unk_token: str | None, source: str):
    """A byte-fallback `tokenizers.models.BPE` over `vocab` (text -> id, every token the model may
    emit or that an added token needs), with merges from `pieces` and `scores`."""
    from tokenizers import models

    from .base import file_error

    try:
        return models.BPE(vocab=vocab, merges=score_ordered_merges(pieces, scores), unk_token=unk_token,
                          byte_fallback=True, fuse_unk=False)
    except Exception as error:  # tokenizers raises its own exception type for inconsistent merges
        raise file_error(source, f"the vocabulary does not form a BPE model ({error})") from None
