"""Continuous batching in the engine: sessions that admit rows, and ContinuousBatch against generate.

An image admitted into a running batch (its prefill joined to the per-row cache, beside images
halfway through theirs) must decode as it would alone: with a fixed window the same tokens and
forwards as ``csdgen.generate(..., seed=s, image_indices=[i])`` (exactly on a float64 model),
with ``window="auto"`` the same distribution (a chi-square test on a known joint law, with a
control that must fail).
"""


import pytest
import torch

import csdgen
from csdgen.engine.continuous import ContinuousBatch
from csdgen.sampling import SamplingConfig, stream_uniforms

from kv_check import assert_next_window_matches_alone, assert_rows_match_fresh
from test_lossless import P_FAIL, P_PASS, chi_square_pvalue

GUIDED = SamplingConfig(guidance_scale=2.0, temperature=1.0)
PLAIN = SamplingConfig(guidance_scale=1.0, temperature=1.0)


@pytest.fixture(scope="module")
def float64_model(cached_model, test_device):
    from conftest import on_device

    return on_device(cached_model, test_device, torch.float64)


def test_per_image_seeds_draw_the_numbers_of_the_int_seed():
    image, step = torch.tensor([0, 3, 7]), torch.tensor([0, 5, 2])
    for seed in (0, 11, 2**40 + 3, 2**63 - 1):  # the seed range is 0 .. 2**63 - 1
        expected = stream_uniforms(seed, image, step, 6, 4)
        assert torch.equal(stream_uniforms(torch.full((3,), seed), image, step, 6, 4), expected), seed
    with pytest.raises(ValueError, match="seed"):
        stream_uniforms(2**63, image, step, 6, 4)
    mixed = stream_uniforms(torch.tensor([1, 2, 1]), image, step, 6, 4)
    assert torch.equal(mixed[:, 1], stream_uniforms(2, image, step, 6, 4)[:, 1])
    assert not torch.equal(mixed[:, 1], stream_uniforms(1, image, step, 6, 4)[:, 1])


@pytest.mark.device
@pytest.mark.parametrize("guided", [False, True])
def test_admitted_rows_hold_the_cache_of_a_fresh_session(float64_model, guided):
    """Rows at different lengths, then new prefilled rows joined: every row's cache equals a fresh
    session fed its tokens, and the next forward's logits equal each row's own session's."""
    model = float64_model
    torch.manual_seed(0)
    tokens = torch.randint(0, model.codebook_size, (3, model.num_image_tokens))
    old = model.start([0, 1], None, guided)
    old.prefill()
    old.forward(tokens[:2, :9], start=torch.tensor([0, 0]), widths=torch.tensor([9, 9]))
    old.rollback(torch.tensor([7, 3]))  # holes in the cache, rows at different lengths
    new = model.start([4], None, guided)
    new.prefill()
    assert old.supports_admission
    old.admit(new)
    assert old.batch_size == 3 and old.cache_lengths.tolist() == [7, 3, 0]

    class Info:  # what assert_rows_match_fresh reads
        session, rows = old, torch.arange(3)
        committed = torch.tensor([8, 4, 1])

    Info.tokens = torch.stack([tokens[0], tokens[1], tokens[2]])
    assert_rows_match_fresh(model, [0, 1, 4], guided, Info)
    assert_next_window_matches_alone(model, old, tokens, guided, 1e-9)


@pytest.mark.device
@pytest.mark.parametrize("guided", [False, True])
def test_an_unprefilled_admission_takes_its_prefill_in_the_next_window(float64_model, guided):
    """A static session admits rows with one-token prompts without a forward (cache length -1); the
    next forward, at start -1 with one slot, returns for them the logits a prefill returns, beside rows
    halfway through their images; rolled back, every row's cache equals a fresh session's."""
    from csdgen.models._static import make_static

    model = float64_model
    torch.manual_seed(0)
    tokens = torch.randint(0, model.codebook_size, (3, model.num_image_tokens))
    running = make_static(model.start([0, 1], None, guided))
    running.prefill()
    running.forward(tokens[:2, :9], start=torch.tensor([0, 0]), widths=torch.tensor([9, 9]))
    running.rollback(torch.tensor([7, 3]))
    new = make_static(model.start([4], None, guided))
    assert running.can_admit_unprefilled(new)
    running.admit_unprefilled(new)
    assert running.batch_size == 3 and running.cache_lengths.tolist() == [7, 3, -1]
    window = torch.stack([tokens[0, 7:11], tokens[1, 3:7], tokens[2, 0:4]])  # row 2's slot 0 is its class token
    out = running.forward(window, start=torch.tensor([7, 3, -1]), widths=torch.tensor([4, 2, 1]))
    prefill = model.start([4], None, guided).prefill()
    torch.testing.assert_close(out.cond[2, :1], prefill.cond[0], atol=1e-9, rtol=1e-9)
    if guided:
        torch.testing.assert_close(out.uncond[2, :1], prefill.uncond[0], atol=1e-9, rtol=1e-9)
    running.rollback(torch.tensor([7, 3, 0]))

    class Info:  # what assert_rows_match_fresh reads
        session, rows, committed = running, torch.arange(3), torch.tensor([8, 4, 1])

    Info.tokens = tokens
    assert_rows_match_fresh(model, [0, 1, 4], guided, Info)
    done = make_static(model.start([2], None, guided))
    done.prefill()
    with pytest.raises(ValueError, match="must not be prefilled"):
        running.admit_unprefilled(done)
    with pytest.raises(ValueError, match="prefill"):
        running.admit(make_static(model.start([2], None, guided)))


def test_admit_refuses_other_guidance_and_unprefilled_sessions(float64_model):
    running = float64_model.start([0], None, True)
    running.prefill()
    plain = float64_model.start([1], None, False)
    plain.prefill()
    with pytest.raises(ValueError, match="guided"):
        running.admit(plain)
    with pytest.raises(ValueError, match="prefill"):
        running.admit(float64_model.start([1], None, True))


def _drive(batch, arrivals, cancel_at=None):
    """Step ``batch``, admitting ``arrivals[k]`` (``(conditions, seeds, indices)``) before iteration k;
    returns {(seed, index): FinishedImage}."""
    done, handles, step = {}, {}, 0
    while step < len(arrivals) or batch.size:
        if step < len(arrivals) and arrivals[step]:
            conditions, seeds, indices = arrivals[step]
            for h, key in zip(batch.admit(conditions, seeds, indices), zip(seeds, indices)):
                handles[h] = key
        if cancel_at is not None and step == cancel_at[0]:
            batch.cancel([h for h, key in handles.items() if key in cancel_at[1]])
        for image in batch.step():
            done[handles[image.handle]] = image
        step += 1
    return done


ARRIVALS = [([0, 3], [11, 11], [0, 1]), ([2], [5], [0]), None, ([4, 4, 1], [7, 7, 7], [0, 1, 2]),
            None, None, None, ([3], [11], [2])]
CLASS_OF = {(11, 0): 0, (11, 1): 3, (5, 0): 2, (7, 0): 4, (7, 1): 4, (7, 2): 1, (11, 2): 3}


@pytest.mark.parametrize("method, window, sampling, waves", [("csd", 6, GUIDED, 8), ("sjd", 9, PLAIN, 8),
                                                             ("ar", 1, GUIDED, 4)])
@pytest.mark.device
def test_admitted_images_equal_offline_images_float64(float64_model, method, window, sampling, waves):
    """Images joining a running batch at iterations 0, 1, 3 and 7, with their own seeds and image
    indices (one request's images and another's), one cancelled halfway: every completed image has
    the tokens, forwards and decisions of generate(seed=s, image_indices=[i]) alone."""
    model = float64_model
    batch = ContinuousBatch(model, method=method, window=window, sampling=sampling)
    done = _drive(batch, ARRIVALS[:waves], cancel_at=(5, {(7, 1)}))
    expected = {key for wave in ARRIVALS[:waves] if wave for key in zip(wave[1], wave[2])} - {(7, 1)}
    assert batch.size == 0 and set(done) == expected
    steps = []
    for (seed, index), image in done.items():
        alone = csdgen.generate(model, [CLASS_OF[(seed, index)]], method=method, window=window, sampling=sampling,
                                seed=seed, image_indices=[index])
        assert torch.equal(image.tokens, alone.tokens[0]), (seed, index)
        assert image.stats.steps == alone.images[0].steps
        assert image.stats.committed_per_step == alone.images[0].committed_per_step
        assert torch.equal(image.stats.decisions, alone.images[0].decisions)
        steps.append(image.stats.steps - 1)
    assert batch.iterations < sum(steps) / 2  # images shared forwards


def test_admitted_rows_match_a_fresh_session_during_the_run(float64_model):
    """At every iteration boundary, every row's cache holds exactly its image's committed tokens."""
    model = float64_model
    batch = ContinuousBatch(model, method="sjd", window=5, sampling=GUIDED)
    conditions = {}
    for step in range(12):
        if step in (0, 2, 5):
            for h, c in zip(batch.admit([step % 5, (step + 1) % 5], [step, step], [0, 1]), [step % 5, (step + 1) % 5]):
                conditions[h] = c
        batch.step()
        if batch.size:
            loop = batch._loop
            committed, tokens = batch.progress(batch.handles)

            class Info:
                session, rows = loop.session, torch.arange(batch.size)

            Info.committed, Info.tokens = torch.tensor(committed), tokens
            assert_rows_match_fresh(model, [conditions[h] for h in batch.handles], True, Info)


def test_a_failed_admission_leaves_the_batch_running(float64_model):
    batch = ContinuousBatch(float64_model, method="sjd", window=4, sampling=PLAIN)
    first = batch.admit([1], [3], [0])
    batch.step()
    with pytest.raises(ValueError, match="class index 9"):
        batch.admit([9], [1], [0])
    with pytest.raises(ValueError, match="image_indices"):
        batch.admit([1], [1], [-1])
    assert batch.size == 1 and batch.handles == first
    finished = []
    while batch.size:
        finished += batch.step()
    alone = csdgen.generate(float64_model, [1], method="sjd", window=4, sampling=PLAIN, seed=3)
    assert [f.handle for f in finished] == first and torch.equal(finished[0].tokens, alone.tokens[0])


def test_auto_window_with_admissions_reproduces_the_target_joint(known_joint):
    """window="auto" in a batch that images keep joining (four waves with their own seeds) and
    leaving: the images still follow the target joint law; a wrong law fails the same test."""
    model, SAMPLES = known_joint.model, 16_000
    batch = ContinuousBatch(model, method="sjd", window="auto", sampling=known_joint.sampling)
    wave = SAMPLES // 4
    arrivals = [([None] * wave, [100 + k] * wave, list(range(wave))) for k in range(4)]
    tokens = [image.tokens for image in _drive(batch, arrivals).values()]
    assert len(tokens) == SAMPLES and len(set(batch.widths)) > 1
    sampled = torch.stack(tokens)
    assert chi_square_pvalue(sampled, known_joint.joint()) > P_PASS
    from conftest import KnownJoint

    wrong = KnownJoint(SamplingConfig(guidance_scale=1.0, temperature=1.0)).joint()
    assert chi_square_pvalue(sampled, wrong) < P_FAIL


def test_prompts_of_other_lengths_join_a_running_janus_batch(tmp_path):
    """A family with left-padded text prompts (tiny Janus, guided): prompts shorter and longer than the
    running rows' join mid-run; every row's cache equals a fresh session's at every boundary, and
    every image equals generate alone (greedy SJD: the same tokens)."""
    from csdgen.models.janus import JanusImageModel

    from test_models_janus import GUIDED as JANUS_GREEDY, PROMPTS, build_checkpoint

    janus = JanusImageModel.from_pretrained(build_checkpoint(tmp_path / "janus"))
    prompts = {0: PROMPTS[0], 2: PROMPTS[1], 3: "a cat"}  # admitted before iterations 0, 2 and 3
    batch = ContinuousBatch(janus, method="sjd", window=5, sampling=JANUS_GREEDY)
    of_handle, done = {}, {}
    for step in range(200):
        if step in prompts:
            (h,) = batch.admit([prompts[step]], [step], [0])
            of_handle[h] = prompts[step]
        for image in batch.step():
            done[of_handle[image.handle]] = image.tokens
        if batch.size:
            committed, tokens = batch.progress(batch.handles)

            class Info:
                session, rows = batch._loop.session, torch.arange(batch.size)

            Info.committed, Info.tokens = torch.tensor(committed), tokens
            assert_rows_match_fresh(janus, [of_handle[h] for h in batch.handles], True, Info)
        elif step > max(prompts):
            break
    assert set(done) == set(prompts.values())
    assert batch.forwards == batch.iterations + 3  # text prompts: every admission runs its own prefill
    for prompt, tokens in done.items():
        alone = csdgen.generate(janus, [prompt], method="sjd", window=5, sampling=JANUS_GREEDY)
        assert torch.equal(tokens, alone.tokens[0]), prompt


@pytest.mark.device
def test_a_continuous_batch_runs_the_static_session_and_grows_its_capacity(float64_model):
    """engine="auto" opens the static session (a preallocated cache of ``capacity`` slots); images
    joining beyond it grow the cache; every image equals generate alone, and the eager engine's
    batch gives the same images."""
    from csdgen.models._static import StaticSession

    arrivals = [([0, 3], [11, 11], [0, 1]), ([2], [5], [0]), None, ([4, 4, 1], [7, 7, 7], [0, 1, 2])]
    static = ContinuousBatch(float64_model, method="sjd", window=4, sampling=GUIDED, capacity=2)
    seen = []
    step = static.step

    def watched():
        seen.append((static._loop.session, static._loop.session.capacity, static.size))
        return step()

    static.step = watched
    done = _drive(static, arrivals)
    session = seen[0][0]
    assert isinstance(session, StaticSession) and seen[0][1:] == (2, 2)
    assert all(s is session for s, _, _ in seen) and max(c for _, c, _ in seen) >= max(n for _, _, n in seen) > 2
    eager_batch = ContinuousBatch(float64_model, method="sjd", window=4, sampling=GUIDED, engine="eager")
    eager = _drive(eager_batch, arrivals)
    assert set(done) == set(eager) and len(done) == 6
    # the static batch prefilled only its first images (an empty batch); the two later waves took
    # their prefill in the next iteration's window; the eager batch ran a prefill per wave
    assert static.forwards == static.iterations + 1 and eager_batch.forwards == eager_batch.iterations + 3
    for (seed, index), image in eager.items():
        alone = csdgen.generate(float64_model, [CLASS_OF[(seed, index)]], method="sjd", window=4, sampling=GUIDED,
                                seed=seed, image_indices=[index])
        assert torch.equal(image.tokens, alone.tokens[0]), (seed, index)
        assert torch.equal(done[(seed, index)].tokens, image.tokens), (seed, index)
    with pytest.raises(ValueError, match="capacity"):
        ContinuousBatch(float64_model, capacity=0)
    with pytest.raises(ValueError, match="engine"):
        ContinuousBatch(float64_model, engine="fast")


def test_admit_names_a_count_mismatch_and_allows_a_repeated_seed_and_index(float64_model):
    """One seed for two images is named as such; the same (seed, image index) twice in one admission
    is allowed (two requests of a server may ask for the same image) and gives the same image twice."""
    batch = ContinuousBatch(float64_model, method="sjd", window=4, sampling=GUIDED)
    with pytest.raises(ValueError, match=r"^seeds=\[3\] \(1 value for 2 images\): allowed one integer per image$"):
        batch.admit([0, 1], [3], [0, 1])
    with pytest.raises(ValueError, match=r"^seeds\[1\]=-1: outside the seed range"):  # the bad one of the list named
        batch.admit([0, 1], [3, -1], [0, 1])
    first, second = batch.admit([2, 2], [3, 3], [0, 0])
    done = {}
    while batch.size:
        done.update({image.handle: image.tokens for image in batch.step()})
    assert torch.equal(done[first], done[second])


def test_admit_takes_numpy_integers_for_seeds_and_image_indices(float64_model):
    """Seeds and indices read from an array (np.int64) were refused as 'allowed an integer per image'."""
    import numpy as np

    images = {}
    for seeds, indices in (([3, 4], [0, 1]), (np.array([3, 4]), np.arange(2))):
        batch = ContinuousBatch(float64_model, method="sjd", window=4, sampling=GUIDED)
        handles = batch.admit([1, 2], seeds, indices)
        done = {}
        while batch.size:
            done.update({image.handle: image.tokens for image in batch.step()})
        images[type(seeds)] = [done[h] for h in handles]
    assert all(torch.equal(a, b) for a, b in zip(*images.values()))


def test_one_token_images_leave_a_continuous_batch_at_the_first_step():
    """With num_image_tokens=1 the admission's prefill completes each image; step() ran a window
    after it and ended in an IndexError in the verify step."""
    from csdgen.models import FunctionModel

    model = FunctionModel(lambda prefix: torch.arange(8.0).expand(prefix.shape[0], 8), num_image_tokens=1,
                          codebook_size=8)
    batch = ContinuousBatch(model, method="sjd", window=2, sampling=SamplingConfig(temperature=0))
    handles = batch.admit([0, 0], [1, 2], [0, 1])
    finished = batch.step()
    assert [(image.handle, image.tokens.tolist(), image.stats.steps) for image in finished] == [
        (handles[0], [7], 1), (handles[1], [7], 1)]
    assert batch.size == 0 and batch.step() == []


def test_admit_names_a_bare_condition_or_seed_and_the_batch_takes_a_numpy_capacity(float64_model):
    """admit("red apple", ...) read the name letter by letter (9 images), admit(3, ...) and seeds=3
    ended in TypeError: 'int' object is not iterable; capacity=np.int64(4) was refused as not an integer."""
    import numpy as np

    batch = ContinuousBatch(float64_model, method="sjd", window=4, sampling=GUIDED, capacity=np.int64(4))
    assert batch.capacity == 4 and type(batch.capacity) is int
    with pytest.raises(ValueError, match=r"^conditions='abc': give a list \(one condition per image\)"):
        batch.admit("abc", [0, 0, 0], [0, 1, 2])
    with pytest.raises(ValueError, match=r"^conditions=3: give a list"):
        batch.admit(3, [0], [0])
    with pytest.raises(ValueError, match=r"^seeds=3: allowed a list of one integer per image \(1 image\), e\.g\. \[3\]$"):
        batch.admit([1], 3, [0])
    assert batch.size == 0 and len(batch.admit([1], [3], [0])) == 1


def test_admit_checks_image_indices_as_generate_does_with_the_same_message(float64_model):
    """admit's image_indices had a check of its own (no upper bound): an index past int64 ended in
    'Overflow when unpacking long long', naming neither the argument nor what is allowed, where
    generate names it. One helper (csdgen.integers.integers_per_image) now checks both."""
    import numpy as np

    batch = ContinuousBatch(float64_model, method="sjd", window=4, sampling=GUIDED)
    for bad in ([2**63], [-1], [1.0], 5):
        with pytest.raises(ValueError) as admitted:
            batch.admit([1], [0], bad)
        with pytest.raises(ValueError) as generated:
            csdgen.generate(float64_model, [1], method="sjd", window=4, sampling=GUIDED, image_indices=bad)
        assert str(admitted.value) == str(generated.value), bad
        assert str(admitted.value).startswith(f"image_indices={bad!r}"), str(admitted.value)
    with pytest.raises(ValueError, match=r"^image_indices=\[9223372036854775808\] \(1 value for 1 image\): allowed one "
                                         r"integer in 0\.\.9223372036854775807 \(2\*\*63 - 1\) per image$"):
        batch.admit([1], [0], [2**63])
    assert batch.size == 0 and len(batch.admit([1], [np.int64(0)], np.array([2**63 - 1]))) == 1


def test_a_continuous_batch_refuses_a_compile_that_is_not_a_bool_as_generate_does(float64_model):
    """ContinuousBatch(..., compile="yes") ran compiled (a truthy string) though its docstring takes
    engine and compile 'as csdgen.generate', which refuses it."""
    for bad in ("yes", 1):
        with pytest.raises(ValueError, match=rf"^compile={bad!r}: allowed True, False or None"):
            ContinuousBatch(float64_model, method="sjd", window=4, sampling=GUIDED, compile=bad)


def test_the_batch_settings_are_generates_without_seed_engine_and_compile(float64_model):
    """What the settings docstring says they hold (it said 'without seed' only)."""
    batch = ContinuousBatch(float64_model, method="sjd", window=4, sampling=GUIDED)
    alone = csdgen.generate(float64_model, [1], method="sjd", window=4, sampling=GUIDED)
    assert batch.settings == {k: v for k, v in alone.settings.items() if k not in ("seed", "engine", "compile")}


def test_cancel_and_progress_name_a_handle_that_is_no_handle(cached_model):
    batch = ContinuousBatch(cached_model, method="sjd", window=4)
    handles = batch.admit([0, 1], seeds=[0, 0], image_indices=[0, 1])
    with pytest.raises(ValueError, match=rf"handles={handles[0]}: allowed a list of the handles admit\(\) returned, "
                                         rf"e.g. \[{handles[0]}\]"):
        batch.cancel(handles[0])  # 'int' object is not iterable
    with pytest.raises(ValueError, match=rf"handle '{handles[0]}': allowed the integer handles admit\(\) returned"):
        batch.cancel([str(handles[0])])  # was ignored as unknown
    with pytest.raises(KeyError, match=r"handle 99 is not in the batch \(finished, cancelled or never admitted\)"):
        batch.progress([99])
    batch.cancel([handles[0], 12345])  # an unknown integer handle is ignored, as documented
    assert batch.progress([handles[1]])[0] == [1]
    batch.cancel(handles[1:])


def test_cancel_and_progress_take_tensor_and_numpy_handles(cached_model):
    import numpy as np

    batch = ContinuousBatch(cached_model, method="sjd", window=4)
    handles = batch.admit([0, 1, 2], seeds=[0, 0, 0], image_indices=[0, 1, 2])
    assert batch.progress(torch.tensor(handles[:1]))[0] == batch.progress([handles[0]])[0]
    assert batch.progress(np.array(handles[1:2]))[0] == [1]
    with pytest.raises(ValueError, match=r"handles=tensor\(.*\): allowed a list of the handles admit\(\) returned"):
        batch.cancel(torch.tensor(handles[0]))  # one bare handle as a 0-d tensor: 'iteration over a 0-d tensor'
    batch.cancel(torch.tensor(handles))
