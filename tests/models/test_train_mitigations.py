"""The training options behind chapter 05's controlled mitigations: scheduled sampling's inputs
(`decodelab.models.train.scheduled_inputs`) and the DAgger recipes (`decodelab.measure.dagger.Recipe`, `soft_batch`)."""
from types import SimpleNamespace

import pytest
import torch

from decodelab.measure.dagger import RECIPES, Recipe, soft_batch
from decodelab.measure.exposure import RESTART
from decodelab.models.train import PRESETS, TrainParams, encode_batch, scheduled_inputs
from decodelab.models.tokenizer import build_tokenizer
from decodelab.toy.documents import DocumentLanguage

LANG = DocumentLanguage()
TOKENIZER = build_tokenizer(LANG.alphabet, model_max_length=512)
SPECIAL = TOKENIZER.all_special_ids
FAVOURITE = TOKENIZER.convert_tokens_to_ids("米")


class OneTokenModel:
    """A mock causal LM that puts almost all its mass on `</s>` and the rest on one character, "米": with special
    tokens excluded, every sample is "米"."""

    def __call__(self, input_ids, attention_mask):
        logits = torch.full((*input_ids.shape, len(TOKENIZER)), -30.0)  # [B, T, V]
        logits[..., TOKENIZER.eos_token_id] = 30.0
        logits[..., FAVOURITE] = 0.0
        return SimpleNamespace(logits=logits)


def batch(n: int = 32):
    return encode_batch(TOKENIZER, LANG.sample(n, seed=11))


def test_probability_zero_keeps_the_data_and_one_replaces_every_character_but_no_special_token():
    ids, labels = batch()
    model = OneTokenModel()
    assert torch.equal(scheduled_inputs(model, ids, labels, 0.0, SPECIAL, torch.Generator().manual_seed(0)), ids)
    out = scheduled_inputs(model, ids, labels, 1.0, SPECIAL, torch.Generator().manual_seed(0))
    special = torch.isin(ids, torch.tensor(SPECIAL))
    assert torch.equal(out[special], ids[special])  # <s>, </s> and padding untouched
    assert torch.equal(out[~special], torch.full_like(out[~special], FAVOURITE))  # every character is the model's


def test_the_share_of_replaced_characters_is_the_probability():
    """"米" is rare in the data, so a changed character is a replaced one: 30% of about 6,000 characters, within
    4 standard errors (a seeded draw; an off-by-one in the comparison or a wrong mask would fail it)."""
    ids, labels = batch(32)
    out = scheduled_inputs(OneTokenModel(), ids, labels, 0.3, SPECIAL, torch.Generator().manual_seed(5))
    character = ~torch.isin(ids, torch.tensor(SPECIAL)) & (ids != FAVOURITE)
    share = (out[character] == FAVOURITE).float().mean().item()
    n = int(character.sum())
    assert n > 4000
    assert abs(share - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5
    again = scheduled_inputs(OneTokenModel(), ids, labels, 0.3, SPECIAL, torch.Generator().manual_seed(5))
    assert torch.equal(out, again)  # seeded: the same inputs again


def test_scheduled_sampling_checks_its_input():
    ids, labels = batch(2)
    with pytest.raises(ValueError, match="probability must be in"):
        scheduled_inputs(OneTokenModel(), ids, labels, 1.5, SPECIAL, torch.Generator())
    with pytest.raises(ValueError, match="one shape"):
        scheduled_inputs(OneTokenModel(), ids, labels[:, :-1], 0.5, SPECIAL, torch.Generator())
    with pytest.raises(ValueError, match="scheduled_sampling must be a probability"):
        TrainParams(scheduled_sampling=-0.1)
    with pytest.raises(ValueError, match="step must be an int"):
        TrainParams(steps=10, scheduled_sampling=0.5).replace_probability(10)


def test_the_replacement_probability_rises_linearly_to_the_preset():
    params = PRESETS["tiny-zh-doc-small-scheduled"]
    assert params.replace_probability(0) == 0.0
    assert params.replace_probability(params.steps // 2) == pytest.approx(params.scheduled_sampling / 2)
    # everything but scheduled sampling is the baseline's: one change
    base = PRESETS["tiny-zh-doc-small"]
    assert params == TrainParams(**{**base.__dict__, "scheduled_sampling": params.scheduled_sampling})
    assert PRESETS["tiny-zh-doc-small-4xdata"] == TrainParams(**{**base.__dict__, "steps": 4 * base.steps})


def test_recipes_differ_from_each_other_by_one_thing_and_count_their_rows():
    params = PRESETS["tiny-zh-doc-small"]
    early, late = 0, params.steps // 4
    rows = {name.removeprefix("tiny-zh-doc-small-"): (r.data_rows(params, late), r.own_rows(params, late))
            for name, r in RECIPES.items()}
    assert rows == {"soft": (16, 0), "dagger": (8, 8), "dagger-fulldata": (16, 8), "dagger-fulldata-noend": (16, 8)}
    assert all((r.data_rows(params, early), r.own_rows(params, early)) == (16, 0) for r in RECIPES.values())
    assert RECIPES["tiny-zh-doc-small-dagger-fulldata"] == Recipe(rollouts=True)
    assert RECIPES["tiny-zh-doc-small-dagger-fulldata-noend"] == Recipe(rollouts=True, restart_labels=False)
    with pytest.raises(ValueError, match="only apply with rollouts"):
        Recipe(rollouts=False, replace_data=True)
    with pytest.raises(TypeError, match="rollouts must be a bool"):
        Recipe(rollouts=1)


def test_soft_batch_without_restart_labels_leaves_the_broken_sentence_untrained():
    text = "这是小明在北京的一天。小明喜欢吃书本。小明"
    broken = range(text.index("书") + 1, text.index("本。") + 2)  # after the error, up to the sentence's 。
    restart = TOKENIZER.convert_tokens_to_ids(RESTART)
    with_labels = soft_batch(TOKENIZER, LANG, [text]).targets[0]  # [T, V]
    without = soft_batch(TOKENIZER, LANG, [text], restart_labels=False).targets[0]
    for t in broken:
        assert with_labels[t, restart] == 1.0 and without[t].sum() == 0.0
    outside = [t for t in range(len(text) + 1) if t not in broken]
    assert torch.equal(with_labels[outside], without[outside])
    assert all(without[t].sum() == pytest.approx(1.0) for t in outside)
    with pytest.raises(ValueError, match="texts must be a non-empty list"):
        soft_batch(TOKENIZER, LANG, [])
