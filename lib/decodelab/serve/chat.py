"""Chat prompts: which chat template the server uses, and a chat request's messages rendered into prompt token ids.

The prompt of `POST /v1/chat/completions` is the tokenizer's chat template applied to the messages
(`tokenizer.apply_chat_template`, as vLLM does), so a hub model that ships a template is served as vLLM serves it.
`--chat-template` (a file path or the template itself) overrides the tokenizer's. The shipped models (tiny-zh,
tiny-zh-doc and the small doc variants) have no template, and their assets stay as they are: for them the server uses
`JOINED_TURNS`, the documented default below. Any other model without a template, and no `--chat-template`, gets a
400 that says so.

`JOINED_TURNS` writes the BOS token and then every message's text, in order, with nothing between them; the reply
starts where the last message ends. The shipped models were trained on plain toy-language text, never on dialogues,
and their vocabulary holds no role or turn marker: any marker would be text they never saw. So a chat request to
tiny-zh continues the joined text, exactly as `/v1/completions` continues the same prompt (a test holds this).

    template = resolve_chat_template("tiny-zh", tokenizer, None)      # JOINED_TURNS: tiny-zh has none
    ids = render_chat(tokenizer, template, [{"role": "user", "content": "小明"}])   # [<s>, 小, 明]

Used by: decodelab.serve.app. Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

from pathlib import Path

from decodelab.validation import ParamError

# the shipped models' default template: BOS, then the messages' texts joined; the generation prompt adds nothing
JOINED_TURNS = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"

# the models whose tokenizer has no template and that get JOINED_TURNS by default (keyed by --model's name)
DEFAULT_TEMPLATES = {name: JOINED_TURNS for name in ("tiny-zh", "tiny-zh-doc", "tiny-zh-doc-small",
                                                     "tiny-zh-doc-small-soft", "tiny-zh-doc-small-dagger")}

_JINJA_CHARS = "{}\n"


def load_chat_template(value: str) -> str:
    """`--chat-template`'s value as a template: the text of the file it names, or the value itself when it is a
    template (holds `{`, `}` or a newline). A value that is neither raises ValueError (vLLM's rule)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"--chat-template must be a file path or a Jinja template, got {value!r}")
    if any(ch in value for ch in _JINJA_CHARS):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"--chat-template {value!r} is neither a readable file nor a template (a template holds "
                         f"'{{' or '}}')")
    return path.read_text(encoding="utf-8")


def resolve_chat_template(model: str, tokenizer, override: str | None) -> str | None:
    """The template the server renders chats with: `override` (--chat-template, loaded) if given, else None when
    the tokenizer has its own (apply_chat_template uses it), else the shipped default for `model`, else None with
    `has_template` False. Returns the template string to pass, or None to use the tokenizer's."""
    if override is not None:
        return load_chat_template(override)
    if getattr(tokenizer, "chat_template", None):
        return None
    return DEFAULT_TEMPLATES.get(model)


def has_template(tokenizer, template: str | None) -> bool:
    return template is not None or bool(getattr(tokenizer, "chat_template", None))


def message_text(content, index: int) -> str:
    """A message's `content` as text: a string, or a list of `{"type": "text", "text": ...}` parts joined."""
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ParamError("messages", f"messages[{index}].content[{j}] must be a text part "
                                         f"{{\"type\": \"text\", \"text\": ...}}; this server reads text only, got "
                                         f"type {part.get('type')!r}")
        parts.append(part["text"])
    return "".join(parts)


def render_chat(tokenizer, template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> list[int]:
    """The prompt's token ids for `messages` (dicts with `role` and text `content`), rendered by `template` (None:
    the tokenizer's own) and tokenized without adding special tokens (the template writes them, as in vLLM)."""
    if not has_template(tokenizer, template):
        raise ParamError("messages", "this model has no chat template: its tokenizer defines none and the server was "
                                     "started without --chat-template; use /v1/completions, or restart the server "
                                     "with --chat-template FILE_OR_TEMPLATE")
    try:
        text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message)
    except Exception as error:      # jinja2's TemplateError and the template's own raise_exception
        raise ParamError("messages", f"the chat template could not render these messages: "
                                     f"{type(error).__name__}: {error}") from error
    if not isinstance(text, str):
        raise ParamError("messages", f"the chat template rendered {type(text).__name__}, not text")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk in ids and tokenizer.unk_token not in text:
        unknown = sorted({ch for m in messages for ch in m["content"] if tokenizer.convert_tokens_to_ids(ch) == unk})
        raise ParamError("messages", f"messages have characters outside the tokenizer's vocabulary: {unknown!r:.200}; "
                                     f"they would be read as {tokenizer.unk_token!r}")
    return ids
