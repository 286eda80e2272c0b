// keel's AG-UI end-to-end client: the unmodified @ag-ui/client HttpAgent
// runs an agent on `keel serve` (POST /ag-ui) through a text answer, a
// keel tool call (bash), a frontend tool round trip, a question
// (ask_user) and an approval, each interrupt then its resume. Every frame keel sends is checked against
// @ag-ui/core's own schemas (EventSchemas, zod) as it arrives, beside the
// client's own verification of the event order.
//
// Run by tests/e2e/daemon/agui.rs with KEEL_URL, KEEL_TOKEN and
// KEEL_APPROVAL_THREAD (a conversation whose bash calls need approval).
// Prints one JSON line: the threads it used and how many frames it
// checked. Exits non-zero on the first thing that is not as it should be.

import { randomUUID } from "node:crypto";
import { HttpAgent } from "@ag-ui/client";
import { EventSchemas } from "@ag-ui/core/schemas";

const url = process.env.KEEL_URL;
const token = process.env.KEEL_TOKEN;
const approvalThread = process.env.KEEL_APPROVAL_THREAD;
if (!url || !token || !approvalThread) {
  throw new Error("KEEL_URL, KEEL_TOKEN and KEEL_APPROVAL_THREAD are required");
}

let checked = 0;
// The raw frames of the run under way, as keel sent them.
let frames = [];
// Reads of response copies still going on.
const reading = [];

function fail(message, detail) {
  console.error(`agui e2e: ${message}`);
  if (detail !== undefined) console.error(JSON.stringify(detail, null, 2));
  process.exit(1);
}

function expect(condition, message, detail) {
  if (!condition) fail(message, detail);
}

// Every SSE frame of a response: its `id` (if any) and its data, checked
// against the schema of its event type.
function checkFrames(text) {
  for (const block of text.split("\n\n")) {
    const lines = block.split("\n");
    const data = lines.filter((line) => line.startsWith("data:"));
    if (data.length === 0) continue;
    const id = lines.find((line) => line.startsWith("id:"));
    const event = JSON.parse(data.map((line) => line.slice(5).replace(/^ /, "")).join("\n"));
    const parsed = EventSchemas.safeParse(event);
    expect(parsed.success, `a frame does not match AG-UI's schema`, {
      event,
      error: parsed.success ? undefined : parsed.error.issues,
    });
    checked += 1;
    frames.push({ id: id ? Number(id.slice(3).trim()) : undefined, event });
  }
}

// The client's own fetch, with a copy of each response read for the check.
async function recordingFetch(input, init) {
  const response = await fetch(input, init);
  if (response.ok) {
    reading.push(response.clone().text().then(checkFrames));
  }
  return response;
}

function agent(threadId) {
  return new HttpAgent({
    url: `${url}/ag-ui`,
    headers: { Authorization: `Bearer ${token}` },
    threadId,
    fetch: recordingFetch,
  });
}

// One run: the events the client applied, and how it finished.
async function run(agent, parameters = {}) {
  frames = [];
  const events = [];
  let finished;
  await agent.runAgent(
    { runId: randomUUID(), ...parameters },
    {
      onEvent({ event }) {
        events.push(event);
      },
      onRunFinishedEvent(params) {
        finished = {
          outcome: params.outcome,
          pendingToolCallIds: params.pendingToolCallIds,
          interrupts: params.interrupts,
        };
      },
    },
  );
  await Promise.all(reading.splice(0));
  expect(finished !== undefined, "the run finished", events);
  // SSE ids are keel seqs, growing through the run.
  const ids = frames.map((frame) => frame.id).filter((id) => id !== undefined);
  expect(
    ids.every((id, index) => index === 0 || id > ids[index - 1]),
    "SSE ids grow through a run",
    ids,
  );
  return { events, finished };
}

function ofType(events, type) {
  return events.filter((event) => event.type === type);
}

function lastAssistantText(agent) {
  const assistant = agent.messages.filter((message) => message.role === "assistant" && message.content);
  return assistant.length ? assistant[assistant.length - 1].content : "";
}

// 1. A text answer, streamed: the fake provider echoes the message.
const chatThread = `agui-${randomUUID()}`;
const chat = agent(chatThread);
chat.addMessage({ id: randomUUID(), role: "user", content: "hello from ag-ui" });
const text = await run(chat);
expect(text.finished.outcome === "success", "a text run succeeds", text.finished);
expect(ofType(text.events, "RUN_STARTED").length === 1, "one RUN_STARTED", text.events);
expect(ofType(text.events, "TEXT_MESSAGE_START").length >= 1, "the answer streams as text", text.events);
expect(ofType(text.events, "MESSAGES_SNAPSHOT").length === 1, "the thread's messages come at the end", text.events);
expect(lastAssistantText(chat).includes("hello from ag-ui"), "the answer echoes the message", chat.messages);
expect(
  chat.messages.every((message) => message.id.startsWith("keel-")),
  "the thread's messages carry keel's ids",
  chat.messages,
);

// 2. A keel tool: the fake model runs bash, keel runs it and the result
// comes back as TOOL_CALL_RESULT.
chat.addMessage({ id: randomUUID(), role: "user", content: "run: echo keel-ran-this" });
const tool = await run(chat);
expect(tool.finished.outcome === "success", "a tool run succeeds", tool.finished);
const bash = ofType(tool.events, "TOOL_CALL_START").find((event) => event.toolCallName === "bash");
expect(bash !== undefined, "the bash call streams", tool.events);
expect(ofType(tool.events, "TOOL_CALL_END").some((event) => event.toolCallId === bash.toolCallId), "the bash call ends", tool.events);
const bashResult = ofType(tool.events, "TOOL_CALL_RESULT").find((event) => event.toolCallId === bash.toolCallId);
expect(bashResult?.content.includes("keel-ran-this"), "bash's output is the call's result", tool.events);

// 3. A frontend tool: the model calls it, the run ends naming the call,
// the client answers it with a tool message in the next run.
const tools = [
  {
    name: "pick_color",
    description: "Let the user pick a color",
    parameters: { type: "object", properties: { options: { type: "array", items: { type: "string" } } } },
  },
];
chat.addMessage({ id: randomUUID(), role: "user", content: 'call: pick_color {"options":["teal","red"]}' });
const asked = await run(chat, { tools });
expect(asked.finished.outcome === "success", "a frontend tool call ends the run as a success", asked.finished);
const pick = ofType(asked.events, "TOOL_CALL_START").find((event) => event.toolCallName === "pick_color");
expect(pick !== undefined, "the frontend tool call streams", asked.events);
expect(
  JSON.stringify(asked.finished.pendingToolCallIds) === JSON.stringify([pick.toolCallId]),
  "the run names the call for the client",
  asked.finished,
);
chat.addMessage({ id: randomUUID(), role: "tool", toolCallId: pick.toolCallId, content: "teal" });
const answered = await run(chat, { tools });
expect(answered.finished.outcome === "success", "the answered run succeeds", answered.finished);
expect(answered.finished.pendingToolCallIds.length === 0, "nothing is left pending", answered.finished);
expect(
  !ofType(answered.events, "TOOL_CALL_RESULT").some((event) => event.toolCallId === pick.toolCallId),
  "the client's own result is not sent back",
  answered.events,
);
expect(lastAssistantText(chat).includes("teal"), "the model saw the client's result", chat.messages);
const toolMessages = chat.messages.filter((message) => message.role === "tool" && message.toolCallId === pick.toolCallId);
expect(toolMessages.length === 1, "the client's result is in the thread once", chat.messages);

// A question (keel's ask_user): the run ends with an interrupt carrying
// it; the next run's resume answers it.
chat.addMessage({ id: randomUUID(), role: "user", content: 'call: ask_user {"question":"Which size?"}' });
const question = await run(chat, { tools });
expect(question.finished.outcome === "interrupt", "a question ends the run with an interrupt", question.finished);
const [asking] = question.finished.interrupts;
expect(asking.reason === "input_required" && asking.message === "Which size?", "the interrupt carries the question", asking);
const answer = await run(chat, {
  tools,
  resume: [{ interruptId: asking.id, status: "resolved", payload: { answer: "large" } }],
});
expect(answer.finished.outcome === "success", "the answered question's run succeeds", answer.finished);
const answerResult = ofType(answer.events, "TOOL_CALL_RESULT").find((event) => event.toolCallId === asking.id);
expect(answerResult?.content.includes("large"), "the answer is the call's result", answer.events);

// 4. An approval: the run ends with an interrupt; a message now is
// refused (the thread waits); the next run resumes it.
const gated = agent(approvalThread);
gated.addMessage({ id: randomUUID(), role: "user", content: "run: echo approved-by-ag-ui" });
const waiting = await run(gated);
expect(waiting.finished.outcome === "interrupt", "an approval ends the run with an interrupt", waiting.finished);
const [interrupt] = waiting.finished.interrupts;
expect(interrupt.reason === "tool_approval" && interrupt.toolCallId === interrupt.id, "the interrupt is the call's approval", interrupt);
expect(gated.pendingInterrupts.length === 1, "the client holds the interrupt", gated.pendingInterrupts);

const busy = await fetch(`${url}/ag-ui`, {
  method: "POST",
  headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
  body: JSON.stringify({
    threadId: approvalThread,
    runId: randomUUID(),
    messages: [...gated.messages, { id: randomUUID(), role: "user", content: "never mind" }],
  }),
});
const busyBody = await busy.json();
expect(busy.status === 409 && busyBody.error.code === "busy", "a message while the thread waits is busy", busyBody);

const resumed = await run(gated, {
  resume: [{ interruptId: interrupt.id, status: "resolved", payload: { approved: true } }],
});
expect(resumed.finished.outcome === "success", "the resumed run succeeds", resumed.finished);
const approvedResult = ofType(resumed.events, "TOOL_CALL_RESULT").find((event) => event.toolCallId === interrupt.id);
expect(approvedResult?.content.includes("approved-by-ag-ui"), "the approved call ran", resumed.events);
expect(gated.pendingInterrupts.length === 0, "no interrupt is left", gated.pendingInterrupts);

console.log(
  JSON.stringify({
    chatThread,
    approvalThread,
    checked,
    pickCall: pick.toolCallId,
    questionCall: asking.id,
    approvalCall: interrupt.id,
  }),
);
