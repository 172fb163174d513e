"""Chat prompts: which chat template the server uses, and a chat request's messages rendered into prompt token ids.

The prompt of `POST /v1/chat/completions` is the tokenizer's chat template applied to the messages
(`tokenizer.apply_chat_template`, as vLLM does), so a hub model that ships a template is served as vLLM serves it.
`--chat-template` (a file path or the template itself) overrides the tokenizer's. The shipped models
(`decodelab.models.load.SHIPPED`: tiny-zh, tiny-zh-doc and the small doc variants) have no template, and their assets
stay as they are: for them the server uses `TOY_TURNS`, the documented default below. Any other model without a
template, and no `--chat-template`, gets a 400 that says so.

The shipped models were never trained on dialogues. They were trained on rows `<s> text </s>` of the toy language
(one sentence, or one document for tiny-zh-doc), and their vocabulary has no role or turn token. `TOY_TURNS` builds a
dialogue out of the one structure they know:

- the messages of one side are joined into one text: consecutive system, developer and user messages with nothing
  between them, and each run of assistant messages likewise;
- a change of side ends the text and starts a new one: `</s><s>`;
- the last text is closed with `</s>`, and the reply's start is marked with `<s>` (the generation prompt, added
  with `add_generation_prompt`, the default): the prompt ends in `</s><s>`, so the reply is the next text, begun
  where the model begins every text.

    [{"role": "user", "content": "小明"}]                    ->  <s> 小 明 </s> <s>
    [system "今天，", user "小明", assistant "喜欢", user "吃"] ->  <s> 今天，小明 </s> <s> 喜欢 </s> <s> 吃 </s> <s>

Both markers are the tokenizer's own special tokens (`bos_token`, `eos_token`), so every shipped tokenizer encodes
them, and a message whose text holds a special token's spelling ("</s>") is refused (400 naming `messages`), so no
text a user sends can forge a turn. What the model does with the marker was measured on tiny-zh: after the user turn
"小明" the greedy reply is "小明喜欢吃米饭。", a new sentence rather than the rest of the user's (a test holds this),
and 78 of 100 samples at temperature 1 (seeds 0-99) are valid sentences of the language. Without a marker the model only continued the user's text, and a user turn that was already
a whole sentence ("今天天气很好。") got an empty reply. A reply is still no answer: the model has never seen a question
answered; it writes another sentence of its language, shaped by the text before it only as far as attention to an
earlier row, never trained, carries. `continue_final_message` (with `add_generation_prompt` false) leaves the last
message's text open instead, and the model continues it, exactly as `/v1/completions` continues that text.

    template = resolve_chat_template("tiny-zh", tokenizer, None)              # TOY_TURNS: tiny-zh has none
    ids = render_chat(tokenizer, template, [{"role": "user", "content": "小明"}])   # [<s>, 小, 明, </s>, <s>]

Used by: decodelab.serve.app. Taught in: chapters/07c-serving.ipynb
"""
from __future__ import annotations

from pathlib import Path

from decodelab.models.load import SHIPPED
from decodelab.validation import ParamError

# the shipped models' default template: each side's messages joined into one text <s> ... </s>; a change of side ends
# the text and begins the next one (</s><s>); the generation prompt, the reply's start, is the <s> after the last </s>
TOY_TURNS = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if not loop.first and (message['role'] == 'assistant') != (loop.previtem['role'] == 'assistant') %}"
    "{{ eos_token }}{{ bos_token }}{% endif %}"
    "{{ message['content'] }}"
    "{% endfor %}"
    "{{ eos_token }}{% if add_generation_prompt %}{{ bos_token }}{% endif %}")

# every shipped model gets TOY_TURNS by default (keyed by --model's name): their tokenizers have no template
DEFAULT_TEMPLATES = dict.fromkeys(SHIPPED, TOY_TURNS)

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
    the tokenizer's own) and tokenized without adding special tokens (the template writes them, as in vLLM). A
    message whose text spells one of the tokenizer's special tokens is refused (ParamError naming `messages`): the
    tokenizer would read it as that token, a turn marker the user could forge."""
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
    for i, message in enumerate(messages):
        forged = [token for token in getattr(tokenizer, "all_special_tokens", ()) if token in message["content"]]
        if forged:
            raise ParamError("messages", f"messages[{i}].content holds the special token {forged[0]!r}; only the chat "
                                         f"template writes special tokens (they mark turns)")
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk in ids and tokenizer.unk_token not in text:
        unknown = sorted({ch for m in messages for ch in m["content"] if tokenizer.convert_tokens_to_ids(ch) == unk})
        raise ParamError("messages", f"messages have characters outside the tokenizer's vocabulary: {unknown!r:.200}; "
                                     f"they would be read as {tokenizer.unk_token!r}")
    return ids
