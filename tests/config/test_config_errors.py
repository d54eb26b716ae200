"""A bad configuration gets one line per problem: ``file:line: key.path: expected ...; got ...``.

Each case of the tables is a whole file and the whole message it must produce, so the
tables double as the catalogue of what an operator sees. The file is named as the user
gave it (here a relative ``node.yaml`` / ``gateway.yml``) and the line is that of the
offending key. The table cases hold one mistake each (their repositories are fictional,
so they are loaded with ``check_paths=False``); the tests at the end hold several, and
every one of them must be reported in the same run.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from reactantserver.config import (
    load_gateway,
    load_node,
    materialize_workers,
    resolve_gateway,
    resolve_worker,
)
from reactantserver.errors import ConfigError

NODE_CASES: list[tuple[str, str, str]] = [
    (
        "discipline-typo",
        """\
        model_repo: /models
        base_port: 8080
        metrics_base_port: 9100
        gpus: auto

        global:
          cache_dir: /var/cache/reactantserver
          model_control_mode: dynamic
          runtime:
            backend: cuda
            mem_fraction: 0.9
            weight_cache_fraction: 1.0
          scheduler:
            discipline: fiar
        """,
        "node.yaml:14: global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'",
    ),
    (
        "unknown-scheduler-key",
        """\
        model_repo: /models
        global:
          scheduler:
            dscipline: fifo
        """,
        "node.yaml:4: global.scheduler.dscipline: unknown key; expected one of discipline, "
        "ema_halflife_seconds, max_queue_depth, dispatch_timeout_seconds, compaction_interval, "
        "cost_ema_alpha, recency_penalty_cap, meta_concurrency, inline_max_seconds, pipeline_depth, models (did you mean discipline?)",
    ),
    (
        "pipeline-depth-zero",
        """\
        model_repo: /models
        global:
          scheduler:
            pipeline_depth: 0
        """,
        "node.yaml:4: global.scheduler.pipeline_depth: expected an integer >= 1 "
        "(1 = no pipelining); got 0",
    ),
    (
        "unknown-top-level-key",
        """\
        model_repo: /models
        base_prot: 8000
        """,
        "node.yaml:2: base_prot: unknown key; expected one of model_repo, base_port, "
        "metrics_base_port, gpus, global, workers, models, gateway (did you mean base_port?)",
    ),
    (
        "legacy-batch-policy",
        """\
        model_repo: /models
        global:
          batch_policy:
            max_batch_size: 8
        """,
        "node.yaml:3: global.batch_policy: removed; batches are coalesced at the bundle's "
        "compiled batch sizes: cap rows per dispatch with scheduler.models.<name>.max_batch_size "
        "and choose the dispatch order with scheduler.discipline",
    ),
    (
        "legacy-residency-mode",
        """\
        model_repo: /models
        workers:
          - name: worker0
            runtime:
              residency_mode: externally_managed
        """,
        "node.yaml:5: workers[0].runtime.residency_mode: removed; use the top-level "
        "model_control_mode instead ('explicit' replaces 'externally_managed'; 'dynamic' and "
        "'static' are self-managed)",
    ),
    (
        "pin-to-gpu-contradiction",
        """\
        model_repo: /models
        global:
          scheduler:
            models:
              resnet50:
                residency: system
                pin_to_gpu: true
        """,
        "node.yaml:7: global.scheduler.models.resnet50.pin_to_gpu: pin_to_gpu: true contradicts "
        "residency: system (pin_to_gpu: true is an alias for residency: device); keep only "
        "residency",
    ),
    (
        "mem-fraction-zero",
        """\
        model_repo: /models
        global:
          runtime:
            mem_fraction: 0
        """,
        "node.yaml:4: global.runtime.mem_fraction: expected a number in (0, 1]; got 0.0",
    ),
    (
        "weight-cache-fraction-above-one",
        """\
        model_repo: /models
        global:
          runtime:
            weight_cache_fraction: 1.5
        """,
        "node.yaml:4: global.runtime.weight_cache_fraction: expected a number in [0, 1]; got 1.5",
    ),
    (
        "negative-half-life",
        """\
        model_repo: /models
        global:
          scheduler:
            ema_halflife_seconds: -30
        """,
        "node.yaml:4: global.scheduler.ema_halflife_seconds: expected a number > 0; got -30.0",
    ),
    (
        "queue-depth-zero-on-a-worker",
        """\
        model_repo: /models
        workers:
          - name: a
          - name: b
            scheduler:
              max_queue_depth: 0
        """,
        "node.yaml:6: workers[1].scheduler.max_queue_depth: expected an integer >= 1; got 0",
    ),
    (
        "model-weight-zero",
        """\
        model_repo: /models
        global:
          scheduler:
            models:
              resnet50: {weight: 0}
        """,
        "node.yaml:5: global.scheduler.models.resnet50.weight: expected a number > 0; got 0.0",
    ),
    (
        "negative-max-batch-size",
        """\
        model_repo: /models
        global:
          scheduler:
            models:
              yolo:
                max_batch_size: -1
        """,
        "node.yaml:6: global.scheduler.models.yolo.max_batch_size: expected an integer >= 0 "
        "(0 = uncapped); got -1",
    ),
    (
        "poll-interval-zero",
        """\
        model_repo: /models
        global:
          model_poll_seconds: 0
        """,
        "node.yaml:3: global.model_poll_seconds: expected a number > 0; got 0.0",
    ),
    (
        "control-mode",
        """\
        model_repo: /models
        global:
          model_control_mode: manual
        """,
        "node.yaml:3: global.model_control_mode: expected one of dynamic, static, explicit; "
        "got 'manual'",
    ),
    (
        "boolean-spelled-yes",
        """\
        model_repo: /models
        global:
          runtime:
            preallocate: yes
        """,
        "node.yaml:4: global.runtime.preallocate: expected true or false; got 'yes'",
    ),
    (
        "port-as-string",
        """\
        model_repo: /models
        workers:
          - name: worker0
            port: "8081"
        """,
        "node.yaml:4: workers[0].port: expected an integer; got '8081'",
    ),
    (
        "base-port-out-of-range",
        """\
        model_repo: /models
        base_port: 70000
        """,
        "node.yaml:2: base_port: expected a port in 1..65535; got 70000",
    ),
    (
        "derived-port-out-of-range",
        """\
        model_repo: /models
        base_port: 65535
        workers:
          - name: a
          - name: b
        """,
        "node.yaml:2: base_port: expected base_port + 1 (b's gRPC port) <= 65535; got 65536",
    ),
    (
        "duplicate-worker-names",
        """\
        model_repo: /models
        workers:
          - name: worker0
          - name: worker0
        """,
        "node.yaml:4: workers[1].name: expected distinct worker names; 'worker0' is listed twice",
    ),
    (
        "explicit-port-collides-with-base-port",
        """\
        model_repo: /models
        base_port: 8080
        workers:
          - name: worker0
          - name: worker1
            port: 8080
        """,
        "node.yaml:6: workers[1].port: expected a port of its own; 8080 would be worker1's gRPC "
        "port and is already worker0's gRPC port",
    ),
    (
        "metrics-ports-overlap-grpc-ports",
        """\
        model_repo: /models
        base_port: 8080
        metrics_base_port: 8081
        workers:
          - name: worker0
          - name: worker1
        """,
        "node.yaml:6: workers[1]: expected a port of its own; 8081 would be worker1's gRPC port "
        "and is already worker0's metrics port",
    ),
    (
        "metrics-port-zero-is-off",
        """\
        model_repo: /models
        workers:
          - name: worker0
            metrics_port: -1
        """,
        "node.yaml:4: workers[0].metrics_port: expected a port in 1..65535, or 0 for off; got -1",
    ),
    (
        "bad-worker-name",
        """\
        model_repo: /models
        workers:
          - name: worker 0
        """,
        "node.yaml:3: workers[0].name: expected a name of letters, digits, '.', '_' and '-'; "
        "got 'worker 0'",
    ),
    (
        "worker-entry-not-a-mapping",
        """\
        model_repo: /models
        workers:
          - worker0
        """,
        "node.yaml:3: workers[0]: expected a mapping; got 'worker0'",
    ),
    (
        "unknown-key-in-worker-entry",
        """\
        model_repo: /models
        workers:
          - name: worker0
            device: 1
        """,
        "node.yaml:4: workers[0].device: unknown key; expected one of name, port, metrics_port, "
        "gpu, cache_dir, follow_symlinks, model_control_mode, model_poll_seconds, models_include, runtime, "
        "scheduler, endpoints, cost",
    ),
    (
        "pin-map-names-unknown-worker",
        """\
        model_repo: /models
        workers:
          - name: worker0
          - name: worker1
        models:
          resnet50: [worker0, worker2]
        """,
        "node.yaml:6: models.resnet50[1]: expected one of worker0, worker1; got 'worker2'",
    ),
    (
        "pin-map-on-auto-node",
        """\
        model_repo: /models
        gpus: auto
        models:
          resnet50: [gpu0]
        """,
        "node.yaml:4: models.resnet50[0]: expected a worker of this node, which runs "
        "worker0..N-1, one per GPU (gpus: auto); got 'gpu0'",
    ),
    (
        "pin-contradicts-worker-residency",
        """\
        model_repo: /models
        workers:
          - name: worker0
            scheduler:
              models:
                resnet50: {residency: unpinned}
        models:
          resnet50: [worker0]
        """,
        "node.yaml:6: workers[0].scheduler.models.resnet50.residency: expected device or "
        "nothing, since models: pins resnet50 to the device on worker0; got 'unpinned'",
    ),
    (
        "gpus-keyword",
        """\
        model_repo: /models
        gpus: all
        """,
        "node.yaml:2: gpus: expected auto, a GPU count, or a list of devices; got 'all'",
    ),
    (
        "more-workers-than-gpus",
        """\
        model_repo: /models
        gpus: 1
        workers:
          - name: worker0
          - name: worker1
        """,
        "node.yaml:3: workers: expected at most 1 workers, one per device of gpus:; got 2",
    ),
    (
        "two-workers-one-device",
        """\
        model_repo: /models
        workers:
          - name: worker0
            gpu: 1
          - name: worker1
        """,
        "node.yaml:5: workers[1]: expected a device of its own; device 1 is also worker0's",
    ),
    (
        "endpoint-port-in-settings",
        """\
        model_repo: /models
        global:
          endpoints:
            port: 9000
        """,
        "node.yaml:4: global.endpoints.port: not set in a settings block; worker i listens on "
        "base_port + i, or on its workers: entry's port:",
    ),
    (
        "model-repo-missing",
        """\
        base_port: 8080
        """,
        "node.yaml:1: model_repo: required key missing; expected the model repository "
        "directory (every subdirectory holding a manifest.yaml is a bundle)",
    ),
    (
        "block-not-a-mapping",
        """\
        model_repo: /models
        global:
          runtime: cuda
        """,
        "node.yaml:3: global.runtime: expected a mapping; got 'cuda'",
    ),
    (
        "lpt-gateway-block-with-fair-workers",
        """\
        model_repo: /models
        workers:
          - name: worker0
          - name: worker1
        gateway:
          scheduling:
            mode: lpt_packing
        """,
        "node.yaml:7: gateway.scheduling.mode: expected workers on fifo or edf under "
        "lpt_packing; worker0 runs fair (by default)",
    ),
    (
        "gateway-block-replicas-zero",
        """\
        model_repo: /models
        gateway:
          scheduling:
            default_replicas: 0
        """,
        "node.yaml:4: gateway.scheduling.default_replicas: expected a positive integer or all; "
        "got 0",
    ),
    (
        "every-problem-in-file-order",
        """\
        model_repo: /models
        workers:
          - name: worker0
          - name: worker0
        global:
          scheduler:
            discipline: fiar
        """,
        "node.yaml:4: workers[1].name: expected distinct worker names; 'worker0' is listed twice\n"
        "node.yaml:7: global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'",
    ),
    (
        "yaml-syntax",
        """\
        model_repo: /models
        global:
          runtime: {backend: cuda
        """,
        "node.yaml:4: not valid YAML: while parsing a flow mapping expected ',' or '}', but got "
        "'<stream end>'",
    ),
    (
        "duplicate-key",
        """\
        model_repo: /models
        base_port: 8080
        base_port: 8081
        """,
        'node.yaml:3: not valid YAML: while constructing a mapping found duplicate key "base_port"'
        ' with value "8081" (original value: "8080")',
    ),
]


@pytest.mark.parametrize(
    ("text", "message"), [c[1:] for c in NODE_CASES], ids=[c[0] for c in NODE_CASES]
)
def test_bad_node_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("node.yaml").write_text(textwrap.dedent(text))
    with pytest.raises(ConfigError) as err:
        load_node("node.yaml", env={}, check_paths=False)
    assert str(err.value) == message


GATEWAY_CASES: list[tuple[str, str, str]] = [
    (
        "no-endpoints",
        """\
        scheduling:
          mode: round_robin
        """,
        "gateway.yml:1: endpoints: expected at least one worker host:port (endpoints: or "
        "REACTANT_GATEWAY_WORKERS); got none",
    ),
    (
        "endpoint-without-port",
        """\
        endpoints:
          - worker0:8080
          - worker1
        """,
        "gateway.yml:3: endpoints[1]: expected host:port with a port in 1..65535; got 'worker1'",
    ),
    (
        "mode-typo",
        """\
        endpoints: [w:1]
        scheduling:
          mode: lpt
        """,
        "gateway.yml:3: scheduling.mode: expected one of round_robin, least_outstanding, "
        "lpt_packing; got 'lpt'",
    ),
    (
        "hysteresis-one",
        """\
        endpoints: [w:1]
        scheduling:
          hysteresis: 1.0
        """,
        "gateway.yml:3: scheduling.hysteresis: expected a number in [0, 1); got 1.0",
    ),
    (
        "model-replicas",
        """\
        endpoints: [w:1]
        scheduling:
          models:
            resnet50:
              replicas: -1
        """,
        "gateway.yml:5: scheduling.models.resnet50.replicas: expected a positive integer or "
        "all; got -1",
    ),
    (
        "fill-mode",
        """\
        endpoints: [w:1]
        scheduling:
          models:
            resnet50: {fill_mode: fill}
        """,
        "gateway.yml:4: scheduling.models.resnet50.fill_mode: expected one of run, spread, "
        "inherit; got 'fill'",
    ),
    (
        "fill-mode-inflight-removed",
        """\
        endpoints: [w:1]
        scheduling:
          routing_fill_mode: inflight
        """,
        "gateway.yml:3: scheduling.routing_fill_mode: the inflight fill mode was removed: it "
        "keeps routing to the replica with the most requests in flight and parks a model on "
        "one worker; use run or spread",
    ),
    (
        "model-fill-mode-inflight-removed",
        """\
        endpoints: [w:1]
        scheduling:
          models:
            resnet50: {fill_mode: inflight}
        """,
        "gateway.yml:4: scheduling.models.resnet50.fill_mode: the inflight fill mode was "
        "removed: it keeps routing to the replica with the most requests in flight and parks a "
        "model on one worker; use run or spread",
    ),
    (
        "streams-zero",
        """\
        endpoints: [w:1]
        worker_client:
          max_concurrent_streams: 0
        """,
        "gateway.yml:3: worker_client.max_concurrent_streams: expected an integer >= 1; got 0",
    ),
    (
        "names-do-not-match-endpoints",
        """\
        endpoints: [a:1, b:2]
        worker_names: [a]
        """,
        "gateway.yml:2: worker_names: expected one name per endpoint (2); got 1",
    ),
    (
        "tls-half-configured",
        """\
        endpoints: [w:1]
        tls:
          cert_file: /etc/tls/cert.pem
        """,
        "gateway.yml:2: tls.key_file: expected cert_file and key_file together; got only one "
        "of them",
    ),
    (
        "log-level",
        """\
        endpoints: [w:1]
        logging:
          level: verbose
        """,
        "gateway.yml:3: logging.level: expected one of debug, info, warning, error; got 'verbose'",
    ),
    (
        "listen-port",
        """\
        endpoints: [w:1]
        listen:
          grpc: 0.0.0.0:0
        """,
        "gateway.yml:3: listen.grpc: expected host:port with a port in 1..65535; got '0.0.0.0:0'",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"), [c[1:] for c in GATEWAY_CASES], ids=[c[0] for c in GATEWAY_CASES]
)
def test_bad_gateway_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("gateway.yml").write_text(textwrap.dedent(text))
    with pytest.raises(ConfigError) as err:
        load_gateway("gateway.yml", env={})
    assert str(err.value) == message


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as err:
        load_node(missing, env={}, check_paths=False)
    assert str(err.value) == f"{missing}: cannot read the file: No such file or directory"


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("- model_repo: /models\n")
    with pytest.raises(ConfigError) as err:
        load_node(path, env={}, check_paths=False)
    assert str(err.value) == f"{path}:1: expected a mapping of keys at the top level; got a list"


def test_unknown_worker_name(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: /m\nworkers:\n  - name: a\n  - name: b\n")
    node = load_node(path, env={}, check_paths=False)
    with pytest.raises(ConfigError) as err:
        resolve_worker(node, "c", env={})
    assert str(err.value) == f"{path}:2: workers: expected one of a, b; got 'c'"


def test_materialize_checks_pins_against_the_detected_workers(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: /m\nmodels:\n  resnet50: [worker3]\n")
    node = load_node(
        path, env={}, check_paths=False
    )  # gpus: auto -- worker3 may exist once devices are known
    assert materialize_workers(node, 4).workers[3].name == "worker3"
    with pytest.raises(ConfigError) as err:
        materialize_workers(node, 2)
    assert str(err.value) == (
        f"{path}:3: models.resnet50[0]: expected one of worker0, worker1; got 'worker3'"
    )


# --- every problem in one run ------------------------------------------------------------


def test_three_different_errors_are_all_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown top-level key (structuring), a bad value in global: (a worker rule) and
    a missing repository (the disk): three checks of three kinds, one run, three lines.
    The unknown key does not stop the others: it is dropped and the rest is checked."""
    monkeypatch.chdir(tmp_path)
    Path("node.yaml").write_text(
        textwrap.dedent(
            """\
            model_repo: models
            base_prot: 8001
            global:
              scheduler:
                discipline: fiar
            """
        )
    )
    with pytest.raises(ConfigError) as err:
        load_node("node.yaml", env={})
    assert err.value.problems == (
        f"node.yaml:1: model_repo: expected a readable directory of model bundles; got "
        f"'models' ({tmp_path / 'models'}), which does not exist",
        "node.yaml:2: base_prot: unknown key; expected one of model_repo, base_port, "
        "metrics_base_port, gpus, global, workers, models, gateway (did you mean base_port?)",
        "node.yaml:5: global.scheduler.discipline: expected one of fair, fifo, edf; got 'fiar'",
    )
    assert str(err.value) == "\n".join(err.value.problems)


def test_problems_at_every_level_of_the_file(tmp_path: Path) -> None:
    """Problems in the node keys, inside a worker entry, in a settings block (two in one
    block: the first does not hide the second), in a list, in the gateway and in the
    environment: all reported, in file order, environment last."""
    (tmp_path / "repo").mkdir()
    path = tmp_path / "node.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            model_repo: repo
            metrics_base_port: 70000
            gpus: [0, -1]
            global:
              scheduler:
                dscipline: fifo
                max_queue_depth: 0
                ema_halflife: 3
            workers:
              - name: w0
                port: "8001"
              - name: w1
            gateway:
              scheduling:
                hysteresis: 1.5
            """
        )
    )
    with pytest.raises(ConfigError) as err:
        load_node(path, env={"INFERENCE_SERVER_SCHEDULER_DISCIPLINE": "fiar"})
    assert err.value.problems == (
        f"{path}:2: metrics_base_port: expected a port in 1..65535, or 0 for off; got 70000",
        f"{path}:3: gpus[1]: expected a device ordinal >= 0; got -1",
        f"{path}:6: global.scheduler.dscipline: unknown key; expected one of discipline, "
        "ema_halflife_seconds, max_queue_depth, dispatch_timeout_seconds, compaction_interval, "
        "cost_ema_alpha, recency_penalty_cap, meta_concurrency, inline_max_seconds, pipeline_depth, models (did you mean "
        "discipline?)",
        f"{path}:7: global.scheduler.max_queue_depth: expected an integer >= 1; got 0",
        f"{path}:8: global.scheduler.ema_halflife: unknown key; expected one of discipline, "
        "ema_halflife_seconds, max_queue_depth, dispatch_timeout_seconds, compaction_interval, "
        "cost_ema_alpha, recency_penalty_cap, meta_concurrency, inline_max_seconds, pipeline_depth, models (did you mean "
        "ema_halflife_seconds?)",
        f"{path}:11: workers[0].port: expected an integer; got '8001'",
        f"{path}:15: gateway.scheduling.hysteresis: expected a number in [0, 1); got 1.5",
        "INFERENCE_SERVER_SCHEDULER_DISCIPLINE: expected one of fair, fifo, edf; got 'fiar'",
    )


def test_a_bad_list_item_is_reported_once_and_hides_no_other_item(tmp_path: Path) -> None:
    """Two bad items of one list are both reported; the list is dropped so the rest of
    the file can be checked, and nothing is then said about the dropped list (such as
    'at most N workers per device')."""
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: /m\ngpus: [0, true, 2, [3]]\nworkers:\n  - name: a\n")
    with pytest.raises(ConfigError) as err:
        load_node(path, env={}, check_paths=False)
    assert err.value.problems == (
        f"{path}:2: gpus[1]: expected a device ordinal or UUID; got true",
        f"{path}:2: gpus[3]: expected a device ordinal or UUID; got a list",
    )


def test_a_missing_required_key_does_not_stop_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("workers:\n  - port: 9000\n  - name: b\nbase_port: 0\n")
    with pytest.raises(ConfigError) as err:
        load_node(path, env={}, check_paths=False)
    assert err.value.problems == (
        f"{path}:1: model_repo: required key missing; expected the model repository directory "
        "(every subdirectory holding a manifest.yaml is a bundle)",
        f"{path}:2: workers[0].name: required key missing; expected the worker's name",
        f"{path}:4: base_port: expected a port in 1..65535; got 0",
    )


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda repo: None, "which does not exist"),
        (lambda repo: repo.write_text("not a directory"), "which is not a directory"),
    ],
    ids=["missing", "a-file"],
)
def test_model_repo_must_be_a_readable_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: object, why: str
) -> None:
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "models")  # type: ignore[operator]
    Path("node.yaml").write_text("gpus: 0\nmodel_repo: models\n")
    with pytest.raises(ConfigError) as err:
        load_node("node.yaml", env={})
    assert str(err.value) == (
        "node.yaml:2: model_repo: expected a readable directory of model bundles; got "
        f"'models' ({tmp_path / 'models'}), {why}"
    )
    # Away from the machine it configures, a node file can be checked without its disk.
    assert load_node("node.yaml", env={}, check_paths=False).model_repo == "models"


def test_an_unreadable_model_repo(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every directory")
    repo = tmp_path / "models"
    repo.mkdir(mode=0)
    path = tmp_path / "node.yaml"
    path.write_text(f"model_repo: {repo}\n")
    try:
        with pytest.raises(ConfigError) as err:
            load_node(path, env={})
    finally:
        repo.chmod(0o755)
    assert str(err.value) == (
        f"{path}:1: model_repo: expected a readable directory of model bundles; got "
        f"'{repo}', which cannot be read (permission denied)"
    )


def test_the_environment_names_the_repository_it_moves(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: models\n")
    with pytest.raises(ConfigError) as err:
        load_node(path, env={"INFERENCE_SERVER_MODEL_DIRS": "/nonexistent/a"})
    assert str(err.value) == (
        "INFERENCE_SERVER_MODEL_DIRS: expected a readable directory of model bundles; got "
        "'/nonexistent/a', which does not exist"
    )


def test_a_gateway_reports_every_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("gateway.yml").write_text(
        textwrap.dedent(
            """\
            endpoints: [w:1, w2]
            scheduling:
              mode: lpt
              hysteresis: 1.0
            logging:
              level: verbose
            """
        )
    )
    with pytest.raises(ConfigError) as err:
        load_gateway("gateway.yml", env={"REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS": "0"})
    assert err.value.problems == (
        "gateway.yml:1: endpoints[1]: expected host:port with a port in 1..65535; got 'w2'",
        "gateway.yml:3: scheduling.mode: expected one of round_robin, least_outstanding, "
        "lpt_packing; got 'lpt'",
        "gateway.yml:4: scheduling.hysteresis: expected a number in [0, 1); got 1.0",
        "gateway.yml:6: logging.level: expected one of debug, info, warning, error; got 'verbose'",
        "REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS: expected a number > 0; got 0.0",
    )


def test_an_embedded_gateway_reports_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            model_repo: /m
            gpus: 2
            gateway:
              scheduling:
                mode: lpt_packing
                routing_fill_factor: 0
              worker_client:
                max_concurrent_streams: 0
            """
        )
    )
    with pytest.raises(ConfigError) as err:
        load_node(path, env={}, check_paths=False)
    assert err.value.problems == (
        f"{path}:5: gateway.scheduling.mode: expected workers on fifo or edf under lpt_packing; "
        "worker0 runs fair (by default)",
        f"{path}:6: gateway.scheduling.routing_fill_factor: expected a number > 0; got 0.0",
        f"{path}:8: gateway.worker_client.max_concurrent_streams: expected an integer >= 1; got 0",
    )
    env = {"REACTANT_GATEWAY_SCHEDULING_MODE": "lpt", "REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS": "-1"}
    ok = tmp_path / "ok.yaml"
    ok.write_text("model_repo: /m\ngpus: 2\n")
    with pytest.raises(ConfigError) as err:
        resolve_gateway(load_node(ok, env={}, check_paths=False), env=env)
    assert err.value.problems == (
        "REACTANT_GATEWAY_SCHEDULING_MODE: expected one of round_robin, least_outstanding, "
        "lpt_packing; got 'lpt'",
        "REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS: expected an integer >= 0 (0 = never exit); got -1",
    )
