"""Seeded Exponential noise by uniforms and one batched logarithm (`decodelab.sampling.ops.exponential`): the same
float32 numbers as `exponential_` with each row's generator, the generators left where `exponential_` leaves them,
the rounding made exact next to float32 midpoints, under every kernel set this CPU has; and the sampler's tokens
unchanged whichever way it draws."""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decodelab.sampling import sampler
from decodelab.sampling.ops import exponential
from decodelab.sampling.ops.exponential import MIN_ENTRIES, _exact_float32, _libm_exponential, exponential_noise
from decodelab.sampling.sampler import SamplingParams, make_generator, sample

LIB = Path(__file__).resolve().parents[2] / "lib"


def _reference(seeds: list[int], widths: list[int], width: int) -> tuple[torch.Tensor, list[torch.Generator]]:
    """What the sampler drew before: `exponential_` on each row's first widths[j] columns, row by row."""
    generators = [make_generator(s) for s in seeds]
    out = torch.ones(len(seeds), width)
    for row, g, w in zip(out, generators, widths):
        row[:w].exponential_(generator=g)
    return out, generators


@pytest.mark.parametrize("rows, width", [(1, 473), (4, 473), (14, 473), (40, 97), (3, 32000)])
def test_equals_exponential_and_leaves_each_generator_where_it_would(rows, width):
    seeds = [1000 * rows + j for j in range(rows)]
    widths = [width if j % 3 else max(1, width // (j + 2)) for j in range(rows)]   # dense rows and top-k-like rows
    expected, reference_gens = _reference(seeds, widths, width)
    generators = [make_generator(s) for s in seeds]
    got = exponential_noise(generators, widths, (rows, width))
    assert got.dtype == torch.float32 and got.shape == (rows, width)
    for j, w in enumerate(widths):
        assert torch.equal(got[j, :w], expected[j, :w])
        assert bool((got[j, w:] > 0).all())                       # the placeholder past a row's width is positive
        assert torch.equal(torch.rand(3, generator=generators[j]), torch.rand(3, generator=reference_gens[j]))


def test_a_changed_seed_changes_the_numbers():
    a = exponential_noise([make_generator(1)], [50], (1, 50))
    b = exponential_noise([make_generator(2)], [50], (1, 50))
    assert not torch.equal(a, b)


def test_the_c_library_reference_is_what_exponential_computes():
    """-math.log1p(-u) (the C library's) against `exponential_` in float64, bit for bit, on the same uniforms (from
    `uniform_` in float64 with the same seed): the double the serial kernel rounds is the C library's, so
    `_libm_exponential`, which rounds that double, stores what it stores."""
    g, h, k = make_generator(7), make_generator(7), make_generator(7)
    stored64 = torch.empty(20_000, dtype=torch.float64).exponential_(generator=g).tolist()
    uniforms = torch.empty(20_000, dtype=torch.float64).uniform_(generator=h).tolist()
    assert stored64 == [-math.log1p(-u) for u in uniforms]
    stored32 = torch.empty(20_000).exponential_(generator=k).tolist()
    assert stored32 == [_libm_exponential(u) for u in uniforms]


def test_the_vectorised_logarithm_is_within_two_ulps_of_the_c_library():
    """The margin `_NEAR` assumes: torch's vectorised -log1p(-u) and the C library's differ by at most 2 ulps of the
    double (each is within 1 ulp of the exact value), well inside the 8 ulps recomputed."""
    g, h = make_generator(11), make_generator(11)
    reference = torch.empty(200_000, dtype=torch.float64).exponential_(generator=g)
    u = torch.empty(200_000, dtype=torch.float64).uniform_(generator=h)
    vectorised = u.neg().log1p_().neg_()
    distance = (vectorised.view(torch.int64) - reference.view(torch.int64)).abs().max()
    assert int(distance) <= 2 < exponential._NEAR


def test_the_recomputation_runs_through_exponential_noise(monkeypatch):
    """With the window widened to half of all doubles, about half the entries of a batch (dense rows and narrower
    ones) are recomputed with the C library's log1p: still `exponential_`'s numbers."""
    monkeypatch.setattr(exponential, "_NEAR", 1 << 27)
    widths, width = [473, 40, 473, 7], 473
    expected, _ = _reference([5, 6, 7, 8], widths, width)
    got = exponential_noise([make_generator(s) for s in (5, 6, 7, 8)], widths, (4, width))
    for j, w in enumerate(widths):
        assert torch.equal(got[j, :w], expected[j, :w])


def test_this_torch_draws_what_the_module_reproduces():
    assert exponential.same_as_exponential() is True


def _near_midpoints(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniforms u whose -log1p(-u) lies next to a midpoint between two float32 values (E in [0.1, 2], where an error
    of u stays within a few ulps of E), and torch's vectorised -log1p(-u) of them."""
    gen = torch.Generator().manual_seed(3)
    lows = (torch.rand(count, generator=gen, dtype=torch.float64) * 1.9 + 0.1).to(torch.float32).to(torch.float64)
    ulp = torch.nextafter(lows.to(torch.float32), torch.tensor(math.inf)).to(torch.float64) - lows
    midpoints = lows + ulp / 2                                    # exactly halfway: representable in float64
    u = -torch.expm1(-midpoints)
    return u, u.neg().log1p_().neg_()


def test_entries_next_to_a_midpoint_are_rounded_as_the_c_library_rounds_them():
    u, e64 = _near_midpoints(2_000)
    bits = (e64.view(torch.int64) + (exponential._NEAR - exponential._HALF)) & exponential._LOW_BITS
    near = int((bits <= 2 * exponential._NEAR).sum())
    assert near > 1_000                                   # the check sees most of them as ambiguous
    naive = e64.to(torch.float32)
    exact = _exact_float32(e64.clone(), u)
    expected = torch.tensor([_libm_exponential(x) for x in u.tolist()])
    assert torch.equal(exact, expected)
    # the rounding these entries needed: at least some differ when rounded without the C library's log1p, or the
    # check would be doing nothing here (SLEEF and the C library disagree in the last bit of about 8% of doubles)
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        assert int((naive != expected).sum()) > 0


_CAPABILITY_CHECK = """
import torch
from decodelab.sampling.ops.exponential import exponential_noise
from decodelab.sampling.sampler import make_generator
torch.set_num_threads(1)
rows, width, total = 64, 473, 0
for s in range(40):
    ref = torch.empty(rows, width)
    for row, j in zip(ref, range(rows)):
        row.exponential_(generator=make_generator(s * rows + j))
    got = exponential_noise([make_generator(s * rows + j) for j in range(rows)], [width] * rows, (rows, width))
    total += int((got != ref).sum())
print(torch.backends.cpu.get_cpu_capability(), total)
"""


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2", "native"])
def test_equal_under_every_kernel_set_this_cpu_has(capability):
    """1.2 million entries per kernel set: torch's vectorised log1p differs by kernel set (scalar C library under
    the portable kernels, SLEEF under AVX2 and AVX-512), the float32 numbers may not."""
    env = {**os.environ, "PYTHONPATH": str(LIB)}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability != "native":
        if capability == "avx2" and "avx2" not in _cpu_flags():
            pytest.skip("this CPU has no AVX2 (torch would not check, and crash)")
        env["ATEN_CPU_CAPABILITY"] = capability
    done = subprocess.run([sys.executable, "-c", _CAPABILITY_CHECK], capture_output=True, text=True, env=env,
                          check=True)
    kernels, differing = done.stdout.split()
    if capability != "native":
        assert kernels == capability.upper()
    assert differing == "0"


@pytest.mark.parametrize("bad, message", [
    (([None, make_generator(1)], [5, 5], (2, 5)), "CPU torch.Generators"),
    (([make_generator(1)], [5], (1, 5, 3)), r"shape must be a tuple \(rows, columns\)"),
    (([], [], (0, 5)), r"shape must be a tuple \(rows, columns\) of ints >= 1"),
    (([make_generator(1)], [5, 5], (1, 5)), "one generator and one width per row"),
    (([make_generator(1)], [6], (1, 5)), r"widths must be ints in \[1, 5\]"),
    (([make_generator(1)], [0], (1, 5)), r"widths must be ints in \[1, 5\]"),
    (([make_generator(1)], [2.0], (1, 5)), r"widths must be ints in \[1, 5\]"),
])
def test_refuses_what_it_cannot_draw_before_any_stream_moves(bad, message):
    generators = [g for g in bad[0] if g is not None]
    before = [g.get_state() for g in generators]
    with pytest.raises(ValueError, match=message):
        exponential_noise(*bad)
    assert all(torch.equal(g.get_state(), state) for g, state in zip(generators, before))


def test_a_subclass_of_torch_generator_is_a_generator():
    class Tagged(torch.Generator):
        pass

    a, b = Tagged(), make_generator(0)
    a.manual_seed(0)
    assert torch.equal(exponential_noise([a], [10], (1, 10)), exponential_noise([b], [10], (1, 10)))


def _tokens(batch_params, logits, min_entries, monkeypatch):
    monkeypatch.setattr(sampler, "MIN_ENTRIES", min_entries)
    generators = [make_generator(p.seed) for p in batch_params]
    return [sample(logits, batch_params, generators).tolist() for _ in range(30)]


@pytest.mark.parametrize("kind", ["dense", "mixed"])
def test_the_sampler_draws_the_same_tokens_either_way(kind, monkeypatch):
    """The same seeded batch, 30 steps, drawn with the batched logarithm and with `exponential_` row by row: the
    same tokens. Mixed: top-k, top-p, min-p and greedy rows beside dense ones (the threshold at 1 entry, so the top-k
    group, 3 to 9 columns per row, takes the batched way too, with its rows' own widths)."""
    rows, vocab = 24, 473
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3
    if kind == "dense":
        params = [SamplingParams(temperature=1.0, seed=j) for j in range(rows)]
    else:
        params = [SamplingParams(temperature=0.9, seed=j, top_k=3 + j % 7 if j % 4 == 0 else 0,
                                 top_p=0.9 if j % 4 == 1 else 1.0, min_p=0.02 if j % 4 == 2 else 0.0)
                  if j % 5 else SamplingParams(temperature=0.0) for j in range(rows)]
    assert 4 * vocab >= MIN_ENTRIES > 2 * vocab                     # the dense group takes it by itself
    batched = _tokens(params, logits, 1, monkeypatch)
    row_by_row = _tokens(params, logits, 10**9, monkeypatch)
    assert batched == row_by_row
    assert len({tuple(step) for step in batched}) > 1               # the draws move: seeded, not frozen


def test_the_sampler_takes_the_batched_way_from_min_entries(monkeypatch):
    """Which way a group draws: batched from MIN_ENTRIES entries (inclusive) of seeded float32 rows on the CPU, row
    by row below it, row by row for float64 logits (their noise is float64, which the batched rounding does not
    give), and row by row where this torch's exponential_ is not what the module reproduces."""
    calls = []

    def spy(generators, widths, shape):
        calls.append(sum(widths))
        return exponential_noise(generators, widths, shape)

    vocab = 473
    monkeypatch.setattr(sampler, "exponential_noise", spy)
    monkeypatch.setattr(sampler, "MIN_ENTRIES", 4 * vocab)
    assert MIN_ENTRIES > 3 * vocab                                  # the real threshold leaves 3 rows of tiny-zh out
    for rows, dtype, same, taken in [(3, torch.float32, True, False), (4, torch.float32, True, True),
                                     (4, torch.float64, True, False), (4, torch.float32, False, False)]:
        calls.clear()
        monkeypatch.setattr(sampler, "same_as_exponential", lambda same=same: same)
        logits = torch.randn(rows, vocab, dtype=dtype)
        sample(logits, [SamplingParams(temperature=1.0, seed=j) for j in range(rows)],
               [make_generator(j) for j in range(rows)])
        assert calls == ([rows * vocab] if taken else []), (rows, dtype, same)
