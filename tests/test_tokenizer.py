"""Tokenizers against golden ids (llama.cpp's vocab test cases), sentencepiece, HF tokenizers and HF
transformers; streaming decode; chat templates; bad input.

Data: tests/data (Llama 2 sentencepiece model, golden cases; see its README), the Llama 3
tokenizer.json (the `llama3_tokenizer_json` fixture fetches it), and the SmolLM2 GGUF
($LLAMA_BRRR_DEFAULT_MODEL or llama_brrr.fetch.default_model_path(), put there by weights/fetch.py).
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from llama_brrr import tokenizer as tk

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SPM_MODEL = DATA / "llama2-tokenizer.model"
SPM_SPEC = {"format": "sentencepiece", "tokenizer_model": str(SPM_MODEL)}
CASE_SEPARATOR = "\n__ggml_vocab_test__\n"

# Text of every kind a chat prompt may hold.
CORPUS = [
    "Hello world",
    "12345 and 3.14159",
    "def area(r):\n    return 3.14159 * r ** 2  # circle\n",
    "emoji 🚀 and 😶\u200d🌫️ and 🦙🦙",
    "中文测试，日本語のテキスト、한국어",
    "Café naïve façade Ångström Ærøskøbing",
    "multiple    spaces   here ",
    "\n\nnew\nlines\n\n\n",
    "<|im_start|>user\nhi<|im_end|>",
    "tabs\tand\r\nwindows lines",
    "don't you'll I'M we'VE",
    "$1,000,000.00!!! ???",
    "",
    " ",
]


def read_cases(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's vocab test format: each case in .inp is followed by a separator line, so the text
    splits into the cases plus an empty tail; line i of .out holds the ids of case i (no BOS)."""
    inputs = (DATA / f"{name}.inp").read_text(encoding="utf-8").split(CASE_SEPARATOR)
    assert inputs[-1] == "", f"{name}.inp does not end with a separator line"
    inputs = inputs[:-1]
    lines = (DATA / f"{name}.out").read_text(encoding="utf-8").split("\n")
    assert len(lines) >= len(inputs) and all(not line for line in lines[len(inputs):]), \
        f"{name}.out has {len(lines)} lines for {len(inputs)} cases"
    return [(text, [int(value) for value in line.split()]) for text, line in zip(inputs, lines)]


def assert_golden(tokenizer: tk.Tokenizer, name: str):
    cases = read_cases(name)
    mismatches = []
    for text, expected in cases:
        got = tokenizer.encode(text, add_bos=False)
        if got != expected:
            mismatches.append(f"  {text!r}\n    ours     {got}\n    expected {expected}")
        elif tokenizer.decode(got) != text:
            mismatches.append(f"  {text!r}: decode gave {tokenizer.decode(got)!r}")
    if mismatches:
        print(f"{len(mismatches)} of {len(cases)} {name} cases differ:\n" + "\n".join(mismatches))
    assert not mismatches, f"{len(mismatches)} of {len(cases)} {name} cases differ (printed above)"


def test_case_files_split_into_matching_cases():
    for name in ("llama-spm-cases", "llama-bpe-cases"):
        cases = read_cases(name)
        texts = [text for text, _ in cases]
        assert len(cases) > 20
        assert "" in texts and " " in texts and "\n\n" in texts  # empty and whitespace-only cases survive
        assert all(ids for text, ids in cases if text), f"{name}: a non-empty case has no ids"


def write_gguf(path: Path, *, model: str, tokens, token_types, scores=None, merges=None, pre=None,
               bos=None, eos=None, unk=None, add_bos=None, template=None):
    """A GGUF holding only tokenizer metadata and one small tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    if scores is not None:
        writer.add_token_scores(scores)
    if merges is not None:
        writer.add_token_merges(merges)
    for setter, value in ((writer.add_bos_token_id, bos), (writer.add_eos_token_id, eos),
                          (writer.add_unk_token_id, unk), (writer.add_add_bos_token, add_bos),
                          (writer.add_chat_template, template)):
        if value is not None:
            setter(value)
    writer.add_tensor("token_embd.weight", np.random.default_rng().standard_normal((3, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------------------------------------
# Llama 2 (sentencepiece): the .model, a GGUF built from it, tokenizer.bin, tokenizer.json


@pytest.fixture(scope="module")
def sp_processor():
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(SPM_MODEL))


def sp_token_types(processor) -> list[int]:
    return [2 if processor.IsUnknown(i) else 3 if processor.IsControl(i) else 6 if processor.IsByte(i)
            else 5 if processor.IsUnused(i) else 1 for i in range(processor.vocab_size())]


@pytest.fixture(scope="module")
def llama2_gguf(sp_processor, tmp_path_factory) -> Path:
    size = sp_processor.vocab_size()
    return write_gguf(
        tmp_path_factory.mktemp("gguf_spm") / "llama2-vocab.gguf", model="llama",
        tokens=[sp_processor.IdToPiece(i) for i in range(size)], token_types=sp_token_types(sp_processor),
        scores=[sp_processor.GetScore(i) for i in range(size)],
        bos=sp_processor.bos_id(), eos=sp_processor.eos_id(), unk=sp_processor.unk_id())


@pytest.fixture(scope="module")
def llama2_gguf_spec(llama2_gguf) -> dict:
    return tk.spec_from_gguf(llama2_gguf)  # read once: GGUFReader takes seconds on a 32k vocabulary


@pytest.fixture(scope="module")
def llama2c_bin(sp_processor, tmp_path_factory) -> Path:
    """tokenizer.bin written the way llama2.c's tokenizer.py exports the Llama 2 model."""
    pieces = []
    for index in range(sp_processor.vocab_size()):
        piece = sp_processor.IdToPiece(index)
        piece = {sp_processor.bos_id(): "\n<s>\n", sp_processor.eos_id(): "\n</s>\n"}.get(index, piece)
        pieces.append((sp_processor.GetScore(index), piece.replace("\u2581", " ").encode("utf-8")))
    path = tmp_path_factory.mktemp("llama2c") / "tokenizer.bin"
    with open(path, "wb") as out:
        out.write(struct.pack("<i", max(len(piece) for _, piece in pieces)))
        for score, piece in pieces:
            out.write(struct.pack("<fi", score, len(piece)))
            out.write(piece)
    return path


LLAMA2_STYLE_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system messages') }}{% endif %}\n"
    "{{ bos_token }}\n"
    "{% for message in messages %}\n"
    "    {% if message['role'] == 'user' %}\n"
    "{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}\n"
    "    {% else %}\n"
    "{{ ' ' + message['content'] + ' ' + eos_token }}\n"
    "    {% endif %}\n"
    "{% endfor %}\n"
)


@pytest.fixture(scope="module")
def llama2_hf_dir(sp_processor, tmp_path_factory) -> Path:
    """A Llama-2-style HF directory: tokenizer.json in the legacy layout of the Llama 2 repos (BPE with
    merges ordered by the merged piece's score, byte fallback, "▁" prepended by the normalizer, a
    post-processor that adds <s>), a tokenizer_config.json without add_bos_token, a generation config
    with a list of EOS ids."""
    from tokenizers import AddedToken, decoders, models, normalizers, processors
    from tokenizers import Tokenizer as Backend

    size = sp_processor.vocab_size()
    pieces = [sp_processor.IdToPiece(i) for i in range(size)]
    vocab = {piece: index for index, piece in enumerate(pieces)}
    types = sp_token_types(sp_processor)
    ranked = []
    for index in range(size):
        if types[index] != 1:
            continue
        piece = pieces[index]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-sp_processor.GetScore(index), vocab[left], vocab[right], left, right))
    merges = [(left, right) for *_, left, right in sorted(ranked)]
    backend = Backend(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
    directory = tmp_path_factory.mktemp("llama2_hf")
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<s>", "special": True}, "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": LLAMA2_STYLE_TEMPLATE}))
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 13]}))
    return directory


def hf_spec(directory: Path, **overrides) -> dict:
    spec = {"format": "hf", "tokenizer_json": directory / "tokenizer.json", "tokenizer_model": None,
            "tokenizer_config": directory / "tokenizer_config.json",
            "generation_config": directory / "generation_config.json"}
    spec.update(overrides)
    return spec


def test_llama2_golden_sentencepiece_model():
    tokenizer = tk.load_tokenizer(SPM_SPEC)
    assert isinstance(tokenizer, tk.SentencePieceTokenizer)
    assert_golden(tokenizer, "llama-spm-cases")


def test_llama2_golden_gguf_sentencepiece(llama2_gguf_spec, sp_processor):
    spec = llama2_gguf_spec
    assert spec["format"] == "gguf" and spec["model"] == "llama" and len(spec["tokens"]) == sp_processor.vocab_size()
    tokenizer = tk.load_tokenizer(spec)
    assert isinstance(tokenizer, tk.GGUFSentencePieceTokenizer)
    assert_golden(tokenizer, "llama-spm-cases")


def test_llama2_golden_llama2c_tokenizer_bin(llama2c_bin):
    tokenizer = tk.load_tokenizer({"format": "llama2c", "tokenizer_bin": str(llama2c_bin), "vocab_size": 32000})
    assert isinstance(tokenizer, tk.Llama2cTokenizer)
    assert_golden(tokenizer, "llama-spm-cases")


def test_llama2_golden_hf_tokenizer_json(llama2_hf_dir):
    tokenizer = tk.load_tokenizer(hf_spec(llama2_hf_dir))
    assert isinstance(tokenizer, tk.HFTokenizer)
    assert_golden(tokenizer, "llama-spm-cases")


def test_llama2_decode_matches_sentencepiece(sp_processor, llama2_gguf_spec, llama2c_bin, llama2_hf_dir):
    tokenizers = {
        "sentencepiece": tk.load_tokenizer(SPM_SPEC),
        "gguf": tk.load_tokenizer(llama2_gguf_spec),
        "llama2c": tk.load_tokenizer({"format": "llama2c", "tokenizer_bin": str(llama2c_bin)}),
        "hf": tk.load_tokenizer(hf_spec(llama2_hf_dir)),
    }
    rng = random.Random()
    samples = [ids for _, ids in read_cases("llama-spm-cases")]
    samples += [[rng.randrange(3, sp_processor.vocab_size()) for _ in range(rng.randrange(1, 40))] for _ in range(50)]
    for ids in samples:
        for name, tokenizer in tokenizers.items():
            assert tokenizer.decode(ids) == sp_processor.DecodeIds(ids), f"{name} decode of {ids}"
            assert tokenizer.decode([sp_processor.bos_id()] + ids) == sp_processor.DecodeIds(ids), name


def test_llama2_bos_eos_and_special_text(sp_processor, llama2_gguf_spec, llama2c_bin, llama2_hf_dir):
    bos, eos = sp_processor.bos_id(), sp_processor.eos_id()
    plain = sp_processor.EncodeAsIds("Hello world")
    for name, tokenizer in {
        "sentencepiece": tk.load_tokenizer(SPM_SPEC),
        "gguf": tk.load_tokenizer(llama2_gguf_spec),
        "llama2c": tk.load_tokenizer({"format": "llama2c", "tokenizer_bin": str(llama2c_bin)}),
        # the config does not say add_bos_token: the post-processor's <s> decides, and only one BOS results
        "hf": tk.load_tokenizer(hf_spec(llama2_hf_dir)),
    }.items():
        assert tokenizer.bos_id == bos and tokenizer.eos_ids[0] == eos, name
        assert tokenizer.encode("Hello world") == [bos] + plain, name
        assert tokenizer.encode("Hello world", add_bos=False) == plain, name
        assert tokenizer.decode([bos] + plain + [eos]) == "Hello world", name
        if name != "llama2c":  # llama2.c's tokenizer has no special tokens written in text
            assert tokenizer.encode("<s>Hello world</s>", add_bos=False) == [bos] + plain + [eos], name


def test_gguf_sentencepiece_add_bos_flag(llama2_gguf_spec):
    spec = llama2_gguf_spec
    assert spec["add_bos_token"] is None
    bos = spec["bos_token_id"]
    assert tk.load_tokenizer(spec).encode("a")[0] == bos  # llama.cpp's default for sentencepiece
    assert tk.load_tokenizer(dict(spec, add_bos_token=False)).encode("a")[0] != bos
    assert tk.load_tokenizer(dict(spec, add_bos_token=False)).encode("a", add_bos=True)[0] == bos
    with_eos = tk.load_tokenizer(dict(spec, add_eos_token=True)).encode("a")
    assert with_eos[-1] == spec["eos_token_id"] and with_eos[0] == bos


def test_hf_config_overrides(llama2_hf_dir, tmp_path):
    tokenizer = tk.load_tokenizer(hf_spec(llama2_hf_dir))
    assert tokenizer.eos_ids == [2, 13]  # tokenizer_config's eos, then generation_config's list
    config = json.loads((llama2_hf_dir / "tokenizer_config.json").read_text())
    config["add_bos_token"] = False
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    changed = tk.load_tokenizer(hf_spec(llama2_hf_dir, tokenizer_config=tmp_path / "tokenizer_config.json",
                                        generation_config=None))
    assert changed.encode("Hi")[0] != 1 and changed.encode("Hi", add_bos=True).count(1) == 1
    assert changed.eos_ids == [2]
    assert changed.apply_chat_template([{"role": "user", "content": "x"}]) == "<user>x"


def test_hf_directory_with_only_tokenizer_model(llama2_hf_dir):
    spec = hf_spec(llama2_hf_dir, tokenizer_json=None, tokenizer_model=str(SPM_MODEL))
    tokenizer = tk.load_tokenizer(spec)
    assert isinstance(tokenizer, tk.SentencePieceTokenizer)
    assert tokenizer.eos_ids == [2, 13] and tokenizer.chat_template == LLAMA2_STYLE_TEMPLATE
    assert tokenizer.encode("Hi")[0] == 1


# ---------------------------------------------------------------------------------------------
# Llama 3 (byte-level BPE): tokenizer.json and a GGUF built from it


@pytest.fixture(scope="module")
def llama3_json(llama3_tokenizer_json) -> Path:
    return llama3_tokenizer_json


@pytest.fixture(scope="module")
def llama3_gguf(llama3_json, tmp_path_factory) -> Path:
    description = json.loads(llama3_json.read_text(encoding="utf-8"))
    vocab = description["model"]["vocab"]
    added = description["added_tokens"]
    tokens = [""] * (len(vocab) + len(added))
    types = [1] * len(tokens)
    for token, index in vocab.items():
        tokens[index] = token
    for entry in added:
        tokens[entry["id"]] = entry["content"]
        types[entry["id"]] = 3
    assert all(tokens), "the Llama 3 vocabulary has gaps"
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in description["model"]["merges"]]
    ids = {entry["content"]: entry["id"] for entry in added}
    return write_gguf(tmp_path_factory.mktemp("gguf_bpe") / "llama3-vocab.gguf", model="gpt2", pre="llama-bpe",
                      tokens=tokens, token_types=types, merges=merges,
                      bos=ids["<|begin_of_text|>"], eos=ids["<|end_of_text|>"])


def test_llama3_golden_hf_tokenizer_json(llama3_json):
    tokenizer = tk.load_tokenizer({"format": "hf", "tokenizer_json": str(llama3_json)})
    assert tokenizer.vocab_size == 128256
    assert_golden(tokenizer, "llama-bpe-cases")


def test_llama3_golden_gguf_byte_level(llama3_gguf, llama3_json):
    from tokenizers import Tokenizer as Backend

    spec = tk.spec_from_gguf(llama3_gguf)
    tokenizer = tk.load_tokenizer(spec)
    assert isinstance(tokenizer, tk.GGUFByteLevelTokenizer) and tokenizer.vocab_size == 128256
    assert_golden(tokenizer, "llama-bpe-cases")
    reference = Backend.from_file(str(llama3_json))
    for _, ids in read_cases("llama-bpe-cases"):
        assert tokenizer.decode(ids) == reference.decode(ids)
    # Llama 3 files that do not say add_bos_token get BOS, like llama.cpp does
    assert spec["add_bos_token"] is None and tokenizer.encode("hi")[0] == spec["bos_token_id"]
    eot = reference.token_to_id("<|eot_id|>")
    assert tokenizer.eos_ids[0] == spec["eos_token_id"] and eot in tokenizer.eos_ids
    assert tokenizer.encode("<|start_header_id|>user<|end_header_id|>", add_bos=False) == \
        reference.encode("<|start_header_id|>user<|end_header_id|>", add_special_tokens=False).ids


def test_fetch_llama3_tokenizer_reuses_a_verified_copy(llama3_json, tmp_path, monkeypatch):
    destination = tmp_path / "tokenizer.json"
    destination.write_bytes(llama3_json.read_bytes())
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("downloaded although a verified copy exists"))
    assert tk.fetch_llama3_tokenizer(destination) == destination
    monkeypatch.setenv(tk.LLAMA3_TOKENIZER_ENV, str(destination))
    assert tk.llama3_tokenizer_path() == destination


# ---------------------------------------------------------------------------------------------
# Pre-tokenizer choice of GGUF byte-level BPE, on a vocabulary small enough to reason about


def tiny_bpe_spec(pre: str | None) -> dict:
    """Byte-level vocabulary: the printable ASCII bytes, "Ġ" (space), and merges building "12",
    "123", "1234", "Ġ1", "ab"; plus one control token."""
    alphabet = tk.byte_level_alphabet()
    tokens = ["<|ctl|>"] + [alphabet[b] for b in range(256)]
    merges = ["Ġ 1", "1 2", "12 3", "123 4", "a b"]
    tokens += [merge.replace(" ", "") for merge in merges]
    return {"format": "gguf", "model": "gpt2", "pre": pre, "tokens": tokens,
            "token_type": [3] + [1] * (len(tokens) - 1), "merges": merges, "scores": None,
            "bos_token_id": 0, "eos_token_id": 0, "add_bos_token": False, "chat_template": None}


def pieces(tokenizer, text):
    return [tokenizer.decode_piece_bytes(i).decode() for i in tokenizer.encode(text)]


def test_byte_level_pre_tokenizers_follow_llama_cpp():
    gpt2 = tk.load_tokenizer(tiny_bpe_spec("gpt2"))
    smollm = tk.load_tokenizer(tiny_bpe_spec("smollm"))
    llama3 = tk.load_tokenizer(tiny_bpe_spec("llama-bpe"))
    assert pieces(gpt2, "ab 1234") == ["ab", " 1", "2", "3", "4"]  # " ?\p{N}+" keeps the space with the digits
    assert pieces(smollm, "ab 1234") == ["ab", " ", "1", "2", "3", "4"]  # every digit on its own
    assert pieces(llama3, "ab 1234") == ["ab", " ", "123", "4"]  # digits in groups of up to three
    for tokenizer in (gpt2, smollm, llama3):
        assert tokenizer.encode("x<|ctl|>y")[1] == 0
        assert tokenizer.decode(tokenizer.encode("x<|ctl|>y")) == "xy"
        assert tokenizer.decode(tokenizer.encode("x<|ctl|>y"), skip_special_tokens=False) == "x<|ctl|>y"


def test_unknown_pre_tokenizer_warns_and_uses_gpt2():
    with pytest.warns(UserWarning, match="made-up-pre"):
        tokenizer = tk.load_tokenizer(tiny_bpe_spec("made-up-pre"))
    assert pieces(tokenizer, "ab 1234") == ["ab", " 1", "2", "3", "4"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tk.load_tokenizer(tiny_bpe_spec(None))  # no pre at all is the documented default, not a surprise


# ---------------------------------------------------------------------------------------------
# SmolLM2 (the default model) against HF transformers reading the same GGUF


def smollm_path() -> Path | None:
    override = os.environ.get("LLAMA_BRRR_DEFAULT_MODEL")
    if override:
        return Path(override)
    try:
        from llama_brrr import fetch
    except ImportError:
        return None
    return Path(fetch.default_model_path())


@pytest.fixture(scope="module")
def smollm_gguf() -> Path:
    path = smollm_path()
    if path is None or not path.is_file():
        pytest.skip(f"SmolLM2 GGUF not found ({path or 'no $LLAMA_BRRR_DEFAULT_MODEL and no llama_brrr.fetch'}); "
                    f"run weights/fetch.py or set LLAMA_BRRR_DEFAULT_MODEL")
    return path


@pytest.fixture(scope="module")
def smollm_spec(smollm_gguf) -> dict:
    return tk.spec_from_gguf(smollm_gguf)


@pytest.fixture(scope="module")
def smollm(smollm_spec):
    return tk.load_tokenizer(smollm_spec)


@pytest.fixture(scope="module")
def smollm_hf(smollm_gguf):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    return transformers.AutoTokenizer.from_pretrained(str(smollm_gguf.parent), gguf_file=smollm_gguf.name)


def test_smollm_encode_matches_transformers(smollm, smollm_hf):
    for text in CORPUS:
        ours = smollm.encode(text)
        assert ours == smollm_hf(text)["input_ids"], f"encode differs on {text!r}"
        assert smollm.decode(ours, skip_special_tokens=False) == text
        assert smollm.decode(ours) == smollm_hf.decode(ours, skip_special_tokens=True), f"decode differs on {text!r}"
    assert smollm.encode("<|im_start|>") == [smollm_hf.convert_tokens_to_ids("<|im_start|>")]


def test_smollm_follows_the_files_bos_flag(smollm_spec, smollm):
    spec = smollm_spec
    assert spec["model"] == "gpt2" and spec["pre"] == "smollm" and isinstance(spec["add_bos_token"], bool)
    bos = spec["bos_token_id"]
    assert smollm.add_bos == spec["add_bos_token"]
    assert (smollm.encode("Hello")[:1] == [bos]) == spec["add_bos_token"]
    flipped = tk.load_tokenizer(dict(spec, add_bos_token=not spec["add_bos_token"]))
    assert (flipped.encode("Hello")[:1] == [bos]) == (not spec["add_bos_token"])
    im_end = smollm.special_token_id("<|im_end|>")
    assert im_end is not None and im_end in smollm.eos_ids and spec["eos_token_id"] == smollm.eos_ids[0]


def test_smollm_chat_template_matches_transformers(smollm, smollm_hf):
    assert smollm.has_chat_template
    for messages in (
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 👋"},
         {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Count: 1 2 3"}],
    ):
        for add_generation_prompt in (True, False):
            ours = smollm.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
            theirs = smollm_hf.apply_chat_template(messages, tokenize=False,
                                                   add_generation_prompt=add_generation_prompt)
            assert ours == theirs
        ids = smollm_hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert smollm.encode(smollm.apply_chat_template(messages)) == list(ids)


# ---------------------------------------------------------------------------------------------
# Streaming


def assert_streams_exactly(tokenizer, text):
    ids = tokenizer.encode(text, add_bos=False)
    assert any(_not_utf8(tokenizer.decode_piece_bytes(i)) for i in ids), \
        "test text has no character split over tokens; it would not exercise hold-back"
    stream = tokenizer.stream_decoder()
    chunks = [stream.push(i) for i in ids]
    chunks.append(stream.flush())
    assert not any("\ufffd" in chunk for chunk in chunks)
    assert "".join(chunks) == text


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_stream_byte_level(smollm):
    assert_streams_exactly(smollm, "Rocket 🚀 then 😶\u200d🌫️, 中文 and 한국어!")


def test_stream_byte_fallback(llama2_gguf_spec, llama2c_bin):
    for tokenizer in (tk.load_tokenizer(SPM_SPEC),
                      tk.load_tokenizer(llama2_gguf_spec),
                      tk.load_tokenizer({"format": "llama2c", "tokenizer_bin": str(llama2c_bin)})):
        assert_streams_exactly(tokenizer, "Rocket 🚀 and 🦙 with Khmer ក់តែ text")


def test_stream_equals_decode_on_random_ids():
    tokenizer = tk.load_tokenizer(SPM_SPEC)
    rng = random.Random()
    for _ in range(100):
        # mostly byte tokens (ids 3..258), so sequences hold broken and unfinished characters too
        ids = [rng.randrange(0, 259) if rng.random() < 0.7 else rng.randrange(tokenizer.vocab_size)
               for _ in range(rng.randrange(1, 30))]
        for skip in (True, False):
            stream = tokenizer.stream_decoder(skip_special_tokens=skip)
            text = "".join(stream.push(i) for i in ids) + stream.flush()
            assert text == tokenizer.decode(ids, skip_special_tokens=skip), ids


def test_stream_flush_reports_an_unfinished_character():
    tokenizer = tk.load_tokenizer(SPM_SPEC)
    rocket = tokenizer.encode("🚀", add_bos=False)
    assert len(rocket) > 2
    stream = tokenizer.stream_decoder()
    assert "".join(stream.push(i) for i in rocket[:-1]) == ""
    assert stream.flush() == "\ufffd"


# ---------------------------------------------------------------------------------------------
# Chat templates without a model file


def test_default_chat_template_is_chatml(llama2c_bin):
    tokenizer = tk.load_tokenizer({"format": "llama2c", "tokenizer_bin": str(llama2c_bin)})
    assert not tokenizer.has_chat_template
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U\nline"}]
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False) == expected
    assert tokenizer.apply_chat_template(messages) == expected + "<|im_start|>assistant\n"


def test_chat_template_renders_like_transformers(llama2_hf_dir):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(llama2_hf_dir / "tokenizer.json"),
                                                  bos_token="<s>", eos_token="</s>")
    theirs.chat_template = LLAMA2_STYLE_TEMPLATE
    ours = tk.load_tokenizer(hf_spec(llama2_hf_dir))
    messages = [{"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Again"}]
    assert ours.apply_chat_template(messages) == theirs.apply_chat_template(messages, tokenize=False)
    with pytest.raises(ValueError, match="no system messages"):
        ours.apply_chat_template([{"role": "system", "content": "x"}])


def test_chat_messages_are_checked(llama2c_bin):
    tokenizer = tk.load_tokenizer({"format": "llama2c", "tokenizer_bin": str(llama2c_bin)})
    with pytest.raises(ValueError, match=r"messages\[1\] must be a dict"):
        tokenizer.apply_chat_template([{"role": "user", "content": "a"}, "b"])
    with pytest.raises(ValueError, match=r"messages\[0\] needs a non-empty 'role'"):
        tokenizer.apply_chat_template([{"content": "a"}])
    with pytest.raises(ValueError, match=r"messages\[0\].*'content' string"):
        tokenizer.apply_chat_template([{"role": "user", "content": 5}])
    with pytest.raises(TypeError, match="got str"):
        tokenizer.apply_chat_template("hello")


def test_invalid_template_names_the_source():
    spec = dict(tiny_bpe_spec(None), chat_template="{% for m in messages %}", path="model.gguf")
    tokenizer = tk.load_tokenizer(spec)
    with pytest.raises(ValueError, match="model.gguf.*not valid Jinja"):
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


# ---------------------------------------------------------------------------------------------
# Bad input


def test_encode_and_decode_reject_bad_values():
    tokenizer = tk.load_tokenizer(tiny_bpe_spec(None))
    size = tokenizer.vocab_size
    with pytest.raises(TypeError, match="got bytes"):
        tokenizer.encode(b"hi")
    with pytest.raises(TypeError, match="got NoneType"):
        tokenizer.encode(None)
    with pytest.raises(ValueError, match=rf"token id {size} .*{size} tokens"):
        tokenizer.decode([1, size])
    with pytest.raises(ValueError, match=r"token id -1 "):
        tokenizer.decode([-1])
    with pytest.raises(TypeError, match="got str"):
        tokenizer.decode(["a"])
    with pytest.raises(ValueError, match=rf"token id {size + 5} "):
        tokenizer.decode_piece_bytes(size + 5)
    with pytest.raises(ValueError, match=rf"token id {size} "):
        tokenizer.stream_decoder().push(size)
    assert tokenizer.decode(np.array([66, 67])) == "AB"  # numpy ids are fine


def file_error_class():
    try:
        from llama_brrr.errors import ModelFileError
    except ImportError:
        return ValueError
    return ModelFileError


def test_truncated_tokenizer_bin_names_the_file(llama2c_bin, tmp_path):
    data = llama2c_bin.read_bytes()
    for cut in (2, 10, len(data) // 2, len(data) - 1):
        broken = tmp_path / f"cut{cut}.bin"
        broken.write_bytes(data[:cut])
        with pytest.raises(file_error_class(), match=str(broken)):
            tk.load_tokenizer({"format": "llama2c", "tokenizer_bin": str(broken)})
    with pytest.raises(file_error_class(), match="vocab_size 32001"):
        tk.load_tokenizer({"format": "llama2c", "tokenizer_bin": str(llama2c_bin), "vocab_size": 32001})
    with pytest.raises(file_error_class(), match="not found"):
        tk.load_tokenizer({"format": "llama2c", "tokenizer_bin": str(tmp_path / "missing.bin")})


def test_bad_gguf_and_spec_errors(tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(file_error_class(), match=str(not_gguf)):
        tk.spec_from_gguf(not_gguf)
    with pytest.raises(file_error_class(), match="not found"):
        tk.spec_from_gguf(tmp_path / "absent.gguf")
    with pytest.raises(ValueError, match="'wordpiece' is not supported"):
        tk.load_tokenizer(dict(tiny_bpe_spec(None), model="wordpiece"))
    with pytest.raises(ValueError, match="format 'onnx' is unknown"):
        tk.load_tokenizer({"format": "onnx"})
    with pytest.raises(ValueError, match="token_type has 2 entries"):
        tk.load_tokenizer(dict(tiny_bpe_spec(None), token_type=[1, 1]))
    with pytest.raises(ValueError, match="bos_token_id = 99999 is outside"):
        tk.load_tokenizer(dict(tiny_bpe_spec(None), bos_token_id=99999))
    spm_spec = dict(tiny_bpe_spec(None), model="llama", scores=None)
    with pytest.raises(ValueError, match="needs tokenizer.ggml.scores"):
        tk.load_tokenizer(spm_spec)
    corrupt_json = tmp_path / "tokenizer.json"
    corrupt_json.write_text("{ not json")
    with pytest.raises(file_error_class(), match=str(corrupt_json)):
        tk.load_tokenizer({"format": "hf", "tokenizer_json": str(corrupt_json)})


# ---------------------------------------------------------------------------------------------
# Hostile chat templates: bounded time and size, no thread or signal left behind

HOSTILE_TEMPLATES = {
    "nested-range": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested-range-output": "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
    "nested-messages": "{% for a in messages %}{% for b in messages %}{% for c in messages %}{% for d in messages %}"
                       "{% for e in messages %}{% endfor %}{% endfor %}{% endfor %}{% endfor %}{% endfor %}",
    "repeat": "{{ 'x' * 1000000000 }}",
    "center-filter": "{{ 'x'|center(1000000000) }}",
    "center-method": "{{ 'x'.center(1000000000) }}",
    "format-width": "{{ '{:>1000000000}'.format(1) }}",
    "format-argument": "{{ '{:>{}}'.format(1, 1000000000) }}",
    "percent-width": "{{ '%1000000000d' % 1 }}",
    "doubling-tilde": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                      "{% endfor %}{{ ns.s|length }}",
    "doubling-plus": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}{{ ns.s|length }}",
    "power": "{{ 2 ** 100000000 }}",
    "squaring": "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    "macro-recursion": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "loop-recursion": "{% for m in [[1]] recursive %}{{ loop([m]) }}{% endfor %}",
    "captured-block": "{% set x %}{% for i in range(100000) %}{% for j in range(100) %}" + "y" * 1000
                      + "{% endfor %}{% endfor %}{% endset %}{{ x|length }}",
    "replace": "{% set s = 'x' * 1000000 %}{{ s|replace('', 'abcdefgh' * 100000) }}",
    "join-filter": "{{ (range(100000)|list)|join('x' * 100000) }}",
    "join-method": "{{ ('x' * 100000).join(range(100000)|list) }}",
    "indent": "{{ 'a\nb'|indent(1000000000) }}",
    "tojson-indent": "{{ messages|tojson(indent=100000) }}",
    "batch": "{{ messages|batch(1000000000)|list }}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEMPLATES))
def test_hostile_chat_template_fails_fast(name):
    import threading
    import time

    spec = dict(tiny_bpe_spec(None), chat_template=HOSTILE_TEMPLATES[name], path="hostile.gguf")
    tokenizer = tk.load_tokenizer(spec)
    messages = [{"role": "user", "content": "hi"}] * 40
    threads = threading.active_count()
    start = time.perf_counter()
    with pytest.raises(tk.ChatTemplateLimitError, match="chat template of hostile.gguf"):
        tokenizer.apply_chat_template(messages)
    assert time.perf_counter() - start < 3.0, f"{name} took {time.perf_counter() - start:.1f} s to fail"
    assert threading.active_count() == threads
    # The same tokenizer still renders, and a template within the limits renders whole.
    assert tk.load_tokenizer(dict(spec, chat_template="{{ 'ab' * 1000 }}")).apply_chat_template(messages) == "ab" * 1000


def test_chat_template_size_limit_names_the_reason():
    tokenizer = tk.load_tokenizer(dict(tiny_bpe_spec(None), chat_template=None))
    messages = [{"role": "user", "content": "z" * 5000}]
    assert len(tokenizer.apply_chat_template(messages, max_chars=5100)) < 5100
    with pytest.raises(tk.ChatTemplateLimitError, match="more than 4000 characters: too long for the context"):
        tokenizer.apply_chat_template(messages, max_chars=4000, limit_reason="too long for the context")


# ---------------------------------------------------------------------------------------------
# The byte bound behind refusing over-long prompts before tokenizing them

def random_text(rng: random.Random, length: int, alphabet: str) -> str:
    return "".join(rng.choice(alphabet) for _ in range(length))


ROUND_TRIP_ALPHABET = ("".join(map(chr, range(0, 128))) + "éüßñ中文字日本語кирилицаΩπ€™"
                       + "\U0001F600\U0001F680\U00010348" + "    \n\n\t")


def check_byte_bound(tokenizer, texts):
    per_token = tokenizer.max_bytes_per_token
    assert per_token is not None and per_token >= 1
    for text in texts:
        n_tokens = len(tokenizer.encode(text, add_bos=False))
        kept = len(text.encode("utf-8")) - sum(text.count(c) for c in tokenizer.dropped_characters)
        assert n_tokens * per_token >= kept, (text, n_tokens, per_token)
        assert tk.prompt_bytes_beyond(tokenizer, text, n_tokens) is None, "a true token count was refused"
        if kept:  # enough copies to hold more bytes than n_tokens tokens can stand for
            assert tk.prompt_bytes_beyond(tokenizer, text * (n_tokens * per_token // kept + 1), n_tokens) is not None


def test_byte_bound_holds_for_every_vocabulary(llama2_gguf_spec, llama2c_bin, llama2_hf_dir):
    rng = random.Random(int(os.environ.get("BRRR_TEST_SEED", random.randrange(2**32))))
    texts = [random_text(rng, rng.randrange(1, 60), ROUND_TRIP_ALPHABET) for _ in range(200)]
    texts += ["a" * 500, " " * 500, "\n" * 300, "<|ctl|>" * 20, "1234" * 50]
    for spec in (tiny_bpe_spec("smollm"), tiny_bpe_spec("llama-bpe"), llama2_gguf_spec,
                 {"format": "llama2c", "tokenizer_bin": str(llama2c_bin)}, hf_spec(llama2_hf_dir)):
        check_byte_bound(tk.load_tokenizer(spec), texts)
    assert tk.load_tokenizer(SPM_SPEC).max_bytes_per_token is None  # sentencepiece's normalizer: no bound known


def test_byte_bound_refuses_fast_and_names_no_false_positive():
    import time

    tokenizer = tk.load_tokenizer(tiny_bpe_spec(None))
    text = "hello world " * 5_000_000
    start = time.perf_counter()
    assert tk.prompt_bytes_beyond(tokenizer, text, 4096) == len(text)
    assert time.perf_counter() - start < 1.0
    assert tk.prompt_bytes_beyond(tokenizer, "a" * 4096 * tokenizer.max_bytes_per_token, 4096) is None


# ---------------------------------------------------------------------------------------------
# decode(encode(s)) == s on the default vocabulary, control characters included

def round_trip_texts(count: int) -> list[str]:
    seed = int(os.environ.get("BRRR_TEST_SEED", random.randrange(2**32)))
    print(f"round-trip seed {seed}")
    rng = random.Random(seed)
    return [random_text(rng, rng.randrange(1, 40), ROUND_TRIP_ALPHABET) for _ in range(count)]


def test_smollm_round_trip_keeps_all_but_the_dropped_controls(smollm):
    # The six ASCII controls with no byte-level token in SmolLM2's vocabulary; llama.cpp and HF
    # transformers drop exactly these too (see GGUFByteLevelTokenizer).
    assert smollm.dropped_characters == "\x04\x06\x13\x14\x16\x1d"
    assert smollm.max_bytes_per_token is not None
    dropped = str.maketrans("", "", smollm.dropped_characters)
    texts = round_trip_texts(2000)
    assert sum(any(c in text for c in smollm.dropped_characters) for text in texts) > 100
    for text in texts:
        assert smollm.decode(smollm.encode(text), skip_special_tokens=False) == text.translate(dropped), repr(text)
    check_byte_bound(smollm, texts[:300])


def test_smollm_round_trip_matches_llama_cpp(smollm, smollm_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    theirs = llama_cpp.Llama(str(smollm_gguf), vocab_only=True, verbose=False)
    for text in round_trip_texts(2000):
        ours = smollm.encode(text, add_bos=False)
        their_ids = theirs.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        # Both drop the same characters, so both decode to the same text; where one was dropped,
        # llama.cpp does not merge its neighbours (" \x13)" -> " ", ")") while HF tokenizers, which
        # the model was trained with, does (" )"): the ids agree only without dropped characters.
        assert theirs.detokenize(their_ids) == theirs.detokenize(ours), repr(text)
        assert smollm.decode(ours, skip_special_tokens=False).encode("utf-8") == theirs.detokenize(ours), repr(text)
        if not any(c in text for c in smollm.dropped_characters):
            assert ours == their_ids, repr(text)


@pytest.mark.parametrize("change, pattern", [
    (dict(merges=None), "merges is missing"),
    (dict(merges=[]), "merges is missing"),
    (dict(merges=7), "merges must be an array"),
    (dict(tokens=["a", 3]), r"tokens\[1\] = 3 is not a string"),
    (dict(token_type=[1.5] * 262), r"token_type\[0\] = 1.5 is not an integer"),
    (dict(add_bos_token=[1, 2]), "add_bos_token = \\[1, 2\\] should be a bool"),
    (dict(chat_template=2.0), "chat_template = 2.0 should be a str"),
], ids=lambda v: str(v)[:30])
def test_gguf_tokenizer_values_of_the_wrong_type_are_refused(change, pattern):
    # Found by tests/fuzz: a retyped value used by its truthiness or str() tokenizes differently
    # without a word.
    spec = dict(tiny_bpe_spec(None), path="damaged.gguf", **change)
    with pytest.raises(file_error_class(), match=f"damaged.gguf: .*{pattern}"):
        tk.load_tokenizer(spec)


def test_llama2_leading_byte_space_is_kept_like_sentencepiece(sp_processor, llama2_gguf_spec, llama2c_bin,
                                                               llama2_hf_dir):
    """A text that starts with the byte token <0x20> keeps that space: the dummy-prefix rule strips
    only a text piece's leading space (found by the random ids of the test above)."""
    space_byte = sp_processor.PieceToId("<0x20>")
    ids = [space_byte, sp_processor.PieceToId("To"), sp_processor.PieceToId("▁be")]
    want = sp_processor.DecodeIds(ids)
    assert want.startswith(" ")
    for name, tokenizer in {
        "sentencepiece": tk.load_tokenizer(SPM_SPEC),
        "gguf": tk.load_tokenizer(llama2_gguf_spec),
        "llama2c": tk.load_tokenizer({"format": "llama2c", "tokenizer_bin": str(llama2c_bin)}),
        "hf": tk.load_tokenizer(hf_spec(llama2_hf_dir)),
    }.items():
        assert tokenizer.decode(ids) == want, name
        assert tokenizer.decode([sp_processor.bos_id()] + ids) == want, name
        stream = tokenizer.stream_decoder()
        assert "".join(stream.push(i) for i in ids) + stream.flush() == want, name
