"""Chat templates: a model's Jinja template rendered the way transformers renders it, ChatML when
the model's files carry none, and where Hugging Face checkpoints keep their template.

A template comes from the model file, so it is untrusted code: rendering is bounded in time and in
the size of everything it builds (see _Budget), without threads or signals, so a hostile template
fails with ChatTemplateLimitError in about a second and leaves nothing running.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from ..errors import ArgumentTypeError

# ChatML, used when a model's files carry no chat template.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Real chat templates render in milliseconds and loop over the messages a few times over.
TEMPLATE_TIME_LIMIT_S = 1.0
TEMPLATE_MAX_CHARS = 16 * 1024 * 1024
TEMPLATE_MAX_LOOP_STEPS = 1 << 20
# Integers beyond this many bits (2**65536 has ~20,000 digits) only serve to make arithmetic slow.
_MAX_INT_BITS = 1 << 16
# A width or precision of seven digits or more in a format string ("%9999999d", "{:>9999999}").
_HUGE_FORMAT_WIDTH = re.compile(r"\d{7,}")


class ChatTemplateLimitError(ValueError):
    """A chat template that needs more time or builds more text than rendering allows."""


class _Budget:
    """The limits of one render, checked by every hook the sandbox offers.

    What can take time or memory in a sandboxed template, and where it is checked:
      loops        every `for` iterates through `environment.brrr_loop` (the template's AST is
                   rewritten at compile time), which counts steps and reads the clock
      calls        SandboxedEnvironment.call, filters (each wrapped), attribute and item lookups:
                   a step each; integer arguments above max_chars are refused (`'x'.center(10**9)`,
                   `|indent(10**9)`, `|batch(10**9)`), as are format widths of seven digits
      operators    `+ * ** %` are intercepted: string, list and integer sizes are computed before
                   the operation runs; `~` (Concat) and captured blocks (`environment.concat`) are
                   checked after joining pieces that are each already bounded
      output       every `{{ expression }}` (finalize) and every chunk of the rendered stream
    Recursion (macros calling themselves) ends in RecursionError, turned into the same error.
    """

    def __init__(self, source: str, time_limit_s: float, max_chars: int, reason: str | None):
        self.source = source
        self.deadline = time.monotonic() + time_limit_s
        self.time_limit_s = time_limit_s
        self.max_chars = max_chars
        self.reason = reason
        self.steps = 0
        self.loop_steps = 0
        self.produced = 0

    def fail(self, problem: str):
        raise ChatTemplateLimitError(f"the chat template of {self.source} {problem}; a chat template "
                                     f"must not loop or build text without bound (the file's template "
                                     f"is damaged or hostile: pass another one)")

    def step(self) -> None:
        self.steps += 1
        if not self.steps & 255 and time.monotonic() > self.deadline:
            self.fail(f"ran longer than {self.time_limit_s:g} s")

    def loop_step(self) -> None:
        self.loop_steps += 1
        if self.loop_steps > TEMPLATE_MAX_LOOP_STEPS:
            self.fail(f"ran more than {TEMPLATE_MAX_LOOP_STEPS} loop iterations")
        self.step()

    def size(self, n: int, what: str) -> None:
        if n > self.max_chars:
            if self.reason:
                raise ChatTemplateLimitError(f"the chat template of {self.source} built {what} of more than "
                                             f"{self.max_chars} characters: {self.reason}")
            self.fail(f"built {what} of more than {self.max_chars} characters")

    def integer(self, value, what: str) -> None:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > self.max_chars:
            self.fail(f"passed {value} to {what}, beyond the limit of {self.max_chars}")

    def format_string(self, text: str, what: str) -> None:
        if _HUGE_FORMAT_WIDTH.search(text):
            self.fail(f"used a format string with a width of seven digits or more in {what}")


_BUDGET: contextvars.ContextVar[_Budget] = contextvars.ContextVar("llama_brrr_chat_budget")


def _budget() -> _Budget:
    return _BUDGET.get()


def _sized(value) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 0


class ChatTemplate:
    """One model's chat template (None: ChatML), compiled on first use.

    Rendered like transformers does: sandboxed, trim_blocks and lstrip_blocks, loop controls,
    `raise_exception`, `strftime_now` and a `tojson` that keeps non-ASCII text; within a time and a
    size limit (ChatTemplateLimitError, a ValueError).
    """

    def __init__(self, text: str | None, source: str):
        self.from_files = text is not None
        self.text = text if text is not None else DEFAULT_CHAT_TEMPLATE
        self._source = source
        self._compiled = None

    def render(self, messages, add_generation_prompt: bool, bos_token: str, eos_token: str, *,
               max_chars: int = TEMPLATE_MAX_CHARS, time_limit_s: float = TEMPLATE_TIME_LIMIT_S,
               limit_reason: str | None = None) -> str:
        """The rendered prompt. max_chars bounds the result and every string built on the way;
        limit_reason, when given, is what a size error says about why (the context's size)."""
        import jinja2

        checked = _check_messages(messages)
        template = self._compile()
        budget = _Budget(self._source, time_limit_s, max_chars, limit_reason)
        token = _BUDGET.set(budget)
        chunks, length = [], 0
        stream = template.generate(messages=checked, add_generation_prompt=bool(add_generation_prompt),
                                   bos_token=bos_token, eos_token=eos_token)
        try:
            for chunk in stream:
                length += len(chunk)
                budget.size(length, "a prompt")
                budget.step()
                chunks.append(chunk)
        except _TemplateRaised as error:
            raise ValueError(f"the chat template of {self._source} rejected the messages: {error}") from None
        except jinja2.TemplateError as error:  # undefined names, sandbox violations
            raise ValueError(f"the chat template of {self._source} failed on these messages: {error}") from None
        except RecursionError:
            budget.fail("recursed too deeply")
        except (MemoryError, OverflowError) as error:
            budget.fail(f"ran out of memory or range ({type(error).__name__})")
        finally:
            stream.close()
            _BUDGET.reset(token)
        return "".join(chunks)

    def _compile(self):
        if self._compiled is None:
            import jinja2

            from .base import file_error

            environment = _BoundedEnvironment()
            try:
                tree = environment.parse(self.text)
            except jinja2.TemplateSyntaxError as error:
                raise file_error(self._source, f"the chat template is not valid Jinja "
                                 f"(line {error.lineno}: {error.message}); pass messages through another "
                                 f"template or fix the file") from None
            except RecursionError:
                raise file_error(self._source, "the chat template nests too deeply to parse; pass "
                                               "messages through another template") from None
            try:
                self._compiled = environment.from_string(_bound_tree(tree))
            except RecursionError:
                raise file_error(self._source, "the chat template nests too deeply to compile; pass "
                                               "messages through another template") from None
        return self._compiled


def _bound_tree(tree):
    """Routes every loop's iterable through environment.brrr_loop and every `~` through
    environment.brrr_text. EnvironmentAttribute names cannot be shadowed by the template."""
    from jinja2 import nodes

    for node in tree.find_all(nodes.For):
        node.iter = nodes.Call(nodes.EnvironmentAttribute("brrr_loop"), [node.iter], [], None, None)
    # Replace each Concat by a checking call around it (innermost first is not needed: a
    # Concat's operands are each bounded before it is joined).
    for parent in list(tree.find_all(nodes.Node)):
        for field in parent.fields:
            value = getattr(parent, field, None)
            if isinstance(value, nodes.Concat):
                setattr(parent, field, _checked_concat(value))
            elif isinstance(value, list):
                setattr(parent, field, [_checked_concat(v) if isinstance(v, nodes.Concat) else v
                                        for v in value])
    return tree


def _checked_concat(node):
    from jinja2 import nodes

    return nodes.Call(nodes.EnvironmentAttribute("brrr_text"), [node], [], None, None)


def _brrr_loop(iterable):
    budget = _budget()
    for item in iterable:
        budget.loop_step()
        yield item


def _brrr_text(text):
    _budget().size(_sized(text), "a string")
    return text


def _bounded_concat(parts) -> str:
    parts = list(parts)
    _budget().size(sum(map(len, parts)), "a captured block")
    return "".join(parts)


def _finalize(value):
    budget = _budget()
    budget.step()
    budget.size(_sized(value), "a value")
    budget.produced += len(value) if isinstance(value, str) else 0
    # Text printed inside captured blocks, macros and filter blocks counts too, at most a few
    # prompts' worth in all.
    budget.size(budget.produced // 4, "printed text (in all)")
    return value


def _guard_filter(name, function):
    @functools.wraps(function)
    def guarded(*args, **kwargs):
        budget = _budget()
        budget.step()
        for value in (*args, *kwargs.values()):
            budget.integer(value, f"the {name} filter")
        if name == "format" and args and isinstance(args[0], str):
            budget.format_string(args[0], "the format filter")
        if name == "replace":
            _check_replace(budget, [a for a in args if isinstance(a, str)])
        if name == "join":
            args = _check_join_filter(budget, args, kwargs)
        result = function(*args, **kwargs)
        budget.size(_sized(result), f"a result of the {name} filter")
        return result

    return guarded


def _join_length(items: list, separator: str) -> int:
    return sum(len(item) if isinstance(item, str) else len(str(item)) for item in items) + len(separator) * max(len(items) - 1, 0)


def _check_join_filter(budget: _Budget, args: tuple, kwargs: dict) -> tuple:
    """join(eval_ctx, value, d="", attribute=None): the result's length, computed before joining."""
    if len(args) < 2 or kwargs.get("attribute") is not None or len(args) > 3 and args[3] is not None:
        return args
    items = list(args[1])
    separator = args[2] if len(args) > 2 else kwargs.get("d", "")
    if isinstance(separator, str):
        budget.size(_join_length(items, separator), "a joined string")
    return (args[0], items, *args[2:])


def _check_replace(budget: _Budget, strings: list) -> None:
    """str.replace(old, new) on text: the exact result length, computed before it is built."""
    if len(strings) >= 3:
        text, old, new = strings[-3], strings[-2], strings[-1]
        budget.size(len(text) + text.count(old) * (len(new) - len(old)), "a string (replace)")


def _environment_class():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["+", "*", "**", "%"])

        def __init__(self):
            super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"],
                             finalize=_finalize)
            # Constant folding would run filters like center(10**9) at compile time, outside
            # any limit.
            self.optimized = False
            self.brrr_loop = _brrr_loop
            self.brrr_text = _brrr_text
            self.concat = _bounded_concat
            self.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs; no template needs it
            self.globals["raise_exception"] = _raise_from_template
            self.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self.filters["tojson"] = _template_tojson
            self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}

        def is_safe_callable(self, obj):
            return super().is_safe_callable(obj) and obj is not self.concat

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
            budget = _budget()
            budget.step()
            if __obj is not _brrr_loop and __obj is not _brrr_text:
                for value in (*args, *kwargs.values()):
                    budget.integer(value, f"{getattr(__obj, '__name__', 'a function')}()")
                name, owner = getattr(__obj, "__name__", None), getattr(__obj, "__self__", None)
                if name == "replace" and isinstance(owner, str):
                    _check_replace(budget, [owner, *[a for a in args if isinstance(a, str)]])
                if name == "join" and isinstance(owner, str) and len(args) == 1 and not kwargs:
                    args = (list(args[0]),)
                    budget.size(_join_length(args[0], owner), "a joined string")
            result = super().call(__context, __obj, *args, **kwargs)
            budget.size(_sized(result), "a string or list")
            return result

        def call_binop(self, context, operator_name, left, right):
            budget = _budget()
            budget.step()
            _check_binop(budget, operator_name, left, right)
            result = self.binop_table[operator_name](left, right)
            budget.size(_sized(result), "a string or list")
            return result

        def getattr(self, obj, attribute):
            _budget().step()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            _budget().step()
            return super().getitem(obj, argument)

        def wrap_str_format(self, value):
            wrapped = super().wrap_str_format(value)
            if wrapped is not None:
                _budget().format_string(value.__self__, f"str.{value.__name__}")
            return wrapped

    return BoundedEnvironment


def _BoundedEnvironment():
    return _environment_class()()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_binop(budget: _Budget, name: str, left, right) -> None:
    """Refuses an operation whose result would be too large, before it runs."""
    if name == "*":
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and _is_int(count):
                budget.size(len(seq) * max(count, 0), "a repeated string or list")
        if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
            budget.fail(f"multiplied integers of more than {_MAX_INT_BITS} bits")
    elif name == "**":
        if _is_int(left) and _is_int(right) and abs(left) > 1 and right * left.bit_length() > _MAX_INT_BITS:
            budget.fail(f"raised an integer to a power of more than {_MAX_INT_BITS} bits")
    elif name == "+":
        if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            budget.size(len(left) + len(right), "a string or list")
    elif name == "%" and isinstance(left, str):
        budget.format_string(left, "the % operator")
        for value in (right if isinstance(right, tuple) else (right,)):
            budget.integer(value, "the % operator")


def hf_chat_template(directory: Path, tokenizer_config: str | Path | None) -> str | None:
    """The chat template of a Hugging Face checkpoint directory, None when it has none.

    Newer transformers save it as chat_template.jinja (or chat_template.json); older ones inside
    tokenizer_config.json, as a string or as a list of named templates of which "default" is the
    one to use. The separate file wins, as in transformers.
    """
    from .base import file_error, read_json_file, read_text_file

    jinja = Path(directory) / "chat_template.jinja"
    if jinja.is_file():
        return read_text_file(jinja, "chat template")
    as_json = Path(directory) / "chat_template.json"
    if as_json.is_file():
        template = read_json_file(as_json, "chat_template.json").get("chat_template")
        if isinstance(template, str):
            return template
    if tokenizer_config is None:
        return None
    template = read_json_file(tokenizer_config, "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, Mapping)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise file_error(tokenizer_config, "chat_template must be a string or a list of named templates")
    return template


class _TemplateRaised(Exception):
    pass


def _raise_from_template(message):
    raise _TemplateRaised(message)


def _template_tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    if _is_int(indent) and indent > 64:
        _budget().fail(f"passed indent={indent} to tojson")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)):
        raise ArgumentTypeError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, "
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
