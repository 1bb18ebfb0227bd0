"""Screenshots of memory the conversation writes: a conversation whose turns wrote entries (the
model's ``remember`` and an extraction) and the subject page saying who wrote each entry, at
1280 and 375 px, as PNGs in ``/tmp/shots/`` (never committed).

    .venv/bin/python -m tools.screenshots [--out /tmp/shots]

It builds a dashboard on a new SQLite file in a temporary folder, writes its data through the
real paths (``Claw.send`` with ``CLAW_MEMORY_WRITES=tool`` then ``extract``, the Agents SDK
session's tool, LangGraph's tool, an MCP-attributed write and the operator's own ``set``),
whose provider is a script of answers in this process (no model runs here), serves it on a free
loopback port and drives Debian's Chromium through Playwright. It prints each PNG's path and
any element wider than the window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
WIDTHS = (1280, 375)
PART_HEIGHT = 1000
USER = "ana-7"
ADMIN, PASSWORD = "shots-admin", "a long pass phrase for the screenshots"
# The innermost elements reaching past the window's right edge.
WIDER_THAN_THE_WINDOW = """() => [...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
  .filter(e => ![...e.children].some(c => c.getBoundingClientRect().right > window.innerWidth + 1))
  .slice(0, 5).map(e => e.tagName + '.' + e.className)"""


class ScriptedProvider:
    """Answers each call with the next of its ``answers`` (a reply text, a list of remember
    calls as ``(key, value)``, or an extraction's facts as a dict), with a usage block."""

    name = "scripted"

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def complete(self, messages: Sequence[Any], tools: Sequence[Any] | None = None) -> Any:
        from clawmem.providers.base import ProviderReply, ToolCall

        self.calls += 1
        usage = {
            "prompt_tokens": 180 + 20 * self.calls,
            "completion_tokens": 24,
            "total_tokens": 204 + 20 * self.calls,
        }
        answer = self.answers.pop(0)
        if isinstance(answer, list):
            calls = tuple(
                ToolCall("remember", {"key": key, "value": value}, f"call_{self.calls}_{n}")
                for n, (key, value) in enumerate(answer)
            )
            return ProviderReply("", calls, usage)
        text = json.dumps(answer) if isinstance(answer, dict) else answer
        return ProviderReply(text, (), usage)


def _facts(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {"facts": [{"key": key, "value": value} for key, value in pairs]}


def populate(settings: Any) -> str:
    """Write the screenshots' data into ``settings``' site; return the conversation id."""
    from clawmem.integrations.langgraph import ClawStore
    from clawmem.integrations.openai_agents import ClawSession
    from clawmem.memory.wrappers import set_any
    from clawmem.rules import subject_namespace
    from clawmem.turn.pipeline import Claw
    from clawmem.turn.writes import attribution

    remembering = ScriptedProvider(
        [("favourite_colour", "teal"), ("diet", "vegetarian, no mushrooms")],
        "Noted: teal, and a vegetarian menu without mushrooms.",
    )
    tool = Claw.from_settings(settings.replace(memory_writes="tool"), remembering)
    first = tool.send(
        "My favourite colour is teal, and I am vegetarian (no mushrooms, please).", user_id=USER
    )

    extracting = ScriptedProvider(
        "Welcome to Porto! Deliveries there take two days.",
        _facts(("city", "Lisbon")),
        "Got it, weekday evenings after 18:00 it is.",
        _facts(
            ("city", "Porto"),
            ("preferred_delivery_window_for_weekday_parcels", "weekday evenings after 18:00"),
        ),
    )
    extract = Claw.from_settings(settings.replace(memory_writes="extract"), extracting)
    extract.send("I still live in Lisbon for now.", first.conversation_id, user_id=USER)
    extract.send(
        "We moved to Porto last month; please deliver on weekday evenings after 18:00.",
        first.conversation_id,
        user_id=USER,
    )

    session = ClawSession.from_settings("shop-chat/ana-7", settings, user_id=USER)
    (agents_tool,) = session.memory_tools()
    context = SimpleNamespace(tool_call_id="call_agents_1")
    asyncio.run(agents_tool.on_invoke_tool(context, json.dumps({"key": "shoe_size", "value": "EU 38"})))

    store = ClawStore.from_settings(settings)
    (graph_tool,) = store.memory_tools(USER)
    graph_tool.invoke({"key": "newsletter", "value": "monthly, in Portuguese"})

    namespace = subject_namespace(USER, settings.subject_namespace)
    memory = tool.memory
    set_any(memory, "loyalty_number", "PT-0042-7781", namespace, None, attribution("mcp", time.time))
    memory.set("plan", "gold", namespace)  # the operator's code: no origin
    return first.conversation_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/shots"))
    parser.add_argument(
        "--parts", action="store_true", help=f"also save each page in {PART_HEIGHT} px pieces"
    )
    options = parser.parse_args(argv)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("playwright is not installed: pip install -r requirements-test.txt", file=sys.stderr)
        return 2
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: apt-get install chromium", file=sys.stderr)
        return 2
    from werkzeug.serving import WSGIRequestHandler, make_server

    class QuietHandler(WSGIRequestHandler):
        def log_request(self, code: Any = "-", size: Any = "-") -> None:  # keep the output to the paths
            pass

    from clawmem.sites.operations import init_db
    from clawmem.sites.site import Site
    from dashboard import accounts, create_app, state

    folder = Path(tempfile.mkdtemp(prefix="clawmem-shots-"))
    config = {
        "TESTING": True,
        "ARGON2_PROFILE": "CHEAPEST",
        "DATABASE_URL": f"sqlite:///{folder / 'shots.db'}",
        "TABLE_PREFIX": "shots_",
    }
    app = create_app(config, instance_path=str(folder / "instance"))
    with app.app_context():
        settings = state.settings()
        init_db(Site(settings))
        accounts.create_admin(ADMIN, PASSWORD, time.time())
    conversation_id = populate(settings)

    http = make_server("127.0.0.1", 0, app, threaded=True, request_handler=QuietHandler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{http.port}"
    pages = {"conversation": f"/conversations/{conversation_id}", "subject": f"/subjects/{USER}"}
    options.out.mkdir(parents=True, exist_ok=True)
    wide = 0
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            for width in WIDTHS:
                context = browser.new_context(viewport={"width": width, "height": 900})
                tab = context.new_page()
                tab.goto(f"{base}/login")
                tab.fill("input[name=username]", ADMIN)
                tab.fill("input[name=password]", PASSWORD)
                tab.click("button[type=submit]")
                tab.wait_for_url(f"{base}/")
                for name, path in pages.items():
                    tab.goto(f"{base}{path}")
                    shot = options.out / f"{name}-{width}.png"
                    tab.screenshot(path=str(shot), full_page=True)
                    print(shot)
                    if options.parts:  # the tall phone pages in pieces a viewer shows at full size
                        height = tab.evaluate("document.documentElement.scrollHeight")
                        for part, top in enumerate(range(0, height, PART_HEIGHT), start=1):
                            clip = {
                                "x": 0,
                                "y": top,
                                "width": width,
                                "height": min(PART_HEIGHT, height - top),
                            }
                            piece = options.out / f"{name}-{width}-part{part}.png"
                            tab.screenshot(path=str(piece), full_page=True, clip=clip)
                            print(piece)
                    overflowing = tab.evaluate(WIDER_THAN_THE_WINDOW)
                    if overflowing:
                        wide += 1
                        print(f"  wider than {width} px: {', '.join(overflowing)}")
                context.close()
            browser.close()
    finally:
        http.shutdown()
        thread.join(timeout=10)
        http.server_close()
    return 1 if wide else 0


if __name__ == "__main__":
    raise SystemExit(main())
