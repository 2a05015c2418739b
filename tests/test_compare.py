"""The judge, on real tensors and real models: tiny, empty, negated, noisy and cached outputs."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn

from pipeline.measure.compare import Verdict, combine, judge, tolerance, uninformative
from pipeline.leaves import tensor_leaves
from pipeline.measure.references import reference_at


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def tiny_gpt2():
    """A real GPT-2 with random weights: logits plus its default DynamicCache (2 layers of keys, values)."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)
    return transformers.GPT2LMHeadModel(config).eval(), {"input_ids": torch.randint(0, 100, (2, 8))}


def test_outputs_of_5e_14_are_judged_on_their_own_scale(gen):
    # efficientnet_b0 with random weights answers about 5e-14; the old absolute floor of 1e-6 passed anything.
    ref = 5e-14 * torch.randn(4, 10, generator=gen)
    for wrong in (torch.zeros(4, 10), -ref, ref + 1e-9 * torch.randn(4, 10, generator=gen)):
        verdict = judge(wrong, ref)
        assert not verdict.ok and not verdict.uninformative, verdict
        assert verdict.error >= 1 and verdict.reason.startswith("output: ")
    close = judge(ref * (1 + 1e-6), ref)
    assert close.ok and close.error == pytest.approx(1e-6, rel=0.1) and close.tensors == 1


def test_negation_fails_the_direction_test_at_any_magnitude(gen):
    base = torch.randn(64, generator=gen)
    for magnitude in (1e-30, 1e-14, 1.0, 1e20):
        verdict = judge(-base * magnitude, base * magnitude)
        assert not verdict.ok and verdict.error == pytest.approx(2.0), magnitude


def test_a_wrong_bulk_under_a_right_maximum_fails_on_direction(gen):
    # One element of 1.0 and 100000 of about 5e-4: negating the bulk moves no element by more than
    # 0.5% of the maximum, so the magnitude test passes it; the direction test does not.
    ref = 5e-4 * torch.randn(100_001, generator=gen)
    ref[0] = 1.0
    wrong = torch.cat([ref[:1], -ref[1:]])
    assert (wrong - ref).abs().max() < tolerance(None)
    verdict = judge(wrong, ref)
    assert not verdict.ok and "direction differs" in verdict.reason


def test_a_small_output_beside_a_large_one_is_held_to_its_own_scale(gen):
    big, small = 1e3 * torch.randn(8, 1000, generator=gen), torch.randn(8, 3, generator=gen)
    verdict = judge((big, -small), (big, small))
    assert not verdict.ok and verdict.tensors == 2
    assert verdict.reason.startswith("output[1]: ")  # the leaf that failed, by name
    assert judge((big, small * (1 + 1e-6)), (big, small)).ok


def test_empty_outputs_match_and_differing_shapes_or_dtypes_do_not():
    # A detector with random weights finds no boxes: (0, 4) boxes, (0,) scores and labels.
    empty = {"boxes": torch.empty(0, 4), "scores": torch.empty(0), "labels": torch.empty(0, dtype=torch.int64)}
    assert judge(torch.empty(0, 4), torch.empty(0, 4)).ok
    assert judge(dict(empty), empty).ok
    one_box = {**empty, "boxes": torch.zeros(1, 4)}
    assert "output.boxes: shape (1, 4) differs from eager's (0, 4)" in judge(one_box, empty).reason
    assert "dtype torch.float64 differs" in judge(torch.empty(0, 4, dtype=torch.float64), torch.empty(0, 4)).reason
    assert "output.scores is missing" in judge({"boxes": empty["boxes"]}, empty).reason


def test_uninformative_references_say_why_instead_of_passing():
    zeros = judge(torch.zeros(4, 10), torch.zeros(4, 10))  # all zeros in eager and candidate: no mismatch
    assert not zeros.ok and zeros.uninformative and "zero to the float type's precision" in zeros.reason
    assert "is constant within the tolerance" in judge(torch.full((4, 10), 0.5), torch.full((4, 10), 0.5)).reason
    nan = judge(torch.ones(3), torch.tensor([1.0, float("nan"), 1.0]))
    assert nan.uninformative and "cannot be checked" in nan.reason
    assert not uninformative(torch.tensor([2.5]))  # one element cannot be judged constant
    # One informative leaf is enough, and the constant one is still compared.
    assert judge((torch.zeros(4), torch.arange(3.0)), (torch.zeros(4), torch.arange(3.0))).ok
    assert judge((torch.ones(4), torch.arange(3.0)), (torch.zeros(4), torch.arange(3.0))).status == "mismatch"
    assert judge(None, None).uninformative  # no tensors at all


def test_a_subnormal_reference_needs_a_subnormal_answer():
    # 1e-40 is below float32's smallest normal number (1.2e-38): its relative precision is gone.
    ref = torch.tensor([1e-40, -2e-40, 3e-40])
    assert judge(torch.zeros(3), ref).uninformative  # flushed to zero: fine, but proves nothing
    assert judge(torch.full((3,), 1e-3), ref).status == "mismatch"


def test_non_finite_candidates_fail_and_integers_compare_exactly():
    ref = torch.linspace(-1, 1, 8)
    bad = ref.clone()
    bad[3] = float("nan")
    assert judge(bad, ref).reason == "output: holds NaN or inf where eager is finite"
    labels = torch.tensor([3, 1, 4, 1, 5])
    assert judge(labels.clone(), labels).ok
    assert "1 of 5 elements differ" in judge(torch.tensor([3, 1, 4, 1, 6]), labels).reason


def test_bf16_autocast_is_held_to_the_bf16_tolerance(gen):
    # A real MLP under bf16 autocast: outputs up to about 0.7 come back in bf16, a few 1e-3 off.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 32)).eval()
    x = torch.randn(16, 64, generator=gen)
    with torch.inference_mode():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
    assert out.dtype == torch.bfloat16
    verdict = judge(out, ref, torch.bfloat16)
    assert verdict.ok and 1e-3 < verdict.error <= tolerance(torch.bfloat16)
    assert "dtype torch.bfloat16 differs" in judge(out, ref).reason  # an fp32 backend may not return bf16
    assert not judge(-out, ref, torch.bfloat16).ok
    # Values spread over 8% of their size are informative in fp32 but constant within bf16's tolerance.
    narrow = 1 + 0.08 * torch.rand(16, generator=gen)
    assert not uninformative(narrow) and "constant within" in uninformative(narrow, torch.bfloat16)


class Pair:
    """A pytree node registered without key paths, as some libraries register theirs."""

    def __init__(self, first, second):
        self.first, self.second = first, second


pytree.register_pytree_node(Pair, lambda p: ([p.first, p.second], None), lambda children, _: Pair(*children))


def test_every_tensor_leaf_is_named_by_its_path():
    stats = collections.namedtuple("Stats", "mean var")

    class Output(collections.OrderedDict):
        """Stands in for a ModelOutput of a transformers release that does not register it as a pytree node."""

    out = {"logits": torch.ones(1), "aux": (None, stats(torch.ones(1), 3)), "extra": Output(hidden=[torch.ones(1)]),
           "pair": Pair(torch.ones(1), (torch.ones(1),))}
    assert list(tensor_leaves(out)) == ["output.logits", "output.aux[1].mean", "output.extra.hidden[0]",
                                        "output.pair[0]", "output.pair[1][0]"]
    assert list(tensor_leaves(torch.ones(2))) == ["output"] and tensor_leaves((None, 1.0)) == {}


def test_every_cache_tensor_of_gpt2_is_named_and_compared():
    model, inputs = tiny_gpt2()
    with torch.inference_mode():
        ref = model(**inputs)
    paths = list(tensor_leaves(ref))
    assert len(paths) == 5 and paths[0] == "output.logits"  # logits, then keys and values of 2 layers
    assert paths[-1].endswith(".layers[1].values")
    assert judge(model(**inputs), ref).ok
    with torch.inference_mode():
        wrong = model(**inputs)
    cache = next(v for k, v in wrong.items() if k != "logits")
    cache.layers[1].values = cache.layers[1].values * 1.5  # eager's logits, a corrupted cache
    verdict = judge(wrong, ref)
    assert not verdict.ok and verdict.tensors == 5
    assert verdict.reason.startswith(paths[-1] + ": ")


def test_inductor_on_cpu_passes_on_gpt2_with_its_cache():
    model, inputs = tiny_gpt2()
    torch._dynamo.reset()
    with torch.inference_mode():
        ref = model(**inputs)
        out = torch.compile(model)(**inputs)
    verdict = judge(out, ref)
    assert verdict.ok and verdict.tensors == 5 and verdict.error < 1e-4, verdict


def test_combine_reports_a_mismatch_before_an_unproved_check():
    ok, unproved = Verdict(True, 1e-7, tensors=2), Verdict(False, 0.0, "constant", 2, uninformative=True)
    mismatch = Verdict(False, 2.0, "output: negated", 2)
    both = combine({"batch size 1": unproved, "batch size 8": mismatch, "graph 8 with 5 rows": ok})
    assert (both.status, both.error, both.tensors) == ("mismatch", 2.0, 6)
    assert both.reason == "batch size 8: output: negated"
    assert combine({"batch size 1": ok, "batch size 8": unproved}).status == "uninformative"
    assert combine({"batch size 1": ok}).ok


def test_the_reference_comes_from_the_first_input_source_that_can_judge():
    # Sources are labelled batch-size -> inputs callables: a user's own examples plug in as one more.
    sources = [("zeros", lambda bs: {"input": torch.zeros(bs, 4)}),
               ("user examples", lambda bs: {"input": torch.linspace(-1, 1, 4 * bs).reshape(bs, 4)})]
    ref = reference_at(nn.ReLU(), 2, sources)
    assert ref.source == "user examples" and not ref.uninformative
    stuck = reference_at(nn.ReLU(), 2, sources[:1])
    assert stuck.source == "zeros" and "zero to the float type's precision" in stuck.uninformative


def test_judging_chunk_by_chunk_gives_the_whole_tensors_figures(gen, monkeypatch):
    """Outputs are judged CHUNK elements at a time (bounded memory, on the output's device); the figures must be
    those of the whole tensors: a flaw in the last, short chunk is found, and the error and scores do not move."""
    from pipeline.measure import accuracy, compare

    r = torch.randn(13, 31, generator=gen)
    close = r + 1e-4 * torch.randn(13, 31, generator=gen)
    flawed = r.clone()
    flawed[-1, -1] += 10  # in the last chunk of 7 elements, which holds only 403 % 7 = 4 of them
    whole = {name: (judge(c, r), [accuracy.leaf_score(c, r, m) for m in accuracy.METRICS])
             for name, c in (("close", close), ("flawed", flawed), ("same", r.clone()))}
    monkeypatch.setattr(compare, "CHUNK", 7)
    for name, c in (("close", close), ("flawed", flawed), ("same", r.clone())):
        verdict, scores = judge(c, r), [accuracy.leaf_score(c, r, m) for m in accuracy.METRICS]
        assert verdict.ok == whole[name][0].ok and verdict.error == pytest.approx(whole[name][0].error, rel=1e-9)
        assert scores == pytest.approx(whole[name][1], rel=1e-9)
    assert not judge(flawed, r).ok and judge(close, r).ok
    assert uninformative(torch.full((5, 3), 2.0)) and not uninformative(r)
