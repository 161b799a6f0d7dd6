"""Hostile and malformed input: fuzzed signature files, config.pbtxt texts and model names end in a
clear validation error or a valid object, never in another exception."""

from __future__ import annotations

import contextlib
import json
import string

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.model import model_config
from components.model.signature import Signature, SignatureError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=30,
)
tensor = st.fixed_dictionaries(
    {
        "name": st.text(min_size=0, max_size=20) | st.sampled_from(["x", "ids", "../x", "a/b", ".h", "x\n"]),
        "dtype": st.sampled_from(["fp32", "fp16", "bf16", "int32", "int64", "bool", "float", "", "FP32"]),
        "shape": st.lists(st.integers(-3, 5) | st.booleans(), max_size=4),
    },
    optional={"range": json_values},
)
signatures = st.fixed_dictionaries(
    {},
    optional={
        "batch": json_values,
        "max_batch_size": json_values,
        "inputs": st.lists(tensor, max_size=3) | json_values,
        "outputs": st.lists(tensor, max_size=3) | json_values,
    },
)
SAFE = set(string.ascii_letters + string.digits + "_.-")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(signatures)
def test_signature_structures_validate_or_fail_clearly(data):
    try:
        signature = Signature.from_dict(data)
    except SignatureError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
        return
    for spec in signature.inputs + signature.outputs:
        assert set(spec.name) <= SAFE and not spec.name.startswith((".", "-"))
        assert all(d == -1 or d > 0 for d in spec.shape)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_signature_files_of_any_text_fail_clearly(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("sig") / "signature.yaml"
    path.write_text(text)
    with contextlib.suppress(SignatureError):
        Signature.load(path)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.builds(lambda d: yaml.safe_dump(d), json_values))
def test_config_pbtxt_of_any_text_parses_or_fails_clearly(text):
    try:
        model_config.parse_pbtxt(text)
    except model_config.ModelConfigError as exc:
        assert "not a valid Triton model configuration" in str(exc)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=140))
def test_model_names_are_safe_triton_names_and_s3_key_segments(name):
    try:
        accepted = model_config.validate_model_name(name)
    except model_config.ModelConfigError:
        return
    assert set(accepted) <= SAFE and ".." not in accepted and "/" not in accepted
    assert not accepted.startswith((".", "-")) and len(accepted) <= 128
    assert model_config.CANDIDATE_SUFFIX not in accepted


def test_json_and_yaml_signature_files_are_equivalent(tmp_path):
    data = {
        "batch": True,
        "max_batch_size": 4,
        "inputs": [{"name": "x", "dtype": "fp32", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "dtype": "int64", "shape": [-1, 1]}],
    }
    (tmp_path / "s.json").write_text(json.dumps(data))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    assert Signature.load(tmp_path / "s.json") == Signature.load(tmp_path / "s.yaml")
