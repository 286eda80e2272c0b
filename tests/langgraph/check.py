"""LangGraph's own Python SDK (`langgraph-sdk`, unmodified) against keel's
`/langgraph` API (docs/langgraph.md).

Run by tests/e2e/daemon/langgraph.rs against a real `keel serve` and
keel's fake provider, with KEEL_URL, KEEL_TOKEN and MOCK_URL set. Each
scenario asserts what a client sees; the first failure ends the run with
a message naming it. Nothing here waits on time: every wait is for
something the daemon says (a frame, a status).
"""

import asyncio
import json
import os
import sys

import httpx
from langgraph_sdk import get_client

KEEL_URL = os.environ["KEEL_URL"]
TOKEN = os.environ["KEEL_TOKEN"]
MOCK_URL = os.environ["MOCK_URL"]
ONLY = os.environ.get("ONLY")

# A 1x1 PNG.
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def client(url=None):
    return get_client(url=(url or KEEL_URL) + "/langgraph", api_key=TOKEN)


def keel_api(method, path, body=None):
    response = httpx.request(
        method,
        KEEL_URL + path,
        json=body,
        headers={"Authorization": "Bearer " + TOKEN},
        timeout=30,
    )
    response.raise_for_status()
    return response.json() if response.content else None


def script(entries):
    httpx.post(MOCK_URL + "/_mock/script", json=entries, timeout=30).raise_for_status()


def keel_thread(tools=None):
    """A thread made through keel's own API (a thread is a conversation)."""
    return keel_api("POST", "/v1/conversations", {"tools": tools or {}})["id"]


async def collect(parts):
    return [part async for part in parts]


def chunks_text(parts, message_id):
    return "".join(
        part.data[0]["content"]
        for part in parts
        if part.event == "messages" and part.data[0]["id"] == message_id
    )


async def text_run():
    lg = client()
    assistants = await lg.assistants.search()
    check([a["assistant_id"] for a in assistants] == ["keel"], f"assistants: {assistants}")
    thread = await lg.threads.create()
    check(thread["status"] == "idle", f"a new thread is idle: {thread}")
    run_ids = []
    parts = await collect(
        lg.runs.stream(
            thread["thread_id"],
            "keel",
            input={"messages": [{"role": "user", "content": "hello from the sdk"}]},
            stream_mode=["values", "updates", "messages-tuple"],
            on_run_created=lambda meta: run_ids.append(meta["run_id"]),
        )
    )
    check(parts[0].event == "metadata", f"metadata first: {parts[0]}")
    run_id = parts[0].data["run_id"]
    check(run_ids == [run_id], f"the run id from Content-Location: {run_ids} vs {run_id}")
    final = [part for part in parts if part.event == "values"][-1].data["messages"]
    check([m["type"] for m in final] == ["human", "ai"], f"values: {final}")
    check(final[0]["content"] == "hello from the sdk", f"the input: {final[0]}")
    check(final[1]["content"] == "hello from the sdk", f"the fake echoes: {final[1]}")
    streamed = chunks_text(parts, final[1]["id"])
    check(streamed == final[1]["content"], f"the chunks make the answer: {streamed!r}")
    updates = [part.data for part in parts if part.event == "updates"]
    check(updates == [{"model": {"messages": [final[1]]}}], f"updates: {updates}")
    run = await lg.runs.get(thread["thread_id"], run_id)
    check(run["status"] == "success", f"the run succeeded: {run}")
    state = await lg.threads.get_state(thread["thread_id"])
    check(state["values"]["messages"] == final, f"state: {state}")
    check(state["next"] == [] and state["tasks"] == [], f"nothing next: {state}")
    history = await lg.threads.get_history(thread["thread_id"])
    check(history[0]["values"] == state["values"], f"history: {history}")
    found = await lg.threads.search(ids=[thread["thread_id"]])
    check([t["thread_id"] for t in found] == [thread["thread_id"]], f"search: {found}")
    waited = await lg.runs.wait(
        thread["thread_id"], "keel", input={"messages": [{"role": "user", "content": "again"}]}
    )
    check(
        [m["content"] for m in waited["messages"]][-2:] == ["again", "again"],
        f"runs.wait returns the values: {waited}",
    )
    # An image, as a data URL beside the text.
    waited = await lg.runs.wait(
        thread["thread_id"],
        "keel",
        input={"messages": [{"type": "human", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}},
        ]}]},
    )
    sent = [m for m in waited["messages"] if m["type"] == "human"][-1]["content"]
    check(
        sent[0] == {"type": "text", "text": "what is this?"} and "an image, 1x1" in sent[1]["text"],
        f"the image went with the message: {sent}",
    )
    await lg.threads.delete(thread["thread_id"])
    try:
        await lg.threads.get(thread["thread_id"])
        check(False, "a deleted thread is gone")
    except httpx.HTTPStatusError as error:
        check(error.response.status_code == 404, f"404: {error}")


async def approvals():
    lg = client()
    thread = keel_thread({"bash": "approve"})
    parts = await collect(
        lg.runs.stream(
            thread,
            "keel",
            input={"messages": [{"role": "user", "content": "run: echo approved-ok"}]},
            stream_mode="updates",
        )
    )
    interrupts = [p.data["__interrupt__"] for p in parts if "__interrupt__" in p.data]
    check(len(interrupts) == 1, f"one interrupt: {parts}")
    request = interrupts[0][0]["value"]
    check(
        request["action_requests"][0]["name"] == "bash"
        and request["action_requests"][0]["args"] == {"command": "echo approved-ok"},
        f"the action: {request}",
    )
    check(
        request["review_configs"][0]["allowed_decisions"] == ["approve", "edit", "reject"],
        f"review config: {request}",
    )
    waiting = await lg.threads.get(thread)
    check(waiting["status"] == "interrupted", f"the thread waits: {waiting}")
    state = await lg.threads.get_state(thread)
    check(state["tasks"][0]["interrupts"] == interrupts[0], f"state's task: {state}")

    resumed = await collect(
        lg.runs.stream(
            thread,
            "keel",
            command={"resume": {"decisions": [{"type": "approve"}]}},
            stream_mode="updates",
        )
    )
    tools = [p.data["tools"]["messages"][0] for p in resumed if "tools" in p.data]
    check(
        len(tools) == 1 and tools[0]["content"] == "approved-ok\n" and tools[0]["status"] == "success",
        f"the approved call ran: {resumed}",
    )
    # The same decision again: nothing waits, nothing runs twice.
    try:
        await lg.runs.wait(thread, "keel", command={"resume": {"decisions": [{"type": "approve"}]}})
        check(False, "a second resume is refused")
    except httpx.HTTPStatusError as error:
        check(error.response.status_code == 409, f"409: {error}")
    log = keel_api("GET", f"/v1/conversations/{thread}/log")["events"]
    resolved = [e for e in log if e["type"] == "resolved"]
    check(
        [(e["decision"], e["by"]) for e in resolved] == [("approve", "langgraph")],
        f"one decision, by langgraph: {resolved}",
    )

    # Edited: the call runs with the human's arguments, and the thread's
    # history shows the call as it ran.
    await collect(
        lg.runs.stream(
            thread, "keel", input={"messages": [{"role": "user", "content": "run: echo as-asked"}]}
        )
    )
    values = await lg.runs.wait(
        thread,
        "keel",
        command={
            "resume": {
                "decisions": [
                    {"type": "edit", "edited_action": {"name": "bash", "args": {"command": "echo as-edited"}}}
                ]
            }
        },
    )
    tool = [m for m in values["messages"] if m["type"] == "tool"][-1]
    check(tool["content"] == "as-edited\n", f"the edited call ran: {tool}")
    call = [m for m in values["messages"] if m["type"] == "ai" and m["tool_calls"]][-1]["tool_calls"][0]
    check(call["args"] == {"command": "echo as-edited"}, f"the history shows the edit: {call}")
    log = keel_api("GET", f"/v1/conversations/{thread}/log")["events"]
    edit = [e for e in log if e["type"] == "resolved"][-1]
    check(
        edit["decision"] == "edit" and edit["input"] == {"command": "echo as-edited"},
        f"recorded as an edit: {edit}",
    )

    # Rejected: the call never runs; the model is told.
    await collect(
        lg.runs.stream(
            thread, "keel", input={"messages": [{"role": "user", "content": "run: echo never-run"}]}
        )
    )
    values = await lg.runs.wait(
        thread, "keel", command={"resume": {"decisions": [{"type": "reject", "message": "no"}]}}
    )
    tool = [m for m in values["messages"] if m["type"] == "tool"][-1]
    check(tool["status"] == "error" and "never-run" not in tool["content"], f"rejected: {tool}")

    # A question, answered with the resume value itself.
    await collect(
        lg.runs.stream(
            thread,
            "keel",
            input={"messages": [{"role": "user", "content": 'call: ask_user {"question": "which color?"}'}]},
        )
    )
    state = await lg.threads.get_state(thread)
    action = state["interrupts"][0]["value"]["action_requests"][0]
    check(action["description"] == "which color?", f"the question: {action}")
    values = await lg.runs.wait(thread, "keel", command={"resume": "blue"})
    tool = [m for m in values["messages"] if m["type"] == "tool"][-1]
    check(tool["content"] == "blue" and tool["name"] == "ask_user", f"answered: {tool}")


def processes_running(marker):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if marker.encode() in cmdline.read():
                    found.append(pid)
        except OSError:
            pass
    return found


async def cancel():
    lg = client()
    thread = (await lg.threads.create())["thread_id"]
    marker = "sleep 41.75"
    run = await lg.runs.create(
        thread, "keel", input={"messages": [{"role": "user", "content": f"run: {marker}"}]}
    )
    check(run["status"] in ("pending", "running"), f"a background run: {run}")
    # Joined from the run's start (its seq ends its id), until the call is
    # out: the command runs then.
    first = int(run["run_id"].rsplit("-", 1)[1], 16)
    async for part in lg.runs.join_stream(
        thread, run["run_id"], stream_mode="updates", last_event_id=str(first - 1)
    ):
        if part.event == "updates" and "model" in part.data:
            break
    await lg.runs.cancel(thread, run["run_id"], wait=True)
    ended = await lg.runs.get(thread, run["run_id"])
    check(ended["status"] == "interrupted", f"the run was interrupted: {ended}")
    check((await lg.threads.get(thread))["status"] == "idle", "the thread is idle")
    # SIGKILL is delivered at once, but a process leaves /proc when it is
    # reaped: wait for that, bounded.
    for _ in range(1000):
        if not processes_running(marker):
            break
        await asyncio.sleep(0.01)
    check(processes_running(marker) == [], f"the command is gone: {processes_running(marker)}")
    try:
        await lg.runs.cancel(thread, run["run_id"])
        check(False, "an ended run is not cancelled again")
    except httpx.HTTPStatusError as error:
        check(error.response.status_code == 409, f"409: {error}")


class CuttingProxy:
    """Forwards to keel; cuts the first run stream after `cut_after` bytes
    of its response, as a network drop would."""

    def __init__(self, cut_after):
        self.cut_after = cut_after
        self.cuts = 0
        self.server = None
        self.tasks = set()

    async def start(self):
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self):
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def serve(self, client_reader, client_writer):
        self.tasks.add(asyncio.current_task())
        try:
            await self.forward(client_reader, client_writer)
        except (asyncio.CancelledError, asyncio.IncompleteReadError, ConnectionError):
            client_writer.transport.abort()

    async def forward(self, client_reader, client_writer):
        host, port = KEEL_URL.removeprefix("http://").split(":")
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        head = await client_reader.readuntil(b"\r\n\r\n")
        cut = self.cuts == 0 and b"/runs/stream" in head.split(b"\r\n")[0] and head.startswith(b"POST")
        if cut:
            self.cuts += 1
        upstream_writer.write(head)

        async def upload():
            try:
                while data := await client_reader.read(65536):
                    upstream_writer.write(data)
                    await upstream_writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass

        uploading = asyncio.create_task(upload())
        sent = 0
        try:
            while data := await upstream_reader.read(512):
                if cut and sent + len(data) >= self.cut_after:
                    client_writer.write(data[: self.cut_after - sent])
                    await client_writer.drain()
                    break
                client_writer.write(data)
                await client_writer.drain()
                sent += len(data)
        except ConnectionError:
            pass
        finally:
            uploading.cancel()
            for writer in (client_writer, upstream_writer):
                try:
                    writer.transport.abort() if cut else writer.close()
                except Exception:
                    pass


async def dropped_connection():
    words = " ".join(f"word{n}" for n in range(400))
    script({"text": words, "drip_ms": 2})
    proxy = CuttingProxy(cut_after=3000)
    url = await proxy.start()
    thread = (await client().threads.create())["thread_id"]
    # Only the stream goes through the proxy: its first connection is the
    # run's.
    lg = client(url)
    parts = await collect(
        lg.runs.stream(
            thread,
            "keel",
            input={"messages": [{"role": "user", "content": "tell me a long story"}]},
            stream_mode=["values", "updates", "messages-tuple"],
        )
    )
    await lg.http.client.aclose()
    await proxy.close()
    check(proxy.cuts == 1, "the stream was cut once")
    run_id = parts[0].data["run_id"]
    answer = [p for p in parts if p.event == "values"][-1].data["messages"][-1]
    check(answer["content"] == words, f"the whole answer: {answer['content'][:80]!r}")
    streamed = chunks_text(parts, answer["id"])
    check(streamed == words, f"each token once, none missing: {len(streamed)} vs {len(words)} bytes")
    # Every frame of the log's events, once, in order: as a clean replay
    # of the whole run sends them.
    run = await client().runs.get(thread, run_id)
    first = int(run_id.rsplit("-", 1)[1], 16)
    replay = await collect(
        client().runs.join_stream(
            thread, run_id, stream_mode=["values", "updates"], last_event_id=str(first - 1)
        )
    )
    seen = [(p.event, p.id, json.dumps(p.data, sort_keys=True)) for p in parts if p.event in ("values", "updates")]
    clean = [(p.event, p.id, json.dumps(p.data, sort_keys=True)) for p in replay if p.event in ("values", "updates")]
    check(seen == clean, f"nothing missed or doubled:\n{seen}\n!=\n{clean}")
    check(run["status"] == "success", f"the run: {run}")


async def refusals():
    lg = client()
    thread = (await lg.threads.create())["thread_id"]
    for body, status in [
        ({"assistant_id": "keel"}, 422),
        ({"assistant_id": "keel", "input": {"messages": []}}, 422),
        ({"assistant_id": "nobody", "input": {"messages": ["hi"]}}, 404),
        ({"assistant_id": "keel", "input": {"messages": ["hi"]}, "multitask_strategy": "rollback"}, 422),
        ({"assistant_id": "keel", "command": {"resume": {"decisions": []}}}, 409),
        (
            {
                "assistant_id": "keel",
                "input": {"messages": [{"type": "human", "content": [
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
                ]}]},
            },
            400,
        ),
        (
            {
                "assistant_id": "keel",
                "input": {"messages": [{"type": "human", "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGEgcG5n"}}
                ]}]},
            },
            422,
        ),
    ]:
        response = httpx.post(
            f"{KEEL_URL}/langgraph/threads/{thread}/runs/wait",
            json=body,
            headers={"x-api-key": TOKEN},
            timeout=30,
        )
        check(response.status_code == status, f"{body}: {response.status_code} {response.text}")
        check("code" in response.json()["error"], f"keel's error shape: {response.text}")
    response = httpx.get(f"{KEEL_URL}/langgraph/threads/{thread}", headers={"x-api-key": "wrong"})
    check(response.status_code == 401, f"a wrong key: {response.status_code}")
    response = httpx.get(f"{KEEL_URL}/v1/conversations/{thread}", headers={"x-api-key": TOKEN})
    check(response.status_code == 401, "x-api-key is taken on /langgraph only")
    runs = await lg.runs.list(thread)
    check(runs == [], f"nothing was started: {runs}")


SCENARIOS = [text_run, approvals, cancel, dropped_connection, refusals]


async def main():
    for scenario in SCENARIOS:
        if ONLY and scenario.__name__ != ONLY:
            continue
        try:
            await scenario()
        except Exception as error:
            print(f"FAILED {scenario.__name__}: {type(error).__name__}: {error}", file=sys.stderr)
            raise
        print(f"ok {scenario.__name__}")


asyncio.run(main())
