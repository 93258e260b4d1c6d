"""The table of transforms (core/transforms.py), every row both ways: push lays the reference's
arrays out as the port holds them, pull reads the port's back. Where a group only moves values,
pull(push(x)) is x exactly; for every group, pull is push's adjoint (<push(x), y> = <x, pull(y)>),
which is what makes a gradient pull back through a sum. And `views` finds the layouts that keep a
weight's rows apart from its columns, the names' convention first, and only where none fits those
that interleave them (a head-shaped Einsum kernel with the input between its head axes)."""

import numpy as np
import pytest

from mhsa.port_check.core import transforms
from mhsa.port_check.core.transforms import Group, View

RNG = np.random.default_rng(0)
D, H, DH = 24, 4, 6  # d_model, heads, d_head: H * DH == D


def group(references, ports, views, shapes, combine="concat", index=None):
    return Group(tuple(references), tuple(ports), tuple(views), tuple(shapes), combine, index)


CASES = {
    "as it is": group(["w"], ["w"], [transforms.same((5, 3))], [(5, 3)]),
    "transposed": group(["w"], ["kernel"], [transforms.transpose((5, 3))], [(5, 3)]),
    "head axes split (a kernel)": group(["w"], ["kernel"], [View((D, 7), (7, H, DH), transposed=True)], [(D, 7)]),
    "head axes merged in (an output kernel)": group(["w"], ["kernel"], [View((7, D), (H, DH, 7), transposed=True)], [(7, D)]),
    "rows and columns interleaved (an Einsum kernel (H, in, d_head))": group(["w"], ["kernel"], transforms.views((D, 7), (H, 7, DH), None), [(D, 7)]),
    "concatenated and interleaved (k, v into (2, H, in, d_head))": group(
        ["k", "v"], ["kv"], transforms.views((2 * D, 7), (2, H, 7, DH), None), [(D, 7)] * 2
    ),
    "a bias's head axes": group(["b"], ["bias"], [View((D,), (H, DH))], [(D,)]),
    "split (a fused qkv)": group(["qkv"], ["q", "k", "v"], [View((D, 7), (7, H, DH), transposed=True)] * 3, [(3 * D, 7)]),
    "split unequally (grouped-query heads)": group(
        ["qkv"], ["q", "k", "v"], [transforms.same((8, 5)), transforms.same((4, 5)), transforms.same((4, 5))], [(16, 5)]
    ),
    "concatenated (q, k, v into one (D, 3, H, d_head))": group(
        ["q", "k", "v"], ["qkv"], [View((3 * D, 7), (7, 3, H, DH), transposed=True)], [(D, 7)] * 3
    ),
    "summed and split (torch's LSTM biases, per gate)": group(
        ["b_ih", "b_hh"], ["i", "f", "g", "o"], [transforms.same((6,))] * 4, [(24,), (24,)], "sum"
    ),
    "summed (torch's LSTM biases, packed)": group(["b_ih", "b_hh"], ["bias"], [transforms.same((24,))], [(24,), (24,)], "sum"),
    "GRU biases with b_hn kept (Equinox)": group(
        ["b_ih", "b_hh"], ["bias", "bias_n"], [transforms.same((18,)), transforms.same((6,))], [(18,), (18,)], "gru"
    ),
    "GRU biases, b_hn lost (nnx.GRUCell)": group(["b_ih", "b_hh"], ["bias"], [transforms.same((18,))], [(18,), (18,)], "gru"),
    "stacked (one layer of three)": group(["h.1.w"], ["h.w"], [transforms.transpose((5, 3))], [(5, 3)], index=1),
}


def _port_arrays(case: Group, values: list[np.ndarray]) -> list[np.ndarray]:
    """The port's whole arrays holding `values` (a stacked group's at its index of three layers)."""
    if case.index is None:
        return values
    return [np.stack([RNG.standard_normal(value.shape) if layer != case.index else value for layer in range(3)]) for value in values]


@pytest.mark.parametrize("name", list(CASES))
def test_push_then_pull_gives_the_values_back_where_the_group_only_moves_them(name):
    case = CASES[name]
    references = [RNG.standard_normal(shape) for shape in case.shapes]
    pushed = case.push(references)
    assert [value.shape for value in pushed] == [view.shape for view in case.views]
    pulled = case.pull(_port_arrays(case, pushed))
    assert [value.shape for value in pulled] == list(case.shapes)
    if case.exact:
        for reference, back in zip(references, pulled):
            np.testing.assert_array_equal(back, reference, err_msg=name)


@pytest.mark.parametrize("name", list(CASES))
def test_pull_is_the_adjoint_of_push_so_gradients_pull_back_through_every_group(name):
    case = CASES[name]
    x = [RNG.standard_normal(shape) for shape in case.shapes]
    y = [RNG.standard_normal(view.shape) for view in case.views]
    forward = sum(float(np.vdot(a, b)) for a, b in zip(case.push(x), y))
    backward = sum(float(np.vdot(a, b)) for a, b in zip(x, case.pull(_port_arrays(case, y))))
    assert forward == pytest.approx(backward, rel=1e-12), name


def test_a_fused_qkv_split_puts_query_key_and_value_rows_where_torch_keeps_them():
    qkv = np.arange(3 * D * 7, dtype=np.float64).reshape(3 * D, 7)  # (3D, in): rows [0, D) are q
    q, k, v = CASES["split (a fused qkv)"].push([qkv])
    np.testing.assert_array_equal(k, qkv[D : 2 * D].T.reshape(7, H, DH))  # head h owns rows h*d_head ... of each
    assert q.shape == (7, H, DH) and np.array_equal(v[:, 2], qkv[2 * D + 2 * DH : 2 * D + 3 * DH].T)


def test_torchs_gru_biases_sum_for_r_and_z_and_keep_b_hn_apart_or_lose_it():
    b_ih, b_hh = np.arange(18.0), 100 + np.arange(18.0)
    bias, bias_n = CASES["GRU biases with b_hn kept (Equinox)"].push([b_ih, b_hh])
    np.testing.assert_array_equal(bias, np.concatenate([b_ih[:12] + b_hh[:12], b_ih[12:]]))
    np.testing.assert_array_equal(bias_n, b_hh[12:])
    (lost,) = CASES["GRU biases, b_hn lost (nnx.GRUCell)"].push([b_ih, b_hh])
    np.testing.assert_array_equal(lost, bias)


def test_views_keep_rows_and_columns_apart_and_put_the_names_convention_first():
    # (H*d_head, D) as (D, H, d_head): only transposed; as (H, d_head, D): only as it is, its rows split
    assert [view.transposed for view in transforms.views((D, 7), (7, H, DH), kernel=None)] == [True]
    assert [view.transposed for view in transforms.views((D, 7), (H, DH, 7), kernel=None)] == [False]
    assert transforms.views((D, 7), (7, DH, H), kernel=None)[0].push(np.ones((D, 7))).shape == (7, DH, H)  # shapes fit; values say the rest
    square = transforms.views((D, D), (D, H, DH), kernel=True)
    assert [view.transposed for view in square] == [True, False]  # a kernel's inputs come first
    assert [view.transposed for view in transforms.views((D, D), (D, H, DH), kernel=False)] == [False, True]
    assert transforms.views((D, 7), (5, 7), kernel=None) == []  # another size: no view


def test_a_kernel_with_the_input_between_its_head_axes_is_read_by_heads_only_where_no_plain_layout_fits():
    w = np.arange(D * 7.0).reshape(D, 7)  # (H*d_head, in): head n owns rows n*d_head ...
    (view,) = transforms.views((D, 7), (H, 7, DH), kernel=None)
    np.testing.assert_array_equal(view.push(w)[2, :, 5], w[2 * DH + 5])
    assert view.words() == "its rows split into (4, 6), its columns into (7,), laid out as (4, 7, 6)"
    (kv,) = CASES["concatenated and interleaved (k, v into (2, H, in, d_head))"].push([w, -w])
    np.testing.assert_array_equal(kv[1, 3, :, 0], -w[3 * DH])  # v's head 3
    assert transforms.views((7, D), (H, DH, 7), kernel=None)[0].order == ()  # a plain layout fits: no interleaving
    assert (
        transforms.views((6, 6), (2, 6, 3), kernel=None) != [] and len(transforms.views((6, 6), (6, 1, 6), kernel=None)) == 2
    )  # size-1 axes move nothing


def test_a_group_says_how_it_is_read():
    assert CASES["transposed"].words() == "transposed"
    assert CASES["split (a fused qkv)"].words() == "split in 3 along its first axis, each transposed and reshaped to (7, 4, 6)"
    assert CASES["summed and split (torch's LSTM biases, per gate)"].words() == "summed, split in 4 along its first axis"
    assert CASES["stacked (one layer of three)"].words() == "transposed, stacked at index 1 of the port's first axis"
    assert CASES["stacked (one layer of three)"].port_names() == "h.w[1]"
