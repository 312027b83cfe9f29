"""GGUF sentencepiece-style vocabularies (tokenizer.ggml.model "llama"): Llama 2 and its kin."""

from __future__ import annotations

from .base import SPM_SPACE, BYTE_TOKEN, BackendTokenizer, file_error, sentencepiece_piece
from .gguf import TYPE_BYTE, TYPE_NORMAL, TYPES_MATCHED_WHOLE, GGUFVocabulary, gguf_source
from .score_bpe import score_bpe_model


class GGUFSentencePieceTokenizer(BackendTokenizer):
    """GGUF sentencepiece vocabulary (tokenizer.ggml.model "llama"), tokenized like llama.cpp and
    sentencepiece: spaces become "▁", a "▁" is put in front of the text and after every token matched
    whole (add_space_prefix, default on), then pieces are merged by score (score_bpe.py) and
    characters left without a piece become <0xNN> byte tokens. Only normal tokens take part in
    merges (sentencepiece never builds control or byte tokens from text). BOS by default unless the
    file says add_bos_token false.
    """

    def __init__(self, spec: dict):
        from tokenizers import Tokenizer as HFBackend
        from tokenizers import normalizers

        source = gguf_source(spec)
        vocabulary = GGUFVocabulary(spec, source)
        tokens, types = vocabulary.tokens, vocabulary.types
        scores = spec.get("scores")
        if scores is None or len(scores) != len(tokens):
            raise file_error(source, f"a sentencepiece vocabulary needs tokenizer.ggml.scores with one "
                             f"score per token ({len(tokens)}), got "
                             f"{'none' if scores is None else len(scores)}")
        # pieces: what merges build and start from (normal tokens). vocab, what the BPE model may emit:
        # the pieces, the byte tokens under the name byte fallback looks up, and the tokens matched
        # whole (so that, added to the backend, they keep their ids). Unused tokens stay out.
        pieces, piece_scores, vocab = {}, {}, {}
        for index, (token, token_type) in enumerate(zip(tokens, types)):
            if token_type == TYPE_NORMAL and token not in pieces:
                pieces[token] = index
                piece_scores[token] = scores[index]
            if token_type == TYPE_BYTE and BYTE_TOKEN.fullmatch(token):
                vocab.setdefault(token.upper().replace("0X", "0x"), index)
            elif token_type == TYPE_NORMAL or token_type in TYPES_MATCHED_WHOLE:
                vocab.setdefault(token, index)
        unknown_id = spec.get("unknown_token_id")
        backend = HFBackend(score_bpe_model(vocab, pieces, piece_scores,
                                            None if unknown_id is None else tokens[unknown_id], source))
        add_space_prefix = spec.get("add_space_prefix")
        add_space_prefix = True if add_space_prefix is None else bool(add_space_prefix)
        spaces = normalizers.Replace(" ", SPM_SPACE)
        # Each stretch of text between tokens matched whole is normalized on its own: the prefix goes
        # in front of the text and after every such token, as llama.cpp does.
        backend.normalizer = (normalizers.Sequence([normalizers.Prepend(SPM_SPACE), spaces])
                              if add_space_prefix else spaces)
        vocabulary.add_matched_tokens(backend)

        super().__init__(backend, **vocabulary.tokenizer_fields(spec, sentencepiece_piece, add_bos_default=True,
                                                                strip_leading_space=add_space_prefix))
