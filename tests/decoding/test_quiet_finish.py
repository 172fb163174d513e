"""`quiet_finish` states what `finish_reason` guarantees: below the length it names, a token outside its set never
ends a sample. Checked exhaustively over small settings, and shown to be tight (each bound is reached)."""
import itertools

import pytest

from decodelab.decoding.request import finish_reason, quiet_finish
from decodelab.sampling import SamplingParams

EOS = {2}


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=6),
    SamplingParams(max_tokens=6, ignore_eos=True),
    SamplingParams(max_tokens=6, stop_token_ids=[7, 9]),
    SamplingParams(max_tokens=6, min_tokens=3, stop_token_ids=[7]),
    SamplingParams(max_tokens=20, min_tokens=2),
], ids=["eos", "ignore_eos", "stop tokens", "min_tokens", "context first"])
@pytest.mark.parametrize("context", [None, 12])
def test_quiet_finish_is_what_finish_reason_guarantees(params, context):
    prompt = 4
    ends, length = quiet_finish(params, prompt, EOS, context)
    reached = set()
    for token, num_tokens in itertools.product(range(12), range(prompt + 1, prompt + params.max_tokens + 1)):
        if context is not None and num_tokens > context:
            continue
        reason = finish_reason(params, token, num_tokens - prompt, num_tokens, EOS, context, None)
        if token not in ends and num_tokens < length:
            assert reason is None, (token, num_tokens)
        elif reason is not None:
            reached.add("token" if token in ends and num_tokens < length else "length")
    assert "length" in reached and (not ends or "token" in reached)
    assert (2 in ends) == (not params.ignore_eos)


def test_stop_strings_leave_it_to_the_rule():
    assert quiet_finish(SamplingParams(stop=["。"]), 4, EOS, None) is None
