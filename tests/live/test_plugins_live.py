"""Plugins on a real server: a virtualenv made here gets the example plugin package and a broken one installed
with pip (offline: the test builds their wheels), and the server runs from it. The plugins' tools are found,
governed and called through the API (one of them in a tool process); the broken plugin's problems are on the
console's plugins page and in the server's log, and the server serves all the same."""
import base64
import csv
import hashlib
import io
import json
import subprocess
import textwrap
import tomllib
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.distributed.support import Api, console_login
from tests.live.conftest import _report
from tests.live.server import ROOT, LiveServer, venv_executable

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("plugins_live")]  # one server for the module

EXAMPLE = ROOT / "examples" / "toolkeeper-example-plugin"
AGENT = "plugin-bot"

BROKEN_PYPROJECT = """\
[project]
name = "toolkeeper-broken-plugin"
version = "0.2.0"

[project.entry-points."toolkeeper.tools"]
halfway = "tk_broken.halfway"
clashing = "tk_broken.clashing"

[tool.setuptools]
packages = ["tk_broken"]
"""
BROKEN_HALFWAY = """\
from tools.python.decorators import tool


@tool(groups=("text-and-units",))
def half_registered() -> str:
    return "registered before the import failed"


raise RuntimeError("the plugin's configuration file is missing")
"""
BROKEN_CLASHING = """\
from tools.python.decorators import tool


@tool(groups=("math",))
def calculate(expression: str) -> str:
    return "not the calculator"
"""
# A module without packaging, named in TOOLKEEPER_TOOL_MODULES; its tool runs in a tool process.
LOCAL_MODULE = """\
import os
import sys

from tools.python.decorators import tool


@tool(isolation="process", groups=("text-and-units",))
def plugin_process_info() -> dict:
    return {"pid": os.getpid(), "python": sys.executable}
"""


def build_wheel(source: Path, out: Path) -> Path:
    """A pure-Python wheel of a package laid out as the example is (`[project]`, its entry points and
    `[tool.setuptools] packages`), so that pip installs it without a build backend or an index."""
    project_file = tomllib.loads((source / "pyproject.toml").read_text())
    project = project_file["project"]
    name, version = project["name"], project["version"]
    stem = f"{name.replace('-', '_')}-{version}"
    files = {}
    for package in project_file["tool"]["setuptools"]["packages"]:
        for path in sorted((source / package).rglob("*.py")):
            files[path.relative_to(source).as_posix()] = path.read_bytes()
    entry_points = "".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items()) + "\n"
        for group, points in project.get("entry-points", {}).items())
    info = f"{stem}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/entry_points.txt"] = entry_points.encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([path, f"sha256={digest}", len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    wheel = out / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{info}/RECORD", record.getvalue())
    return wheel


def site_packages(python: str) -> str:
    return subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()


def plugin_venv(home: Path) -> Path:
    """A virtualenv that sees the project's packages (a .pth adds the project's site-packages, whose own .pth
    files put Toolkeeper itself on the path) and has the plugin packages installed; its bin dir."""
    venv = home / "venv"
    subprocess.run([venv_executable("python"), "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib, project_packages = (site_packages(str(venv / "bin" / "python")), site_packages(venv_executable("python")))
    (Path(purelib) / "toolkeeper-project.pth").write_text(f"import site; site.addsitedir({project_packages!r})\n")

    broken = home / "broken"
    (broken / "tk_broken").mkdir(parents=True)
    (broken / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    (broken / "tk_broken" / "__init__.py").write_text("")
    (broken / "tk_broken" / "halfway.py").write_text(BROKEN_HALFWAY)
    (broken / "tk_broken" / "clashing.py").write_text(BROKEN_CLASHING)
    wheels = [build_wheel(EXAMPLE, home), build_wheel(broken, home)]
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", *map(str, wheels)], check=True)
    return venv / "bin"


@pytest.fixture(scope="module")
def plugin_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("plugins")
    bin_dir = plugin_venv(home)
    local = home / "local"
    local.mkdir()
    (local / "tk_local_tools.py").write_text(textwrap.dedent(LOCAL_MODULE))
    server = LiveServer(bin_dir=bin_dir, extra_pythonpath=[str(local)],
                        extra_env={"TOOLKEEPER_TOOL_MODULES": "tk_local_tools, tk_absent_module"})
    with server:
        yield server
        _report(server)


@pytest.fixture(scope="module")
def api(plugin_server):
    with Api(plugin_server.url, plugin_server.api_key) as client:
        yield client


@pytest.fixture(scope="module")
def session(api):
    session = api.new_session(agent=AGENT, ops=False)
    switched = api.submit(session, "reset_tools", {"text-and-units": True, "math": True}, wait=10)
    assert switched["status"] == "succeeded", switched
    return session


def test_the_plugins_tools_are_on_the_surface_and_run(api, session, plugin_server):
    response = api.http.get(f"/api/v1/sessions/{session}/tools", params={"format": "openai"})
    assert response.status_code == 200, response.text
    surface = {tool["function"]["name"]: tool["function"] for tool in response.json()["tools"]}
    assert {"word_count", "unit_convert", "plugin_process_info", "calculate"} <= set(surface)
    assert "half_registered" not in surface
    assert surface["word_count"]["parameters"]["required"] == ["text"]

    counted = api.submit(session, "word_count", {"text": "the cat saw the dog\nthe end"}, wait=30)
    assert counted["status"] == "succeeded", counted
    structured = counted["result"]["structured"]
    assert (structured["words"], structured["lines"]) == (7, 2)
    assert structured["most_frequent"][0] == {"word": "the", "count": 3}
    progress = [event for event in api.events(counted["id"]) if event["kind"] == "progress"]
    assert progress and progress[-1]["data"]["progress"] == 1.0

    converted = api.submit(session, "unit_convert", {"value": 100, "from_unit": "C", "to_unit": "F"}, wait=30)
    assert converted["status"] == "succeeded", converted
    assert converted["result"]["structured"]["value"] == 212.0

    # The module of the setting loads in the tool processes too, which run on the virtualenv's interpreter.
    info = api.submit(session, "plugin_process_info", {}, wait=30)
    assert info["status"] == "succeeded", info
    assert info["result"]["structured"]["pid"] != plugin_server.process.pid
    assert Path(info["result"]["structured"]["python"]).parent == plugin_server.bin_dir

    # The shipped calculator kept its name against the broken plugin's `calculate`.
    calculated = api.submit(session, "calculate", {"expression": "2 + 3"}, wait=30)
    assert calculated["status"] == "succeeded", calculated
    assert "not the calculator" not in json.dumps(calculated["result"])


def test_a_rule_governs_a_plugins_tool(plugin_server, api, session):
    with Api(plugin_server.url, plugin_server.admin_api_key) as admin:
        rule = admin.http.post("/api/v1/rules", json={
            "behavior": "deny", "tool_pattern": "unit_convert", "agents": [AGENT], "note": "no conversions"})
        assert rule.status_code == 201, rule.text
    denied = api.submit(session, "unit_convert", {"value": 1, "from_unit": "km", "to_unit": "m"}, wait=30)
    assert denied["status"] == "denied", denied
    assert denied["decision"]["rule"] == rule.json()["id"]
    still = api.submit(session, "word_count", {"text": "still allowed"}, wait=30)
    assert still["status"] == "succeeded", still


def test_broken_plugins_are_reported_on_the_console_and_in_the_log(plugin_server):
    log = plugin_server.log_tail(200_000)
    assert "plugin halfway (toolkeeper-broken-plugin 0.2.0): failed to load: RuntimeError" in log
    assert "plugin clashing (toolkeeper-broken-plugin 0.2.0): tool calculate: the name is taken" in log
    assert "plugin tk_absent_module (module): failed to load: ModuleNotFoundError" in log
    assert "plugin text-and-units" not in log  # the good plugin has nothing to report

    login = plugin_server.credentials["operator"]
    console = httpx.Client(base_url=plugin_server.url, timeout=30, headers={
        "Cookie": console_login(plugin_server.url, login["username"], login["password"])})
    page = console.get("/t/demo/tools/plugins/")
    assert page.status_code == 200, page.text
    html = page.text
    with Api(plugin_server.url, plugin_server.admin_api_key) as admin:
        word_count = admin.tool_id("word_count")
        with pytest.raises(AssertionError):
            admin.tool_id("half_registered")  # not in the catalog: its plugin failed midway
    assert "toolkeeper-example-plugin" in html and "0.1.0" in html
    assert "toolkeeper_example_plugin.tools" in html
    assert f'href="/t/demo/tools/{word_count}/"' in html
    assert "failed to load: RuntimeError: the plugin&#x27;s configuration file is missing" in html
    assert "tool calculate: the name is taken by another tool" in html
    assert "tk_absent_module" in html and "ModuleNotFoundError" in html
    assert "Traceback" not in html

    detail = console.get(f"/t/demo/tools/{word_count}/")
    console.close()
    assert detail.status_code == 200
    assert "toolkeeper-example-plugin 0.1.0" in detail.text
