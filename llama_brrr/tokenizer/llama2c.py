"""llama2.c's tokenizer.bin."""

from __future__ import annotations

import struct
from pathlib import Path

from .base import BYTE_TOKEN, BackendTokenizer, file_error
from .score_bpe import score_bpe_model


class Llama2cTokenizer(BackendTokenizer):
    """llama2.c's tokenizer.bin: int32 max_token_length, then per token float32 score, int32 length
    and that many bytes (spaces stored as " ", bytes as "<0xNN>"). The file does not store the
    vocabulary size: tokens are read to the end of the file, and `vocab_size`, when given, must match.

    Encoding is llama2.c's: a " " token in front of non-empty text, one symbol per character (a
    character without a token becomes byte tokens, id = byte + 3), then pieces are merged by score
    (score_bpe.py; every token takes part). BOS is id 1 (added by default), EOS id 2. Decoding drops
    the leading space of the first text piece, the space the encoder put after BOS.
    """

    BOS_ID, EOS_ID, BYTE_OFFSET = 1, 2, 3

    def __init__(self, path, vocab_size: int | None = None):
        from tokenizers import Tokenizer as HFBackend
        from tokenizers import normalizers

        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise file_error(path, "llama2.c tokenizer not found") from None
        except OSError as error:
            raise file_error(path, f"cannot read this llama2.c tokenizer: {error}") from None
        tokens, scores = self._parse(data, path)
        if vocab_size is not None and vocab_size != len(tokens):
            raise file_error(path, f"holds {len(tokens)} tokens but the model has vocab_size {vocab_size}; "
                             f"use the tokenizer.bin that belongs to this model")
        if len(tokens) < self.BYTE_OFFSET + 256:
            raise file_error(path, f"holds {len(tokens)} tokens, fewer than the 259 (3 special + 256 byte "
                             f"tokens) llama2.c's tokenizer requires")
        pieces, piece_scores = {}, {}
        for index, token in enumerate(tokens):
            text = token.decode("utf-8", errors="replace")
            if text not in pieces:
                pieces[text] = index
                piece_scores[text] = scores[index]
        # Byte fallback looks tokens up as "<0xNN>"; llama2.c takes byte b as id b + 3 whatever its text.
        vocab = dict(pieces)
        for byte in range(256):
            vocab.setdefault(f"<0x{byte:02X}>", byte + self.BYTE_OFFSET)
        backend = HFBackend(score_bpe_model(vocab, pieces, piece_scores, None, str(path)))
        backend.normalizer = normalizers.Prepend(" ")
        piece_bytes, byte_ids = [], set()
        for index, token in enumerate(tokens):
            byte = BYTE_TOKEN.fullmatch(token.decode("utf-8", errors="replace"))
            piece_bytes.append(bytes([int(byte.group(1), 16)]) if byte else token)
            if byte:
                byte_ids.add(index)
        super().__init__(
            backend, piece_bytes=piece_bytes, special_ids={0, self.BOS_ID, self.EOS_ID}, bos_id=self.BOS_ID,
            eos_ids=[self.EOS_ID], add_bos=True, add_eos=False, chat_template=None,
            strip_leading_space=True, source=str(path), byte_ids=frozenset(byte_ids))

    @staticmethod
    def _parse(data: bytes, path: Path) -> tuple[list[bytes], list[float]]:
        if len(data) < 4:
            raise file_error(path, f"truncated: {len(data)} bytes, too short for a llama2.c tokenizer header")
        (max_token_length,) = struct.unpack_from("<i", data, 0)
        if not 0 < max_token_length <= 1 << 16:
            raise file_error(path, f"not a llama2.c tokenizer.bin (max_token_length {max_token_length})")
        tokens, scores = [], []
        offset = 4
        while offset < len(data):
            if offset + 8 > len(data):
                raise file_error(path, f"truncated inside token {len(tokens)} (at byte {offset} of "
                                 f"{len(data)}); download or export it again")
            score, length = struct.unpack_from("<fi", data, offset)
            offset += 8
            if not 0 <= length <= max_token_length or offset + length > len(data):
                raise file_error(path, f"truncated or corrupt at token {len(tokens)} (length {length}, "
                                 f"{len(data) - offset} bytes left); download or export it again")
            tokens.append(data[offset:offset + length])
            scores.append(score)
            offset += length
        return tokens, scores
