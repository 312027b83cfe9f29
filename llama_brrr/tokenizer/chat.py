"""Chat templates: a model's Jinja template rendered the way transformers renders it, ChatML when
the model's files carry none, and where Hugging Face checkpoints keep their template."""

from __future__ import annotations

import json
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


class ChatTemplate:
    """One model's chat template (None: ChatML), compiled on first use.

    Rendered like transformers does: sandboxed, trim_blocks and lstrip_blocks, loop controls,
    `raise_exception`, `strftime_now` and a `tojson` that keeps non-ASCII text.
    """

    def __init__(self, text: str | None, source: str):
        self.from_files = text is not None
        self.text = text if text is not None else DEFAULT_CHAT_TEMPLATE
        self._source = source
        self._compiled = None

    def render(self, messages, add_generation_prompt: bool, bos_token: str, eos_token: str) -> str:
        import jinja2

        checked = _check_messages(messages)
        template = self._compile()
        try:
            return template.render(messages=checked, add_generation_prompt=bool(add_generation_prompt),
                                   bos_token=bos_token, eos_token=eos_token)
        except _TemplateRaised as error:
            raise ValueError(f"the chat template of {self._source} rejected the messages: {error}") from None
        except jinja2.TemplateError as error:  # undefined names, sandbox violations
            raise ValueError(f"the chat template of {self._source} failed on these messages: {error}") from None

    def _compile(self):
        if self._compiled is None:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            from .base import file_error

            environment = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            environment.globals["raise_exception"] = _raise_from_template
            environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            environment.filters["tojson"] = _template_tojson
            try:
                self._compiled = environment.from_string(self.text)
            except jinja2.TemplateSyntaxError as error:
                raise file_error(self._source, f"the chat template is not valid Jinja "
                                 f"(line {error.lineno}: {error.message}); pass messages through another "
                                 f"template or fix the file") from None
        return self._compiled


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
