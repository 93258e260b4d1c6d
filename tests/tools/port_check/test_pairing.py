"""The pairing's rules (forward/pairing.py) on parameters alone: names through the map, Linen's list
index, conventions, a list of layers against a stack, a fused projection split by structure (q, k,
v by their names), and the name map's syntax for what structure cannot say (a pattern, a slice of a
stack, a split, a concatenation, a sum, a forced transpose); a parameter with several candidates
is named ambiguous, never paired on shape alone; a map's own mistake is one line."""

import json

import numpy as np
import pytest

from mhsa.cli import main as mhsa
from mhsa.port_check.forward.pairing import Sides, check_map, pair_parameters, pull, push

RNG = np.random.default_rng(0)


def arrays(**shapes) -> dict[str, np.ndarray]:
    return {name.replace("__", "."): RNG.standard_normal(shape) for name, shape in shapes.items()}


def sides(reference: dict, port: dict, reference_types=None, port_types=None, order=(None, None)) -> Sides:
    modules = lambda names: {name.rpartition(".")[0]: "Linear" for name in names} | {"": "Model"}  # noqa: E731
    orders = (
        order[0] or list(dict.fromkeys(name.rpartition(".")[0] for name in reference)),
        order[1] or list(dict.fromkeys(name.rpartition(".")[0] for name in port)),
    )
    return Sides(reference, port, reference_types or modules(reference), port_types or modules(port), order=lambda: orders)


def pairs(report) -> dict[str, str]:
    return {name: group.port_names() for group in report.groups for name in group.reference}


def test_a_fused_projection_splits_into_the_modules_q_k_v_name_whatever_their_call_order():
    reference = arrays(attn__qkv__weight=(18, 6), attn__qkv__bias=(18,))
    port = arrays(attn__v__kernel=(6, 6), attn__v__bias=(6,), attn__q__kernel=(6, 6), attn__q__bias=(6,), attn__k__kernel=(6, 6), attn__k__bias=(6,))
    report = pair_parameters(sides(reference, port))
    assert pairs(report) == {
        "attn.qkv.weight": "attn.q.kernel, attn.k.kernel, attn.v.kernel",
        "attn.qkv.bias": "attn.q.bias, attn.k.bias, attn.v.bias",
    }
    weight = next(group for group in report.groups if group.reference == ("attn.qkv.weight",))
    assert weight.words() == "split in 3 along its first axis, each transposed"  # a kernel's inputs come first
    pulled = pull(report.groups, push(report.groups, reference, {name: value.shape for name, value in port.items()}))
    assert all(np.array_equal(pulled[name], reference[name]) for name in reference)


def test_two_modules_of_one_shape_for_one_of_the_reference_are_ambiguous_never_paired_on_shape():
    report = pair_parameters(sides(arrays(proj__weight=(6, 6)), arrays(left__weight=(6, 6), right__weight=(6, 6))))
    assert not report.groups and report.ambiguous == [("proj", ["left", "right"])]


def test_a_list_of_layers_pairs_with_slices_of_a_stack_and_blocks_of_two_layers_too():
    reference = {f"h.{i}.fc.weight": RNG.standard_normal((5, 7)) for i in range(4)}
    stacked = {"h.fc.weight": np.stack([reference[f"h.{i}.fc.weight"] for i in range(4)])}
    report = pair_parameters(sides(reference, stacked))
    assert pairs(report) == {f"h.{i}.fc.weight": f"h.fc.weight[{i}]" for i in range(4)} and report.renamed == {"h.{i}": "h[{i}]"}
    grouped = {f"h.layers_{m}.fc.weight": np.stack([reference[f"h.{2 * j + m}.fc.weight"] for j in range(2)]) for m in range(2)}
    report = pair_parameters(sides(reference, grouped))
    assert pairs(report) == {f"h.{i}.fc.weight": f"h.layers_{i % 2}.fc.weight[{i // 2}]" for i in range(4)}
    assert report.renamed == {f"h.{i}": f"h[{i // 2}].layers_{i % 2}" for i in range(4)}


def test_a_layers_parameters_the_stack_names_otherwise_stay_for_the_map_and_the_rest_pair():
    reference = {f"h.{i}.{name}": RNG.standard_normal(shape) for i in range(3) for name, shape in (("norm.weight", (4,)), ("q.weight", (6, 4)))}
    port = {"h.norm.weight": np.stack([reference[f"h.{i}.norm.weight"] for i in range(3)]), "h.q_einsum.w": RNG.standard_normal((3, 2, 4, 3))}
    report = pair_parameters(sides(reference, port))
    assert pairs(report) == {f"h.{i}.norm.weight": f"h.norm.weight[{i}]" for i in range(3)} and report.reference_left == [
        f"h.{i}.q.weight" for i in range(3)
    ]
    mapped = pair_parameters(sides(reference, port), {"h.{i}.q.weight": "h.q_einsum.w[{i}]"})
    assert not mapped.reference_left and not mapped.port_left and len(mapped.groups) == 6


def test_the_maps_syntax_says_what_structure_cannot():
    reference = arrays(a__weight=(6, 4), b__weight=(2, 4), c__weight=(2, 4), d__bias=(3,), e__bias=(3,), f__weight=(5, 5), g__weight=(4, 3))
    port = arrays(x__w=(6, 4), y__w=(4, 4), z__b=(3,), t__w=(5, 5), u__a=(2, 3), u__b=(2, 3))
    name_map = {"a.weight": "x.w", "b.weight, c.weight": "y.w", "d.bias + e.bias": "z.b", "f.weight": "t.w.T", "g.weight": ["u.a", "u.b"]}
    report = pair_parameters(sides(reference, port), name_map)
    found = {group.reference: (group.port, group.words()) for group in report.groups}
    assert found == {
        ("a.weight",): (("x.w",), "as it is"),
        ("b.weight", "c.weight"): (("y.w",), "concatenated"),
        ("d.bias", "e.bias"): (("z.b",), "summed"),
        ("f.weight",): (("t.w",), "transposed"),  # the map's .T
        ("g.weight",): (("u.a", "u.b"), "split in 2 along its first axis"),
    }
    assert not report.reference_left and not report.port_left
    with pytest.raises(ValueError, match=r"the map's entry g\.weight -> x\.nope, u\.b: the port has no parameter 'x\.nope'"):
        pair_parameters(sides(reference, port), {"g.weight": ["x.nope", "u.b"]})
    with pytest.raises(ValueError, match=r"g\.weight \(4, 3\) cannot be laid out as x\.w \(6, 4\), u\.b \(2, 3\)"):
        pair_parameters(sides(reference, port), {"g.weight": ["x.w", "u.b"]})


def test_a_renaming_entry_that_pairs_nothing_is_refused_naming_it_and_a_jax_librarys_own_leaf_name_is_its_array():
    reference = {f"h.{i}.norm.weight": RNG.standard_normal(4) for i in range(2)} | {"h.0.fc.weight": RNG.standard_normal((4, 4))}
    port = {"h.norm.weight": np.stack([reference[f"h.{i}.norm.weight"] for i in range(2)]), "h.fc.weight": RNG.standard_normal((1, 4, 4))}
    for spelled in ("h.norm.weight[{i}]", "h.norm.scale[{i}]"):  # the reader's name for it, or Flax's own
        assert pairs(pair_parameters(sides(reference, port), {"h.{i}.norm.weight": spelled}))["h.1.norm.weight"] == "h.norm.weight[1]"
    typo = r"the map's entry 'h\.\{i\}\.norm\.weight' -> 'h\.nrm\.weight\[\{i\}\]': the port has no parameter 'h\.nrm\.weight\[0\]'$"
    with pytest.raises(ValueError, match=typo):
        pair_parameters(sides(reference, port), {"h.{i}.norm.weight": "h.nrm.weight[{i}]"})
    with pytest.raises(
        ValueError, match=r"the map's entry 'blocks\.\{i\}' -> 'h\[\{i\}\]': the reference has no parameter or module 'blocks\.\{i\}'"
    ):
        pair_parameters(sides(reference, port), {"blocks.{i}": "h[{i}]"})
    types = {"h.0.norm": "LayerNorm", "h.1.norm": "LayerNorm", "h.0.fc": "Linear", "h.0.act": "GELU", "": "Model"}
    named = pair_parameters(sides(reference, port, reference_types=types), {"h.{i}.act": "h[{i}].gelu", "h.{i}": "h[{i}]"})
    assert len(named.groups) == 3  # a module's entry names no parameter: its value is no port parameter either


def test_a_weight_whose_shapes_leave_two_interleavings_open_pairs_by_its_values_or_by_a_map_entry_naming_it():
    weight = RNG.standard_normal((24, 24))  # (N*d_head, D) as an Einsum's (N, D, d_head), or as (N*d_head)'s transpose cut the same way
    held = weight.reshape(3, 8, 24).transpose(0, 2, 1)
    converted = pair_parameters(sides({"q.weight": weight}, {"q.weight": held}))
    assert converted.groups[0].found == "values" and np.array_equal(converted.groups[0].push([weight])[0], held)
    fresh = pair_parameters(sides({"q.weight": weight}, {"q.weight": RNG.standard_normal((3, 24, 8))}))
    assert not fresh.groups and [(pair.reference, pair.layouts) for pair in fresh.mismatched] == [("q.weight", 2)]
    named = pair_parameters(sides({"q.weight": weight}, {"q.weight": RNG.standard_normal((3, 24, 8))}), {"q.weight": "q.weight"})
    assert named.groups[0].found == "map" and np.array_equal(named.groups[0].push([weight])[0], held)  # untransposed: .T would say otherwise


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"h.{i}": "h[{j}]"}, "uses {j}, which the key does not match"),
        ({"a": "b[1][2]"}, "may hold one index"),
        ({"a": []}, "is not a name to a name"),
        ({"a{": "b"}, "has a brace that is no {field}"),
    ],
)
def test_a_maps_mistake_is_one_line_before_any_model_is_built(entry, message, tmp_path, capsys):
    with pytest.raises(ValueError, match=message):
        check_map(entry)
    path = tmp_path / "map.json"
    path.write_text(json.dumps(entry))
    assert mhsa(["port-check", "examples.torch_block:block", "examples.flax_block:block", "--map", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith(f"mhsa port-check: error: --map file '{path}': ")


def test_a_parameter_the_names_leave_ambiguous_pairs_with_the_candidate_holding_its_values_in_a_converted_port():
    reference = arrays(norm__weight=(5,))
    held = {"norm.scale": reference["norm.weight"].copy(), "norm.gamma": RNG.standard_normal(5)}  # a converter wrote scale
    report = pair_parameters(sides(reference, held))
    assert [(group.reference, group.port, group.found) for group in report.groups] == [(("norm.weight",), ("norm.scale",), "values")]
    fresh = {"norm.scale": RNG.standard_normal(5), "norm.gamma": RNG.standard_normal(5)}  # values say nothing: ambiguous, the check stops
    assert pair_parameters(sides(reference, fresh)).ambiguous == [("norm.weight", ["norm.gamma", "norm.scale"])]
