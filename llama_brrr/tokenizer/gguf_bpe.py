"""GGUF byte-level BPE vocabularies (tokenizer.ggml.model "gpt2"): SmolLM2, Llama 3."""

from __future__ import annotations

import warnings

from .base import BackendTokenizer, byte_level_alphabet, byte_level_piece, file_error
from .gguf import GGUFVocabulary, gguf_source

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Bytes that never occur in UTF-8 text.
_NOT_UTF8 = frozenset([0xC0, 0xC1, *range(0xF5, 0x100)])
_LLAMA3_PRE_NAMES = ("llama-bpe", "llama3", "llama-v3")
_KNOWN_BPE_PRE_NAMES = ("default", "gpt2", "smollm") + _LLAMA3_PRE_NAMES


class GGUFByteLevelTokenizer(BackendTokenizer):
    """GGUF byte-level BPE (tokenizer.ggml.model "gpt2"), built on HF `tokenizers` from the file's
    vocabulary and merges, with the pre-tokenizer llama.cpp uses for tokenizer.ggml.pre:

        smollm               digits split one by one, then GPT-2's regex
        llama-bpe / llama3   Llama 3's regex; whole words found in the vocabulary skip the merges
        gpt2 / default       GPT-2's regex (also the fallback, with a warning, for unknown names)

    BOS by default only when the file says add_bos_token, or for Llama 3 files that do not say.
    """

    def __init__(self, spec: dict):
        from tokenizers import Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFBackend

        source = gguf_source(spec)
        vocabulary = GGUFVocabulary(spec, source)
        pre = spec.get("pre") or "default"
        if pre not in _KNOWN_BPE_PRE_NAMES:
            warnings.warn(f"{source}: unknown tokenizer.ggml.pre {pre!r}; using GPT-2's pre-tokenizer "
                          f"(the tokenization may differ from llama.cpp's)", stacklevel=3)
        llama3 = pre in _LLAMA3_PRE_NAMES
        if not spec.get("merges"):
            # Without merges every byte would be a token of its own: a damaged or mis-converted
            # file (llama.cpp refuses it too).
            raise file_error(source, "tokenizer.ggml.merges is missing or empty; a byte-level BPE "
                                     "vocabulary needs its merges: convert the model again")
        merges = []
        for index, merge in enumerate(spec.get("merges")):
            parts = merge.split(" ")
            if len(parts) != 2:
                raise file_error(source, f"tokenizer.ggml.merges[{index}] = {merge!r} is not two "
                                 f"tokens separated by one space")
            merges.append((parts[0], parts[1]))
        vocab = {}
        for index, token in enumerate(vocabulary.tokens):
            vocab.setdefault(token, index)
        try:
            model = models.BPE(vocab=vocab, merges=merges, ignore_merges=llama3)
        except Exception as error:  # tokenizers raises its own exception type for inconsistent merges
            raise file_error(source, f"the vocabulary and merges do not form a BPE model ({error})") from None
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
        vocabulary.add_matched_tokens(backend)

        super().__init__(backend, **vocabulary.tokenizer_fields(spec, byte_level_piece, add_bos_default=llama3,
                                                                strip_leading_space=False))
        alphabet = byte_level_alphabet()
        # Bytes of UTF-8 text whose byte-level character is not a token: no merge can start from
        # them, so encode leaves them out. SmolLM2 lacks 0x04 0x06 0x13 0x14 0x16 0x1D and the
        # lead bytes 0xF1 0xF2 (planes 4-11, unassigned). llama.cpp (its BPE session skips a symbol
        # it finds no token for) and HF tokenizers / transformers reading the same GGUF (a BPE
        # without an unknown token) both drop them the same way; the only alternative, the unknown
        # token, is <|endoftext|> in SmolLM2: an end of text in the middle of a prompt. So, like
        # both, decode(encode(s)) == s without these characters. The two differ in one respect,
        # and this follows HF tokenizers, which the model was trained with: the neighbours of a
        # dropped character may merge (" \x13)" -> " )"), where llama.cpp keeps them apart.
        self.dropped_bytes = frozenset(b for b in range(256) if alphabet[b] not in vocab and b not in _NOT_UTF8)
        self.dropped_characters = "".join(chr(b) for b in sorted(self.dropped_bytes) if b < 0x80)

    def _input_shrink(self) -> int | None:
        # Byte-level: every input byte is one character of exactly one token, or dropped (above).
        # Dropped ASCII characters are counted out by prompt_bytes_beyond; a dropped lead byte
        # leaves at least half of its character's bytes; a dropped continuation byte, no bound.
        if any(0x80 <= b < 0xC0 for b in self.dropped_bytes):
            return None
        return 2 if any(b >= 0xC0 for b in self.dropped_bytes) else 1
