"""Test double of the engine behind the gateway: an OpenAI chat endpoint that answers with scripted
tool calls, plus `/reef/report`, recording what it was sent. Also each task's scripted solution.

It stands in for the model only: the agent loop, environments and sandbox under test are real,
and it speaks real HTTP on port 0.
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from reef_shim.envs import terminal, toolcall

ALL_TASKS = (*terminal.TASKS, *toolcall.TASKS)

# A correct solution for every task: the tool calls in order, then the final reply.
SOLUTIONS: dict[str, tuple[list[tuple[str, dict[str, Any]]], str]] = {
    "write-file": ([("run_shell", {"command": "echo 'hello reef' > greeting.txt"})], "done"),
    "count-errors": ([("run_shell", {"command": "grep -c ERROR app.log > count.txt"})], "done"),
    "unique-names": ([("run_shell", {"command": "sort -u names.txt > unique.txt"})], "done"),
    "fix-script": ([("run_shell", {"command": "printf '#!/bin/sh\\necho $(( $1 + $2 ))\\n' > add.sh"})], "fixed"),
    "move-logs": ([("run_shell", {"command": "mkdir logs && mv *.log logs/"})], "moved"),
    "arith": ([("calculator", {"expression": "17 * 23 + 4"})], "The answer is 395."),
    "miles-to-km": ([("convert_units", {"value": 26.2, "from_unit": "mi", "to_unit": "km"})], "About 42.16 km."),
    "fahrenheit": ([("convert_units", {"value": 98.6, "from_unit": "F", "to_unit": "C"})], "37 C"),
    "atomic-sum": ([("lookup", {"table": "atomic_number", "key": "iron"}), ("lookup", {"table": "atomic_number", "key": "oxygen"}),
                    ("calculator", {"expression": "26 + 8"})], "34"),
    "moons-times-boil": ([("lookup", {"table": "planet_moons", "key": "mars"}), ("lookup", {"table": "boiling_point_c", "key": "water"}),
                          ("calculator", {"expression": "2 * 100"})], "200"),
}


class FakeChat:
    """Answers `/v1/chat/completions` by the task whose prompt opens the conversation's user message.

    Step k of a conversation (k = the number of assistant turns in it) answers with the script's
    k-th tool call, then with the final reply. Every answer carries a receipt header."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.chats: list[dict[str, Any]] = []  # {headers, body, receipt}
        self.reports: list[dict[str, Any]] = []  # {headers, body}
        self._ids = itertools.count(1)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if self.path == "/v1/chat/completions":
                    out, extra = fake.answer(headers, body)
                elif self.path == "/reef/report":
                    with fake.lock:
                        fake.reports.append({"headers": headers, "body": body})
                    out, extra = {"id": f"rep-{next(fake._ids)}", "created": True}, {}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def answer(self, headers: dict[str, str], body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        task = next(t.id for t in ALL_TASKS if user.startswith(t.prompt))
        calls, final = SOLUTIONS[task]
        k = sum(1 for m in body["messages"] if m["role"] == "assistant")
        receipt = f"rec-{next(self._ids)}"
        if k < len(calls):
            name, args = calls[k]
            message = {"role": "assistant", "content": None,
                       "tool_calls": [{"id": f"call_{receipt}", "type": "function",
                                       "function": {"name": name, "arguments": json.dumps(args)}}]}
        else:
            message = {"role": "assistant", "content": final}
        with self.lock:
            self.chats.append({"headers": headers, "body": body, "receipt": receipt})
        return {"id": receipt, "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if k < len(calls) else "stop"}]}, \
            {"x-reef-agent-record-id": receipt}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
