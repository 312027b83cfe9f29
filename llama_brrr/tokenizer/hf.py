"""Hugging Face tokenizer files: tokenizer.json (or only tokenizer.model), tokenizer_config.json,
generation_config.json and the chat template beside them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from .base import (BYTE_TOKEN, BackendTokenizer, Tokenizer, byte_level_piece, end_of_turn_ids, file_error, read_json_file,
                   sentencepiece_piece)
from .chat import hf_chat_template
from .spm import SentencePieceTokenizer


def _config_token_text(value) -> str | None:
    """tokenizer_config.json writes a token as "text" or as {"content": "text", ...}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer(BackendTokenizer):
    """A Hugging Face tokenizer.json through `tokenizers`, configured by tokenizer_config.json
    (add_bos_token, add_eos_token, bos/eos tokens, chat_template or chat_template.jinja beside it)
    and generation_config.json (eos_token_id, possibly a list: all of them end generation).

    The text is always encoded without the post-processor's special tokens and BOS/EOS are added
    here, so BOS is never added twice; when tokenizer_config.json does not say add_bos_token, the
    default is what the post-processor would have done.
    """

    def __init__(self, tokenizer_json, tokenizer_config=None, generation_config=None,
                 chat_template: str | None = None):
        from tokenizers import Tokenizer as HFBackend

        path = Path(tokenizer_json)
        if not path.is_file():
            raise file_error(path, "tokenizer.json not found")
        try:
            backend = HFBackend.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for unreadable files
            raise file_error(path, f"not a valid tokenizer.json ({error}); download it again") from None
        source = str(path)
        config = read_json_file(tokenizer_config, "tokenizer_config.json") if tokenizer_config else {}
        generation = read_json_file(generation_config, "generation_config.json") if generation_config else {}

        description = json.loads(backend.to_str())
        size = backend.get_vocab_size(with_added_tokens=True)
        special = {entry["id"] for entry in description.get("added_tokens", []) if entry.get("special")}
        added = {entry["id"] for entry in description.get("added_tokens", [])}
        byte_level, strip_leading_space = self._decoder_kind(description.get("decoder"), source)
        piece_bytes, byte_ids = [], set()
        for index in range(size):
            token = backend.id_to_token(index)
            if token is None:
                piece_bytes.append(b"")
            elif index in added:
                piece_bytes.append(token.encode("utf-8"))
            else:
                piece_bytes.append(byte_level_piece(token) if byte_level else sentencepiece_piece(token))
                if not byte_level and BYTE_TOKEN.fullmatch(token):
                    byte_ids.add(index)

        bos_text = _config_token_text(config.get("bos_token"))
        bos_id = backend.token_to_id(bos_text) if bos_text else None
        if bos_id is None and isinstance(generation.get("bos_token_id"), int):
            bos_id = generation["bos_token_id"]
        eos_ids = []
        eos_text = _config_token_text(config.get("eos_token"))
        if eos_text and backend.token_to_id(eos_text) is not None:
            eos_ids.append(backend.token_to_id(eos_text))
        eos_ids += generation_eos_ids(generation)
        eos_ids += end_of_turn_ids({backend.id_to_token(i): i for i in special})
        for token_id in eos_ids + ([bos_id] if bos_id is not None else []):
            if not 0 <= token_id < size:
                raise file_error(source, f"BOS/EOS id {token_id} is outside the vocabulary of {size}")

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
            backend, piece_bytes=piece_bytes, special_ids=special, bos_id=bos_id, eos_ids=eos_ids,
            add_bos=add_bos, add_eos=add_eos,
            chat_template=chat_template or hf_chat_template(Path(tokenizer_config or path).parent, tokenizer_config),
            strip_leading_space=strip_leading_space, source=source, byte_ids=frozenset(byte_ids))

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
        raise file_error(source, f"decoder {sorted(k for k in kinds if k) or None} is not supported; "
                          f"llama_brrr reads byte-level (Llama 3) and sentencepiece-style (Llama 2) tokenizers")


def generation_eos_ids(generation: dict) -> list[int]:
    """generation_config.json's eos_token_id: one id or a list of them."""
    eos = generation.get("eos_token_id")
    return eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []


def hf_tokenizer(spec: Mapping) -> Tokenizer:
    """The tokenizer of a Hugging Face spec: tokenizer.json when there is one, else tokenizer.model
    configured by the same tokenizer_config.json / generation_config.json."""
    config_path = spec.get("tokenizer_config")
    generation_path = spec.get("generation_config")
    if spec.get("tokenizer_json"):
        return HFTokenizer(spec["tokenizer_json"], config_path, generation_path, spec.get("chat_template"))
    model_path = spec.get("tokenizer_model")
    if not model_path:
        raise file_error(config_path or "the model directory", "neither tokenizer.json nor tokenizer.model was "
                         "found; copy the tokenizer files next to the weights")
    config = read_json_file(config_path, "tokenizer_config.json") if config_path else {}
    generation = read_json_file(generation_path, "generation_config.json") if generation_path else {}
    add_bos, add_eos = config.get("add_bos_token"), config.get("add_eos_token")
    return SentencePieceTokenizer(
        model_path, add_bos=add_bos if isinstance(add_bos, bool) else None,
        add_eos=add_eos if isinstance(add_eos, bool) else None, extra_eos_ids=generation_eos_ids(generation),
        chat_template=spec.get("chat_template") or hf_chat_template(Path(config_path or model_path).parent,
                                                                    config_path))
