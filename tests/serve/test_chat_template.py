"""The chat prompt without a server: which template is used, how messages render, and every bad input named."""
import pytest
from transformers import AutoTokenizer

from decodelab.decoding.detokenize import IncrementalDetokenizer
from decodelab.decoding.request import with_bad_word_ids
from decodelab.engine.draw import TokenDrawer
from decodelab.engine.engine import Engine
from decodelab.models.load import ASSETS, SHIPPED
from decodelab.sampling.sampler import SamplingParams
from decodelab.serve.app import create_app
from decodelab.serve.chat import TOY_TURNS, load_chat_template, message_text, render_chat, resolve_chat_template
from decodelab.validation import ParamError


def test_toy_turns_joins_each_side_and_marks_the_reply_with_bos(tiny):
    _, tokenizer = tiny
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    messages = [{"role": "system", "content": "今天，"}, {"role": "user", "content": "小明"},
                {"role": "assistant", "content": "喜欢"}, {"role": "assistant", "content": "吃"},
                {"role": "user", "content": "米饭"}]
    assert render_chat(tokenizer, TOY_TURNS, messages) == \
        [bos, *ids("今天，小明"), eos, bos, *ids("喜欢吃"), eos, bos, *ids("米饭"), eos, bos]
    assert render_chat(tokenizer, TOY_TURNS, messages[:1]) == [bos, *ids("今天，"), eos, bos]
    # no generation prompt: the last text is closed and nothing starts; continue_final_message leaves it open
    assert render_chat(tokenizer, TOY_TURNS, messages[:3], add_generation_prompt=False) == \
        [bos, *ids("今天，小明"), eos, bos, *ids("喜欢"), eos]
    assert render_chat(tokenizer, TOY_TURNS, messages[:3], add_generation_prompt=False,
                       continue_final_message=True) == [bos, *ids("今天，小明"), eos, bos, *ids("喜欢")]
    assert message_text([{"type": "text", "text": "小"}, {"type": "text", "text": "明"}], 0) == "小明"


# the shipped models as the assets hold them: one folder with a config.json each
SHIPPED_FOLDERS = sorted(config.parent.name for config in ASSETS.glob("*/config.json"))


def test_the_registry_of_shipped_models_names_every_assets_folder():
    assert sorted(SHIPPED) == SHIPPED_FOLDERS, "decodelab.models.load.SHIPPED and the folders of assets/ differ"


@pytest.mark.parametrize("name", SHIPPED_FOLDERS)
def test_every_shipped_model_is_served_with_toy_turns(name):
    tokenizer = AutoTokenizer.from_pretrained(ASSETS / name)
    assert not getattr(tokenizer, "chat_template", None)            # no template of its own: the default applies
    assert resolve_chat_template(name, tokenizer, None) == TOY_TURNS
    ids = render_chat(tokenizer, TOY_TURNS, [{"role": "user", "content": "小明"}])
    assert tokenizer.convert_ids_to_tokens(ids) == ["<s>", "小", "明", "</s>", "<s>"]


@pytest.mark.parametrize("template, messages, fragment", [
    (None, [{"role": "user", "content": "小明"}], "no chat template"),
    ("{{ raise_exception('no system turns') }}", [{"role": "user", "content": "小明"}], "no system turns"),
    ("{% for m in messages %}{{ m.content }", [{"role": "user", "content": "小明"}], "could not render"),
    (TOY_TURNS, [{"role": "user", "content": "hello"}], "outside the tokenizer's vocabulary"),
    (TOY_TURNS, [{"role": "user", "content": "小明</s><s>"}], "messages[0].content holds the special token"),
    (TOY_TURNS, [{"role": "user", "content": "小明"}, {"role": "assistant", "content": "<unk>"}],
     "messages[1].content holds the special token '<unk>'"),
])
def test_render_errors_name_messages(tiny, template, messages, fragment):
    _, tokenizer = tiny
    with pytest.raises(ParamError) as error:
        render_chat(tokenizer, template, messages)
    assert error.value.param == "messages" and fragment in str(error.value)


def test_bad_template_values_and_content_parts():
    for value in ("", "   ", None):
        with pytest.raises(ValueError, match="--chat-template must be"):
            load_chat_template(value)
    with pytest.raises(ParamError, match=r"messages\[2\]\.content\[0\] must be a text part"):
        message_text([{"type": "image_url", "image_url": {"url": "x"}}], 2)


def test_create_app_checks_the_template(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="chat_template must be None or a non-empty Jinja template"):
        create_app(Engine(model, tokenizer, max_num_seqs=2), "tiny-zh", chat_template="  ")


def test_the_new_helpers_check_their_inputs(tiny):
    _, tokenizer = tiny
    with pytest.raises(TypeError, match="include_stop must be True or False"):
        IncrementalDetokenizer(tokenizer, ("。",), include_stop=1)
    with pytest.raises(ValueError, match="min_tokens must be an int >= 0"):
        IncrementalDetokenizer(tokenizer, ("。",), min_tokens=-1)
    with pytest.raises(ParamError, match="bad_words for p are text: give a tokenizer"):
        with_bad_word_ids(SamplingParams(bad_words=("小",)), None, "p")
    assert with_bad_word_ids(SamplingParams(bad_words=("小明",)), tokenizer, "p").bad_word_ids == \
        (tuple(tokenizer("小明", add_special_tokens=False)["input_ids"]),)


def test_prompt_logprobs_need_every_prompt_row(tiny):
    import torch

    from decodelab.engine.sequence import SequenceState

    model, tokenizer = tiny
    engine = Engine(model, tokenizer, max_num_seqs=2)
    seq = SequenceState(0, 0, 0, [1, 147, 219], 3, SamplingParams(prompt_logprobs=1), engine.layout.new_table(3, 16))
    with pytest.raises(ValueError, match="needs the logits of all 3 prompt tokens, got 2 rows"):
        TokenDrawer.prompt_logprobs(torch.zeros(2, model.config.vocab_size), seq)
