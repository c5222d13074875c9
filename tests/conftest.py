"""Shared fixtures: the small cached transformer, a model with a known joint distribution, and the
device the ``device``-marked tests build their models on.

Device test mode: ``CSDGEN_TEST_DEVICE=cuda python -m pytest -m device`` runs the tests marked
``device`` (engine, static, continuous, tree and family tests) with their models on that device
(default ``cpu``); where the device is not available here they skip, saying why.
"""

import copy
import itertools
import os
import re

import pytest
import torch

from csdgen.models import ClassConditionalLlama, FunctionModel
from csdgen.sampling import SamplingConfig, target_probs

# The test models are tiny: one thread is faster than two, and immune to a busy machine.
torch.set_num_threads(1)
# ... and so are the commands and benchmark scripts the tests start in processes of their own: each
# of the suite's two workers (pytest-xdist) runs one at a time, and at torch's default (one thread per
# core) two of them put four OpenMP threads on a 2-core machine, whose busy-waiting made those tests run
# 2-5x as long. A test of thread counts passes its own OMP_NUM_THREADS; a value set outside is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def cached_model():
    """A tiny random class-conditional Llama with a KV cache: 6 x 8 = 48 tokens, V = 48.

    Random weights with a scaled-up output layer (peaked target distributions) and scaled-down
    code embeddings (weaker dependence on the previous tokens), so that drafts are both
    accepted and rejected, greedy Jacobi iteration included.
    """
    model = ClassConditionalLlama.random(codebook_size=48, num_classes=5, grid=(6, 8), hidden_size=64, num_layers=2, seed=0)
    with torch.no_grad():
        model.backbone.lm_head.weight.mul_(4.0)
        model.backbone.model.embed_tokens.weight[:48].mul_(0.1)
    return model


class KnownJoint:
    """A FunctionModel over V = 3 tokens, N = 4 positions, with an exactly computable joint law.

    Next-token logits are a fixed random table indexed by the whole prefix; the conditional
    and unconditional tables differ, so guidance is exercised too.
    """

    V, N = 3, 4

    def __init__(self, sampling: SamplingConfig, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.sampling = sampling
        size = sum(self.V**t for t in range(self.N))  # one row per prefix of length 0..N-1
        self.cond_table = torch.randn(size, self.V, generator=g) * 1.5
        self.uncond_table = torch.randn(size, self.V, generator=g) * 1.5
        self.model = FunctionModel(self._fn(self.cond_table), self.N, self.V, uncond_fn=self._fn(self.uncond_table))

    def _index(self, prefix):
        t = prefix.shape[1]
        offset = sum(self.V**s for s in range(t))
        weights = torch.tensor([self.V ** (t - 1 - s) for s in range(t)], dtype=torch.long)
        return offset + (prefix * weights).sum(-1) if t else torch.full((prefix.shape[0],), offset)

    def _fn(self, table):
        return lambda prefix: table[self._index(prefix)]

    def joint(self) -> dict[tuple, float]:
        """Exact probability of every sequence under the target (guided, warped) distribution."""
        law = {}
        for seq in itertools.product(range(self.V), repeat=self.N):
            prob = 1.0
            for t in range(self.N):
                prefix = torch.tensor([seq[:t]], dtype=torch.long)
                q = target_probs(self.model.fn(prefix)[:, None], self.model.uncond_fn(prefix)[:, None], self.sampling)
                prob *= q[0, 0, seq[t]].item()
            law[seq] = prob
        return law


@pytest.fixture(scope="session")
def known_joint():
    return KnownJoint(SamplingConfig(guidance_scale=2.0, temperature=1.0))


#: the environment variable naming the device of the ``device``-marked tests
TEST_DEVICE_VARIABLE = "CSDGEN_TEST_DEVICE"


def device_unavailable(name: str) -> str | None:
    """Why ``name`` (``cpu``, ``cuda`` or ``cuda:N``) cannot run tests here, or None when it can.

    Raises:
        ValueError: a name that is none of these (naming it and the allowed ones).
    """
    if name == "cpu":
        return None
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match is None:
        raise ValueError(f"{TEST_DEVICE_VARIABLE}={name!r}: allowed cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        return f"{TEST_DEVICE_VARIABLE}={name}: no CUDA device is visible here"
    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        return f"{TEST_DEVICE_VARIABLE}={name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
    return None


@pytest.fixture(scope="session")
def test_device() -> torch.device:
    """The device of the ``device``-marked tests: ``$CSDGEN_TEST_DEVICE`` (default ``cpu``); skips the
    test, with the reason, when that device is not available here."""
    name = os.environ.get(TEST_DEVICE_VARIABLE, "cpu").strip() or "cpu"
    try:
        reason = device_unavailable(name)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    if reason is not None:
        pytest.skip(reason)
    return torch.device(name)


def on_device(model, device, dtype: torch.dtype | None = None):
    """A copy of a :class:`~csdgen.models.ClassConditionalLlama` with its backbone on ``device`` (and in
    ``dtype`` when given); ``model`` itself is not touched."""
    backbone = copy.deepcopy(model.backbone).to(device=device, dtype=dtype)
    return type(model)(backbone, model.codebook_size, model.num_classes, model.grid)


@pytest.fixture(scope="session")
def device_model(cached_model, test_device):
    """:func:`cached_model` on the test device (float32)."""
    return on_device(cached_model, test_device)


#: The quick subset (``python -m pytest -q -m smoke``, README): tests named here get the ``smoke``
#: marker wherever they live, by function name, so that moving a test to another file keeps it in
#: the subset (tests/test_smoke_subset.py checks that every name here still names a test). It
#: covers the main paths in seconds each: acceptance rules, sampling streams, the engine against
#: AR and its own cache, lossless rules against an exact joint law, `csdgen generate` / `compare`
#: on the built-in model's code path, the README's commands and library block, the server's basics
#: and the package's layout and install pins.
SMOKE_TESTS = frozenset({
    # acceptance rules and sampling
    "test_zero_relaxation_is_exactly_sjd",
    "test_relaxed_rules_never_accept_less_than_sjd",
    "test_residual_is_a_distribution_never_nan",
    "test_stream_uniforms_are_keyed_not_sequential",
    # the engine
    "test_ar_takes_one_step_per_token",
    "test_greedy_default_csd_equals_ar_since_one_hot_targets_have_zero_entropy",
    "test_csd_with_zero_relaxation_equals_sjd_sample_for_sample",
    "test_csd_accepts_more_than_sjd_on_average",
    "test_jacobi_acceptances_are_labelled_exact",
    "test_kv_state_of_every_row_after_every_iteration_equals_fresh_prefill",
    "test_an_image_does_not_depend_on_its_batch_float64",
    "test_runs_in_batches_give_the_same_images_at_any_batch_size",
    "test_auto_window_records_its_widths_and_matches_greedy_ar",
    # lossless rules against an exactly computable joint law
    "test_ar_reproduces_the_target_joint",
    "test_sjd_reproduces_the_target_joint",
    "test_the_test_fails_a_wrong_rule",
    # the command line
    "test_generate_writes_images_maps_and_record",
    "test_generate_resumes_without_redoing_and_keeps_written_images",
    "test_same_seed_same_images_other_seed_other_images",
    "test_resume_refuses_other_classes_or_settings_in_the_same_folder",
    "test_generate_without_class_draws_the_weights_default_classes_in_turn",
    "test_compare_prints_and_saves_one_table",
    "test_any_list_of_names_joined_by_commas_splits_back",
    # the README
    "test_readme_commands_run_in_order_in_a_fresh_folder",
    "test_readme_library_example_runs",
    "test_readme_first_command_on_the_shipped_weights_prints_what_the_readme_says",
    "test_readme_code_blocks_that_run_offline_run",
    # the server
    "test_openai_client_gets_n_pngs_of_the_model_size_with_statistics",
    "test_bad_bodies_and_routes_get_4xx_and_the_server_still_answers",
    "test_metrics_count_requests_images_forwards_and_occupancy",
    # the package
    "test_no_import_circle",
    "test_ci_and_readme_install_with_the_constraints_file",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if getattr(item, "originalname", item.name) in SMOKE_TESTS:
            item.add_marker(pytest.mark.smoke)
