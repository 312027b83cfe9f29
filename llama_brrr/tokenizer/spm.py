"""Sentencepiece `.model` files (Llama 2), through the sentencepiece package."""

from __future__ import annotations

import re
from pathlib import Path

from .base import SPM_SPACE, Tokenizer, end_of_turn_ids, file_error, sentencepiece_piece


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece `.model` file (Llama 2), through the sentencepiece package.

    BOS by default (like Llama 2), no EOS; both can be overridden by an HF tokenizer_config.json.
    Control tokens written in the text ("<s>") become their id; sentencepiece itself would split them.
    """

    def __init__(self, path, *, add_bos: bool | None = None, add_eos: bool | None = None,
                 extra_eos_ids: list[int] = (), chat_template: str | None = None):
        import sentencepiece

        path = Path(path)
        if not path.is_file():
            raise file_error(path, "sentencepiece model not found")
        try:
            processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as error:
            raise file_error(path, f"not a valid sentencepiece model ({error}); download it again") from None
        self._processor = processor
        size = processor.vocab_size()
        special = {i for i in range(size) if processor.IsControl(i) or processor.IsUnknown(i)}
        self._matched = {processor.IdToPiece(i): i for i in special}
        self._splitter = _special_splitter(self._matched)
        piece_bytes = [processor.IdToPiece(i).encode("utf-8") if i in special
                       else sentencepiece_piece(processor.IdToPiece(i)) for i in range(size)]
        # The model proto's add_dummy_prefix is not exposed without protobuf; its effect is.
        dummy_prefix = processor.EncodeAsPieces("a")[0].startswith(SPM_SPACE)
        bos_id = processor.bos_id() if processor.bos_id() >= 0 else None
        eos_ids = ([processor.eos_id()] if processor.eos_id() >= 0 else []) + list(extra_eos_ids)
        super().__init__(
            piece_bytes=piece_bytes, special_ids=special, bos_id=bos_id,
            eos_ids=eos_ids + end_of_turn_ids(self._matched),
            add_bos=(bos_id is not None) if add_bos is None else add_bos, add_eos=bool(add_eos),
            chat_template=chat_template, strip_leading_space=dummy_prefix, source=str(path),
            byte_ids=frozenset(i for i in range(size) if processor.IsByte(i)))

    def _encode_text(self, text: str) -> list[int]:
        ids = []
        for is_special, value in _split_on_specials(text, self._splitter, self._matched):
            ids.extend([value] if is_special else self._processor.EncodeAsIds(value))
        return ids


def _special_splitter(texts: dict[str, int]):
    """A regex matching any special token text, longest first (so "<|im_start|>" beats "<|im")."""
    usable = sorted((text for text in texts if text), key=len, reverse=True)
    return re.compile("|".join(re.escape(text) for text in usable)) if usable else None


def _split_on_specials(text: str, splitter, special_ids: dict[str, int]):
    """Yield (True, id) for special tokens written in `text` and (False, fragment) for the text between."""
    if splitter is None:
        if text:
            yield False, text
        return
    position = 0
    for match in splitter.finditer(text):
        if match.start() > position:
            yield False, text[position:match.start()]
        yield True, special_ids[match.group()]
        position = match.end()
    if position < len(text):
        yield False, text[position:]
