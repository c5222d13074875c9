"""Draft initialisation and refresh."""

import pytest
import torch

from csdgen.drafting import check_drafting, init_drafts, refresh_drafts
from csdgen.integers import as_integer


def test_uniform_and_onehot_initialisation():
    tokens = torch.zeros(2, 10, dtype=torch.long)
    u = torch.tensor([[0.0, 0.5, 0.99], [0.26, 0.74, 0.1]], dtype=torch.float64)
    draft, probs = init_drafts("uniform", tokens, 4, 3, 4, 5, u)
    assert draft.tolist() == [[0, 2, 3], [1, 2, 0]]
    assert torch.allclose(probs, torch.full((2, 3, 4), 0.25))
    draft1, probs1 = init_drafts("onehot", tokens, 4, 3, 4, 5, u)
    assert torch.equal(draft1, draft) and torch.equal(probs1.argmax(-1), draft) and torch.equal(probs1.sum(-1), torch.ones(2, 3))


def test_repeat_horizontal_copies_last_known_token():
    tokens = torch.tensor([[1, 2, 3, 0, 0, 0], [4, 5, 6, 0, 0, 0]])
    draft, probs = init_drafts("repeat-horizontal", tokens, 3, 3, 8, 3, torch.zeros(2, 3, dtype=torch.float64))
    assert draft.tolist() == [[3, 3, 3], [6, 6, 6]]
    assert torch.equal(probs.argmax(-1), draft)


def test_repeat_vertical_copies_row_above_and_random_in_first_row():
    # grid rows of 3; known positions 0..3; new slots 4..9
    tokens = torch.tensor([[10, 11, 12, 13, 0, 0, 0, 0, 0, 0]])
    draft, _ = init_drafts("repeat-vertical", tokens, 4, 6, 20, 3, torch.zeros(1, 6, dtype=torch.float64))
    # 4 <- 1, 5 <- 2, 6 <- 3, 7 <- 4 <- 1 (chained), 8 <- 2, 9 <- 3
    assert draft.tolist() == [[11, 12, 13, 11, 12, 13]]
    first_row, _ = init_drafts("repeat-vertical", tokens[:, :2], 1, 1, 20, 3, torch.full((1, 1), 0.5, dtype=torch.float64))
    assert first_row.tolist() == [[10]]  # no row above: random token floor(0.5 * 20)


def test_coupled_refresh_keeps_good_drafts_and_has_target_law():
    V, n = 4, 200_000
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.4, 0.3, 0.2, 0.1])
    x = torch.multinomial(p, n, replacement=True, generator=g)[None]
    u1, u2 = torch.rand(2, 1, n, dtype=torch.float64, generator=g)
    new = refresh_drafts("coupled", x, p.expand(1, n, V), q.expand(1, n, V), torch.zeros_like(x), u1, u2)
    law = torch.bincount(new[0], minlength=V).double() / n
    assert (law - q.double()).abs().max() < 0.005
    # maximal coupling: P(new == old) = 1 - TV(p, q) = 1 - 0.4
    assert abs((new == x).double().mean().item() - 0.6) < 0.005
    y = torch.arange(n)[None] % V
    assert torch.equal(refresh_drafts("independent", x, p.expand(1, n, V), q.expand(1, n, V), y, u1, u2), y)


def test_unknown_drafting_names_raise():
    with pytest.raises(ValueError, match="unknown draft initialisation 'zeros'"):
        check_drafting("zeros", "independent")
    with pytest.raises(ValueError, match="unknown draft refresh 'gumbel'"):
        check_drafting("uniform", "gumbel")


# -- argument checks (audit tester3, findings 14 and 24) --------------------------------------------------------

def _u(B, S):
    return torch.full((B, S), 0.5, dtype=torch.float64)


def test_init_drafts_refuses_uniforms_that_do_not_hold_count_slots():
    """count=3 with [2, 4] uniforms silently gave [2, 4] drafts: count was ignored."""
    tokens = torch.zeros(2, 7, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^init_drafts: uniforms \[2, 4\]; allowed \[B, count\] = \[2, 3\]$"):
        init_drafts("onehot", tokens, 3, 3, 4, 7, _u(2, 4))
    with pytest.raises(ValueError, match=r"^init_drafts: positions is torch.int64 \[2, 4\]; allowed None or an integer"):
        init_drafts("onehot", tokens, 3, 3, 4, 7, _u(2, 3), positions=torch.zeros(2, 4, dtype=torch.long))


@pytest.mark.parametrize("name, args", [
    ("count", dict(count=-1)), ("count", dict(count=2.0)), ("row_length", dict(row_length=0)),
    ("row_length", dict(row_length=-1)), ("vocab_size", dict(vocab_size=0)), ("first", dict(first=0)),
    ("first", dict(first=1.5)),
])
def test_init_drafts_refuses_counts_sizes_and_first_outside_their_ranges(name, args):
    """row_length=-1 ran silently (garbage drafts), 0 was a ZeroDivisionError, first=0 silently copied
    position 0, count=-1 a torch arange error."""
    call = dict(kind="repeat-vertical", tokens=torch.zeros(2, 7, dtype=torch.long), first=3, count=2, vocab_size=4,
                row_length=2)
    call.update(args)
    S = max(as_integer(call["count"]) or 0, 0)
    with pytest.raises(ValueError, match=rf"^init_drafts: {name}=.*; allowed an int"):
        init_drafts(call.pop("kind"), *call.values(), _u(2, S))


def test_init_drafts_refuses_an_unknown_kind_and_a_float_first_tensor():
    tokens = torch.zeros(2, 7, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^unknown draft initialisation 'repeat'; allowed: uniform, onehot"):
        init_drafts("repeat", tokens, 3, 2, 4, 7, _u(2, 2))
    with pytest.raises(ValueError, match=r"^init_drafts: first is torch.float32 \[2\]; allowed an int >= 1 or an integer"):
        init_drafts("repeat-horizontal", tokens, torch.tensor([3.0, 4.0]), 2, 4, 7, _u(2, 2))
    draft, _ = init_drafts("repeat-horizontal", tokens, torch.tensor([3, 4]), 2, 4, 7, _u(2, 2))  # per image: allowed
    assert draft.shape == (2, 2)
