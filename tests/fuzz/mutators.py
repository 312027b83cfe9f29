"""Field-aware mutations of GGUF, safetensors and llama2.c files.

Each mutator takes the seed's bytes (and a random.Random) and returns the mutated bytes plus a
`Mutation` that says what changed: the field (a stable name such as "kv:llama.rope.freq_base:value"
or "tensor:blk.0.attn_q.weight:offset") and how. The field decides whether a changed output is
legitimate (LEGITIMATE_FIELDS): a value the model can run with, such as a RoPE base, may change
the generated tokens without an error; any other change must be refused at load or leave the
output identical.

GGUF files are parsed into their fields (header counts, each metadata key's length, type and
value, each tensor's name, dims, type and offset) so a mutation can set one field to a boundary
value, change a value's type, rewrite a string with a wrong length, move or misalign a tensor, or
replace the chat template, and the file is then rebuilt around the change when it changes sizes.
"""

from __future__ import annotations

import json
import random
import re
import struct
from dataclasses import dataclass

# GGUF value types (gguf.GGUFValueType) and their struct formats.
GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9

# Fields whose changed value the model legitimately runs with (output may differ, no error due):
# names, RoPE base and scaling, the norm epsilon, the context length, and the tokenizer's own
# tables (a different vocabulary text or merge list tokenizes differently, and that is all).
LEGITIMATE_FIELDS = [
    r"kv:general\.(?!architecture|alignment)[\w.]+:value",
    r"kv:llama\.rope\.freq_base:value",
    r"kv:llama\.rope\.scaling\.[\w.]+:value",
    r"kv:llama\.attention\.layer_norm_rms_epsilon:value",
    r"kv:llama\.context_length:value",
    r"kv:tokenizer\.[\w.]+:(value|item)",
    r"kv:tokenizer\.chat_template:template",
    r"config:(rope_theta|rms_norm_eps|max_position_embeddings|bos_token_id|eos_token_id|torch_dtype|rope_scaling)",
    # An untied config without lm_head.weight is read as tied (the loader's documented rule,
    # tests/test_loaders.py::test_safetensors_untied_config_without_lm_head_is_tied).
    r"safetensors:lm_head\.weight:presence",
    r"tokenizer_config:chat_template",
    r"llama2c:seq_len",
    r"llama2c-tokenizer:score",
]
_LEGITIMATE = re.compile("|".join(f"(?:{p})" for p in LEGITIMATE_FIELDS))

HOSTILE_TEMPLATES = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
    "{{ 'x' * 1000000000 }}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "{{ 'x'|center(1000000000) }}",
    "{% for m in messages %}",  # not valid Jinja
    "{{ raise_exception('no') }}",
    "{{ messages[0]['content'] }}{{ undefined_name.attribute }}",
    "",
    "{{ messages }}",
]


def is_legitimate(field: str) -> bool:
    return bool(_LEGITIMATE.fullmatch(field))


def is_undetectable(mutation: "Mutation") -> bool:
    """A relabel between two types of the same size per value: F16 <-> BF16 in safetensors, or two
    GGUF block formats with equal bytes per value (Q4_0 / IQ4_NL / Q4_K: 0.5625) where the rows
    divide both blocks. Every byte range still fits, so neither we, the safetensors library nor
    llama.cpp can tell the file from a valid one without judging the weights' values; such cases
    are counted apart ("undetectable"), not passed as legitimate."""
    import gguf

    match = re.fullmatch(r"dtype (\w+) -> (\w+)", mutation.how)
    if mutation.field.endswith(":dtype") and match:
        return {match.group(1), match.group(2)} == {"F16", "BF16"}
    match = re.fullmatch(r"type (\d+) -> (\d+)", mutation.how)
    if mutation.field.endswith(":type") and match:
        sizes = []
        for type_id in map(int, match.groups()):
            try:
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
            except (ValueError, KeyError):
                return False
            sizes.append(size / block)
        return sizes[0] == sizes[1]
    return False


@dataclass
class Mutation:
    field: str
    how: str

    def describe(self) -> str:
        return f"{self.field}: {self.how}"


# ---- interesting values -------------------------------------------------------------------------

def interesting_ints(rng: random.Random, current: int, bits: int, signed: bool) -> int:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    choices = [0, 1, 2, 3, 7, 8, 31, 32, 33, 255, 256, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1,
               2**32, 2**63 - 1, 2**64 - 1, -1, -2, -(2**31), current + 1, current - 1, current * 2,
               current // 2, current * 256, current + 32, current - 32, rng.randrange(0, 1 << min(bits, 62))]
    value = rng.choice(choices)
    if signed:
        return max(lo, min(hi, value))
    return value % (1 << bits)


def interesting_float(rng: random.Random, current: float) -> float:
    return rng.choice([0.0, -0.0, 1.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 1e-30,
                       3.4e38, current * 2, current / 2, -current, current * 1e6, 5e-324])


# ---- GGUF layout ----------------------------------------------------------------------------------

@dataclass
class Field:
    name: str
    offset: int
    fmt: str   # struct format of the field


class GGUFLayout:
    """The fields of a GGUF file, parsed without the gguf package (which would refuse damaged
    files): header, metadata (raw spans for rebuilding), tensor infos, the data start."""

    def __init__(self, data: bytes):
        self.data = data
        self.fields: list[Field] = []
        self.kv: list[dict] = []        # key, type, start, end, value_start, (item_type, count)
        self.tensors: list[dict] = []   # name, start, end, n_dims, dims, type, offset
        self.pos = 0
        self._read_header()

    def _take(self, name: str, fmt: str):
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.fields.append(Field(name, self.pos, fmt))
        self.pos += struct.calcsize(fmt)
        return value

    def _string(self, name: str) -> str:
        length = self._take(f"{name}:length", "<Q")
        text = self.data[self.pos:self.pos + length].decode("utf-8", errors="replace")
        self.pos += length
        return text

    def _value(self, name: str, vtype: int):
        if vtype in GGUF_SCALAR:
            return self._take(f"{name}:value", GGUF_SCALAR[vtype])
        if vtype == GGUF_STRING:
            return self._string(f"{name}:value")
        if vtype == GGUF_ARRAY:
            item_type = self._take(f"{name}:item_type", "<I")
            count = self._take(f"{name}:count", "<Q")
            items = []
            for index in range(count):
                item_name = f"{name}:item" if index < 4 else None
                if item_type in GGUF_SCALAR:
                    fmt = GGUF_SCALAR[item_type]
                    if item_name:
                        items.append(self._take(item_name, fmt))
                    else:
                        items.append(struct.unpack_from(fmt, self.data, self.pos)[0])
                        self.pos += struct.calcsize(fmt)
                elif item_type == GGUF_STRING:
                    if item_name:
                        items.append(self._string(item_name))
                    else:
                        (length,) = struct.unpack_from("<Q", self.data, self.pos)
                        self.pos += 8 + length
                        items.append(None)
                else:
                    raise ValueError(f"nested array in {name}")
            return items
        raise ValueError(f"unknown GGUF value type {vtype}")

    def _read_header(self) -> None:
        self.pos = 4
        self._take("header:version", "<I")
        n_tensors = self._take("header:n_tensors", "<Q")
        n_kv = self._take("header:n_kv", "<Q")
        self.header_end = self.pos
        self.alignment = 32
        for _ in range(n_kv):
            start = self.pos
            key = self._string(f"kv:{len(self.kv)}:key")
            self.fields[-1].name = f"kv:{key}:key_length"
            vtype = self._take(f"kv:{key}:type", "<I")
            value_start = self.pos
            value = self._value(f"kv:{key}", vtype)
            self.kv.append(dict(key=key, type=vtype, start=start, end=self.pos, value_start=value_start,
                                value=value if vtype != GGUF_ARRAY or key != "tokenizer.ggml.tokens" else None))
            if key == "general.alignment" and isinstance(value, int):
                self.alignment = value
        self.kv_end = self.pos
        for _ in range(n_tensors):
            start = self.pos
            name = self._string("tensor:?:name")
            self.fields[-1].name = f"tensor:{name}:name_length"
            n_dims = self._take(f"tensor:{name}:n_dims", "<I")
            dims = [self._take(f"tensor:{name}:dim{i}", "<Q") for i in range(n_dims)]
            ttype = self._take(f"tensor:{name}:type", "<I")
            offset = self._take(f"tensor:{name}:offset", "<Q")
            self.tensors.append(dict(name=name, start=start, end=self.pos, n_dims=n_dims, dims=dims,
                                     type=ttype, offset=offset))
        self.infos_end = self.pos
        self.data_start = self.pos + (-self.pos % self.alignment)

    def rebuild(self, kv_blobs: list[bytes], tensor_blobs: list[bytes] | None = None,
                n_kv: int | None = None) -> bytes:
        """The file with its metadata replaced by kv_blobs (tensor infos and data kept), padded
        again to the alignment, so tensor offsets stay right."""
        tensor_blobs = tensor_blobs if tensor_blobs is not None else [
            self.data[t["start"]:t["end"]] for t in self.tensors]
        head = bytearray(self.data[:self.header_end])
        struct.pack_into("<Q", head, 16, len(kv_blobs) if n_kv is None else n_kv)
        struct.pack_into("<Q", head, 8, len(tensor_blobs))
        body = bytes(head) + b"".join(kv_blobs) + b"".join(tensor_blobs)
        body += b"\0" * (-len(body) % self.alignment)
        return body + self.data[self.data_start:]

    def kv_blobs(self) -> list[bytes]:
        return [self.data[k["start"]:k["end"]] for k in self.kv]


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def gguf_kv(key: str, vtype: int, payload: bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", vtype) + payload


def set_field(data: bytes, field: Field, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(field.fmt, out, field.offset, value)
    return bytes(out)


def _field_value(data: bytes, field: Field):
    return struct.unpack_from(field.fmt, data, field.offset)[0]


def _mutate_number(data: bytes, field: Field, rng: random.Random) -> tuple[bytes, str]:
    current = _field_value(data, field)
    code = field.fmt[-1]
    if code in "fd":
        value = interesting_float(rng, current)
        if code == "f" and abs(value) > 3.4e38 and value == value and abs(value) != float("inf"):
            value = float("inf")
    elif code == "?":
        value = not current
    else:
        bits = struct.calcsize(field.fmt) * 8
        value = interesting_ints(rng, current, bits, signed=code.islower())
    return set_field(data, field, value), f"{current!r} -> {value!r}"


# GGUF mutators: each (data, layout, rng) -> (bytes, Mutation)

def gguf_header_field(data, layout, rng):
    field = rng.choice([f for f in layout.fields if f.name.startswith("header:")])
    out, how = _mutate_number(data, field, rng)
    return out, Mutation(field.name, how)


def gguf_kv_value(data, layout, rng):
    """A number in the metadata (or an array's first items) set to a boundary value."""
    fields = [f for f in layout.fields if f.name.startswith("kv:") and f.name.endswith((":value", ":item"))]
    field = rng.choice(fields)
    out, how = _mutate_number(data, field, rng)
    return out, Mutation(field.name, how)


def gguf_lengths(data, layout, rng):
    """A string or array length, a key length or an item type: off by a little or by a lot."""
    fields = [f for f in layout.fields if f.name.endswith((":length", ":key_length", ":count", ":item_type",
                                                           ":name_length"))]
    field = rng.choice(fields)
    current = _field_value(data, field)
    if field.fmt == "<I":
        value = rng.choice([0, 1, 2, 7, 8, 9, 10, 12, 13, 99, 2**32 - 1])
    else:
        value = rng.choice([0, 1, current - 1, current + 1, current + 7, current * 2, 2**31, 2**40,
                            2**63, 2**64 - 1]) % 2**64
    return set_field(data, field, value), Mutation(field.name, f"{current} -> {value}")


def gguf_value_type(data, layout, rng):
    """A metadata value's type tag changed, bytes left as they are (the rest misparses)."""
    field = rng.choice([f for f in layout.fields if f.name.endswith(":type") and f.name.startswith("kv:")])
    current = _field_value(data, field)
    value = rng.choice([t for t in range(14) if t != current] + [255, 2**31])
    return set_field(data, field, value), Mutation(field.name, f"type {current} -> {value} (bytes kept)")


def gguf_retyped_value(data, layout, rng):
    """A metadata value re-encoded, well formed, as another type: block_count as a float, a
    string, an array; the file rebuilt around it."""
    index = rng.randrange(len(layout.kv))
    entry = layout.kv[index]
    value = entry["value"]
    if entry["type"] == GGUF_ARRAY or value is None:
        candidates = [(GGUF_STRING, gguf_string("x")), (4, struct.pack("<I", 3))]
    else:
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else 2
        candidates = [(6, struct.pack("<f", float(number))), (12, struct.pack("<d", float(number))),
                      (GGUF_STRING, gguf_string(str(value))), (7, struct.pack("<?", True)),
                      (11, struct.pack("<q", int(number) if number == number and abs(number) < 2**62 else -1)),
                      (1, struct.pack("<b", -1)),
                      (GGUF_ARRAY, struct.pack("<IQ", 4, 2) + struct.pack("<2I", 1, 2))]
    vtype, payload = rng.choice([c for c in candidates if c[0] != entry["type"]])
    blobs = layout.kv_blobs()
    blobs[index] = gguf_kv(entry["key"], vtype, payload)
    return layout.rebuild(blobs), Mutation(f"kv:{entry['key']}:value_type", f"type {entry['type']} -> {vtype}")


def gguf_drop_or_duplicate_kv(data, layout, rng):
    blobs = layout.kv_blobs()
    index = rng.randrange(len(blobs))
    key = layout.kv[index]["key"]
    if rng.random() < 0.5:
        del blobs[index]
        return layout.rebuild(blobs), Mutation(f"kv:{key}:presence", "removed")
    other = rng.choice(layout.kv)
    blobs.insert(rng.randrange(len(blobs) + 1), gguf_kv(key, other["type"], data[other["value_start"]:other["end"]]))
    return layout.rebuild(blobs), Mutation(f"kv:{key}:presence", f"duplicated with {other['key']}'s value")


def gguf_count_mismatch(data, layout, rng):
    """The header's metadata count left as it was while an entry is added or removed."""
    blobs = layout.kv_blobs()
    if rng.random() < 0.5:
        del blobs[rng.randrange(len(blobs))]
    else:
        blobs.append(gguf_kv("fuzz.extra", 4, struct.pack("<I", 1)))
    return layout.rebuild(blobs, n_kv=len(layout.kv)), Mutation("header:n_kv", "stale count after an edit")


def gguf_tensor_type(data, layout, rng):
    tensor = rng.choice(layout.tensors)
    field = next(f for f in layout.fields if f.name == f"tensor:{tensor['name']}:type")
    value = rng.choice([0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 25, 26, 28, 29, 30, 34, 35, 39,
                        40, 99, 2**31])
    return set_field(data, field, value), Mutation(field.name, f"type {tensor['type']} -> {value}")


def gguf_tensor_shape(data, layout, rng):
    tensor = rng.choice(layout.tensors)
    dims = [f for f in layout.fields if f.name.startswith(f"tensor:{tensor['name']}:dim")]
    if rng.random() < 0.3 and len(dims) == 2:
        a, b = (_field_value(data, d) for d in dims)
        out = set_field(set_field(data, dims[0], b), dims[1], a)
        return out, Mutation(f"tensor:{tensor['name']}:dims", f"swapped {a}x{b}")
    if rng.random() < 0.2:
        field = next(f for f in layout.fields if f.name == f"tensor:{tensor['name']}:n_dims")
        value = rng.choice([0, 1, 3, 4, 5, 2**31])
        return set_field(data, field, value), Mutation(field.name, f"{tensor['n_dims']} -> {value}")
    field = rng.choice(dims)
    current = _field_value(data, field)
    value = rng.choice([0, 1, current - 1, current + 1, current * 2, current // 2, current + 32, 2**31, 2**32,
                        2**62, 2**64 - 1]) % 2**64
    return set_field(data, field, value), Mutation(field.name, f"{current} -> {value}")


def gguf_tensor_offset(data, layout, rng):
    tensor = rng.choice(layout.tensors)
    field = next(f for f in layout.fields if f.name == f"tensor:{tensor['name']}:offset")
    current = tensor["offset"]
    if rng.random() < 0.3:
        other = rng.choice(layout.tensors)
        value = other["offset"]
        how = f"{current} -> {value} (the offset of {other['name']})"
    else:
        size = len(data) - layout.data_start
        value = rng.choice([0, current + 1, current - 1, current + layout.alignment, current - layout.alignment,
                            current + 4, size, size - 1, size + layout.alignment, 2**63, 2**64 - 1]) % 2**64
        how = f"{current} -> {value}"
    return set_field(data, field, value), Mutation(field.name, how)


def gguf_alignment(data, layout, rng):
    """general.alignment written (or changed) with the data left where it was."""
    value = rng.choice([0, 1, 3, 7, 16, 64, 4096, 2**31, 2**32 - 1])
    blobs = [b for b, k in zip(layout.kv_blobs(), layout.kv) if k["key"] != "general.alignment"]
    blobs.append(gguf_kv("general.alignment", 4, struct.pack("<I", value)))
    return layout.rebuild(blobs), Mutation("kv:general.alignment:value", f"{layout.alignment} -> {value}")


def gguf_chat_template(data, layout, rng):
    template = rng.choice(HOSTILE_TEMPLATES)
    blobs = [b for b, k in zip(layout.kv_blobs(), layout.kv) if k["key"] != "tokenizer.chat_template"]
    blobs.append(gguf_kv("tokenizer.chat_template", GGUF_STRING, gguf_string(template)))
    return layout.rebuild(blobs), Mutation("kv:tokenizer.chat_template:template", f"{template[:60]!r}")


def gguf_scale_bytes(data, layout, rng):
    """A quantized block's scale (the first two bytes of a Q8_0 / Q4_0 / Q4_1 block) or an f32
    weight set to NaN / inf / a huge value: the NaN scan's target."""
    tensors = [t for t in layout.tensors if t["type"] in (0, 2, 3, 8) and t["offset"] < len(data)]
    tensor = rng.choice(tensors)
    start = layout.data_start + tensor["offset"]
    if tensor["type"] == 0:
        elements = 1
        for d in tensor["dims"]:
            elements *= d
        position = start + 4 * rng.randrange(max(1, elements))
        value = rng.choice([struct.pack("<f", float("nan")), struct.pack("<f", float("inf")),
                            struct.pack("<f", -float("inf"))])
    else:
        block = {2: 18, 3: 20, 8: 34}[tensor["type"]]
        position = start + block * rng.randrange(64)
        value = rng.choice([b"\x00\x7e", b"\x00\x7c", b"\x00\xfc", b"\x01\x7e"])  # f16 NaN, inf, -inf, NaN
    if position + len(value) > len(data):
        position = start
    out = bytearray(data)
    out[position:position + len(value)] = value
    return bytes(out), Mutation(f"tensor:{tensor['name']}:data", f"non-finite value at byte {position - start}")


def truncate(data, layout, rng):
    """Cut at a random point, at a field boundary, or a few bytes short of the end."""
    boundaries = [f.offset for f in layout.fields] if layout is not None else []
    choice = rng.random()
    if boundaries and choice < 0.4:
        cut = rng.choice(boundaries) + rng.choice([0, 1, -1])
    elif choice < 0.7:
        cut = len(data) - rng.choice([1, 2, 3, 4, 7, 8, 31, 32, 33, 100, 1000])
    else:
        cut = rng.randrange(len(data))
    cut = max(0, min(len(data) - 1, cut))
    return data[:cut], Mutation("file:length", f"truncated to {cut} of {len(data)} bytes")


def byte_flips(data, layout, rng):
    """A few random bytes of the header region changed (the data region is left alone: a changed
    weight is a different model, not a damaged file), all in one place: inside one GGUF metadata
    value, whose field the mutation then names (so a changed token text counts as the tokenizer
    change it is, LEGITIMATE_FIELDS), or all in the structure (keys, types, lengths, the tensor
    table: "header:bytes", damage). Mixing the two made a legitimate value change plus a harmless
    one (a renamed optional key) read as silent damage."""
    end = layout.data_start if layout is not None else min(len(data), 512)
    gguf = isinstance(layout, GGUFLayout)
    first = rng.randrange(end)
    owner = _kv_value_owner(layout, first) if gguf else None
    changed = [first]
    for _ in range(rng.randint(1, 4) - 1):
        if owner is not None:
            changed.append(rng.randrange(owner["value_start"], owner["end"]))
            continue
        for _try in range(100):  # another structure byte (most of a header is metadata values)
            position = rng.randrange(end)
            if not gguf or _kv_value_owner(layout, position) is None:
                changed.append(position)
                break
    out = bytearray(data)
    for position in changed:
        out[position] = rng.randrange(256)
    if owner is not None:
        field = f"kv:{owner['key']}:value"
        return bytes(out), Mutation(field, f"random bytes at {changed} (in {field})")
    return bytes(out), Mutation("header:bytes", f"random bytes at {changed}")


def _kv_value_owner(layout, position: int):
    """The metadata entry whose value bytes hold `position`, or None (a key, a type or the tensor
    table)."""
    for kv in layout.kv:
        if kv["value_start"] <= position < kv["end"]:
            return kv
    return None


GGUF_MUTATORS = [
    (gguf_header_field, 4), (gguf_kv_value, 14), (gguf_lengths, 8), (gguf_value_type, 6),
    (gguf_retyped_value, 10), (gguf_drop_or_duplicate_kv, 6), (gguf_count_mismatch, 2),
    (gguf_tensor_type, 10), (gguf_tensor_shape, 10), (gguf_tensor_offset, 10), (gguf_alignment, 3),
    (gguf_chat_template, 4), (gguf_scale_bytes, 5), (truncate, 6), (byte_flips, 4),
]


def mutate_gguf(data: bytes, rng: random.Random) -> tuple[bytes, Mutation]:
    layout = GGUFLayout(data)
    mutator = rng.choices([m for m, _ in GGUF_MUTATORS], weights=[w for _, w in GGUF_MUTATORS])[0]
    out, mutation = mutator(data, layout, rng)
    mutation.how = f"{mutator.__name__}: {mutation.how}"
    return out, mutation


# ---- safetensors ------------------------------------------------------------------------------------

def mutate_safetensors(data: bytes, rng: random.Random) -> tuple[bytes, Mutation]:
    (header_len,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + header_len])
    body = data[8 + header_len:]
    names = [k for k in header if k != "__metadata__"]
    choice = rng.random()

    def pack(new_header: dict, length: int | None = None) -> bytes:
        raw = json.dumps(new_header).encode()
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw) if length is None else length) + raw + body

    if choice < 0.15:
        delta = rng.choice([-1, -2, -3, -7, -8, 1, 2, 7, 8, 16])
        value = rng.choice([header_len + delta, 0, 1, 2**31, 2**63, 2**64 - 1, len(data)]) % 2**64
        out = bytearray(data)
        struct.pack_into("<Q", out, 0, value)
        return bytes(out), Mutation("safetensors:header_length", f"{header_len} -> {value}")
    name = rng.choice(names)
    entry = dict(header[name])
    if choice < 0.3:
        value = rng.choice(["F16", "BF16", "F32", "F64", "I32", "I8", "U8", "BOOL", "F8_E4M3", "X", 3, None])
        how = f"dtype {entry['dtype']} -> {value}"
        entry["dtype"] = value
        field = "dtype"
    elif choice < 0.5:
        shape = list(entry["shape"])
        option = rng.randrange(6)
        if option == 0 and len(shape) == 2:
            shape = shape[::-1]
        elif option == 1:
            shape = shape + [1]
        elif option == 2:
            shape = []
        elif option == 3:
            shape[rng.randrange(len(shape))] += rng.choice([-1, 1, 32])
        elif option == 4:
            shape[rng.randrange(len(shape))] = rng.choice([0, -1, 2**31, 2**63, "3", 1.5])
        else:
            shape = [shape[0] // 2, shape[-1] * 2] if len(shape) == 2 else shape * 2
        how = f"shape {entry['shape']} -> {shape}"
        entry["shape"] = shape
        field = "shape"
    elif choice < 0.7:
        begin, end = entry["data_offsets"]
        option = rng.randrange(6)
        if option == 0:
            offsets = [begin + 4, end + 4]
        elif option == 1:
            offsets = [begin, end - 4]
        elif option == 2:
            offsets = [end, begin]
        elif option == 3:
            offsets = [begin, len(body) + 8]
        elif option == 4:
            other = header[rng.choice(names)]["data_offsets"]
            offsets = list(other)
        else:
            offsets = [rng.choice([-1, 2**63, 1.5, "0"]), end]
        how = f"data_offsets {entry['data_offsets']} -> {offsets}"
        entry["data_offsets"] = offsets
        field = "data_offsets"
    elif choice < 0.8:
        new = dict(header)
        del new[name]
        return pack(new), Mutation(f"safetensors:{name}:presence", "removed")
    elif choice < 0.9:
        raw = bytearray(data[8:8 + header_len])
        position = rng.randrange(len(raw))
        raw[position] = rng.choice(b'{}[]",:0 x\x00\xff')
        return data[:8] + bytes(raw) + body, Mutation("safetensors:json", f"byte {position} changed")
    else:
        out, mutation = truncate(data, None, rng)
        mutation.field = "safetensors:length"
        return out, mutation
    new = dict(header)
    new[name] = entry
    return pack(new), Mutation(f"safetensors:{name}:{field}", how)


CONFIG_FIELDS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "rms_norm_eps", "rope_theta", "max_position_embeddings",
                 "vocab_size", "bos_token_id", "eos_token_id", "tie_word_embeddings", "head_dim",
                 "architectures", "rope_scaling", "torch_dtype"]


def mutate_config(data: bytes, rng: random.Random) -> tuple[bytes, Mutation]:
    config = json.loads(data)
    key = rng.choice(CONFIG_FIELDS)
    current = config.get(key)
    if rng.random() < 0.1:
        config.pop(key, None)
        return json.dumps(config).encode(), Mutation(f"config:{key}", "removed")
    if isinstance(current, (int, float)) and not isinstance(current, bool):
        value = rng.choice([0, 1, -1, 2, current + 1, current - 1, current * 2, 2**31, 2**63, 1e300, 0.5,
                            float("nan"), "7", None, [current], True] if key not in ("rms_norm_eps", "rope_theta")
                           else [current * 2, current / 2, 1e-12, 1e6, 0.0, -1.0, float("inf"), "x", None])
    else:
        value = rng.choice([None, "llama", ["MistralForCausalLM"], {"rope_type": "yarn", "factor": 4.0},
                            {"rope_type": "linear", "factor": 2.0}, {"rope_type": "llama3"}, 3, True, "bfloat16"])
    config[key] = value
    raw = json.dumps(config, allow_nan=True).encode()
    return raw, Mutation(f"config:{key}", f"{current!r} -> {value!r}")


def mutate_tokenizer_config(data: bytes, rng: random.Random) -> tuple[bytes, Mutation]:
    config = json.loads(data)
    config["chat_template"] = rng.choice(HOSTILE_TEMPLATES)
    return json.dumps(config).encode(), Mutation("tokenizer_config:chat_template", repr(config["chat_template"][:60]))


# ---- llama2.c -----------------------------------------------------------------------------------------

LLAMA2C_INTS = ["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"]


def mutate_llama2c(data: bytes, rng: random.Random) -> tuple[bytes, Mutation]:
    versioned = struct.unpack_from("<I", data, 0)[0] == 0x616B3432
    base = 8 if versioned else 0
    choice = rng.random()
    if choice < 0.15:
        out, mutation = truncate(data, None, rng)
        mutation.field = "llama2c:length"
        return out, mutation
    if choice < 0.2:
        extra = bytes(rng.randrange(256) for _ in range(rng.choice([1, 4, 64, 4096])))
        return data + extra, Mutation("llama2c:length", f"{len(extra)} bytes appended")
    out = bytearray(data)
    if versioned and choice < 0.35:
        field, fmt, offset = rng.choice([("llama2c:magic", "<I", 0), ("llama2c:version", "<i", 4),
                                         ("llama2c:shared_classifier", "<B", 36)])
        current = struct.unpack_from(fmt, data, offset)[0]
        value = interesting_ints(rng, current, struct.calcsize(fmt) * 8, fmt[-1].islower())
        struct.pack_into(fmt, out, offset, value)
        return bytes(out), Mutation(field, f"{current} -> {value}")
    index = rng.randrange(7)
    offset = base + 4 * index
    current = struct.unpack_from("<i", data, offset)[0]
    value = interesting_ints(rng, current, 32, True)
    struct.pack_into("<i", out, offset, value)
    return bytes(out), Mutation(f"llama2c:{LLAMA2C_INTS[index]}", f"{current} -> {value}")


def mutate_llama2c_tokenizer(data: bytes, rng: random.Random) -> tuple[bytes, Mutation]:
    out = bytearray(data)
    choice = rng.random()
    if choice < 0.3:
        cut = rng.randrange(len(data))
        return data[:cut], Mutation("llama2c-tokenizer:length", f"truncated to {cut}")
    if choice < 0.5:
        value = interesting_ints(rng, struct.unpack_from("<i", data, 0)[0], 32, True)
        struct.pack_into("<i", out, 0, value)
        return bytes(out), Mutation("llama2c-tokenizer:max_token_length", f"-> {value}")
    # Walk to a random token and change its length or score.
    offset, index, target = 4, 0, rng.randrange(290)
    while index < target:
        (length,) = struct.unpack_from("<i", data, offset + 4)
        offset += 8 + length
        index += 1
    if choice < 0.75:
        value = interesting_ints(rng, struct.unpack_from("<i", data, offset + 4)[0], 32, True)
        struct.pack_into("<i", out, offset + 4, value)
        return bytes(out), Mutation("llama2c-tokenizer:token_length", f"token {index} length -> {value}")
    value = interesting_float(rng, struct.unpack_from("<f", data, offset)[0])
    struct.pack_into("<f", out, offset, value)
    return bytes(out), Mutation("llama2c-tokenizer:score", f"token {index} score -> {value}")
