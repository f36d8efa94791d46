"""The deployment files in deploy/ (docs/observability.md, "Dashboards and alerts").

Prometheus loads the example configuration with the alert rules, and a real Prometheus server running it sends
the token to /metrics and fires an alert; each alert fires when it should and stays quiet when it should not
(deploy/prometheus/alerts_test.yml, run by `promtool test rules`); the Grafana
dashboard is one Grafana imports, and each of its queries is valid PromQL that shows data over series of the
platform's metrics. Every metric name the files use is one the platform defines.

promtool and prometheus come with Debian's `prometheus` package (`.ci/run` installs it). Without them the tests
that run them skip, unless TOOLKEEPER_REQUIRE_SERVICES=1, where they fail.
"""
import http.server
import itertools
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.live.server import free_port

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"
SCRAPE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "toolkeeper.json"


def defined_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The platform's metrics: name -> (type, label names), read from the code that defines them (the hooks'
    metrics in `common.metrics`, the scrape's gauges in `toolkeeper.metrics`). The one place the tests below take
    the metric names (and labels) from."""
    from prometheus_client.metrics import MetricWrapperBase

    from common import metrics
    from toolkeeper.metrics import DatabaseGauges

    found = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            suffix = "_total" if value._type == "counter" else ""  # a counter's name is kept without it
            found[value._name + suffix] = (value._type, tuple(value._labelnames))
    for family in DatabaseGauges.describe():
        found[family.name] = (family.type, tuple(family._labelnames))
    return found


def defined_metric_names() -> set[str]:
    return set(defined_metrics())


# Series Prometheus itself records for each target, which the rules may use besides the platform's.
PROMETHEUS_OWN = {"up": ("gauge", ("job", "instance"))}
# Variables Grafana defines itself.
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")

SELECTOR = re.compile(r"\b(toolkeeper_[a-z0-9_]+|up)\b(?:\{([^}]*)\})?")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def metric_of(series: str) -> str:
    """The metric a series name belongs to: a histogram's `_bucket`, `_sum` and `_count` are its own."""
    metrics = defined_metrics() | PROMETHEUS_OWN
    if series in metrics:
        return series
    for suffix in HISTOGRAM_SERIES:
        base = series.removesuffix(suffix)
        if base != series and metrics.get(base, ("",))[0] == "histogram":
            return base
    return series


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric, matchers) of each series selector in a PromQL expression."""
    return [(metric_of(match.group(1)), match.group(2) or "") for match in SELECTOR.finditer(expr)]


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_targets() -> list[tuple[dict, dict]]:
    return [(panel, target) for panel in dashboard()["panels"] for target in panel.get("targets", [])]


def substituted(expr: str, tenant: str = ".*") -> str:
    """The query as Grafana sends it: the tenant variable (all tenants by default) and the rate interval."""
    return expr.replace("$__rate_interval", "5m").replace("${tenant}", tenant).replace("$tenant", tenant)


def installed(program: str) -> str:
    """The path of a program of Debian's prometheus package; or skip (fail with TOOLKEEPER_REQUIRE_SERVICES=1)."""
    path = shutil.which(program)
    if path is None:
        problem = f"{program} is not installed (Debian's prometheus package)"
        if os.environ.get("TOOLKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{problem}; it is required (TOOLKEEPER_REQUIRE_SERVICES=1)")
        pytest.skip(problem)
    return path


@pytest.fixture
def promtool():
    path = installed("promtool")

    def run(*args, cwd=None):
        return subprocess.run([path, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd,
                              check=False)

    return run


# --- Prometheus: the configuration and the alert rules ----------------------------------------------------------


def test_prometheus_loads_the_example_configuration_with_the_alert_rules(promtool, tmp_path):
    for source in (SCRAPE_CONFIG, ALERTS):
        shutil.copy(source, tmp_path / source.name)
    checked = promtool("check", "config", tmp_path / SCRAPE_CONFIG.name)
    # The token is read from a file beside the configuration: promtool refuses the configuration without it.
    assert checked.returncode != 0 and "toolkeeper-metrics-token" in checked.stdout + checked.stderr

    (tmp_path / "toolkeeper-metrics-token").write_text("a-token\n")
    checked = promtool("check", "config", tmp_path / SCRAPE_CONFIG.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout


class Exporter(http.server.BaseHTTPRequestHandler):
    """/metrics as the platform serves it: 404 without the right bearer token; with it, one tenant's audit chain
    broken and another's intact."""

    token = "a-token"
    seen: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        authorization = self.headers.get("Authorization", "")
        self.seen.append(authorization)
        if self.path != "/metrics" or authorization != f"Bearer {self.token}":
            self.send_error(404)
            return
        body = (b"# TYPE toolkeeper_audit_chain_broken gauge\n"
                b'toolkeeper_audit_chain_broken{tenant="acme"} 1\n'
                b'toolkeeper_audit_chain_broken{tenant="beta"} 0\n')
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def prometheus_api(port: int, path: str, **query) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]


@pytest.mark.live
def test_a_prometheus_server_scrapes_with_the_example_and_fires_an_alert(tmp_path):
    """The example as a Prometheus server runs it (its target and intervals made local and short): the token
    from the file beside it reaches /metrics, and the audit chain's alert fires for the broken tenant only."""
    binary = installed("prometheus")
    exporter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    [job] = config["scrape_configs"]
    job["scheme"] = "http"
    job["static_configs"] = [{"targets": [f"127.0.0.1:{exporter.server_address[1]}"]}]
    (tmp_path / SCRAPE_CONFIG.name).write_text(yaml.safe_dump(config))
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    (tmp_path / "toolkeeper-metrics-token").write_text(f"{Exporter.token}\n")
    port = free_port()
    log = tmp_path / "prometheus.log"
    Exporter.seen.clear()
    with log.open("w") as output:
        server = subprocess.Popen([binary, f"--config.file={tmp_path / SCRAPE_CONFIG.name}",
                                   f"--storage.tsdb.path={tmp_path / 'data'}",
                                   f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=output, stderr=subprocess.STDOUT)
    try:
        firing = []
        deadline = time.monotonic() + 90
        while not firing and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.5)
            try:
                alerts = prometheus_api(port, "alerts")["alerts"]
            except OSError:
                continue  # not listening yet
            firing = [alert["labels"] for alert in alerts if alert["state"] == "firing"]
        assert server.poll() is None, log.read_text()
        assert firing == [{"alertname": "ToolkeeperAuditChainBroken", "severity": "critical", "tenant": "acme"}]
        assert Exporter.seen and set(Exporter.seen) == {f"Bearer {Exporter.token}"}
        [up] = prometheus_api(port, "query", query='up{job="toolkeeper"}')["result"]
        assert up["value"][1] == "1"
        groups = prometheus_api(port, "rules")["groups"]
        assert {rule["name"] for group in groups for rule in group["rules"]} == {
            rule["alert"] for rule in alert_rules()}
    finally:
        server.terminate()
        server.wait(timeout=30)
        exporter.shutdown()
        exporter.server_close()


def test_the_example_scrapes_metrics_with_the_bearer_token_from_a_file():
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    assert config["rule_files"] == [ALERTS.name]
    [job] = [job for job in config["scrape_configs"] if job["job_name"] == "toolkeeper"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "toolkeeper-metrics-token"}
    assert "credentials" not in job["authorization"]  # never a token written into the configuration


def test_the_alert_rules_are_valid(promtool):
    checked = promtool("check", "rules", ALERTS)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert {rule["alert"] for rule in alert_rules()} == {
        "ToolkeeperUpstreamFailing", "ToolkeeperApprovalsOverdue", "ToolkeeperExecutorSaturated",
        "ToolkeeperAuditChainBroken", "ToolkeeperTargetDown"}


def test_each_alert_fires_when_it_should_and_stays_quiet_when_it_should_not(promtool):
    tested = promtool("test", "rules", ALERTS_TEST.name, cwd=PROMETHEUS_DIR)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_stays_quiet():
    cases = [(case["alertname"], bool(case["exp_alerts"]))
             for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"] for case in test["alert_rule_test"]]
    for rule in alert_rules():
        assert (rule["alert"], True) in cases, f"{rule['alert']} is never expected to fire"
        assert (rule["alert"], False) in cases, f"{rule['alert']} is never expected to stay quiet"


@pytest.mark.parametrize("alert", [rule["alert"] for rule in alert_rules()])
def test_the_unit_tests_fail_for_an_alert_that_never_fires(promtool, tmp_path, alert):
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == alert:
                rule["expr"] = "vector(1) == 0"
    (tmp_path / ALERTS.name).write_text(yaml.safe_dump(rules))
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    tested = promtool("test", "rules", ALERTS_TEST.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert f"alertname: {alert}" in tested.stdout + tested.stderr


def test_every_alert_has_a_severity_a_summary_and_a_description():
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]


def test_the_alerts_use_only_the_platforms_metrics():
    for rule in alert_rules():
        used = {metric for metric, _ in selectors(rule["expr"])}
        assert used, rule["alert"]
        assert used <= defined_metric_names() | set(PROMETHEUS_OWN), (rule["alert"], used)


# --- Grafana: the dashboard ----------------------------------------------------------------------------------------


def test_the_dashboard_has_what_grafana_imports():
    board = dashboard()
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", board["uid"])
    assert board["title"] == "Toolkeeper"
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert "id" not in board  # an import creates the dashboard; Grafana gives it its id
    panels = board["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert all(isinstance(grid[key], int) for key in ("x", "y", "w", "h")), panel["title"]
        assert grid["x"] >= 0 and grid["y"] >= 0 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["type"] in ("timeseries", "stat"), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        targets = panel["targets"]
        assert targets, panel["title"]
        assert len({target["refId"] for target in targets}) == len(targets), panel["title"]
        for target in targets:
            assert target["datasource"] == panel["datasource"] and target["expr"].strip(), panel["title"]


def test_the_dashboard_picks_its_data_source_and_tenants():
    variables = {variable["name"]: variable for variable in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    tenant = variables["tenant"]
    assert tenant["type"] == "query"
    assert tenant["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert tenant["query"]["query"] == "label_values(toolkeeper_calls_total, tenant)"
    assert tenant["multi"] and tenant["includeAll"] and tenant["allValue"] == ".*"

    for panel, target in dashboard_targets():
        for braced, bare in VARIABLE.findall(target["expr"]):
            assert (braced or bare) in set(variables) | GRAFANA_BUILTINS, (panel["title"], braced or bare)


def test_every_query_of_a_tenants_metric_follows_the_tenant_variable():
    for panel, target in dashboard_targets():
        for metric, matchers in selectors(target["expr"]):
            if "tenant" in defined_metrics()[metric][1]:
                assert 'tenant=~"$tenant"' in matchers, (panel["title"], metric)
            else:
                assert "tenant" not in matchers, (panel["title"], metric)


def test_the_dashboard_shows_every_metric_of_the_platform_and_no_other():
    used = {metric for _, target in dashboard_targets() for metric, _ in selectors(target["expr"])}
    assert used == defined_metric_names()


def test_the_dashboards_groupings_and_legends_name_labels_the_metrics_have():
    for panel, target in dashboard_targets():
        expr = target["expr"]
        labels = {label for metric, _ in selectors(expr) for label in defined_metrics()[metric][1]}
        grouped = {label.strip() for grouping in GROUPING.findall(expr) for label in grouping.split(",")}
        assert grouped <= labels | {"le"}, (panel["title"], grouped - labels)
        legend = set(LEGEND_LABEL.findall(target.get("legendFormat", "")))
        assert legend <= grouped - {"le"}, (panel["title"], legend)


def test_every_dashboard_query_is_valid_promql(promtool, tmp_path):
    rules = [{"record": f"dashboard:panel{panel['id']}:{target['refId']}", "expr": substituted(target["expr"])}
             for panel, target in dashboard_targets()]
    path = tmp_path / "dashboard.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def series_of_the_platform() -> list[dict]:
    """Input series for `promtool test rules`: each metric with every label set, over 30 minutes."""
    values = {"tenant": ("acme", "beta"), "outcome": ("ok", "error")}
    series = []
    for metric, (kind, labels) in defined_metrics().items():
        for combination in itertools.product(*(values.get(label, (f"{label}-1",)) for label in labels)):
            matchers = ",".join(f'{label}="{value}"' for label, value in zip(labels, combination, strict=True))
            if kind == "counter":
                series.append({"series": f"{metric}{{{matchers}}}", "values": "0+2x30"})
            elif kind == "gauge":
                series.append({"series": f"{metric}{{{matchers}}}", "values": "3x30"})
            else:
                prefix = matchers + "," if matchers else ""
                for step, bound in enumerate(("0.1", "1", "+Inf"), start=1):
                    series.append({"series": f'{metric}_bucket{{{prefix}le="{bound}"}}', "values": f"0+{step}x30"})
                series.append({"series": f"{metric}_sum{{{matchers}}}", "values": "0+2x30"})
                series.append({"series": f"{metric}_count{{{matchers}}}", "values": "0+3x30"})
    return series


def test_every_dashboard_query_shows_data_from_the_platforms_metrics(promtool, tmp_path):
    # One tenant picked in the tenant variable, then all of them: each query answers at least one series.
    cases = [{"expr": f"clamp_max(count({substituted(target['expr'], tenant)}), 1)", "eval_time": "20m",
              "exp_samples": [{"labels": "{}", "value": 1}]}
             for tenant in ("acme", ".*") for _, target in dashboard_targets()]
    tests = {"rule_files": [], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": series_of_the_platform(), "promql_expr_test": cases}]}
    (tmp_path / "dashboard_test.yml").write_text(yaml.safe_dump(tests))
    tested = promtool("test", "rules", "dashboard_test.yml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
