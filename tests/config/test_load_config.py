"""RepositoryModelLoad's ``config`` (``load_config``) and the versions a request names
(``model_version``): the sans-IO rules, without a server.

The end-to-end behaviour (a worker and a gateway, through tritonclient) is in
``tests/worker/test_triton_examples.py``; here every field rule and every message, one by one.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest

from reactantserver.bundle.manifest import TensorSpec
from reactantserver.errors import InvalidArgument, NotFound
from reactantserver.load_config import MAX_TEXT, Override, Resolved, parse
from reactantserver.messages import model_config
from reactantserver.model_version import check_version, parse_version, serves_version

COMPILED = (1, 8, 16, 32)


class _Model:
    """Just what ModelConfig reads of a hosted model."""

    name = "simple"
    version = "1"
    platform = "jax_cpu"
    inputs = (TensorSpec("INPUT0", "INT32", (-1, 16)), TensorSpec("INPUT1", "INT32", (-1, 16)))
    outputs = (TensorSpec("OUTPUT0", "INT32", (-1, 16)),)
    max_batch_size = 32
    compiled_batch_sizes = COMPILED
    max_queue_depth = 1024
    parameters: ClassVar[dict[str, str]] = {
        "weight": "1",
        "residency": "default",
        "generation": "3",
    }


def reported() -> dict[str, Any]:
    return model_config(_Model(), backend="cpu", device_ordinal=0).to_dict()  # type: ignore[arg-type]


def resolve(text: str) -> Resolved:
    return parse("simple", text).resolve(
        reported(), compiled=COMPILED, batched=True, max_batch_size=32
    )


def refusal(text: str) -> str:
    with pytest.raises(InvalidArgument) as caught:
        resolve(text)
    return str(caught.value)


def test_the_three_values_a_config_changes() -> None:
    assert resolve('{"max_batch_size": "16"}') == Resolved(16, COMPILED, None)
    assert resolve('{"maxBatchSize": 8.0, "parameters": {"weight": {"stringValue": "2"}}}') == (
        Resolved(8, COMPILED, 2.0)
    )
    assert resolve('{"dynamic_batching": {"preferred_batch_size": ["16", 32, 16]}}') == (
        Resolved(32, (16, 32), None)
    )
    assert resolve("{}") == Resolved(32, COMPILED, None)


def test_modelconfig_read_back_and_sent_again_changes_nothing() -> None:
    """A config that restates ModelConfig as JSON (what a client reads and edits) is
    accepted whole, and resolves to what the model had."""
    text = json.dumps(reported())
    assert resolve(text) == Resolved(32, COMPILED, 1.0)
    # Two overrides that change the same values are equal, whatever else they restate.
    assert parse("simple", text) == parse(
        "simple", '{"max_batch_size": 32, "dynamic_batching": {"preferred_batch_size": '
        '[1, 8, 16, 32]}, "parameters": {"weight": {"string_value": "1"}}}'
    )  # fmt: skip


def test_defaults_and_omissions_say_nothing() -> None:
    accepted = (
        '{"dynamic_batching": {"max_queue_delay_microseconds": 0, "preserve_ordering": false}}',
        '{"instance_group": [{"count": 1}], "version_policy": {}}',
        '{"sequence_batching": {}, "model_transaction_policy": {"decoupled": false}}',
        '{"input": [{"name": "INPUT1", "dims": [16]}, {"name": "INPUT0"}]}',
        '{"parameters": {"generation": {"string_value": "99"}}}',  # read-only: ignored
    )
    for text in accepted:
        assert resolve(text) == Resolved(32, COMPILED, None), text


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"max_batch_size": 64}', "max_batch_size: 64, but the bundle is compiled for batches"),
        ('{"max_batch_size": 0}', "give 1 to 32"),
        ('{"dynamic_batching": {"preferred_batch_size": [4]}}', "([4] are not)"),
        (
            '{"dynamic_batching": {"preferred_batch_size": [8]}}',
            "the largest, 8, is below max_batch_size 32",
        ),
        ('{"instance_group": [{"count": 2}]}', "one execution at a time on its one device"),
        (
            '{"dynamic_batching": {"max_queue_delay_microseconds": 100}}',
            "never holds a request back waiting for company",
        ),
        (
            '{"input": [{"name": "INPUT0", "data_type": "TYPE_FP32"}, {"name": "INPUT1"}]}',
            "the tensors are the bundle's, fixed by its export",
        ),
        ('{"parameters": {"residency": {"string_value": "device"}}}', "only parameters.weight"),
        ('{"model_transaction_policy": {"decoupled": true}}', "model_transaction_policy: "),
    ],
)
def test_what_the_bundle_cannot_honour_is_refused_by_name(text: str, words: str) -> None:
    message = refusal(text)
    assert message.startswith("config: ") and words in message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"max_batch_size": 2', "config: not valid JSON (Expecting ',' delimiter"),
        ("[1, 2]", "a JSON object (a ModelConfig) is expected, got a list"),
        ("[" * 30_000 + "]" * 30_000, "nested too deeply"),
        (" " * (MAX_TEXT + 1), f"a ModelConfig in JSON is at most {MAX_TEXT}"),
        ('{"name": "other"}', """name: "other", but the model loaded is 'simple'"""),
        ('{"bogus": 1, "max_batch_size": "x"}', "bogus: not a field of ModelConfig; max_batch"),
        ('{"max_batch_size": true}', "an integer is expected, got true"),
        ('{"sequence_batching": {"max_sequence_idle_microseconds": 5}}', "sequence batching"),
        ('{"ensemble_scheduling": {"step": [{}]}}', "ensembles are meta models here"),
        ('{"parameters": {"weight": {"string_value": "-1"}}}', "<a finite number > 0>"),
        ('{"parameters": {"weight": "2"}}', "<a finite number > 0>"),
        ('{"dynamic_batching": {"preferred_batch_size": 8}}', "a list of batch sizes"),
    ],
)
def test_a_config_that_is_not_one_is_refused_before_any_load(text: str, words: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse("simple", text)
    assert words in str(caught.value)


def test_a_model_without_a_batch_axis_keeps_zero() -> None:
    unbatched = Override("u", max_batch_size=0)
    assert unbatched.resolve({}, compiled=(), batched=False, max_batch_size=0) == Resolved(
        0, (), None
    )
    with pytest.raises(InvalidArgument, match="has no batch axis"):
        Override("u", max_batch_size=4).resolve({}, compiled=(), batched=False, max_batch_size=0)


# ------------------------------------------------------------------ model versions


@pytest.mark.parametrize("requested", ["", "1", "01", "+1"])
def test_the_served_version_serves(requested: str) -> None:
    assert serves_version("1", requested)
    check_version("simple", "1", requested)


def test_another_version_is_not_found() -> None:
    assert parse_version("7") == 7 and not serves_version("1", "7")
    with pytest.raises(NotFound) as caught:
        check_version("simple", "1", "007")
    assert str(caught.value) == (
        "model 'simple' version 7 is not found: version 1 serves; ask for it, or send no version"
    )


@pytest.mark.parametrize("requested", ["wrong_specification", "7abc", "1.0", " 1", "x" * 500])
def test_a_string_that_is_not_a_version_is_refused_in_tritons_words(requested: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_version(requested)
    message = str(caught.value)
    assert message.startswith("failed to get model version from specified version string '")
    assert len(message) < 250  # the client's string is repeated, bounded


def test_a_negative_version_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="invalid model version specified '-1'"):
        parse_version("-1")
