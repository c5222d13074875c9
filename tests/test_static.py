"""The static engine (csdgen/models/_static.py) against the eager one: same tokens, exact laws, cache state.

The static session keeps every row in a preallocated cache, runs windows as width buckets
(padding slots masked) and images in batch slots; each test here holds it to the ragged
DynamicCache session or to an exact law. The family tests (tests/test_models_*.py) run the
static engine too, since ``engine="auto"`` picks it for every transformers family.
"""

import shutil

import pytest
import torch

import csdgen
from csdgen import SamplingConfig
from csdgen.models import ClassConditionalLlama
from csdgen.models._static import (WIDTH_BUCKETS, StaticSession, batch_bucket, make_static, open_engine, static_refusal,
                                   width_bucket)
from csdgen.sampling import target_probs
from conftest import on_device
from kv_check import assert_next_window_matches_alone, assert_rows_match_fresh
from test_lossless import P_FAIL, P_PASS, chi_square_pvalue

GREEDY = SamplingConfig(temperature=0)
SAMPLED = SamplingConfig(guidance_scale=3.0, temperature=1.0)


@pytest.fixture(scope="module")
def float64_model(cached_model, test_device):
    return on_device(cached_model, test_device, torch.float64)


# -- buckets ------------------------------------------------------------------------------------


def test_buckets():
    assert [width_bucket(w) for w in (1, 2, 3, 4, 5, 8, 9, 31, 32, 33, 64, 65, 100)] == \
        [1, 2, 4, 4, 8, 8, 16, 32, 32, 64, 64, 128, 128]
    assert WIDTH_BUCKETS == (1, 2, 4, 8, 16, 32, 64)
    assert [batch_bucket(a, 16) for a in (16, 9, 8, 5, 3, 2, 1)] == [16, 16, 8, 8, 4, 2, 1]
    assert [batch_bucket(a, 5) for a in (5, 4, 3, 1)] == [5, 4, 4, 1]
    # uncompiled (no shape to reuse): a forward runs exactly the images
    assert [batch_bucket(a, 16, compiled=False) for a in (16, 9, 5, 1, 0)] == [16, 9, 5, 1, 1]
    with pytest.raises(ValueError, match="width=0"):
        width_bucket(0)


def test_prompt_and_slot_buckets_and_the_step_shapes_bound():
    from csdgen.models._static import cache_width, prompt_bucket, slot_bucket, step_shapes

    assert [prompt_bucket(p) for p in (1, 2, 3, 5, 33, 64, 65, 128, 129)] == [1, 2, 4, 8, 64, 64, 128, 128, 192]
    assert [slot_bucket(b) for b in (1, 2, 3, 4, 5, 9, 16)] == [1, 2, 4, 4, 8, 16, 16]
    assert cache_width(1, 256) == 384 and cache_width(64, 256, 4) == 448
    shapes = step_shapes(guided=True, capacity=16, prompt_width=64, image_columns=576, widths=(1, 2, 4, 8, 16, 32))
    assert len(shapes) == 5 * 6 * 6  # batch slots 1..16 x 6 window buckets x attended columns 128..640, 704
    assert {s.visible for s in shapes} == {128, 256, 384, 512, 640, 704} and {s.columns for s in shapes} == {704}
    with pytest.raises(ValueError, match="prompt width=0"):
        prompt_bucket(0)
    with pytest.raises(ValueError, match="images=0"):
        slot_bucket(0)
    with pytest.raises(ValueError, match=r"widths \[3\]: allowed window buckets"):
        step_shapes(guided=False, capacity=4, prompt_width=1, image_columns=48, widths=(3,))


# -- engine choice ------------------------------------------------------------------------------


def test_auto_picks_static_for_transformers_sessions_and_eager_for_the_rest(cached_model, known_joint):
    out = csdgen.generate(cached_model, [0, 1], method="sjd", window=4, seed=1)
    assert out.settings["engine"] == "static" and out.settings["compile"] is False
    assert csdgen.generate(cached_model, [0, 1], method="sjd", window=4, seed=1, engine="eager").settings["engine"] == "eager"
    assert csdgen.generate(known_joint.model, batch_size=2, method="sjd", window=3).settings["engine"] == "eager"
    assert isinstance(open_engine(cached_model.start([0], None, False), "auto", None), StaticSession)
    assert static_refusal(known_joint.model.start(None, 2, False)).startswith("its session (_FunctionSession)")


def _admit_class_4_and_check(model, old, tokens, guided):
    """Admit one prefilled image of class 4 into ``old`` (rows of classes 0 and 1 cached to image positions
    7 and 3, fed from ``tokens``), check that every row reads as a fresh session and that the next
    forward's logits equal each row's own; returns what assert_rows_match_fresh read."""
    new = open_engine(model.start([4], None, guided), "static", False)
    new.prefill()
    old.admit(new)
    assert old.batch_size == 3 and old.cache_lengths.tolist() == [7, 3, 0]

    class Info:  # what assert_rows_match_fresh reads
        session, rows = old, torch.arange(3)
        committed = torch.tensor([8, 4, 1])

    Info.tokens = tokens
    assert_rows_match_fresh(model, [0, 1, 4], guided, Info)
    assert_next_window_matches_alone(model, old, tokens, guided, 1e-4)
    return Info


@pytest.mark.device
@pytest.mark.parametrize("guided", [False, True])
def test_static_session_admits_rows_that_read_as_a_fresh_session(device_model, guided):
    """The server's admission on the static cache: rows at different lengths with holes,
    then new prefilled rows joined into free slots (past the capacity: the cache grows); every row's
    cache equals a fresh session fed its tokens, and the next forward's logits equal each row's own."""
    model = device_model
    torch.manual_seed(0)
    tokens = torch.randint(0, model.codebook_size, (3, model.num_image_tokens))
    old = open_engine(model.start([0, 1], None, guided), "static", False)
    old.prefill()
    old.forward(tokens[:2, :9], start=torch.tensor([0, 0]), widths=torch.tensor([9, 9]))
    old.rollback(torch.tensor([7, 3]))
    assert old.supports_admission and old.capacity == 2
    _admit_class_4_and_check(model, old, tokens, guided)
    assert old.capacity >= 3
    with pytest.raises(ValueError, match="another model|cannot join"):
        old.admit(model.start([1], None, guided))  # a ragged session: not this cache's layout
    other = open_engine(model.start([1], None, not guided), "static", False)
    other.prefill()
    with pytest.raises(ValueError, match="guided"):
        old.admit(other)


@pytest.mark.parametrize("guided", [False, True])
def test_admission_into_a_slot_with_stale_entries_reads_as_a_fresh_session(device_model, guided):
    """An admission copies only the columns the new rows use (their prompt), so a freed slot keeps its
    old keys and values past them: with those set to large finite values (another image's entries at
    their worst), the admitted row's cache and the next forward's logits still equal a fresh session's.
    The control: the same garbage written inside the admitted row's prompt columns breaks the check."""
    model = device_model
    torch.manual_seed(0)
    tokens = torch.randint(0, model.codebook_size, (3, model.num_image_tokens))
    old = open_engine(model.start([0, 1, 2], None, guided), "static", False, capacity=3)
    old.prefill()
    old.forward(tokens[:, :9], start=torch.tensor([0, 0, 0]), widths=torch.tensor([9, 9, 9]))
    old.rollback(torch.tensor([7, 3, 5]))
    old.select_rows(torch.tensor([0, 1]))  # the third image leaves: its slot is free, its entries stay
    free = old._physical(torch.tensor([2]))
    for layer in old.kv.cache.layers:
        for buffer in (layer.keys, layer.values):
            buffer[free.to(buffer.device)] = 1e4
    info = _admit_class_4_and_check(model, old, tokens, guided)
    assert old.capacity == 3
    slot = old._slots[2:3]
    for layer in old.kv.cache.layers:
        layer.keys[old._physical(slot).to(layer.keys.device), :, old._P - 1] = 1e4
    with pytest.raises(AssertionError):
        assert_rows_match_fresh(model, [0, 1, 4], guided, info)


@pytest.mark.parametrize("kwargs, match", [
    (dict(engine="fast"), r"engine='fast': allowed 'auto', 'static', 'eager'"),
    (dict(engine="eager", compile=True), r"compile=True with engine='eager'"),
    (dict(compile="yes"), r"compile='yes': allowed True, False or None"),
])
def test_bad_engine_arguments(cached_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        csdgen.generate(cached_model, [0], method="sjd", window=4, **kwargs)


def test_static_refused_where_it_does_not_apply(known_joint, cached_model):
    with pytest.raises(ValueError, match=r"engine='static' cannot be used: its session \(_FunctionSession\) is not a "
                                         r"per-row transformers session"):
        csdgen.generate(known_joint.model, batch_size=2, method="sjd", window=3, engine="static")
    session = cached_model.start([0], None, False)
    session.prefill()
    with pytest.raises(ValueError, match="already prefilled"):
        make_static(session)


# -- the same tokens as the eager engine --------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(method="csd", window=10, sampling=SAMPLED),
    dict(method="sjd", window=5, sampling=SamplingConfig(temperature=1.0)),
    dict(method="csd", window=32, sampling=SAMPLED, refresh="coupled"),
    dict(method="ar", sampling=SAMPLED),
    dict(method="sjd", window=6, sampling=SAMPLED, tree=(2, 2)),
    dict(method="sjd", window=9, sampling=SamplingConfig(temperature=1.0), tree=(3, 1)),
])
@pytest.mark.device
def test_static_equals_eager_token_for_token_float64(float64_model, kwargs):
    """Five images finishing at different steps (batch slots 5 -> 4 -> 2 -> 1 with rows moved
    down), windows of every width up to the image end (padded to buckets): the same tokens,
    forwards and decisions as the eager engine."""
    classes = [0, 3, 1, 4, 2]
    eager = csdgen.generate(float64_model, classes, seed=7, engine="eager", **kwargs)
    static = csdgen.generate(float64_model, classes, seed=7, engine="static", **kwargs)
    assert static.settings["engine"] == "static" and eager.settings["engine"] == "eager"
    assert torch.equal(static.tokens, eager.tokens)
    assert [s.committed_per_step for s in static.images] == [s.committed_per_step for s in eager.images]
    assert all(torch.equal(a.decisions, b.decisions) for a, b in zip(static.images, eager.images))
    if kwargs["method"] != "ar":
        assert len({s.steps for s in static.images}) > 1  # images left the batch at different steps


def test_static_and_eager_agree_in_logits_and_distribution_on_the_builtin_model_float32():
    """The built-in model (float32): the static cache sums attention over its padded width in another
    order than the eager session, so a draw that falls within rounding of its threshold can tip and
    the image goes its own way; tokens are the wrong check. Teacher-forced on the same tokens, their
    logits agree within 1e-4; their runs draw from the same distribution: step compression within
    10 % and token histograms closer than those of a run at another seed (the control)."""
    from csdgen.evaluation.agreement import histogram_distance, teacher_forced_logits
    from csdgen.models.builtin import load_builtin_model

    model = load_builtin_model()
    kwargs = dict(method="csd", window=16, image_indices=[3, 0, 8, 9])
    classes = [1, 4, 7, 9]
    eager = csdgen.generate(model, classes, engine="eager", seed=2, **kwargs)
    static = csdgen.generate(model, classes, engine="static", seed=2, **kwargs)
    other_seed = csdgen.generate(model, classes, engine="eager", seed=3, **kwargs)
    for a, b in zip(teacher_forced_logits(model, classes, eager.tokens, guided=True, engine="eager"),
                    teacher_forced_logits(model, classes, eager.tokens, guided=True, engine="static")):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert abs(static.step_compression - eager.step_compression) <= 0.1 * eager.step_compression
    V = model.codebook_size
    assert histogram_distance(static.tokens, eager.tokens, V) < histogram_distance(other_seed.tokens, eager.tokens, V)


# -- greedy equals AR on every family --------------------------------------------------------------


def test_greedy_static_equals_ar_llama(cached_model):
    classes = [4, 0, 2]
    ar = csdgen.generate(cached_model, classes, method="ar", sampling=GREEDY, engine="eager").tokens
    assert torch.equal(csdgen.generate(cached_model, classes, method="ar", sampling=GREEDY, engine="static").tokens, ar)
    for window in (1, 3, 5, 8, 13, 32):
        out = csdgen.generate(cached_model, classes, method="sjd", window=window, sampling=GREEDY, engine="static")
        assert torch.equal(out.tokens, ar), window
    assert torch.equal(csdgen.generate(cached_model, classes, method="sjd", window="auto", sampling=GREEDY,
                                       engine="static").tokens, ar)
    assert torch.equal(csdgen.generate(cached_model, classes, method="sjd", window=7, tree=(2, 2), sampling=GREEDY,
                                       engine="static").tokens, ar)


from test_models_janus import GUIDED as JANUS_GREEDY, PROMPTS as JANUS_PROMPTS  # noqa: E402
from test_models_janus import checkpoint, janus  # noqa: E402,F401  (fixtures)


def _families_greedy(model, prompts, greedy):
    ar = csdgen.generate(model, prompts, method="ar", sampling=greedy, engine="eager").tokens
    assert torch.equal(csdgen.generate(model, prompts, method="ar", sampling=greedy, engine="static").tokens, ar)
    for kwargs in (dict(window=5), dict(window=16), dict(window="auto"), dict(window=7, tree=(2, 2))):
        out = csdgen.generate(model, prompts, method="sjd", sampling=greedy, engine="static", draft_init="uniform", **kwargs)
        assert out.settings["engine"] == "static"
        assert torch.equal(out.tokens, ar), kwargs


def test_greedy_static_equals_ar_janus(janus):
    _families_greedy(janus, JANUS_PROMPTS, JANUS_GREEDY)


@pytest.fixture(scope="module")
def row_end_models(tmp_path_factory):
    """Tiny random Emu3, Lumina-mGPT and Anole (Chameleon) checkpoints: row-end tokens, hidden prompt tokens."""
    from test_models_chameleon import build_checkpoint as build_chameleon
    from test_models_emu3 import HEIGHT, NEGATIVE, WIDTH
    from test_models_emu3 import build_checkpoint as build_emu3

    from csdgen.models.chameleon import ChameleonImageModel
    from csdgen.models.emu3 import Emu3ImageModel

    emu3 = Emu3ImageModel.from_pretrained(build_emu3(tmp_path_factory.mktemp("emu3")), height=HEIGHT, width=WIDTH,
                                          negative_prompt=NEGATIVE, positive_prompt="")
    folder = build_chameleon(str(tmp_path_factory.mktemp("chameleon")))
    lumina = ChameleonImageModel.from_pretrained(folder, layout="lumina", height=12, width=16)
    anole = ChameleonImageModel.from_pretrained(folder, layout="anole")
    token_prompts = [[4, 9, 7, 12, 5], [6, 6, 11]]
    return {"emu3": (emu3, ["a red cat", "two dogs on a long sunny beach"]), "lumina": (lumina, token_prompts),
            "anole": (anole, token_prompts)}


@pytest.mark.parametrize("family", ["emu3", "lumina", "anole"])
def test_greedy_static_equals_ar_row_end_families(row_end_models, family):
    model, prompts = row_end_models[family]
    _families_greedy(model, prompts, SamplingConfig(temperature=0, guidance_scale=3.0))


@pytest.mark.parametrize("family", ["janus", "emu3", "lumina", "anole"])
def test_static_equals_eager_in_logits_and_cache_equals_fresh_on_every_family(row_end_models, janus, family):
    """Sampled (fixed window, and a draft tree): fed the eager run's tokens, the static engine gives the
    eager logits within 1e-4 (float32: not token for token, a rounding can tip a draw); after every
    iteration every row of the static cache equals a fresh prefill of its committed tokens."""
    from csdgen.evaluation.agreement import teacher_forced_logits

    model, prompts = (janus, JANUS_PROMPTS) if family == "janus" else row_end_models[family]
    sampling = SamplingConfig(guidance_scale=3.0)
    for kwargs in (dict(window=7), dict(window=6, tree=(3, 2))):
        eager = csdgen.generate(model, prompts, method="sjd", sampling=sampling, seed=4, engine="eager", **kwargs)

        def check(info):
            if info.step > 1:
                assert_rows_match_fresh(model, prompts, True, info)

        static = csdgen.generate(model, prompts, method="sjd", sampling=sampling, seed=4, engine="static", callback=check,
                                 **kwargs)
        assert static.settings["engine"] == "static" and static.steps > 1
        for a, b in zip(teacher_forced_logits(model, prompts, eager.tokens, guided=True, engine="eager", window=7),
                        teacher_forced_logits(model, prompts, eager.tokens, guided=True, engine="static", window=7)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


# -- the cache: rollback, padding at image ends, images leaving -----------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(method="csd", window=10),
    dict(method="sjd", window="auto"),
    dict(method="sjd", window=5, tree=(2, 2)),
    dict(method="ar"),
])
@pytest.mark.parametrize("guided", [False, True])
@pytest.mark.device
def test_cache_after_every_iteration_equals_fresh_prefill(device_model, kwargs, guided):
    classes = [0, 3, 1, 4, 2]
    sampling = SAMPLED if guided else SamplingConfig(temperature=1.0)
    buckets = set()

    def check(info):
        assert isinstance(info.session, StaticSession)
        buckets.add(info.session._bucket)
        if not info.session.compile:  # uncompiled: the live slots compacted at every image that leaves
            assert info.session._bucket == info.session.batch_size
        assert_rows_match_fresh(device_model, classes, guided, info)

    out = csdgen.generate(device_model, classes, seed=2, sampling=sampling, engine="static", callback=check, **kwargs)
    if len({s.steps for s in out.images}) > 1:
        assert len(buckets) > 1 and max(buckets) == 5  # images left, the slots were compacted


@pytest.mark.device
def test_padded_window_at_the_image_end_is_masked_and_not_cached(float64_model):
    """A window of 5 slots runs as bucket 8 with per-row widths 5, 3 (the image end) and 0 (an
    idle row): its logits equal the eager session's, and each row caches only its valid slots."""
    N = float64_model.num_image_tokens
    tokens = torch.randint(48, (3, N), generator=torch.Generator().manual_seed(0))
    start, widths = torch.tensor([40, N - 4, 39]), torch.tensor([5, 3, 0])
    window = torch.zeros(3, 5, dtype=torch.long)
    for b in range(3):
        window[b, : widths[b]] = tokens[b, start[b] : start[b] + widths[b]]
    runs = []
    for engine in ("eager", "static"):
        session = open_engine(float64_model.start([1, 2, 3], None, True), engine, False)
        session.prefill()
        session.forward(tokens[:, :N - 4], torch.zeros(3, dtype=torch.long), start)
        runs.append((session, session.forward(window, start, widths)))
    (eager, a), (static, b) = runs
    assert isinstance(static, StaticSession) and not isinstance(eager, StaticSession)
    for row in range(2):
        w = int(widths[row])
        torch.testing.assert_close(b.cond[row, :w], a.cond[row, :w], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(b.uncond[row, :w], a.uncond[row, :w], rtol=1e-12, atol=1e-12)
    assert static.cache_lengths.tolist() == [45, N - 1, 39] == eager.cache_lengths.tolist()
    for row in range(6):  # 3 conditional rows, then their unconditional rows
        assert torch.equal(static.row_sequence(row), eager.row_sequence(row))
        for layer in range(2):
            for x, y in zip(static.kv.row_entries(layer, row), eager.kv.row_entries(layer, row)):
                torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_rollback_is_a_length_update_and_later_windows_overwrite(cached_model):
    session = open_engine(cached_model.start([0, 1], None, False), "static", False)
    session.prefill()
    g = torch.Generator().manual_seed(1)
    tokens, new = torch.randint(48, (2, 12), generator=g), torch.randint(48, (2, 6), generator=g)
    session.forward(tokens, torch.zeros(2, dtype=torch.long))
    keys = session.kv.cache.layers[0].keys.clone()
    session.rollback(torch.tensor([3, 7]))
    assert torch.equal(session.kv.cache.layers[0].keys, keys)  # nothing moved or cropped
    assert session.cache_lengths.tolist() == [3, 7]
    session.forward(new, torch.tensor([3, 7]))
    for row, kept in ((0, 3), (1, 7)):
        one = cached_model.start([row], None, False)
        one.prefill()
        one.forward(torch.cat([tokens[row, :kept], new[row]])[None], torch.zeros(1, dtype=torch.long))
        assert torch.equal(session.row_sequence(row), one.row_sequence(0))
        for layer in range(2):
            for x, y in zip(session.kv.row_entries(layer, row), one.kv.row_entries(layer, 0)):
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_session_errors_name_the_bad_value(cached_model):
    session = open_engine(cached_model.start([0, 1], None, False), "static", False)
    with pytest.raises(ValueError, match="forward before prefill"):
        session.forward(torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    session.prefill()
    with pytest.raises(ValueError, match=r"start\[0\]=1: allowed 0..0"):
        session.forward(torch.zeros(2, 1, dtype=torch.long), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match=r"rollback lengths\[1\]=2: allowed 0..0"):
        session.rollback(torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="prefill runs once"):
        session.prefill()


# -- lossless on the static path: a cached transformer with an exactly computable law -------------


class StaticJoint:
    """A tiny random class-conditional Llama over V = 3 tokens, N = 4 positions, guided: its exact
    joint law (guided, warped) by teacher-forcing all 81 sequences."""

    V, N = 3, 4

    def __init__(self, sampling: SamplingConfig):
        self.sampling = sampling
        model = ClassConditionalLlama.random(codebook_size=3, num_classes=2, grid=(2, 2), hidden_size=16, num_layers=2,
                                             num_heads=2, seed=3)
        with torch.no_grad():
            model.backbone.lm_head.weight.mul_(6.0)
        self.model = model

    def joint(self) -> dict[tuple, float]:
        import itertools

        seqs = torch.tensor(list(itertools.product(range(self.V), repeat=self.N)))
        M, V = len(seqs), self.V
        with torch.no_grad():
            logits = []
            for first in (V + 0, V + 2):  # class 0, the null class
                ids = torch.cat([torch.full((M, 1), first), seqs[:, :-1]], 1)
                logits.append(self.model.backbone(input_ids=ids).logits[..., :V].double())
        q = target_probs(logits[0], logits[1], self.sampling)
        probs = q.gather(-1, seqs[..., None])[..., 0].prod(-1)
        return {tuple(s.tolist()): float(p) for s, p in zip(seqs, probs)}


SAMPLES, CHUNK = 24_000, 4_000


@pytest.fixture(scope="module")
def static_joint():
    joint = StaticJoint(SamplingConfig(guidance_scale=2.0, temperature=1.0))
    return joint, joint.joint()


def _sample(joint, **kwargs):
    out = []
    for first in range(0, SAMPLES, CHUNK):
        indices = list(range(first, first + CHUNK))
        result = csdgen.generate(joint.model, [0] * CHUNK, image_indices=indices, sampling=joint.sampling,
                                 engine="static", **kwargs)
        assert result.settings["engine"] == "static"
        out.append(result.tokens)
    return torch.cat(out)


@pytest.mark.parametrize("kwargs", [
    dict(method="sjd", window=3, seed=11),
    dict(method="sjd", window="auto", seed=12),
    dict(method="sjd", window=3, tree=(2, 1), seed=13),
    dict(method="ar", seed=14),
])
def test_static_path_reproduces_the_target_joint(static_joint, kwargs):
    joint, law = static_joint
    assert abs(sum(law.values()) - 1) < 1e-9
    assert chi_square_pvalue(_sample(joint, **kwargs), law) > P_PASS


def test_the_static_test_fails_a_mask_that_shows_the_next_column(static_joint, monkeypatch):
    """Control: a static mask off by one (every query also sees the column after it, the next draft)."""
    joint, law = static_joint
    original = StaticSession._mask

    def leaky(self, allowed):
        return original(self, allowed | torch.nn.functional.pad(allowed, (1, 0))[..., :-1])

    monkeypatch.setattr(StaticSession, "_mask", leaky)
    assert chi_square_pvalue(_sample(joint, method="sjd", window=3, seed=11), law) < P_FAIL


# -- compiled -------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_static_engine_one_shape(cached_model):
    """AR at batch 1 runs one shape (2 rows x 1 column): compiled, it gives the uncompiled
    static engine's tokens and reports its compile time; a second call reuses the compiled step
    (the model's buffer set keeps it: nothing is compiled again)."""
    kwargs = dict(method="ar", sampling=SamplingConfig(guidance_scale=2.0), seed=5)
    plain = csdgen.generate(cached_model, [2], engine="static", compile=False, **kwargs)
    first = csdgen.generate(cached_model, [2], engine="static", compile=True, **kwargs)
    assert first.settings["compile"] is True and list(first.compile_seconds) == ["2x1"]
    assert torch.equal(first.tokens, plain.tokens)
    again = csdgen.generate(cached_model, [2], engine="static", compile=True, **kwargs)
    assert torch.equal(again.tokens, plain.tokens)
    assert again.compile_seconds == {}


# -- compiled steps owned by the model: reuse, growth, a bounded set of shapes ---------------------

from torch._dynamo.utils import counters  # noqa: E402

from csdgen.models import _static, _static_steps, _static_warmup  # noqa: E402
from csdgen.models._ragged import RaggedSession  # noqa: E402
from csdgen.models.llama import _LlamaSession  # noqa: E402


@pytest.fixture
def traced(monkeypatch):
    """Compiled steps traced by dynamo with the eager backend: the same shapes and variants as
    inductor's, in seconds on a CPU. Yields a function giving dynamo's compiled-graph count."""
    monkeypatch.setattr(_static_steps, "COMPILE_BACKEND", "eager")
    yield lambda: counters["stats"]["unique_graphs"]


def _tiny_model(dtype=torch.float32):
    model = ClassConditionalLlama.random(codebook_size=48, num_classes=5, grid=(6, 8), hidden_size=64, num_layers=2, seed=0)
    with torch.no_grad():
        model.backbone.lm_head.weight.mul_(4.0)
        model.backbone.model.embed_tokens.weight[:48].mul_(0.1)
    model.backbone.to(dtype)
    return model


def _assert_steps_bound_to_their_buffers(model):
    for buffers in _static.model_buffers(model):
        for shape, step in buffers.steps.items():
            assert step.shape == shape and step.bound_to(buffers) and step.pointers == buffers.pointers(), shape


def test_compiled_sessions_reuse_the_models_buffers_and_steps(traced):
    """Two generate calls with the same shapes decode in the same buffer set of the model with the
    same compiled steps: the second compiles nothing; the set is free again after each call."""
    model = _tiny_model()
    seen = []
    kwargs = dict(method="sjd", window=4, sampling=GREEDY, engine="static", compile=True,
                  callback=lambda info: seen.append(info.session.buffers))
    first = csdgen.generate(model, [0, 1, 2, 3], seed=1, **kwargs)
    graphs, buffers = traced(), seen[0]
    steps = dict(buffers.steps)
    assert first.compile_seconds and len(steps) == len(first.compile_seconds) and buffers.free
    second = csdgen.generate(model, [0, 1, 2, 3], seed=2, **kwargs)
    assert all(b is buffers for b in seen) and _static.model_buffers(model) == [buffers]
    assert second.compile_seconds == {} and traced() == graphs
    assert buffers.steps == steps and all(buffers.steps[k] is v for k, v in steps.items())
    assert torch.equal(second.tokens, first.tokens)
    plain = csdgen.generate(model, [0, 1, 2, 3], method="sjd", window=4, sampling=GREEDY, engine="static")
    assert torch.equal(plain.tokens, first.tokens)
    _assert_steps_bound_to_their_buffers(model)


def test_generate_gives_its_buffer_set_back_while_a_kept_step_holds_the_session(traced):
    """A callback that keeps every StepInfo keeps the session alive (``info.session``); generate
    still gives the model's buffer set back when it returns, so the next call decodes in the same
    set instead of allocating a second one."""
    model = _tiny_model()
    first, second = [], []
    kwargs = dict(method="sjd", window=4, sampling=GREEDY, engine="static", compile=True)  # a model-owned set
    csdgen.generate(model, [0, 1, 2, 3], seed=1, callback=first.append, **kwargs)
    buffers = first[0].session.buffers
    assert buffers.free  # the kept steps hold the session, not the set
    csdgen.generate(model, [0, 1, 2, 3], seed=2, callback=second.append, **kwargs)
    assert second[0].session.buffers is buffers and _static.model_buffers(model) == [buffers]


def test_a_compiled_batch_that_grows_equals_solo_generate_and_keeps_no_step_of_replaced_buffers(traced):
    """A ContinuousBatch without a capacity (1 slot) admits images past it twice: the session moves
    into larger buffer sets (4, then 8 slots); every image equals generate alone (float64), the
    sets left behind are dropped with their steps, and every step the model holds is bound to the
    very tensors of its own set."""
    from csdgen.engine.continuous import ContinuousBatch
    from test_continuous import _drive

    model = _tiny_model(torch.float64)
    sampling = SamplingConfig(guidance_scale=2.0, temperature=1.0)
    batch = ContinuousBatch(model, method="ar", sampling=sampling, compile=True)
    arrivals = [([0], [11], [0]), ([2, 4], [5, 7], [0, 0]), None, ([1, 3, 2], [7, 7, 7], [1, 2, 3])]
    classes = {(11, 0): 0, (5, 0): 2, (7, 0): 4, (7, 1): 1, (7, 2): 3, (7, 3): 2}
    sets = []
    step = batch.step

    def watched():
        session = batch._loop.session
        if not sets or sets[-1] is not session.buffers:
            sets.append(session.buffers)
        for old in sets[:-1]:  # every set the session left
            assert old.steps == {} and all(old is not b for b in _static.model_buffers(model))
        _assert_steps_bound_to_their_buffers(model)
        return step()

    batch.step = watched
    done = _drive(batch, arrivals)
    assert [s.capacity for s in sets] == [1, 4, 8] and len(done) == 6
    assert _static.model_buffers(model) == [sets[-1]] and sets[-1].free
    for (seed, index), image in done.items():
        alone = csdgen.generate(model, [classes[(seed, index)]], method="ar", sampling=sampling, seed=seed,
                                image_indices=[index], engine="static")
        assert torch.equal(image.tokens, alone.tokens[0]), (seed, index)


def test_a_graph_refuses_to_replay_over_other_buffers():
    """The replay check of a CUDA graph (checked on the object: no GPU here): buffers whose
    data_ptr()s differ from the captured ones raise before any kernel is replayed."""
    import types

    graphed = object.__new__(_static._GraphedStep)
    graphed.shape, graphed.pointers = "shape", (1, 2)
    graphed.graph = None  # a replay would fail with AttributeError
    session = types.SimpleNamespace(buffers=types.SimpleNamespace(pointers=lambda: (1, 3)))
    with pytest.raises(RuntimeError, match="captured over other buffers"):
        graphed(session, torch.zeros(1, 1), torch.zeros(1), torch.zeros(1))


class _PromptedSession(_LlamaSession):
    """A text-prompted family in miniature: a prompt of class tokens of any length, left-padded."""

    def __init__(self, model, prompts, guided):
        from transformers import DynamicCache

        V, C = model.codebook_size, model.num_classes
        rows = [[V + c for c in p] for p in prompts] + ([[V + C] * len(p) for p in prompts] if guided else [])
        P = max(map(len, rows))
        ids = torch.tensor([[0] * (P - len(r)) + r for r in rows])
        valid = torch.tensor([[False] * (P - len(r)) + [True] * len(r) for r in rows])
        self.model = model
        RaggedSession.__init__(self, batch_size=len(prompts), guided=guided, cache=DynamicCache(config=model.backbone.config),
                               prompt_ids=ids, prompt_valid=valid, num_image_tokens=model.num_image_tokens,
                               device=model.device)


def test_prompts_of_ten_lengths_at_batch_4_then_3_compile_within_the_documented_shapes(traced):
    """Prompts of 10 lengths (1..10 columns) decoded 4 at a time, then 3 at a time: the prompts
    fall in 3 prompt buckets (4, 8, 16 columns), batch 3 runs in the slots of batch 4, and dynamo
    compiles exactly the 5 shapes visited, all within step_shapes' 9 for those buckets."""
    model = _tiny_model()
    model.start = lambda conditions, batch_size, guided: _PromptedSession(model, list(conditions), guided)
    prompts = [[length % 5] * length for length in range(1, 11)]
    sampling = SamplingConfig(guidance_scale=1.0, temperature=1.0)
    before = traced()
    for size in (4, 3):
        for first in range(0, 10, size):
            out = csdgen.generate(model, prompts[first:first + size], method="ar", sampling=sampling, seed=first,
                                  engine="static", compile=True)
            assert out.settings["compile"] is True
    visited = {shape for b in _static.model_buffers(model) for shape in b.steps}
    documented = {shape for P in (4, 8, 16) for shape in _static.step_shapes(
        guided=False, capacity=4, prompt_width=P, image_columns=model.num_image_tokens, widths=(1,))}
    assert [_static.prompt_bucket(n) for n in (3, 4, 6, 8, 9, 10)] == [4, 4, 8, 8, 16, 16]
    assert len(documented) == 9 and visited <= documented
    assert len(visited) == 5 and traced() - before == 5
    _assert_steps_bound_to_their_buffers(model)


def test_warmup_compiles_the_shapes_a_later_run_visits(traced):
    """warmup(model, [2], [1]): the steps of batch slots 1 and 2 at width 1; a later AR run at
    batch 2 and one at batch 1 compile nothing; a second warm-up finds them held."""
    model = _tiny_model()
    report = _static_warmup.warmup(model, [2], [1], guided=True, compile=True)
    assert report.made == 2 and report.held == 0 and report.seconds > 0
    assert {(s.batch, s.width, s.guided) for s in report.shapes} == {(1, 1, True), (2, 1, True)}
    graphs = traced()
    for classes in ([0, 3], [4]):
        out = csdgen.generate(model, classes, method="ar", sampling=SAMPLED, seed=1, engine="static", compile=True)
        assert out.compile_seconds == {}
    assert traced() == graphs
    assert _static_warmup.warmup(model, [2], [1], compile=True)[:2] == (0, 2)
    assert _static_warmup.warmup(model, [2], [1], compile=False) == (0, 0, 0.0, ())
    with pytest.raises(ValueError, match=r"batch_sizes=\[0\]"):
        _static_warmup.warmup(model, [0])


def test_mask_dtype_is_the_decoder_layers_not_the_first_parameter(checkpoint):
    """A Janus checkpoint in bfloat16 whose vision tower (its first floating parameters) stays float32:
    the mask is bfloat16, and a static run completes with a sane step compression."""
    from csdgen.models.janus import JanusImageModel

    model = JanusImageModel.from_pretrained(checkpoint, dtype=torch.bfloat16)
    model.model.model.vision_model.float()
    first = next(p for p in model.model.parameters() if p.is_floating_point())
    assert first.dtype == torch.float32
    assert _static.attention_dtype(model) == torch.bfloat16
    assert _static.attention_dtype(_tiny_model()) == torch.float32
    out = csdgen.generate(model, JANUS_PROMPTS, method="sjd", window=4, sampling=JANUS_GREEDY, engine="static")
    assert out.settings["engine"] == "static" and out.step_compression > 1


def test_a_failed_capture_restores_the_callers_stream_and_warns_once(monkeypatch, traced):
    """A CUDA graph capture that fails when it ends (an invalidated capture: torch.cuda.graph then
    leaves its side stream current) restores the caller's stream, synchronises and raises; the
    session then runs that shape compiled, with one warning per process. Checked with stand-ins for
    torch.cuda's stream and graph objects (no GPU here): the order of the calls is what is tested."""
    import contextlib
    import warnings

    calls = []

    class Stream:
        def wait_stream(self, other):
            calls.append("wait")

        def synchronize(self):
            calls.append("stream sync")

    side = Stream()

    class Graph:
        def reset(self):
            calls.append("reset")

    class Capture:
        def __init__(self, graph, pool=None, stream=None, capture_error_mode="global"):
            calls.append(("capture", pool, stream is side, capture_error_mode))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            raise RuntimeError("operation failed due to a previous error during capture")

    for name, value in (("graph_pool_handle", lambda: "pool"), ("current_stream", lambda device=None: "caller"),
                        ("Stream", lambda device=None: side), ("stream", lambda s: contextlib.nullcontext()),
                        ("CUDAGraph", Graph), ("graph", Capture),
                        ("set_stream", lambda s: calls.append(("set_stream", s))),
                        ("synchronize", lambda device=None: calls.append("sync"))):
        monkeypatch.setattr(torch.cuda, name, value)
    model = _tiny_model()
    session = open_engine(model.start([0, 1], None, False), "static", True)
    session.prefill()
    session._set_visible(4)
    tokens, start, widths = torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.long)
    shape = session._step_shape(tokens)
    with pytest.raises(RuntimeError, match="during capture"):
        _static._GraphedStep(shape, session.buffers, session, (tokens, start, widths))
    assert calls == ["wait", "stream sync", ("capture", "pool", True, "thread_local"), ("set_stream", "caller"), "reset",
                     "sync"]
    monkeypatch.setattr(_static_steps, "_CAPTURE_WARNED", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            _static._capture_failed(shape, RuntimeError("capture failed"))
    assert len(caught) == 1 and "run compiled without a graph" in str(caught[0].message)


def test_a_graph_output_is_overwritten_by_the_next_replay_but_the_images_logits_are_copies(monkeypatch, traced):
    """The replayed output is the graph's own memory (not cloned): the next replay overwrites it.
    The images' logits the session returns are gathered out of it (index_select), so they keep
    their values. A stand-in graph replays by running the compiled step into the same output."""
    import contextlib

    class Stream:
        def wait_stream(self, other):
            pass

        def synchronize(self):
            pass

    recorded = {}

    class Graph:
        def replay(self):
            recorded["output"].copy_(recorded["run"]())

    class Capture:
        def __init__(self, graph, pool=None, stream=None, capture_error_mode="global"):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    for name, value in (("graph_pool_handle", lambda: "pool"), ("current_stream", lambda device=None: "caller"),
                        ("Stream", lambda device=None: Stream()), ("stream", lambda s: contextlib.nullcontext()),
                        ("CUDAGraph", Graph), ("graph", Capture), ("synchronize", lambda device=None: None)):
        monkeypatch.setattr(torch.cuda, name, value)
    model = _tiny_model()
    session = open_engine(model.start([0, 1], None, False), "static", True)
    session.prefill()
    session._set_visible(4)
    tokens, start, widths = torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.full((2,), 4)
    graphed = _static._GraphedStep(session._step_shape(tokens), session.buffers, session, (tokens, start, widths))
    recorded["output"] = graphed.output
    recorded["run"] = lambda: _static._CompiledStep(graphed.shape, session.buffers)(session, *graphed.inputs)
    first = graphed(session, tokens + 3, start, widths)
    images = session._logical(first, 4, torch.arange(2))
    kept = images.cond.clone()
    second = graphed(session, tokens + 7, start, widths)
    assert second is first and not torch.equal(first[:, :4], kept)  # the graph's memory, overwritten
    assert torch.equal(images.cond, kept)  # the copies the loop reads
    direct = _static._CompiledStep(graphed.shape, session.buffers)(session, tokens + 7, start, widths)
    torch.testing.assert_close(second, direct)
