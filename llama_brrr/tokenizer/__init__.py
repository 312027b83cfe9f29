"""Tokenizers and chat templates: text <-> token ids for every model format the engine loads.

One interface, `Tokenizer` (base.py), five implementations, chosen by `load_tokenizer(spec)` from the
`tokenizer_spec` the loaders produce (loaders.LoadedModel documents its keys):

    GGUFByteLevelTokenizer      gguf_bpe.py  GGUF `tokenizer.ggml.model == "gpt2"`: byte-level BPE (SmolLM2, Llama 3)
    GGUFSentencePieceTokenizer  gguf_spm.py  GGUF `tokenizer.ggml.model == "llama"`: sentencepiece-style BPE over scores
    SentencePieceTokenizer      spm.py       a sentencepiece `.model` file (Llama 2)
    HFTokenizer                 hf.py        a Hugging Face `tokenizer.json` (+ tokenizer_config.json, generation_config.json)
    Llama2cTokenizer            llama2c.py   llama2.c's `tokenizer.bin`

All but the sentencepiece one encode through a HF `tokenizers` model; the vocabularies that merge by
score become BPE models whose merges are ranked by score (score_bpe.py). Chat templates: chat.py.

Text passed to `encode` may contain special tokens written out ("<|im_start|>", "<s>"): they become
their single id, as llama.cpp does for prompts and as chat templates rely on.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..fetch import (LLAMA3_TOKENIZER_ENV, fetch_llama3_tokenizer, llama3_tokenizer_cache_path,
                     llama3_tokenizer_path)
from .base import (BackendTokenizer, StreamDecoder, Tokenizer, byte_level_alphabet, file_error,
                   prompt_bytes_beyond)
from .chat import DEFAULT_CHAT_TEMPLATE, ChatTemplateLimitError
from .gguf import spec_from_gguf
from .gguf_bpe import GGUFByteLevelTokenizer
from .gguf_spm import GGUFSentencePieceTokenizer
from .hf import HFTokenizer, hf_tokenizer
from .llama2c import Llama2cTokenizer
from .spm import SentencePieceTokenizer

__all__ = ["Tokenizer", "StreamDecoder", "BackendTokenizer", "GGUFByteLevelTokenizer", "GGUFSentencePieceTokenizer",
           "SentencePieceTokenizer", "HFTokenizer", "Llama2cTokenizer", "load_tokenizer", "spec_from_gguf",
           "DEFAULT_CHAT_TEMPLATE", "ChatTemplateLimitError", "prompt_bytes_beyond", "byte_level_alphabet", "LLAMA3_TOKENIZER_ENV", "fetch_llama3_tokenizer",
           "llama3_tokenizer_cache_path", "llama3_tokenizer_path"]


def load_tokenizer(spec: Mapping) -> Tokenizer:
    """The tokenizer a `tokenizer_spec` describes. spec["format"]:

      "gguf"           the tokenizer.ggml.* values without that prefix, "chat_template" and "path";
                       "model" picks byte-level BPE ("gpt2") or sentencepiece-style ("llama")
      "hf"             paths "tokenizer_json", "tokenizer_model", "tokenizer_config", "generation_config"
                       (each may be None; tokenizer.json wins over tokenizer.model), "chat_template"
                       (text, or None to look for it in the files)
      "llama2c"        "tokenizer_bin", optional "vocab_size" to check it against
      "sentencepiece"  "tokenizer_model": a .model file
    """
    if not isinstance(spec, Mapping):
        raise TypeError(f"load_tokenizer() takes a tokenizer spec dict, got {type(spec).__name__}")
    kind = spec.get("format")
    if kind == "gguf":
        model = spec.get("model")
        if model == "gpt2":
            return GGUFByteLevelTokenizer(spec)
        if model == "llama":
            return GGUFSentencePieceTokenizer(spec)
        raise file_error(spec.get("path") or "GGUF tokenizer metadata",
                         f"tokenizer.ggml.model {model!r} is not supported; llama_brrr reads 'gpt2' "
                         f"(byte-level BPE) and 'llama' (sentencepiece) vocabularies")
    if kind == "hf":
        return hf_tokenizer(spec)
    if kind == "llama2c":
        return Llama2cTokenizer(_required_path(spec, "tokenizer_bin"), spec.get("vocab_size"))
    if kind == "sentencepiece":
        return SentencePieceTokenizer(_required_path(spec, "tokenizer_model"))
    raise ValueError(f"tokenizer spec format {kind!r} is unknown; expected 'gguf', 'hf', 'llama2c' or "
                     f"'sentencepiece'")


def _required_path(spec: Mapping, key: str):
    value = spec.get(key)
    if not value:
        raise ValueError(f"tokenizer spec of format {spec.get('format')!r} needs {key!r}")
    return value
