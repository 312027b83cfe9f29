"""What both GGUF vocabulary kinds share: the spec of a GGUF file, its token types, the checks."""

from __future__ import annotations

from pathlib import Path

from .base import end_of_turn_ids, file_error

# GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6
# Token types whose text is matched whole in the input and stands for itself when decoded.
TYPES_MATCHED_WHOLE = (TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNKNOWN)


def spec_from_gguf(path) -> dict:
    """The tokenizer_spec of a GGUF file, as the GGUF loader makes it (see loaders.LoadedModel),
    without loading the tensors."""
    from ..loaders.gguf import read_tokenizer_spec

    if not Path(path).is_file():
        raise file_error(path, "GGUF file not found")
    spec = read_tokenizer_spec(path)
    if spec["model"] is None or spec["tokens"] is None:
        raise file_error(path, "no tokenizer in this GGUF (tokenizer.ggml.model / tokenizer.ggml.tokens "
                               "missing); use a GGUF converted with its tokenizer")
    return spec


# The type each tokenizer value must have in a GGUF file: a value of another type (a merge list
# stored as a number, a flag stored as an array) means the metadata is damaged, and using it
# anyway (truthiness, str()) would tokenize differently without a word.
_LIST_OF = {"tokens": (str,), "merges": (str,), "token_type": (int,), "scores": (int, float)}
_SCALAR = {"model": (str,), "pre": (str,), "chat_template": (str,), "add_bos_token": (bool,),
           "add_eos_token": (bool,), "add_space_prefix": (bool,)}


def check_spec_types(spec: dict, source: str) -> None:
    import numpy as np

    for key, kinds in _LIST_OF.items():
        value = spec.get(key)
        if value is None:
            continue
        if not isinstance(value, (list, tuple, np.ndarray)):
            raise file_error(source, f"tokenizer.ggml.{key} must be an array, got a {type(value).__name__}; "
                                     f"the file's metadata is damaged")
        numeric = kinds != (str,)
        for index, item in enumerate(value):
            ok = (isinstance(item, (int, float, np.integer, np.floating)) and not isinstance(item, (bool, np.bool_))
                  and (float in kinds or isinstance(item, (int, np.integer)))) if numeric else isinstance(item, str)
            if not ok:
                raise file_error(source, f"tokenizer.ggml.{key}[{index}] = {item!r} is not "
                                         f"{'a string' if not numeric else 'a number' if float in kinds else 'an integer'}; "
                                         f"the file's metadata is damaged")
    for key, kinds in _SCALAR.items():
        value = spec.get(key)
        if value is None:
            continue
        ok = isinstance(value, (bool, np.bool_)) if kinds == (bool,) else isinstance(value, kinds)
        if not ok:
            name = "tokenizer.chat_template" if key == "chat_template" else f"tokenizer.ggml.{key}"
            raise file_error(source, f"{name} = {value!r} should be a {kinds[0].__name__}, got a "
                                     f"{type(value).__name__}; the file's metadata is damaged")


def gguf_source(spec: dict) -> str:
    return spec.get("path") or "the GGUF tokenizer metadata"


class GGUFVocabulary:
    """The checked token tables of a GGUF spec.

    tokens[i], types[i]: text and type of id i; matched: text -> id of the tokens matched whole in
    text (control, user-defined and unknown, as llama.cpp does); special: ids of control and unknown
    tokens; eos_ids: the declared EOS, EOT and EOM, then the end-of-turn tokens among the specials.
    """

    def __init__(self, spec: dict, source: str):
        check_spec_types(spec, source)
        tokens = spec.get("tokens")
        if not isinstance(tokens, list) or not tokens:
            raise file_error(source, "tokenizer.ggml.tokens is missing or empty")
        types = spec.get("token_type")
        if types is None:
            # llama.cpp would treat every token as plain text, so control tokens in a prompt (a
            # chat template's) would be split into pieces: every converter writes the types, so
            # their absence is damage, not a vocabulary without specials.
            raise file_error(source, "tokenizer.ggml.token_type is missing (every GGUF converter "
                                     "writes it); the file's metadata is damaged")
        if len(types) != len(tokens):
            raise file_error(source, f"tokenizer.ggml.token_type has {len(types)} entries for "
                             f"{len(tokens)} tokens")
        for key in ("bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "unknown_token_id"):
            value = spec.get(key)
            if value is not None and (isinstance(value, bool) or not hasattr(value, "__index__")):
                raise file_error(source, f"tokenizer.ggml.{key} = {value!r} is not an integer "
                                 f"token id; the file's metadata is damaged")
            if value is not None and not 0 <= value < len(tokens):
                raise file_error(source, f"tokenizer.ggml.{key} = {value} is outside the vocabulary "
                                 f"of {len(tokens)} tokens")
        self.source = source
        self.tokens = tokens
        self.types = types
        self.matched = {tokens[i]: i for i in range(len(tokens)) if types[i] in TYPES_MATCHED_WHOLE and tokens[i]}
        self.special = {i for i in range(len(tokens)) if types[i] in (TYPE_CONTROL, TYPE_UNKNOWN)}
        declared = [spec.get(key) for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
        self.eos_ids = ([i for i in declared if i is not None]
                        + end_of_turn_ids({tokens[i]: i for i in self.special}))

    def tokenizer_fields(self, spec: dict, piece_of_text, *, add_bos_default: bool,
                         strip_leading_space: bool) -> dict:
        """Tokenizer.__init__'s arguments, filled the same way for both GGUF kinds: raw bytes of
        whole-matched tokens are their text, of the others what `piece_of_text(text)` says; BOS
        `add_bos_default` unless the file says add_bos_token."""
        add_bos = spec.get("add_bos_token")
        return dict(
            piece_bytes=[token.encode("utf-8") if self.types[i] in TYPES_MATCHED_WHOLE else piece_of_text(token)
                         for i, token in enumerate(self.tokens)],
            special_ids=self.special, bos_id=spec.get("bos_token_id"), eos_ids=self.eos_ids,
            add_bos=add_bos_default if add_bos is None else bool(add_bos), add_eos=bool(spec.get("add_eos_token")),
            chat_template=spec.get("chat_template"), strip_leading_space=strip_leading_space, source=self.source,
            byte_ids=frozenset(i for i, kind in enumerate(self.types) if kind == TYPE_BYTE))

    def add_matched_tokens(self, backend) -> None:
        """Control and unknown tokens as special added tokens, user-defined ones as plain added
        tokens: `backend` matches them whole in text before its model sees it."""
        from tokenizers import AddedToken

        backend.add_special_tokens([AddedToken(self.tokens[i], special=True, normalized=False)
                                    for i in sorted(self.special) if self.tokens[i]])
        backend.add_tokens([AddedToken(token, special=False, normalized=False)
                            for token, kind in zip(self.tokens, self.types) if kind == TYPE_USER_DEFINED and token])

