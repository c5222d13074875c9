"""Draft trees (csdgen.trees): exact in distribution, AR under greedy, cache = fresh prefill after compaction.

The chi-square tests use the model with a known joint law of tests/conftest.py (V = 3, N = 4).
With K >= V a level's candidates cover the whole codebook (always one accepted), with top-k the
draft distributions have fewer than K tokens (void siblings): both edges are covered. The
failing control is SJD-PAC's released path choice (longest accepted run), run on more samples.
"""

import pytest
import torch

import csdgen
from csdgen.engine.results import Decision
from csdgen.engine.tree_loop import _TreeLoop
from csdgen.models import FunctionModel
from csdgen.sampling import SamplingConfig
from csdgen.trees import draw_siblings, tree_layout, without
from cli_helpers import usage_error
from conftest import KnownJoint
from kv_check import assert_rows_match_fresh
from test_lossless import P_FAIL, P_PASS, SAMPLES, chi_square_pvalue

TOP_K = KnownJoint(SamplingConfig(guidance_scale=2.0, top_k=2), seed=1)
UNGUIDED = KnownJoint(SamplingConfig(guidance_scale=1.0), seed=2)


def test_layout_of_a_tree():
    t = tree_layout(2, 2, 5)
    assert t.S == 1 + 2 + 4 + 2  # root, two levels, then the chain to depth 4
    assert t.depth.tolist() == [0, 1, 1, 2, 2, 2, 2, 3, 4]
    assert t.parent.tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 7]
    assert t.main.tolist() == [0, 1, 3, 7, 8]
    assert t.children.tolist() == [[1, 2], [3, 4], [5, 6]]
    assert t.ancestors[6].nonzero()[:, 0].tolist() == [0, 2, 6]
    assert tree_layout(3, 3, 2).D == 1  # a tree never reaches past the window


def test_siblings_are_drawn_without_replacement():
    p = torch.tensor([[[0.5, 0.3, 0.2, 0.0]]]).expand(20000, 1, 4)
    u = torch.rand(20000, 1, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    first = torch.multinomial(p[:, 0], 1, generator=torch.Generator().manual_seed(1))
    cand, alive = draw_siblings(first, p, 3, u)
    assert bool(alive.all())
    assert bool((cand[..., 0] != cand[..., 1]).all() & (cand[..., 1] != cand[..., 2]).all() & (cand[..., 0] != cand[..., 2]).all())
    assert not bool((cand == 3).any())  # zero mass never drawn
    # second candidate's law: sum_x p(x) p(y) / (1 - p(x))
    expected = torch.tensor([0.3 * 0.5 / 0.7 + 0.2 * 0.5 / 0.8, 0.5 * 0.3 / 0.5 + 0.2 * 0.3 / 0.8, 0.5 * 0.2 / 0.5 + 0.3 * 0.2 / 0.7])
    observed = torch.bincount(cand[:, 0, 1], minlength=4)[:3].double() / 20000
    assert torch.allclose(observed, expected.double(), atol=0.015)
    _, alive = draw_siblings(torch.zeros(1, 1, dtype=torch.long), torch.tensor([[[1.0, 0.0]]]), 2, torch.zeros(1, 1, 1, dtype=torch.float64))
    assert alive.tolist() == [[[True, False]]]  # a one-hot draft leaves no sibling: void
    probs, ok = without(torch.tensor([[0.5, 0.5]]), torch.tensor([[0, 1]]))
    assert not bool(ok.any())


@pytest.mark.parametrize(
    "joint, tree, window, refresh, draft_init, method",
    [
        ("known", (2, 1), 3, "independent", "uniform", "sjd"),
        ("known", (2, 2), 4, "coupled", "uniform", "sjd"),
        ("known", (2, 3), 4, "independent", "uniform", "sjd"),
        ("known", (4, 3), 4, "coupled", "uniform", "sjd"),
        ("top_k", (3, 2), 4, "coupled", "uniform", "sjd"),
        ("top_k", (4, 1), 2, "independent", "uniform", "sjd"),
        ("unguided", (3, 2), 4, "coupled", "onehot", "sjd"),
        ("unguided", (2, 2), "auto", "independent", "uniform", "sjd"),
        ("known", (2, 2), 4, "independent", "uniform", "jacobi"),
    ],
)
def test_trees_reproduce_the_target_joint(known_joint, joint, tree, window, refresh, draft_init, method):
    model = {"known": known_joint, "top_k": TOP_K, "unguided": UNGUIDED}[joint]
    out = csdgen.generate(model.model, batch_size=SAMPLES, sampling=model.sampling, method=method, window=window, tree=tree,
                          refresh=refresh, draft_init=draft_init, seed=21)
    assert len({s.steps for s in out.images}) > 1 or tree[0] >= 3  # K >= V: every level accepts
    assert chi_square_pvalue(out.tokens, model.joint()) > P_PASS


def test_longest_run_path_choice_is_biased(known_joint, monkeypatch):
    """SJD-PAC's released choice fails the same test, with the same seed and sample size, where the exact one passes."""
    law, n = known_joint.joint(), 2 * SAMPLES
    kwargs = dict(batch_size=n, sampling=known_joint.sampling, method="sjd", window=3, tree=(2, 2), seed=5)
    assert chi_square_pvalue(csdgen.generate(known_joint.model, **kwargs).tokens, law) > P_PASS
    monkeypatch.setattr(_TreeLoop, "PATH_CHOICE", "longest")
    assert chi_square_pvalue(csdgen.generate(known_joint.model, **kwargs).tokens, law) < P_FAIL


@pytest.mark.parametrize("tree, window, guided", [((2, 1), 4, False), ((3, 2), 6, True), ((4, 3), 8, False)])
def test_greedy_tree_equals_ar(cached_model, tree, window, guided):
    sampling = SamplingConfig(guidance_scale=3.0 if guided else 1.0, temperature=0)
    classes = [0, 1, 2, 3]
    ar = csdgen.generate(cached_model, classes, method="ar", sampling=sampling)
    out = csdgen.generate(cached_model, classes, method="sjd", window=window, tree=tree, sampling=sampling, draft_init="uniform")
    assert torch.equal(out.tokens, ar.tokens)
    assert out.steps < ar.steps


def test_one_candidate_per_level_is_the_plain_window(cached_model):
    """tree=(1, D) has no side branch: it runs and is recorded as no tree (it ran the tree verifier
    with other random streams, so the same seed drew another image and its folder refused a rerun
    without --tree)."""
    from csdgen.run_settings import run_settings

    kwargs = dict(method="sjd", window=8, seed=3)
    plain = csdgen.generate(cached_model, [0, 1], **kwargs)
    chain = csdgen.generate(cached_model, [0, 1], tree=(1, 2), **kwargs)
    assert torch.equal(chain.tokens, plain.tokens) and chain.steps == plain.steps
    assert run_settings(cached_model, tree=(1, 2), **kwargs) == run_settings(cached_model, **kwargs)
    assert "tree" in run_settings(cached_model, tree=(2, 2), **kwargs)  # control: a real tree is recorded


@pytest.mark.parametrize("guided", [False, True])
@pytest.mark.device
def test_cache_after_every_compaction_equals_fresh_prefill(device_model, guided):
    cached_model = device_model
    sampling = SamplingConfig(guidance_scale=2.0 if guided else 1.0, temperature=1.0)
    classes = [0, 3, 4]

    def check(info):
        if info.step > 1:
            assert_rows_match_fresh(cached_model, classes, guided, info)

    out = csdgen.generate(cached_model, classes, method="sjd", window=6, tree=(3, 2), sampling=sampling, seed=3, callback=check)
    assert any(bool(s.side_branch.any()) for s in out.images)  # side branches won and were compacted


@pytest.mark.device
def test_tree_statistics_and_acceptance_map(device_model):
    cached_model = device_model
    out = csdgen.generate(cached_model, [0, 1, 2], method="sjd", window=6, tree=(3, 2), seed=4,
                          sampling=SamplingConfig(guidance_scale=2.0))
    for s in out.images:
        assert sum(s.committed_per_step) == s.num_tokens
        assert s.branches.shape == (s.steps - 1, 2)
        t = s.summary()["tree"]
        assert sum(t["branch_wins"][0]) == t["tokens_per_level"][0] and len(t["branch_wins"][0]) == 3
        assert sum(t["tokens_per_level"]) + t["chain_tokens"] == sum(n - 1 for n in s.committed_per_step[1:])
        accepted = (s.decisions == Decision.ACCEPTED) | (s.decisions == Decision.RELAXED)
        assert not bool((s.side_branch & ~accepted).any())  # side-branch tokens are accepted candidates
        assert t["side_tokens"] == int(s.side_branch.sum())
    assert sum(t for s in out.images for t in s.summary()["tree"]["branch_wins"][0][1:]) > 0


def test_tree_deeper_than_the_window_runs_window_minus_one_levels_and_keeps_the_tree_asked(cached_model):
    out = csdgen.generate(cached_model, [0, 1, 2], method="sjd", window=4, tree=(2, 5), seed=4)
    assert out.settings["tree"] == [2, 5]  # the settings keep what was asked for
    for s in out.images:
        levels = s.summary()["tree"]["tokens_per_level"]
        assert len(levels) == 5 and levels[3:] == [0, 0]  # a window of 4 slots holds 3 tree levels
        assert bool((s.branches[:, 3:] == -1).all())  # -1: a level no iteration reached
    assert all(sum(s.summary()["tree"]["tokens_per_level"][:3]) > 0 for s in out.images)


@pytest.mark.device
def test_tree_images_do_not_depend_on_the_batch(cached_model, test_device):
    """Exact in float64 (in float32 a batched kernel's rounding can tip a draw: tests compare logits there)."""
    from conftest import on_device

    cached_model = on_device(cached_model, test_device, torch.float64)
    sampling = SamplingConfig(guidance_scale=2.0)
    kwargs = dict(method="sjd", window=5, tree=(2, 2), sampling=sampling, seed=9)
    both = csdgen.generate(cached_model, [1, 2], **kwargs)
    alone = csdgen.generate(cached_model, [2], image_indices=[1], **kwargs)
    assert torch.equal(both.tokens[1:], alone.tokens)


def test_csd_with_a_tree_runs_and_labels_relaxed_tokens(cached_model):
    out = csdgen.generate(cached_model, [0, 1], method="csd", window=6, tree=(2, 2), seed=2,
                          sampling=SamplingConfig(guidance_scale=2.0))
    assert out.tokens.shape == (2, cached_model.num_image_tokens)
    assert out.settings["tree"] == [2, 2]


@pytest.mark.parametrize("tree", [(0, 1), (2, 0), (2,), "3,2", (2.0, 1), (True, 1)])
def test_bad_tree_is_refused(known_joint, tree):
    with pytest.raises(ValueError, match="tree="):
        csdgen.generate(known_joint.model, batch_size=2, method="sjd", window=3, tree=tree)


def test_tree_needs_a_speculative_method_and_a_tree_session(known_joint):
    with pytest.raises(ValueError, match="method='ar'"):
        csdgen.generate(known_joint.model, batch_size=2, method="ar", tree=(2, 1))

    class NoTrees(FunctionModel):
        def start(self, conditions, batch_size, guided):
            session = super().start(conditions, batch_size, guided)
            session.supports_trees = False
            session.tree_refusal = "no tree forward here"
            return session

    model = NoTrees(known_joint.model.fn, 4, 3)
    with pytest.raises(ValueError, match="no tree forward here"):
        csdgen.generate(model, batch_size=2, method="sjd", window=3, tree=(2, 1))


# -- the families: Janus (Llama backbone) evaluates trees; row-end families refuse in one line

from test_models_janus import GUIDED as JANUS_GREEDY, PROMPTS as JANUS_PROMPTS  # noqa: E402
from test_models_janus import ar_tokens, checkpoint, janus  # noqa: E402,F401  (fixtures)


def test_janus_greedy_tree_equals_ar_and_cache_equals_fresh(janus, ar_tokens):
    for tree, window in (((2, 2), 7), ((3, 1), 13)):
        out = csdgen.generate(janus, JANUS_PROMPTS, method="sjd", window=window, tree=tree, sampling=JANUS_GREEDY,
                              draft_init="uniform")
        assert torch.equal(out.tokens, ar_tokens[2]), tree
    sampling = SamplingConfig(guidance_scale=3.0)

    def check(info):
        if info.step > 1:
            assert_rows_match_fresh(janus, JANUS_PROMPTS, True, info)

    csdgen.generate(janus, JANUS_PROMPTS, method="sjd", window=8, tree=(3, 2), sampling=sampling, seed=1, callback=check)


@pytest.fixture(scope="module")
def row_end_models(tmp_path_factory):
    """Tiny random Emu3 and Lumina-mGPT (Chameleon) checkpoints: families with a row-end token after every image row."""
    from test_models_chameleon import build_checkpoint as build_chameleon
    from test_models_emu3 import HEIGHT, NEGATIVE, WIDTH
    from test_models_emu3 import build_checkpoint as build_emu3

    from csdgen.models.chameleon import ChameleonImageModel
    from csdgen.models.emu3 import Emu3ImageModel

    emu3 = Emu3ImageModel.from_pretrained(build_emu3(tmp_path_factory.mktemp("emu3")), height=HEIGHT, width=WIDTH,
                                          negative_prompt=NEGATIVE, positive_prompt="")
    lumina = ChameleonImageModel.from_pretrained(build_chameleon(str(tmp_path_factory.mktemp("chameleon"))),
                                                 layout="lumina", height=12, width=16)
    return {"emu3": (emu3, ["a red cat", "two dogs on a long sunny beach"]), "lumina": (lumina, [[4, 9, 7, 12, 5], [6, 6, 11]])}


@pytest.mark.parametrize("family", ["emu3", "lumina"])
def test_row_end_families_greedy_tree_equals_ar_and_cache_equals_fresh(row_end_models, family):
    """Tree branches that cross an image row get their own row-end column (RaggedSession._tree_columns)."""
    model, prompts = row_end_models[family]
    greedy = SamplingConfig(temperature=0, guidance_scale=3.0)
    ar = csdgen.generate(model, prompts, method="ar", sampling=greedy).tokens
    for tree, window in (((2, 2), 5), ((3, 3), 9), ((2, 1), 13)):
        out = csdgen.generate(model, prompts, method="sjd", window=window, tree=tree, sampling=greedy, draft_init="uniform")
        assert torch.equal(out.tokens, ar), tree
    lengths = []

    def check(info):
        if info.step > 1:
            assert_rows_match_fresh(model, prompts, True, info)
            lengths.extend(info.session.cache_lengths.tolist())

    cols = model.grid[1]
    out = csdgen.generate(model, prompts, method="sjd", window=7, tree=(3, 2), sampling=SamplingConfig(guidance_scale=3.0),
                          seed=2, callback=check)
    assert any(k % cols == 0 and k for k in lengths) and any(k % cols == cols - 1 for k in lengths)


def test_acceptance_map_marks_side_branch_tokens(cached_model):
    import numpy as np

    from csdgen.evaluation.maps import SIDE_BRANCH_COLOUR, TITLE_H, acceptance_map

    out = csdgen.generate(cached_model, [0, 3, 4], method="sjd", window=6, tree=(3, 2), seed=3,
                          sampling=SamplingConfig(guidance_scale=2.0))
    s = next(s for s in out.images if bool(s.side_branch.any()))
    image = np.zeros((6, 8, 3), dtype=np.uint8)
    plain = np.asarray(acceptance_map(image, s.decisions, s.entropy, cached_model.grid, 48, scale=1))
    marked = np.asarray(acceptance_map(image, s.decisions, s.entropy, cached_model.grid, 48, scale=1, side_branch=s.side_branch))
    row, col = divmod(int(s.side_branch.nonzero()[0, 0]), 8)
    panel = marked[TITLE_H : TITLE_H + 6, 2 * (8 + 4) :][row, col].astype(int)
    assert not np.array_equal(plain[TITLE_H : TITLE_H + 6, 2 * (8 + 4) :][row, col], panel)
    grey = (s.entropy[row * 8 + col].item() / np.log(48)) * 255
    assert np.allclose(panel, 0.4 * min(grey, 255) + 0.6 * np.array(SIDE_BRANCH_COLOUR), atol=2)


def test_cli_tree_option(tmp_path, capsys):
    import json

    from builtin_fixture import make_tiny_weights

    from csdgen import cli

    weights = make_tiny_weights(tmp_path / "w")
    out = tmp_path / "out"
    argv = ["generate", "--weights", str(weights), "-n", "2", "--batch-size", "2", "--out", str(out), "--method", "sjd",
            "--refresh", "coupled", "--window", "8", "--tree", "3,2"]
    assert cli.main(argv) == 0
    record = json.loads((out / "record.json").read_text())
    assert record["settings"]["tree"] == [3, 2]
    assert "tree" in record["images"]["0"] and len(record["images"]["0"]["tree"]["branch_wins"]) == 2
    assert "expected K,D" in usage_error(capsys, *argv[:-1], "3")
    ar = ["generate", "--weights", str(weights), "-n", "1", "--out", str(tmp_path / "ar"), "--method", "ar", "--tree", "2,1"]
    assert "--tree 2,1 with --method ar: a draft tree needs a speculative method" in usage_error(capsys, *ar)


def test_check_tree_takes_numpy_integers_as_ints():
    """tree=(np.int64(2), np.int64(2)) was refused as 'allowed ... integers K >= 1'."""
    import numpy as np

    from csdgen.trees import check_tree

    tree = check_tree([np.int64(2), np.int64(3)])
    assert tree == (2, 3) and all(type(v) is int for v in tree)
    with pytest.raises(ValueError, match=r"^tree=\(2\.0, 2\): allowed None or \(K, D\) with integers"):
        check_tree((2.0, 2))


def test_check_tree_refuses_huge_depth_at_once():
    """tree=(10**5, 10**7) computed K**D (minutes of big-integer arithmetic) before refusing; K = 1 at any depth
    is a chain, allowed as the plain window (None); (2, 12) = 4096 leaves is the largest binary tree."""
    import time

    from csdgen.trees import check_tree

    start = time.perf_counter()
    for tree in [(10**5, 10**7), (2, 13), (4097, 1)]:
        with pytest.raises(ValueError, match=r"K\*\*D <= 4096"):
            check_tree(tree)
    assert time.perf_counter() - start < 1.0
    assert check_tree((2, 12)) == (2, 12) and check_tree((1, 10**7)) is None and check_tree((4096, 1)) == (4096, 1)


def test_cli_tree_shape_refuses_too_many_leaves_before_loading():
    """--tree 100,5 loaded the model and then printed the library's 'tree=(100, 5)' line; --tree 100000,10000000
    hung computing K**D. The option's parser now refuses K**D > 4096 in one line naming the value."""
    import argparse

    from csdgen.cli._options import tree_shape

    for text in ["100,5", "2,13", "100000,10000000"]:
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^'{text}': .*allowed K\*\*D <= 4096"):
            tree_shape(text)
    assert tree_shape("2,12") == (2, 12) and tree_shape("1,40") is None and tree_shape("3,2") == (3, 2)


@pytest.mark.parametrize("argv, expected", [
    (["generate", "--tree", "3,2", "--method", "ar"], "--tree 3,2 with --method ar: a draft tree needs a speculative"),
    (["generate", "--tree", "2,2", "--window", "1"], "--tree 2,2 with --window 1: a draft tree grows from the window's "
                                                     "drafts; allowed: --window 2 or more, or auto"),
    (["generate", "--engine", "eager", "--compile"], "--compile with --engine eager: compiled forwards need the static"),
    (["sweep", "--engine", "eager", "--compile"], "--compile with --engine eager: compiled forwards need the static"),
    (["compare", "--engine", "eager", "--compile"], "--compile with --engine eager: compiled forwards need the static"),
])
def test_cli_refuses_tree_with_ar_and_compile_with_eager_before_loading(argv, expected, tmp_path, capsys):
    """A new-user try-out found --tree with --method ar and --compile with --engine eager refused only after the
    model loaded, in the library's wording (tree=(3, 2) with method='ar'); they are now usage errors naming the
    options, in one line, before anything loads or --out is made."""
    err = usage_error(capsys, *argv, "--out", tmp_path / "out", one_line=True)
    assert expected in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, expected", [
    (["generate", "--tree", "-1,2"], "argument --tree: '-1,2': K and D must be integers >= 1"),
    (["sweep", "--csd-lam", "-1,0.5"], "argument --csd-lam: '-1,0.5': value -1.0 is out of range; allowed: finite numbers >= 0"),
])
def test_cli_negative_list_values_are_named_not_taken_for_options(argv, expected, capsys):
    """A new-user try-out found --tree -1,2 answered 'argument --tree: expected one argument' (argparse before
    Python 3.13 reads '-1,2' as an option); the value is now read as a value and its type names it."""
    assert expected in usage_error(capsys, *argv, one_line=True)


# -- argument checks (audit tester3, findings 21 and 24) --------------------------------------------------------

@pytest.mark.parametrize("K, D, W, name", [(0, 2, 4, "K"), (2, -1, 4, "D"), (2, 2, -3, "W"), (2, 2, 0, "W"),
                                           ([2], 2, 4, "K"), (2, 2.0, 4, "D"), (True, 2, 4, "K")])
def test_tree_layout_and_tree_nodes_refuse_sizes_outside_their_ranges(K, D, W, name):
    """tree_layout(0, 2, 4) laid out a tree with no candidates, (2, 2, -3) gave S = 1, a list K an
    'unhashable type' TypeError from the cache; tree_nodes(2, 2, 0) said 0 where tree_layout said 1."""
    from csdgen.trees import tree_nodes

    for function in (tree_layout, tree_nodes):
        with pytest.raises(ValueError, match=rf"^{function.__name__}: {name}=.*; allowed an integer >= [01]"):
            function(K, D, W)


def test_tree_nodes_agrees_with_tree_layout_at_the_edges_of_the_ranges():
    import numpy as np

    from csdgen.trees import tree_nodes

    for K, D, W in [(1, 0, 1), (2, 0, 3), (3, 5, 1), (2, 3, 2), (4, 1, 6), (np.int64(2), np.int64(2), np.int64(5))]:
        assert tree_nodes(K, D, W) == tree_layout(K, D, W).S, (K, D, W)
    assert tree_layout(np.int64(2), 2, 5) is tree_layout(2, 2, 5)  # numpy integers reach the same cached layout


def test_draw_siblings_refuses_k_below_1_and_uniforms_of_the_wrong_shape():
    """K=0 drew one candidate per level; too few uniforms gave an IndexError."""
    drafts, p = torch.zeros(2, 3, dtype=torch.long), torch.full((2, 3, 4), 0.25)
    for K in (0, 2.0):
        with pytest.raises(ValueError, match=r"^draw_siblings: K=.*; allowed an integer >= 1"):
            draw_siblings(drafts, p, K, torch.zeros(2, 3, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^draw_siblings: .*uniforms \[2, 3, 1\]; allowed .* = \[2, 3, 2\] \(K = 3\)"):
        draw_siblings(drafts, p, 3, torch.zeros(2, 3, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^draw_siblings: drafts \[2, 3\], draft_probs \[2, 4\]"):
        draw_siblings(drafts, p[:, 0], 2, torch.zeros(2, 3, 1, dtype=torch.float64))


def test_without_refuses_removed_tokens_that_are_not_int64_of_the_leading_shape():
    """Float tokens gave torch's 'scatter(): Expected dtype int32/int64' RuntimeError."""
    probs = torch.full((2, 4), 0.25)
    for bad in (torch.tensor([[0.0], [1.0]]), torch.tensor([[0]]), [[0], [1]]):
        with pytest.raises(ValueError, match=r"^without: removed is .*; allowed an int64 tensor \[\.\.\., k\]"):
            without(probs, bad)


def test_verify_tree_refuses_an_unknown_path_choice():
    from csdgen.acceptance import SJD
    from csdgen.trees import verify_tree

    with pytest.raises(ValueError, match=r"^choice='best': allowed 'first' \(exact\) or 'longest'"):
        verify_tree(SJD(), "independent", tree_layout(2, 1, 2), *[None] * 8, choice="best")
