"""A bad configuration gets exactly one error: ``file:line: key.path: expected ...; got ...``.

Each case is a whole file and the whole message it must produce, so the table doubles as
the catalogue of what an operator sees. The file is named as the user gave it (here a
relative ``node.yaml`` / ``gateway.yml``) and the line is that of the offending key.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from reactantserver.config import (
    load_gateway,
    load_node,
    materialize_workers,
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
        "cost_ema_alpha, recency_penalty_cap, meta_concurrency, models (did you mean discipline?)",
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
        "gpu, cache_dir, model_control_mode, model_poll_seconds, models_include, runtime, "
        "scheduler, endpoints",
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
        "earliest-line-wins",
        """\
        model_repo: /models
        workers:
          - name: worker0
          - name: worker0
        global:
          scheduler:
            discipline: fiar
        """,
        "node.yaml:4: workers[1].name: expected distinct worker names; 'worker0' is listed twice",
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
        load_node("node.yaml", env={})
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
        load_node(missing, env={})
    assert str(err.value) == f"{missing}: cannot read the file: No such file or directory"


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("- model_repo: /models\n")
    with pytest.raises(ConfigError) as err:
        load_node(path, env={})
    assert str(err.value) == f"{path}:1: expected a mapping of keys at the top level; got a list"


def test_unknown_worker_name(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: /m\nworkers:\n  - name: a\n  - name: b\n")
    node = load_node(path, env={})
    with pytest.raises(ConfigError) as err:
        resolve_worker(node, "c", env={})
    assert str(err.value) == f"{path}:2: workers: expected one of a, b; got 'c'"


def test_materialize_checks_pins_against_the_detected_workers(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("model_repo: /m\nmodels:\n  resnet50: [worker3]\n")
    node = load_node(path, env={})  # gpus: auto -- worker3 may exist once devices are known
    assert materialize_workers(node, 4).workers[3].name == "worker3"
    with pytest.raises(ConfigError) as err:
        materialize_workers(node, 2)
    assert str(err.value) == (
        f"{path}:3: models.resnet50[0]: expected one of worker0, worker1; got 'worker3'"
    )
