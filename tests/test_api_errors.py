"""The library API (``csdgen.generate``, ``decode_images``, ``pil_images``, rules, ``classes``): a bad
argument is one line naming the value and what is allowed."""

from __future__ import annotations

import pytest
import torch

import csdgen

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)


def _rule_cases():
    import csdgen
    from csdgen.acceptance import GSD, Lantern

    def codebook():
        import torch

        return torch.randn(16, 4)

    return [
        (lambda: csdgen.CSD(delta="x"), r"^delta='x': the CSD TV threshold must be a number in \[0, 1\]$"),
        (lambda: csdgen.CSD(lam="x"), r"^lam='x': the CSD relaxation coefficient lambda must be a finite number >= 0$"),
        (lambda: csdgen.CSD(lam=True), r"^lam=True: .*finite number >= 0$"),
        (lambda: csdgen.CSD(eps="x"), r"^eps='x': .*a number in \[0, 1\) \(default 1e-10\)$"),
        (lambda: csdgen.Addition(c="x"), r"^c='x': the Addition constant must be a finite number >= 0$"),
        (lambda: csdgen.Addition(c=True), r"^c=True: "),
        (lambda: GSD(codebook(), prob_gap="x"), r"^prob_gap='x': the GSD prob gap must be a number > 0$"),
        (lambda: GSD(codebook(), max_distance=True), r"^max_distance=True: .*number > 0$"),
        (lambda: Lantern(codebook(), k="x"), r"^k='x': .*an integer >= 1"),
        (lambda: Lantern(codebook(), k=2.5), r"^k=2.5: .*an integer >= 1"),
        (lambda: Lantern(codebook(), delta="x"), r"^delta='x': the LANTERN mass budget must be a number in \[0, 1\]$"),
        (lambda: Lantern(codebook(), cap=True), r"^cap=True: the LANTERN\+\+ cap must be a number >= 1"),
        (lambda: csdgen.SamplingConfig(guidance_scale="x"), r"^guidance_scale='x': must be a finite number >= 0$"),
        (lambda: csdgen.SamplingConfig(temperature=True), r"^temperature=True: must be a finite number >= 0"),
        (lambda: csdgen.SamplingConfig(top_p="x"), r"^top_p='x': must be None or in \(0, 1\]$"),
    ]


def test_library_a_non_model_is_a_one_line_error():
    for bad in ("path/to/model", None, torch.nn.Linear(2, 2)):
        with pytest.raises(ValueError, match="not an image-token model"):
            csdgen.generate(bad, [0])


def test_library_seed_1_5_is_a_one_line_error(cached_model):
    with pytest.raises(ValueError, match=r"seed=1\.5"):
        csdgen.generate(cached_model, [0], seed=1.5, window=4)


def test_library_method_given_as_the_rule_class_is_a_one_line_error(cached_model):
    with pytest.raises(ValueError, match=r"method=CSD is the rule's class; allowed: an instance such as CSD\(\)"):
        csdgen.generate(cached_model, [0], method=csdgen.CSD, window=4)
    with pytest.raises(ValueError, match="method=3: allowed a method name"):
        csdgen.generate(cached_model, [0], method=3, window=4)


def test_library_sampling_of_another_type_is_a_one_line_error(cached_model):
    # a dict was refused here too; now it is a set of changes to the model's
    # defaults (tests/test_sampling_argument.py), and a dict with an unknown key is refused
    with pytest.raises(ValueError, match=r"sampling=\[3\.0\]: allowed None .* a dict .* csdgen\.SamplingConfig"):
        csdgen.generate(cached_model, [0], sampling=[3.0], window=4)
    with pytest.raises(ValueError, match=r"sampling=\{'scale': 3\.0\}: unknown key 'scale'; allowed keys: guidance_scale"):
        csdgen.generate(cached_model, [0], sampling={"scale": 3.0}, window=4)


def test_library_condition_1_5_is_refused_not_class_1(cached_model):
    for bad in (1.5, True, None, [1]):
        with pytest.raises(ValueError, match="allowed a class index 0..4"):
            csdgen.generate(cached_model, [bad], window=4)
    import numpy as np

    assert csdgen.generate(cached_model, [np.int64(1)], window=4, seed=3).tokens.equal(
        csdgen.generate(cached_model, [1], window=4, seed=3).tokens)


def test_library_a_huge_batch_is_a_one_line_memory_error(cached_model, monkeypatch):
    from csdgen.models import llama

    def fail(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 85899345920 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(llama.ClassConditionalLlama, "start", fail)
    with pytest.raises(MemoryError, match=r"decoding 3 images at once ran out of cpu memory .* a smaller batch") as info:
        csdgen.generate(cached_model, [0, 1, 2], window=4)
    assert "\n" not in str(info.value)


def test_demo_window_1e9_is_clamped_by_the_engine_which_records_the_width_used(cached_model):
    N = cached_model.num_image_tokens
    out = csdgen.generate(cached_model, [0, 1], method="sjd", window=10**9, seed=0)
    assert out.settings["window"] == N and max(out.widths) <= N
    same = csdgen.generate(cached_model, [0, 1], method="sjd", window=N, seed=0)
    assert torch.equal(out.tokens, same.tokens)


def test_generate_refuses_a_string_for_conditions_showing_the_list_form(builtin, tmp_path):
    for bad in ("red apple", b"red apple"):
        with pytest.raises(ValueError, match=r"^conditions='red apple': give a list .*e\.g\. \['red apple'\]$"):
            csdgen.generate(builtin, bad, seed=0, window=16)
        with pytest.raises(ValueError, match=r"conditions='red apple': give a list"):
            csdgen.save_run(builtin, bad, tmp_path / "o", window=16)
    assert not (tmp_path / "o").exists()


def test_api_save_run_into_a_file_names_the_path(builtin, tmp_path):
    path = tmp_path / "afile"
    path.write_text("x")
    with pytest.raises(ValueError, match=r"^output folder '.*afile' cannot be made \(File exists\); allowed: a folder"):
        csdgen.save_run(builtin, ["red apple"], path, window=16)


def test_api_decode_images_refuses_bad_tokens_naming_shape_and_range(builtin):
    with pytest.raises(ValueError, match=r"tokens in 1000000\.\.1000000; allowed: tokens \[B, 256\] int64 in 0\.\.1023"):
        builtin.decode_images(torch.full((1, 256), 10**6))
    with pytest.raises(ValueError, match=r"tokens of shape \[1, 7\] torch.int64; allowed: tokens \[B, 256\]"):
        builtin.decode_images(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"tokens in -1\.\.0"):
        builtin.decode_images(torch.tensor([[-1] + [0] * 255]))
    assert builtin.decode_images(torch.zeros(1, 256, dtype=torch.long)).shape == (1, 3, 64, 64)


def test_api_pil_images_of_none_is_a_clear_type_error(builtin):
    with pytest.raises(TypeError, match=r"pil_images: got NoneType; allowed: a GenerationResult"):
        csdgen.pil_images(builtin, None)


def test_api_classes_assign_refuses_a_negative_count(builtin):
    with pytest.raises(ValueError, match=r"^count=-1: allowed an integer >= 0"):
        builtin.classes.assign(["random"], -1, seed=0)
    assert builtin.classes.assign(["random"], 0, seed=0) == []


def test_image_indices_given_twice_are_refused(builtin):
    """``image_indices=[3, 3]`` gave two images one random stream (identical images for one condition)."""
    with pytest.raises(ValueError, match="image_indices: index 3 is given twice; allowed: distinct indices"):
        csdgen.generate(builtin, ["red apple", "red apple"], method="sjd", window=4, image_indices=[3, 3])


@pytest.mark.parametrize("case", range(15))
def test_rule_and_sampling_arguments_of_the_wrong_type_are_named_in_one_line(case):
    make, message = _rule_cases()[case]
    with pytest.raises(ValueError, match=message):
        make()


def test_rule_arguments_still_take_numpy_numbers():
    import numpy as np

    import csdgen

    assert csdgen.CSD(lam=np.float32(0.25), delta=np.float64(0.5)).options()["lam"] == 0.25
    assert csdgen.SamplingConfig(guidance_scale=np.float32(2.0), top_p=np.float64(0.9)).guided


@pytest.mark.parametrize("scale", [0, 1.5, 10**6, True, "2"])
def test_pil_images_refuses_a_bad_scale_naming_it_before_decoding(builtin, scale):
    import torch

    import csdgen

    tokens = torch.zeros(1, builtin.num_image_tokens, dtype=torch.int64)
    with pytest.raises(ValueError, match=rf"^scale={scale!r}: allowed an integer in 1\.\.16 "):
        csdgen.pil_images(builtin, tokens, scale=scale)
    assert csdgen.pil_images(builtin, tokens, scale=16)[0].size == (1024, 1024)


def test_generate_with_random_points_to_classes_assign_not_to_close_names(builtin):
    import csdgen

    with pytest.raises(ValueError) as info:
        csdgen.generate(builtin, ["random"], window=4)
    message = str(info.value)
    assert "model.classes.assign(['random'], n, seed=...)" in message and "did you mean" not in message, message
    assert "\n" not in message


def test_load_model_names_an_unknown_device_and_the_allowed_ones(tmp_path):
    from csdgen.models.auto import load_model

    with pytest.raises(ValueError, match=r"^device='tpu': not a device; allowed: 'cpu', 'cuda' or 'cuda:N'"):
        load_model(tmp_path, device="tpu")


def test_load_model_refuses_prompt_text_that_is_not_utf8_naming_the_argument(tmp_path):
    from csdgen.models.auto import load_model

    with pytest.raises(ValueError, match=r"^negative_prompt = 'caf\\udce9' is not UTF-8 text \(byte 3: b'\\xe9'\)"):
        load_model(tmp_path, negative_prompt="caf\udce9")


def test_a_function_model_takes_the_image_count_from_a_list_of_conditions():
    import torch

    import csdgen
    from csdgen.models import FunctionModel

    model = FunctionModel(lambda ids: torch.zeros(ids.shape[0], 8), num_image_tokens=4, codebook_size=8)
    listed = csdgen.generate(model, [0, 0, 0], seed=0, window=2)
    counted = csdgen.generate(model, None, batch_size=3, seed=0, window=2)
    assert listed.tokens.shape == (3, 4) and torch.equal(listed.tokens, counted.tokens)
    with pytest.raises(ValueError, match="FunctionModel takes no conditions; give batch_size >= 1"):
        csdgen.generate(model, None, seed=0, window=2)


def test_one_condition_not_in_a_list_is_named_in_one_line(builtin, tmp_path):
    """generate(model, 33) and save_run(model, 33, ...) ended in TypeError: 'int' object is not
    iterable; model.class_ids("red apple") read the name letter by letter ("unknown class 'r'")."""
    with pytest.raises(ValueError, match=r"^conditions=2: give a list \(one condition per image\), e\.g\. \[2\]$"):
        csdgen.generate(builtin, 2, window=16)
    with pytest.raises(ValueError, match=r"^conditions=2: give a list"):
        csdgen.save_run(builtin, 2, tmp_path / "o", window=16)
    assert not (tmp_path / "o").exists()

    class Result:  # a GenerationResult given where its conditions belong: every token in its repr
        def __repr__(self):
            return "Result(tokens=" + "616, " * 5000 + ")"

    with pytest.raises(ValueError, match=r"^conditions=<a Result>: give a list \(one condition per image\), e\.g\. \[0, 'red apple'\]$"):
        csdgen.save_run(builtin, Result(), tmp_path / "o", window=16)
    for bad in ("red apple", 2):
        with pytest.raises(ValueError, match=rf"^conditions={bad!r}: give a list \(one class per image\), e\.g\. \[{bad!r}\]$"):
            builtin.class_ids(bad)
    assert builtin.class_ids(["red apple", 0]) == [2, 0]


def test_a_function_model_names_logits_of_the_wrong_shape_and_sizes_that_are_not_integers():
    """A function returning [B, V + 1] ended in the engine's RuntimeError 'shape mismatch: value tensor
    of shape [2, 9] cannot be broadcast ...'; num_image_tokens=None in a TypeError, 16.0 was taken."""
    import torch

    import csdgen
    from csdgen.models import FunctionModel

    wide = FunctionModel(lambda ids: torch.zeros(ids.shape[0], 9), num_image_tokens=4, codebook_size=8)
    with pytest.raises(ValueError, match=r"^FunctionModel: the function returned shape \[2, 9\] for a prefix \[2, 0\]; "
                                         r"allowed: next-token logits \[B, V\] = \[2, 8\]"):
        csdgen.generate(wide, None, batch_size=2, window=2)
    listed = FunctionModel(lambda ids: [0.0] * 8, num_image_tokens=4, codebook_size=8)
    with pytest.raises(ValueError, match=r"^FunctionModel: the function returned list for a prefix"):
        csdgen.generate(listed, None, batch_size=2, window=2)
    for bad in (None, 16.0, 0, True):
        with pytest.raises(ValueError, match=rf"^num_image_tokens={bad!r}, codebook_size=8: both must be integers >= 1$"):
            FunctionModel(lambda ids: torch.zeros(ids.shape[0], 8), num_image_tokens=bad, codebook_size=8)


def test_a_rule_without_a_name_is_named_in_one_line(cached_model):
    """An AcceptanceRule subclass that sets no name ended in AttributeError: '...' object has no attribute 'name'."""
    from csdgen.acceptance import lossless_acceptance

    class Nameless(csdgen.AcceptanceRule):
        def acceptance_probability(self, draft_tokens, draft_probs, target_probs, target_sample):
            return lossless_acceptance(draft_tokens, draft_probs, target_probs)

    with pytest.raises(ValueError, match=r"^method=.*Nameless.*: an AcceptanceRule sets its name \(a class attribute"):
        csdgen.generate(cached_model, [0], method=Nameless(), window=4)


def test_a_callback_that_is_not_callable_and_a_profile_that_is_not_a_bool_are_named(cached_model):
    """callback=3 ended in TypeError: 'int' object is not callable after the prefill; profile="no"
    (truthy) profiled."""
    with pytest.raises(ValueError, match=r"^callback=3: allowed None or a function called with a StepInfo"):
        csdgen.generate(cached_model, [0], window=4, callback=3)
    with pytest.raises(ValueError, match=r"^profile='no': allowed True \(time the forwards and the verify step\) or False$"):
        csdgen.generate(cached_model, [0], window=4, profile="no")
    steps = []
    assert csdgen.generate(cached_model, [0], window=4, callback=steps.append, profile=False).steps == len(steps)


def test_pil_images_of_no_tokens_is_an_empty_list(builtin):
    """Tokens [0, N] (an empty selection of a run's images) ended in numpy's 'need at least one array to concatenate'."""
    assert csdgen.pil_images(builtin, torch.zeros(0, builtin.num_image_tokens, dtype=torch.int64)) == []


def test_a_codebook_rule_made_for_another_model_is_named(builtin):
    """GSD or LANTERN made with another model's codebook (another V) ended in an IndexError inside the rule."""
    V = builtin.codebook_size
    for name in ("gsd", "lantern"):
        rule = csdgen.make_rule(name, codebook=torch.randn(16, 4))
        with pytest.raises(ValueError, match=rf"^method=.*: made with a codebook of 16 entries, the model's has {V}; "
                                             rf"allowed: a rule made with this model's codebook"):
            csdgen.generate(builtin, ["red apple"], method=rule, window=4)
        own = csdgen.make_rule(name, codebook=builtin.codebook_embeddings())
        assert own.codebook_size == V and csdgen.generate(builtin, ["red apple"], method=own, window=4).tokens.shape[0] == 1


@pytest.mark.parametrize("batch_size", [-1, 0, 1.5, True])
def test_generate_batches_refuses_a_bad_batch_size_at_the_call(cached_model, batch_size):
    """generate_batches (which the out-of-memory error recommends) yielded nothing for batch_size=-1,
    and 0 ended in range()'s 'arg 3 must not be zero'."""
    from csdgen.runs import generate_batches

    with pytest.raises(ValueError, match=rf"^batch_size={batch_size!r}: allowed an integer >= 1"):
        generate_batches(cached_model, [0, 1], batch_size=batch_size, seed=0, window=4)


def test_generate_batches_refuses_a_bare_string_at_the_call(cached_model):
    from csdgen.runs import generate_batches

    with pytest.raises(ValueError, match=r"^conditions='ab': give a list"):
        generate_batches(cached_model, "ab", batch_size=1, seed=0, window=4)
    assert [i for i, _ in generate_batches(cached_model, [0, 1, 2], batch_size=2, seed=0, window=4)] == [[0, 1], [2]]
