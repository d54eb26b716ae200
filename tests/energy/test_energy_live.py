"""Energy and cost per model on live processes: a worker reading a (fake) RAPL tree, one
reading nothing, a gateway in front of both; ``reactantserver report`` against each; and
the Grafana dashboard's queries against their /metrics (issue 36).

The measured worker's counter is a fake sysfs tree the test advances by hand, so every
joule is known; the other worker runs as on this CPU machine (no RAPL): it must say "not
measured" and export no joules at all.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from fake_energy import powercap_tree, set_energy
from gateway_harness import GatewayRun, http_get, metric, running_gateway, wait_until
from prometheus_client.parser import text_string_to_metric_families
from worker_harness import free_port, running_worker, worker_config

from reactantserver.cli import main as cli_main
from reactantserver.config.schema import CostConfig, GatewayConfig, ListenConfig, RuntimeConfig
from reactantserver.energy import RaplReader
from reactantserver.energy.report import as_json, render, run
from reactantserver.worker import WorkerAddress

pytestmark = pytest.mark.slow

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "reactantserver.json"
ZONE = "intel-rapl:0"
START_UJ = 262_140_000_000  # near max_energy_range_uj: the first advances wrap


@attrs.define
class Fleet:
    rapl: Path
    energy_uj: int
    measured: WorkerAddress
    unmeasured: WorkerAddress
    gateway: GatewayRun

    def add_joules(self, joules: float) -> None:
        self.energy_uj = (self.energy_uj + int(joules * 1e6)) % 262_143_328_850
        set_energy(self.rapl, ZONE, self.energy_uj)


def infer(address: WorkerAddress | str, n: int) -> None:
    target = address if isinstance(address, str) else f"127.0.0.1:{address.grpc_port}"
    client = grpcclient.InferenceServerClient(target)
    x = grpcclient.InferInput("x", [2, 16], "FP32")
    x.set_data_from_numpy(np.ones((2, 16), dtype=np.float32))
    try:
        for _ in range(n):
            client.infer("double", [x])
    finally:
        client.close()


def scrape(address: WorkerAddress) -> str:
    status, text = http_get(f"http://127.0.0.1:{address.metrics_port}/metrics")
    assert status == 200
    return text


@pytest.fixture(scope="module")
def fleet(zoo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    rapl = powercap_tree(
        tmp_path_factory.mktemp("powercap"), {ZONE: ("package-0", START_UJ, 262_143_328_850)}
    )
    reader = RaplReader.open(rapl)
    assert isinstance(reader, RaplReader)
    cache = tmp_path_factory.mktemp("jaxcache")
    base = worker_config(zoo_repo, include=("double",), cache_dir=cache)
    # An arena on the CPU turns the weight cache on: its series are on the dashboard.
    runtime = RuntimeConfig(arena_bytes=64 * 2**20)
    measured = attrs.evolve(
        base, name="measured", runtime=runtime, cost=CostConfig(device_hour=2.5)
    )
    unmeasured = attrs.evolve(
        worker_config(zoo_repo, include=("double",), cache_dir=cache),
        name="unmeasured",
        runtime=runtime,
    )
    with (
        running_worker(measured, energy_reader=reader) as a,
        running_worker(unmeasured) as b,
    ):
        config = GatewayConfig(
            listen=ListenConfig(
                grpc=f"127.0.0.1:{free_port()}", metrics=f"127.0.0.1:{free_port()}"
            ),
            endpoints=(f"127.0.0.1:{a.grpc_port}", f"127.0.0.1:{b.grpc_port}"),
            metrics_endpoints=(f"127.0.0.1:{a.metrics_port}", f"127.0.0.1:{b.metrics_port}"),
            worker_names=("measured", "unmeasured"),
            health_interval_seconds=0.5,
            cost=CostConfig(device_hour=1.0),
        )
        with running_gateway(config) as gateway:
            wait_until(
                lambda: http_get(gateway.metrics_url + "/readyz")[0] == 200, what="gateway ready"
            )
            yield Fleet(rapl, START_UJ, a, b, gateway)


def test_the_measured_worker_accounts_every_joule(fleet: Fleet) -> None:
    """Energy the counter gained while the model ran goes to it and to idle, nothing lost;
    a scrape with no new energy changes nothing."""
    text = scrape(fleet.measured)
    before = metric(text, "worker_energy_joules_total", model="double") + metric(
        text, "worker_idle_energy_joules_total"
    )
    fleet.add_joules(5.0)
    infer(fleet.measured, 20)
    text = scrape(fleet.measured)
    double = metric(text, "worker_energy_joules_total", model="double")
    idle = metric(text, "worker_idle_energy_joules_total")
    assert double + idle - before == pytest.approx(5.0, abs=1e-6)
    assert double > 0
    assert metric(text, "worker_energy_measured", source="rapl", worker="measured") == 1
    assert metric(text, "worker_cost_device_hour", worker="measured") == 2.5
    assert "worker_device_power_watts{" in text
    again = scrape(fleet.measured)
    assert metric(again, "worker_energy_joules_total", model="double") == double


def test_the_unmeasured_worker_exports_no_joules(fleet: Fleet) -> None:
    infer(fleet.unmeasured, 3)
    text = scrape(fleet.unmeasured)
    assert 'worker_energy_measured{gpu="0",source="none",worker="unmeasured"} 0.0' in text
    for name in ("worker_energy_joules", "worker_idle_energy_joules", "worker_device_power"):
        assert name not in text
    assert "worker_cost_device_hour" not in text


def test_the_gateway_sums_its_workers(fleet: Fleet) -> None:
    infer(fleet.measured, 2)
    _, text = http_get(fleet.gateway.metrics_url + "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    worker = sum(
        s.value for s in families["worker_energy_joules"].samples if s.labels["model"] == "double"
    )
    assert metric(text, "gateway_energy_joules_total", model="double") == pytest.approx(worker)
    assert metric(text, "gateway_workers_energy_measured") == 1
    assert metric(text, "gateway_cost_device_hour") == 1.0
    assert "gateway_idle_energy_joules_total" in text
    assert "gateway_device_power_watts" in text


def test_report_against_the_measured_worker(fleet: Fleet) -> None:
    """Joules per inference = the joules the counter gained, attributed by device time,
    over the requests answered in the window; cost = price x window, split by device time."""
    address = f"127.0.0.1:{fleet.measured.metrics_port}"

    def traffic(_: float) -> None:
        fleet.add_joules(3.0)
        infer(fleet.measured, 10)

    report = run(address, 0.0, sleep=traffic)
    (double,) = report.models
    assert double.model == "double"
    assert double.rows_per_execution == 2.0
    assert double.device_seconds_per_request is not None
    assert double.device_seconds_per_request > 0
    assert double.joules_per_inference is not None
    assert report.attributed_joules is not None and report.idle_joules is not None
    assert report.attributed_joules + report.idle_joules == pytest.approx(3.0, abs=1e-6)
    assert double.joules_per_inference == pytest.approx(report.attributed_joules / 10)
    # The whole window's price goes to the only model that ran: 2.5/h x window / requests.
    assert double.cost_per_million_requests == pytest.approx(
        2.5 * report.window_seconds / 3600 / 10 * 1e6
    )
    text = render(report)
    assert "energy: 3.0 J in the window" in text
    assert "[measured: rapl]" in text


def test_report_against_the_unmeasured_worker_says_not_measured(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{fleet.unmeasured.metrics_port}"
    assert cli_main(["report", address, "--interval", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "energy: not measured" in out
    assert "cost: not set (cost.device_hour)" in out
    assert re.search(r"^double +\S+ +\S+ +\S+ +- +-$", out, re.M), out
    assert cli_main(["report", address, "--interval", "0.2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["energy_measured"] is False
    assert data["models"][0]["joules_per_inference"] is None


def test_report_through_the_gateway(fleet: Fleet) -> None:
    """Behind the gateway 'double' is served by both workers; one measures nothing, so
    its joules per inference are unknown (not half-known), while cost is known: the
    unmeasured worker's price comes from the gateway's cost.device_hour."""
    address = fleet.gateway.metrics_url.removeprefix("http://")

    def traffic(_: float) -> None:
        fleet.add_joules(1.0)
        infer(fleet.gateway.grpc, 12)

    report = run(address, 0.0, sleep=traffic)
    assert report.workers == ("measured", "unmeasured")
    assert report.energy_sources == {"measured": "rapl"}
    assert report.device_hour == {"measured": 2.5, "unmeasured": 1.0}
    (double,) = report.models
    assert double.requests_per_second > 0
    assert double.joules_per_inference is None
    assert double.cost_per_million_requests is not None
    assert "measured on 1 of 2 workers" in render(report)
    assert as_json(report)["device_hour"] == {"measured": 2.5, "unmeasured": 1.0}


def test_report_of_an_address_with_no_workers(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["report", f"127.0.0.1:{free_port()}", "--interval", "0.1"]) == 1
    assert "cannot read http://127.0.0.1:" in capsys.readouterr().err
    assert cli_main(["report", "x:1", "--interval", "0"]) == 2


@pytest.mark.parametrize("which", ["worker", "gateway"])
def test_report_takes_the_grpc_address_and_host_port_metrics(
    fleet: Fleet, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    """Issue 42: ``report 127.0.0.1:8001`` (the gRPC address, the one a user knows)
    printed a 40-line BadStatusLine traceback. The server knows its admin address: the
    report asks it (AdminEndpoint) and reads that; ``host:port/metrics`` works too."""
    if which == "worker":
        grpc, admin = f"127.0.0.1:{fleet.unmeasured.grpc_port}", fleet.unmeasured.metrics_port
    else:
        grpc = fleet.gateway.grpc
        admin = int(fleet.gateway.metrics_url.rsplit(":", 1)[1])
    assert cli_main(["report", grpc, "--interval", "0.1"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        f"{grpc} is a gRPC port; reading its admin listener, http://127.0.0.1:{admin}/metrics\n"
    )
    assert captured.out.startswith(f"reactantserver report 127.0.0.1:{admin}: ")
    assert "double" in captured.out
    for form in (f"127.0.0.1:{admin}/metrics", f"http://127.0.0.1:{admin}/metrics"):
        assert cli_main(["report", form, "--interval", "0.1", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["models"][0]["model"] == "double"


def test_report_refusals_are_one_line(zoo_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A gRPC port whose server has no admin listener, an address that is not one, and a
    port that speaks neither HTTP nor gRPC: one line each, exit 1, no traceback."""
    config = worker_config(zoo_repo, include=("double",), metrics=False)
    with running_worker(config) as worker:
        grpc = f"127.0.0.1:{worker.grpc_port}"
        assert cli_main(["report", grpc, "--interval", "0.1"]) == 1
        assert capsys.readouterr().err == (
            f"{grpc} is the gRPC port of a server with no admin listener, so there is no "
            "/metrics to read (set endpoints.metrics_port, or a gateway's listen.metrics)\n"
        )
    for address, says in (
        ("127.0.0.1:8001/status", "expected host:port"),
        ("ftp://127.0.0.1:21", "expected host:port"),
        ("127.0.0.1:port", "'127.0.0.1:port': Port could not be cast to integer value"),
    ):
        assert cli_main(["report", address, "--interval", "0.1"]) == 1
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    with _junk_server() as port:
        assert cli_main(["report", f"127.0.0.1:{port}", "--interval", "0.1"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"127.0.0.1:{port} answers neither HTTP (/metrics) nor ")
        assert err.count("\n") == 1, err


@contextlib.contextmanager
def _junk_server() -> Iterator[int]:
    """A port that answers every connection with bytes of no protocol, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-not-what-you-asked-for\r\n\x00\x01")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        listener.close()


def dashboard_metrics() -> set[str]:
    """Every metric name the dashboard's queries name."""
    board = json.loads(DASHBOARD.read_text())
    names: set[str] = set()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            names.update(re.findall(r"\b((?:worker|gateway)_[a-z0-9_]+)\b", target["expr"]))
    return names


def test_the_dashboard_imports_and_every_metric_it_names_exists(fleet: Fleet) -> None:
    """The dashboard cannot rot: each metric a query names is a sample name on the live
    worker's or the gateway's /metrics (histogram buckets included)."""
    board = json.loads(DASHBOARD.read_text())
    assert board["__inputs"][0]["pluginId"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in board["panels"])
    for want in ("Requests/s", "p99", "Queue depth", "busy share", "Weight cache", "Joules per "
                 "inference", "Cost per million", "Workers ready", "Gateway ready"):  # fmt: skip
        assert want in titles
    infer(fleet.gateway.grpc, 4)
    fleet.add_joules(0.5)
    exposed: set[str] = set()
    for text in (scrape(fleet.measured), http_get(fleet.gateway.metrics_url + "/metrics")[1]):
        for family in text_string_to_metric_families(text):
            exposed.update(s.name for s in family.samples)
    named = dashboard_metrics()
    assert len(named) >= 20
    assert named - exposed == set()


_SELECTOR = re.compile(r"\b((?:worker|gateway)_[a-z0-9_]+)(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!=|=)\s*"([^"]*)"')


def _selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    return [(m[1], _MATCHER.findall(m[2] or "")) for m in _SELECTOR.finditer(expr)]


def _matches(labels: dict[str, str], matchers: list[tuple[str, str, str]], job: str) -> bool:
    for label, op, value in matchers:
        value = {"$job": job, "$worker": ".*", "$model": ".*"}.get(value, value)
        got = labels.get(label, "")
        if op == "=" and got != value:
            return False
        if op == "!=" and got == value:
            return False
        if op == "=~" and re.fullmatch(value, got) is None:
            return False
    return True


def test_the_dashboard_counts_each_worker_once_with_both_paths_scraped(fleet: Fleet) -> None:
    """Issue 42: the dashboard had no worker or model variables and, with Prometheus
    scraping both the workers and the gateway (whose /metrics carries every worker's
    series, merged), summed each worker's series twice. Now a single-valued ``job``
    variable picks which scrape path the worker_* panels read, and ``worker`` / ``model``
    variables narrow them. Checked against the live expositions, labelled as Prometheus
    labels them (job, instance): for either job, every selector of every panel selects
    each series of each worker once -- and without the job matcher it would select twice."""
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"job", "worker", "model"}
    assert variables["job"]["multi"] is False and variables["job"]["includeAll"] is False
    assert variables["worker"]["multi"] and variables["model"]["multi"]
    infer(fleet.gateway.grpc, 4)
    scraped = [
        ("workers", f"127.0.0.1:{w.metrics_port}", scrape(w))
        for w in (fleet.measured, fleet.unmeasured)
    ]
    scraped.append(("gateway", "gateway", http_get(fleet.gateway.metrics_url + "/metrics")[1]))
    samples = [
        (s.name, {**s.labels, "job": job, "instance": instance})
        for job, instance, text in scraped
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            if re.search(r"by \((le, )?model", target["expr"]):  # a panel per model
                assert '=~"$model"' in target["expr"], (panel["title"], target["expr"])
            for name, matchers in _selectors(target["expr"]):
                if not name.startswith("worker_"):
                    continue
                assert ("job", "=", "$job") in matchers, (panel["title"], target["expr"])
                assert ("worker", "=~", "$worker") in matchers, (panel["title"], name)
                for job in ("workers", "gateway"):
                    chosen = [
                        tuple(
                            sorted(
                                (k, v) for k, v in labels.items() if k not in ("job", "instance")
                            )
                        )
                        for sample, labels in samples
                        if sample == name and _matches(labels, matchers, job)
                    ]
                    assert len(chosen) == len(set(chosen)), (panel["title"], name, job)
                without_job = [m for m in matchers if m[0] != "job"]
                both = [
                    tuple(sorted((k, v) for k, v in labels.items() if k not in ("job", "instance")))
                    for sample, labels in samples
                    if sample == name and _matches(labels, without_job, "")
                ]
                if both:  # a series both paths carry: the old dashboard counted it twice
                    assert len(both) > len(set(both)), (panel["title"], name)
