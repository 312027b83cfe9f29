"""The tokenizer interface: text <-> token ids, raw token bytes, byte-exact streaming decode.

Every implementation turns each token id into the raw bytes it stands for (`decode_piece_bytes`);
decoding is the concatenation of those bytes read as UTF-8, which is what makes byte-exact streaming
(`StreamDecoder`) possible. Sentencepiece-style vocabularies put a space in front of the text when
encoding ("dummy prefix"); their decode removes one leading space from the first text piece again,
as sentencepiece does, so that decode(encode(text)) == text.
"""

from __future__ import annotations

import codecs
import json
import operator
import os
import re
from pathlib import Path

import numpy as np

from ..errors import ArgumentTypeError
from .chat import ChatTemplate

# Tokens that end a turn in the chat formats of the Llama family and its fine-tunes. A vocabulary
# that has one of them as a special token stops generation on it even when the file only declares
# the document-level EOS (the same list llama.cpp uses to find end-of-generation tokens).
_END_OF_TURN_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")

SPM_SPACE = "\u2581"  # sentencepiece writes a space as "▁"
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def file_error(path, problem: str) -> Exception:
    """llama_brrr.errors.ModelFileError ("<path>: <problem>"); a ValueError (its base class) with the
    same message if that module is unavailable."""
    try:
        from llama_brrr.errors import ModelFileError
    except ImportError:
        return ValueError(f"{os.fspath(path)}: {problem}")
    return ModelFileError(path, problem)


# ----------------------------------------------------------------------------------------------
# The interface


class Tokenizer:
    """Text <-> token ids, raw token bytes for streaming, and the model's chat template.

    Subclasses fill in the per-token tables through `__init__` and implement `_encode_text`.
    """

    def __init__(self, *, piece_bytes: list[bytes], special_ids: set[int], bos_id: int | None,
                 eos_ids: list[int], add_bos: bool, add_eos: bool, chat_template: str | None,
                 strip_leading_space: bool, source: str, byte_ids: frozenset = frozenset()):
        self._piece_bytes = piece_bytes
        # Byte-fallback tokens (<0xNN>): their bytes are the text as it was, never the dummy prefix,
        # so a leading one keeps its space (sentencepiece's decode).
        self._byte_ids = frozenset(byte_ids)
        self._special_ids = frozenset(special_ids)
        self._bos_id = bos_id
        self._eos_ids = list(dict.fromkeys(eos_ids))
        self._add_bos = add_bos
        self._add_eos = add_eos
        self._chat = ChatTemplate(chat_template, source)
        self._strip_leading_space = strip_leading_space
        self.source = source

    # -- properties --------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._piece_bytes)

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_ids(self) -> list[int]:
        """The declared EOS first, then the end-of-turn/end-of-message tokens; generation stops on any."""
        return list(self._eos_ids)

    @property
    def add_bos(self) -> bool:
        """Whether `encode(text)` puts BOS in front, as the model's files say."""
        return self._add_bos

    @property
    def chat_template(self) -> str:
        return self._chat.text

    @property
    def has_chat_template(self) -> bool:
        """False when the files carry no template and `apply_chat_template` falls back to ChatML."""
        return self._chat.from_files

    @property
    def max_bytes_per_token(self) -> int | None:
        """The most bytes of input text (UTF-8) that one token can stand for; None when no bound is
        known. A text of more than n * max_bytes_per_token bytes encodes to more than n tokens, so a
        prompt that cannot fit the context is refused before it is tokenized (see `_input_shrink`)."""
        if not hasattr(self, "_max_bytes_per_token"):
            shrink = self._input_shrink()
            longest = max((len(piece) for piece in self._piece_bytes), default=1)
            self._max_bytes_per_token = None if shrink is None else shrink * max(longest, 1)
        return self._max_bytes_per_token

    # Characters encode leaves out (no token holds them); see GGUFByteLevelTokenizer.
    dropped_characters = ""

    def _input_shrink(self) -> int | None:
        """How many input bytes may stand for one byte of the tokens' text (piece bytes), None when
        unbounded. Sound only where every input byte ends up in exactly one token: byte-level BPE,
        byte-fallback vocabularies. Implementations that know their normalization say so."""
        return None

    def is_special(self, token_id: int) -> bool:
        return self._check_id(token_id) in self._special_ids

    def special_token_id(self, text: str) -> int | None:
        """The id of the special token written `text` ("<|im_end|>"), or None when there is none."""
        encoded = text.encode("utf-8")
        return next((i for i in sorted(self._special_ids) if self._piece_bytes[i] == encoded), None)

    # -- encode ------------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`. add_bos None: BOS when the model's files say so; EOS only when they say so."""
        if not isinstance(text, str):
            raise ArgumentTypeError(f"encode(): text must be a str, got {type(text).__name__}")
        if add_bos is not None and not isinstance(add_bos, (bool, np.bool_)):
            raise ArgumentTypeError(f"add_bos must be True, False or None, got {add_bos!r}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"encode(): text is not valid Unicode: a lone surrogate at index "
                             f"{error.start} ({text[error.start]!r}); UTF-8 cannot hold it") from None
        if add_bos is None:
            add_bos = self._add_bos
        ids = self._encode_text(text)
        if add_bos:
            if self._bos_id is None:
                raise ValueError(f"add_bos=True, but the tokenizer from {self.source} has no BOS token")
            ids.insert(0, self._bos_id)
        if self._add_eos and self._eos_ids:
            ids.append(self._eos_ids[0])
        return ids

    def _encode_text(self, text: str) -> list[int]:
        raise NotImplementedError(f"{type(self).__name__} must implement _encode_text")

    # -- decode ------------------------------------------------------------------------------

    def _check_id(self, token_id) -> int:
        try:
            index = operator.index(token_id)
        except TypeError:
            raise ArgumentTypeError(f"token ids must be integers, got {type(token_id).__name__}") from None
        if isinstance(token_id, (bool, np.bool_)):
            raise ArgumentTypeError(f"token ids must be integers, got {token_id!r}")
        if not 0 <= index < len(self._piece_bytes):
            raise ValueError(f"token id {index} is out of range: the vocabulary has {len(self._piece_bytes)} "
                             f"tokens (ids 0..{len(self._piece_bytes) - 1})")
        return index

    def decode_piece_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (a byte-fallback or byte-level token may be part of a character)."""
        return self._piece_bytes[self._check_id(token_id)]

    def _text_bytes(self, token_id: int, skip_special_tokens: bool, at_text_start: bool) -> bytes | None:
        """Bytes this token adds to decoded text; None when it is skipped."""
        token_id = self._check_id(token_id)
        special = token_id in self._special_ids
        if special and skip_special_tokens:
            return None
        piece = self._piece_bytes[token_id]
        if (at_text_start and not special and self._strip_leading_space and piece.startswith(b" ")
                and token_id not in self._byte_ids):
            piece = piece[1:]
        return piece

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 become U+FFFD."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise ArgumentTypeError(f"decode() takes a sequence of token ids, got {type(ids).__name__}")
        if not isinstance(skip_special_tokens, (bool, np.bool_)):
            raise ArgumentTypeError(f"skip_special_tokens must be True or False, "
                                    f"got {skip_special_tokens!r}")
        chunks = []
        at_text_start = True
        for token_id in ids:
            piece = self._text_bytes(token_id, skip_special_tokens, at_text_start)
            if piece is None:
                continue
            chunks.append(piece)
            if not self.is_special(token_id):
                at_text_start = False
        return b"".join(chunks).decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special_tokens: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens)

    # -- chat --------------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, *,
                            max_chars: int | None = None, limit_reason: str | None = None) -> str:
        """Render `messages` ([{"role": ..., "content": ...}, ...]) as a prompt string.

        Uses the model's own Jinja template (from the GGUF / tokenizer_config.json / chat_template.jinja),
        rendered like transformers does (sandboxed, trim_blocks and lstrip_blocks, `raise_exception`,
        `bos_token` / `eos_token`). When the files carry no template, ChatML (DEFAULT_CHAT_TEMPLATE) is
        used: <|im_start|>{role}\\n{content}<|im_end|>\\n per message, then <|im_start|>assistant\\n.
        The result is text; encode it with `encode` (it already contains any BOS the template writes).
        Rendering is bounded (chat.TEMPLATE_TIME_LIMIT_S; max_chars, default chat.TEMPLATE_MAX_CHARS,
        for the result and every string built on the way): beyond either, ChatTemplateLimitError
        (a ValueError), whose message adds `limit_reason` when the size limit is what failed.
        """
        limits = {} if max_chars is None else {"max_chars": max_chars}
        return self._chat.render(messages, add_generation_prompt, bos_token=self._token_text(self._bos_id),
                                 eos_token=self._token_text(self._eos_ids[0] if self._eos_ids else None),
                                 limit_reason=limit_reason, **limits)

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self._piece_bytes[token_id].decode("utf-8", errors="replace")


class BackendTokenizer(Tokenizer):
    """A Tokenizer whose encoding is a `tokenizers.Tokenizer` (`backend`) that matches the special
    tokens written in the text itself and adds none around it (BOS/EOS are added by `encode`)."""

    def __init__(self, backend, **tables):
        self._backend = backend
        super().__init__(**tables)

    def _encode_text(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def _input_shrink(self) -> int | None:
        """From the backend's normalizer and model: 1 when they never shrink text (byte-level,
        Prepend, Replace by something as long), 4 after Unicode normalization or lowercasing (a
        character of at most 4 bytes becomes at least one byte), None for anything that may delete
        text (Strip, StripAccents, regex replacements) or a model that fuses unknown characters
        into one token."""
        description = json.loads(self._backend.to_str())
        model = description.get("model") or {}
        if model.get("type") != "BPE":
            return None
        unknown_fused = model.get("unk_token") is not None and model.get("fuse_unk") and not model.get("byte_fallback")
        if unknown_fused:
            return None
        # An unknown character not fused with its neighbours is one token of its own (<= 4 bytes).
        shrink = 4 if model.get("unk_token") is not None and not model.get("byte_fallback") else 1
        return _normalizer_shrink(description.get("normalizer"), shrink)


def prompt_bytes_beyond(tokenizer, text: str, n_tokens: int) -> int | None:
    """The UTF-8 length of `text` (less the characters `tokenizer` drops) when that alone proves
    that `text` encodes to more than `n_tokens` tokens, else None. Sound because no token stands
    for more than tokenizer.max_bytes_per_token bytes of text (None there: nothing is proved).
    Costs a pass over the text, no tokenization: a 100 MB prompt is refused in a fraction of a second."""
    per_token = getattr(tokenizer, "max_bytes_per_token", None)
    if per_token is None:
        return None
    limit = n_tokens * per_token
    dropped = getattr(tokenizer, "dropped_characters", "")
    if not dropped and len(text) > limit:  # at least one byte per character
        return len(text)
    counted = len(text.encode("utf-8")) - sum(text.count(c) * len(c.encode("utf-8")) for c in dropped)
    return counted if counted > limit else None


def _normalizer_shrink(normalizer, shrink: int) -> int | None:
    if normalizer is None:
        return shrink
    kind = normalizer.get("type")
    if kind == "Sequence":
        for inner in normalizer.get("normalizers", []):
            shrink = _normalizer_shrink(inner, shrink)
            if shrink is None:
                return None
        return shrink
    if kind == "Prepend":
        return shrink
    if kind == "Replace":
        pattern, content = normalizer.get("pattern", {}), normalizer.get("content", "")
        if "String" not in pattern or not content:
            return None
        ratio = -(-len(pattern["String"].encode("utf-8")) // len(content.encode("utf-8")))
        return shrink * max(1, ratio)
    if kind in ("NFC", "NFD", "NFKC", "NFKD", "Lowercase"):
        return shrink * 4
    return None


class StreamDecoder:
    """Incremental decode for streaming: `push(id)` returns only complete UTF-8 text.

    A character split over several tokens (byte-fallback or byte-level pieces of an emoji) is held
    back until its last byte arrives, so no U+FFFD appears mid-stream. The concatenation of every
    `push` and the final `flush` equals `tokenizer.decode(ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._at_text_start = True

    def push(self, token_id: int) -> str:
        piece = self._tokenizer._text_bytes(token_id, self._skip_special_tokens, self._at_text_start)
        if piece is None:
            return ""
        if not self._tokenizer.is_special(token_id):
            self._at_text_start = False
        return self._utf8.decode(piece)

    def flush(self) -> str:
        """Whatever is still held back; an unfinished character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)


# ----------------------------------------------------------------------------------------------
# Shared pieces


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves, the
    others are shifted to 256 and up, so every byte sequence is a string without spaces or controls."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    alphabet = {}
    shifted = 0
    for byte in range(256):
        if byte in kept:
            alphabet[byte] = chr(byte)
        else:
            alphabet[byte] = chr(256 + shifted)
            shifted += 1
    return alphabet


_BYTE_LEVEL_DECODE = {char: byte for byte, char in byte_level_alphabet().items()}


def byte_level_piece(token: str) -> bytes:
    if all(char in _BYTE_LEVEL_DECODE for char in token):
        return bytes(_BYTE_LEVEL_DECODE[char] for char in token)
    return token.encode("utf-8")  # added tokens ("<|im_start|>") are stored as plain text


def sentencepiece_piece(token: str) -> bytes:
    byte = BYTE_TOKEN.fullmatch(token)
    if byte:
        return bytes([int(byte.group(1), 16)])
    return token.replace(SPM_SPACE, " ").encode("utf-8")


def end_of_turn_ids(texts_to_ids: dict[str, int]) -> list[int]:
    return [texts_to_ids[text] for text in _END_OF_TURN_TEXTS if text in texts_to_ids]


def read_text_file(path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise file_error(path, f"{what} not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise file_error(path, f"cannot read this {what}: {error}") from None


def read_json_file(path, what: str) -> dict:
    text = read_text_file(path, what)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise file_error(path, f"this {what} is not valid JSON ({error}); re-download it") from None
    if not isinstance(value, dict):
        raise file_error(path, f"this {what} must hold a JSON object, got {type(value).__name__}")
    return value
