"""The README's five-minute tour runs verbatim against a live server (embedded mode).

Every ```sh block of README.md runs, in order, in one bash process, as a reader pasting them into
one terminal would; only TK_URL, TK_KEY and TK_ADMIN_KEY come from the environment. Markers printed between
the blocks split the output so each block's own output can be checked.
"""
import json
import os
import re
import shutil
import subprocess

import pytest

from tests.live.server import ROOT

pytestmark = pytest.mark.live

README = ROOT / "README.md"
BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.DOTALL | re.MULTILINE)
MARK = "@@tour-block"


def sh_blocks() -> list[str]:
    return BLOCK.findall(README.read_text())


def tour_script(blocks: list[str]) -> str:
    parts = ["set -euo pipefail"]
    for n, block in enumerate(blocks):
        parts += [f"echo '{MARK} {n} begin'", block.rstrip("\n"), f"echo '{MARK} {n} end'"]
    return "\n".join(parts) + "\n"


def split_output(stdout: str, count: int) -> list[str | None]:
    """The output of each block; None for a block that did not reach its end marker."""
    outputs: list[str | None] = []
    for n in range(count):
        match = re.search(rf"^{MARK} {n} begin\n(.*?)^{MARK} {n} end$", stdout, re.DOTALL | re.MULTILINE)
        outputs.append(match.group(1) if match else None)
    return outputs


def block_with(blocks: list[str], outputs: list[str], *needles: str) -> tuple[str, str]:
    """The first block whose source contains every needle, and its output."""
    for source, output in zip(blocks, outputs, strict=True):
        if all(needle in source for needle in needles):
            return source, output
    raise AssertionError(f"no README sh block contains {needles}")


def calls_of(output: str) -> list[dict]:
    return json.loads(output)["calls"]


def test_the_readme_has_a_tour():
    blocks = sh_blocks()
    assert len(blocks) >= 8
    assert blocks[0].startswith("TK_URL=${TK_URL:-http://127.0.0.1:8000}\n")


@pytest.mark.skipif(shutil.which("curl") is None, reason="the tour uses curl")
def test_the_readme_tour_runs_verbatim(toolkeeper_server):
    blocks = sh_blocks()
    env = {k: v for k, v in os.environ.items() if k not in {"TK_URL", "TK_KEY", "TK_ADMIN_KEY"}}
    env.update(TK_URL=toolkeeper_server.url, TK_KEY=toolkeeper_server.api_key,
               TK_ADMIN_KEY=toolkeeper_server.admin_api_key)
    result = subprocess.run(["bash", "-c", tour_script(blocks)], env=env, capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL, cwd=toolkeeper_server.data_dir)
    outputs = split_output(result.stdout, len(blocks))
    failed = next((n for n, out in enumerate(outputs) if out is None), None)
    assert result.returncode == 0 and failed is None, (
        f"tour block {failed} failed (exit {result.returncode}):\n{blocks[failed or 0]}\n"
        f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-4000:]}"
    )

    # 1. a session for support-bot
    _, out = block_with(blocks, outputs, "/api/v1/sessions\"", "support-bot")
    assert re.search(r"^session: [0-9a-f-]{36}$", out, re.MULTILINE), out

    # 2. tool lists: the bound argument `timezone` appears in neither format
    _, openai = block_with(blocks, outputs, "/tools\"")
    tools = {t["function"]["name"]: t["function"] for t in json.loads(openai)["tools"]}
    assert {"current_time", "todo_write", "reset_tools"} <= set(tools)
    assert "calculate" not in tools  # the math group is not active yet
    assert "timezone" not in tools["current_time"]["parameters"].get("properties", {})
    _, anthropic = block_with(blocks, outputs, "format=anthropic")
    by_name = {t["name"]: t for t in json.loads(anthropic)["tools"]}
    assert set(by_name) == set(tools)
    assert "input_schema" in by_name["current_time"]
    assert "timezone" not in anthropic

    # 3. current_time with wait: succeeded, with the server's bound value
    _, out = block_with(blocks, outputs, '"call_1"', "current_time")
    (call,) = calls_of(out)
    assert call["status"] == "succeeded", call
    assert call["input"] == {}
    assert call["result"]["structured"]["timezone"] == "Europe/Berlin"

    # 4. reset_tools activates math and returns its notes
    _, out = block_with(blocks, outputs, '"call_2"', "reset_tools")
    (call,) = calls_of(out)
    assert call["status"] == "succeeded", call
    assert "math" in call["result"]["structured"]["notes"]

    # 5. calculate
    _, out = block_with(blocks, outputs, '"call_3"', "calculate")
    (call,) = calls_of(out)
    assert call["status"] == "succeeded", call
    assert call["result"]["structured"]["value"] == 20

    # 6. the calculate call's events end in succeeded
    _, out = block_with(blocks, outputs, "$CALL/events")
    events = json.loads(out)["events"]
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    assert events[-1]["data"]["status"] == "succeeded"

    # 9. the knowledge base answers with the relevant document first
    _, out = block_with(blocks, outputs, '"call_8"', "knowledge_search")
    reset, search = calls_of(out)
    assert reset["status"] == "succeeded" and search["status"] == "succeeded", search
    assert search["result"]["structured"]["results"][0]["title"] == "VPN setup"

    # 7. overriding the bound argument is refused
    _, out = block_with(blocks, outputs, '"call_4"', '"timezone": "UTC"')
    (call,) = calls_of(out)
    assert call["status"] == "failed", call
    assert call["error"]["errorType"] == "BoundArgumentOverride"
    assert "BoundArgumentOverride" in out

    # 8. countdown, waited for separately, with its progress events
    _, out = block_with(blocks, outputs, "countdown", "$COUNTDOWN/events")
    assert '"status": "succeeded"' in out
    assert "counted down 3 seconds" in out
    assert '"kind": "progress"' in out

    # 10. support-bot's write waits for a reviewer; the admin key approves it and it runs
    _, out = block_with(blocks, outputs, '"call_9"', "slow_write")
    (call,) = calls_of(out)
    assert call["status"] == "awaiting_approval", call
    assert call["decision"]["behavior"] == "ask" and call["approval"]["status"] == "pending", call
    _, out = block_with(blocks, outputs, "$APPROVAL/decide")
    decided, end = json.JSONDecoder().raw_decode(out)
    final = json.loads(out[end:])
    assert decided["status"] == "approved", decided
    assert final["id"] == call["id"] and final["status"] == "succeeded", final
    assert final["result"]["structured"]["appended"] == "hello from the tour", final
    assert [vote["decision"] for vote in final["approval"]["votes"]] == ["approve"], final
