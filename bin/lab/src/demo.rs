//! `keel demo`: one conversation on the real runtime, shown as it happens.
//!
//! It starts the fake provider (`keel mock-llm`'s server) and a daemon
//! (keel-daemon's `daemon::start`, the same start-up as `keel serve`) in this process, on
//! free loopback ports, over a temporary data dir, and drives them over
//! HTTP and SSE as a user would: a text reply streamed token by token, a
//! `bash` call that waits for an approval and is granted it, a cancel while
//! a command's process tree runs (and proof the tree is gone), a crash of
//! the daemon mid-turn and a restart on the same data dir that recovers the
//! turn from the log, and a final read of the log. Then it stops the daemon
//! and removes the temporary directory.
//!
//! Every request goes through the daemon's typed client (keel-api's `client`),
//! the one the admin CLI is built on. The fake provider is scripted
//! through its script API
//! (`POST /_mock/script`) before each step, so every run says the same
//! thing and takes the same time. Nothing here reads the user's provider
//! settings: the demo never calls a real provider.

mod procs;
mod reading;
mod trace;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{IsTerminal as _, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _};
use serde_json::{json, Value};

use crate::mock_llm;
use keel_api::client::{self, Client, Events};
use keel_api::types::{
    ApiDecisionKind, ApiState, ApiToolPolicy, CreateConversation, ResolveRequest,
};
use keel_daemon::config::Config;
use keel_daemon::daemon::{self, Daemon};
use reading::*;
pub use trace::Format;
use trace::{quote, Trace};

/// The answer the fake provider streams in step 3, a word per delta.
const STREAMED_TEXT: &str =
    "Hello! I am the fake provider, streaming this answer one word at a time.";
/// Its pace: slow enough to watch, quick enough for a demo.
const STREAM_DRIP_MS: u64 = 40;

/// The command the model runs in step 4 (the fake provider turns
/// `run: CMD` into a `bash` call).
const HELLO_COMMAND: &str = "echo hello from keel in $PWD";

/// The command cancelled in step 5: a process tree (bash and two `sleep`s
/// in its process group) that would run for a minute, and says its process
/// group. Its own pids (`$$`, `$!`) are those of its PID namespace
/// (docs/sandbox.md); `/proc` shows the machine's, whose pids the demo
/// then reads there.
const TREE_COMMAND: &str =
    "sleep 60 & sleep 60 & echo \"process group $(cut -d' ' -f5 /proc/self/stat)\"; wait";

/// The answer the daemon is crashed in the middle of, in step 6: slow, so
/// the crash lands mid-stream.
const CRASHED_TEXT: &str = "Once upon a time a daemon was killed in the middle of a sentence, \
     and when it came back it read its log and finished what it had started.";
const CRASHED_DRIP_MS: u64 = 150;
/// Deltas seen before the crash.
const DELTAS_BEFORE_CRASH: usize = 3;
/// The recovered turn asks again and gets the same answer, faster.
const RECOVERED_DRIP_MS: u64 = 20;

/// How long any one wait for the daemon may take before the demo fails.
const PATIENCE: Duration = Duration::from_secs(15);

/// Who approves in the log's `resolved` event.
const APPROVER: &str = "keel demo";

pub fn run(out: impl Write, format: Format) -> anyhow::Result<()> {
    let color = format == Format::Human
        && std::io::stdout().is_terminal()
        && std::env::var_os("NO_COLOR").is_none();
    let mut trace = Trace::new(out, format, color);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let started = Instant::now();
    trace.intro()?;
    let outcome = runtime.block_on(async {
        let mut demo = Demo::start(&mut trace).await?;
        let walked = demo.walk().await;
        // Clean up whether or not the walk got to the end.
        let cleaned = demo.clean_up().await;
        walked.and(cleaned)
    });
    // Ends the fake provider's server, the last task left.
    drop(runtime);
    outcome?;
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    trace.fact(
        "done",
        json!({ "ms": ms }),
        &format!("done in {:.1} s", ms as f64 / 1000.0),
    )?;
    Ok(())
}

/// The demo's world: where it keeps things, the fake provider, the daemon
/// of the moment and the conversation it walks.
struct Demo<'t, W: Write> {
    trace: &'t mut Trace<W>,
    /// Holds the data dir and the conversation's working directory; removed
    /// at the end (and on drop, if the demo fails).
    temp: Option<tempfile::TempDir>,
    data_dir: PathBuf,
    cwd: PathBuf,
    mock_url: String,
    /// `None` between a crash and the restart.
    daemon: Option<Daemon>,
    /// The current daemon's client.
    api: Client,
    /// The conversation walked, once created.
    id: String,
    /// Its event stream on the current daemon.
    events: Option<Events>,
    /// The last canonical seq seen on the event stream.
    last_seq: u64,
    /// Text deltas shown since the model's last message: a stream opened
    /// mid-answer misses the first ones, and then the whole answer is
    /// shown from the log.
    streamed: String,
    /// Every tool process the demo saw, checked again at the end.
    tool_pids: Vec<u32>,
    tool_pgids: Vec<u32>,
}

impl<'t, W: Write> Demo<'t, W> {
    /// Step 1: the fake provider and the first daemon.
    async fn start(trace: &'t mut Trace<W>) -> anyhow::Result<Demo<'t, W>> {
        trace.step(1, "start the fake provider and a daemon, in this process")?;
        let temp = tempfile::Builder::new()
            .prefix("keel-demo-")
            .tempdir()
            .context("creating a temporary directory")?;
        // Its real path: bash reports the physical directory (`$PWD`), so a
        // temporary directory under a symlink would not look like itself.
        let root = std::fs::canonicalize(temp.path())
            .with_context(|| format!("resolving {}", temp.path().display()))?;
        let data_dir = root.join("data");
        let cwd = root.join("work");
        std::fs::create_dir_all(&cwd).context("creating the working directory")?;
        let mock_url = mock_llm::start_in_process(mock_llm::Settings::default()).await?;
        trace.fact(
            "mock",
            json!({ "url": mock_url }),
            &format!("fake provider at {mock_url} (scripted for each step)"),
        )?;
        let daemon = daemon::start(config(&data_dir, &mock_url)?, None).await?;
        let api = Client::new(&daemon.addr.to_string(), Some(daemon.token.clone()));
        trace.fact(
            "daemon",
            json!({ "url": format!("http://{}", daemon.addr), "data_dir": data_dir }),
            &format!(
                "daemon at http://{} over the data dir {}",
                daemon.addr,
                data_dir.display()
            ),
        )?;
        Ok(Demo {
            trace,
            temp: Some(temp),
            data_dir,
            cwd,
            mock_url,
            daemon: Some(daemon),
            api,
            id: String::new(),
            events: None,
            last_seq: 0,
            streamed: String::new(),
            tool_pids: Vec::new(),
            tool_pgids: Vec::new(),
        })
    }

    async fn walk(&mut self) -> anyhow::Result<()> {
        self.create().await?;
        self.stream_text().await?;
        self.approved_bash().await?;
        self.cancel_mid_tool().await?;
        self.crash_mid_turn().await?;
        self.read_the_log().await
    }

    /// Step 2.
    async fn create(&mut self) -> anyhow::Result<()> {
        self.trace.step(2, "create a conversation")?;
        let cwd = self
            .cwd
            .to_str()
            .ok_or_else(|| anyhow!("the temporary directory is not UTF-8"))?;
        let request = CreateConversation {
            cwd: Some(cwd.to_owned()),
            tools: BTreeMap::from([("bash".to_owned(), ApiToolPolicy::Approve)]),
            ..CreateConversation::default()
        };
        self.id = self.api.create(&request).await?.id;
        self.trace.fact(
            "created",
            json!({ "id": self.id, "cwd": cwd, "tools": { "bash": "approve" } }),
            &format!(
                "conversation {} in {cwd}; every bash call waits for an approval",
                self.id
            ),
        )?;
        // The follower connects on its first `next`: wait for its snapshot
        // now, so the next step's message cannot be answered before it
        // listens.
        self.events = Some(self.api.events(&self.id, None));
        self.until(|frame| frame.event == "snapshot").await?;
        Ok(())
    }

    /// Step 3.
    async fn stream_text(&mut self) -> anyhow::Result<()> {
        self.trace
            .step(3, "a text reply, streamed token by token")?;
        push_script(
            &self.mock_url,
            json!([{ "text": STREAMED_TEXT, "drip_ms": STREAM_DRIP_MS }]),
        )
        .await?;
        self.say("hello, keel").await?;
        let mut n_tokens = 0;
        let mut streamed = String::new();
        self.until(|frame| {
            if is_live(frame, "text_delta") {
                n_tokens += 1;
                streamed.push_str(frame.data["text"].as_str().unwrap_or_default());
            }
            is_canonical(frame, "turn_completed")
        })
        .await?;
        ensure!(
            streamed == STREAMED_TEXT && n_tokens > 1,
            "expected {STREAMED_TEXT:?} in several deltas, got {n_tokens}: {streamed:?}"
        );
        self.trace.check(
            "streamed",
            json!({ "tokens": n_tokens, "text": streamed }),
            &format!("{n_tokens} tokens streamed over SSE as they were generated"),
        )?;
        Ok(())
    }

    /// Step 4.
    async fn approved_bash(&mut self) -> anyhow::Result<()> {
        self.trace.step(
            4,
            "the model calls bash: an approval, waited for and granted",
        )?;
        self.say(&format!("run: {HELLO_COMMAND}")).await?;
        let (call_id, call) = self.suspended_call().await?;
        let state = self.state().await?;
        ensure!(
            state == "awaiting_input",
            "the conversation is {state} while its bash call waits for approval"
        );
        self.trace.check(
            "awaiting_approval",
            json!({ "tool_call_id": call_id, "state": state, "command": call["input"]["command"] }),
            &format!("the turn waits ({state}): nothing runs until someone approves"),
        )?;
        self.approve(&call_id).await?;
        self.trace.fact(
            "approved",
            json!({ "tool_call_id": call_id, "by": APPROVER }),
            &format!("> approve {call_id}"),
        )?;
        let mut result = Value::Null;
        self.until(|frame| {
            if is_canonical(frame, "tool_result") {
                result = frame.data.clone();
            }
            is_canonical(frame, "turn_completed")
        })
        .await?;
        let output = result["content"].as_str().unwrap_or_default().to_owned();
        let expected = format!("hello from keel in {}", self.cwd.display());
        ensure!(
            result["tool_call_id"] == call_id.as_str()
                && result["is_error"] == false
                && output.trim() == expected,
            "expected bash to print {expected:?}, got {result}"
        );
        self.trace.check(
            "bash",
            json!({ "tool_call_id": call_id, "output": output, "is_error": false }),
            "bash ran in the conversation's directory, its output went back to the model",
        )?;
        Ok(())
    }

    /// Wait for the turn to suspend on a call; its id and the pending call.
    async fn suspended_call(&mut self) -> anyhow::Result<(String, Value)> {
        let suspended = self.until(|frame| is_canonical(frame, "suspended")).await?;
        let call = suspended.data["pending"][0].clone();
        let call_id = call["tool_call_id"]
            .as_str()
            .ok_or_else(|| anyhow!("no pending call in {}", suspended.data))?
            .to_owned();
        Ok((call_id, call))
    }

    /// Step 5.
    async fn cancel_mid_tool(&mut self) -> anyhow::Result<()> {
        self.trace
            .step(5, "cancel while a command's process tree runs")?;
        self.say(&format!("run: {TREE_COMMAND}")).await?;
        let (call_id, _call) = self.suspended_call().await?;
        self.approve(&call_id).await?;
        self.trace.fact(
            "approved",
            json!({ "tool_call_id": call_id, "by": APPROVER }),
            &format!("> approve {call_id}"),
        )?;
        let mut said = String::new();
        self.until(|frame| {
            if is_live(frame, "tool_output") {
                said.push_str(frame.data["chunk"].as_str().unwrap_or_default());
            }
            said.contains('\n')
        })
        .await?;
        let pgid = group_in(&said)?;
        let pids = procs::running(&[], pgid);
        ensure!(
            pids.len() == 3 && pids.first() == Some(&pgid),
            "expected bash and its two sleeps running in process group {pgid}, found {pids:?}"
        );
        self.tool_pids.extend(&pids);
        self.tool_pgids.push(pgid);
        self.trace.fact(
            "tree_running",
            json!({ "pgid": pgid, "pids": pids }),
            &format!("running: process group {pgid}, pids {}", join(&pids)),
        )?;

        let state = state_name(self.api.cancel(&self.id).await?.state);
        self.trace
            .fact("cancelled", json!({ "state": state }), "> cancel")?;
        let interrupted = self
            .until(|frame| is_canonical(frame, "turn_interrupted"))
            .await?;
        let left = procs::wait_gone(&pids, pgid, Duration::from_secs(2)).await;
        ensure!(
            left.is_empty(),
            "after the cancel, still running: {left:?} (of {pids:?}, group {pgid})"
        );
        let state = self.state().await?;
        ensure!(state == "idle", "the cancel left the conversation {state}");
        self.trace.check(
            "tree_gone",
            json!({
                "pgid": pgid,
                "pids": pids,
                "running": left,
                "reason": interrupted.data["reason"],
                "state": state,
            }),
            &format!(
                "turn interrupted ({}), conversation idle, and no process of group {pgid} is left",
                interrupted.data["reason"].as_str().unwrap_or("?")
            ),
        )?;
        Ok(())
    }

    /// Step 6.
    async fn crash_mid_turn(&mut self) -> anyhow::Result<()> {
        self.trace.step(
            6,
            "crash the daemon mid-turn, restart it on the same data dir",
        )?;
        push_script(
            &self.mock_url,
            json!([
                { "text": CRASHED_TEXT, "drip_ms": CRASHED_DRIP_MS },
                { "text": CRASHED_TEXT, "drip_ms": RECOVERED_DRIP_MS },
            ]),
        )
        .await?;
        self.say("tell me a story").await?;
        let mut n_tokens = 0;
        self.until(|frame| {
            n_tokens += usize::from(is_live(frame, "text_delta"));
            n_tokens == DELTAS_BEFORE_CRASH
        })
        .await?;
        self.trace.close_line()?;
        // The recovered turn streams its answer again, from the start.
        self.streamed.clear();
        let state = self.state().await?;
        ensure!(
            state == "streaming",
            "the crash was to land mid-stream, but the conversation is {state}"
        );
        self.events = None;
        let daemon = self
            .daemon
            .take()
            .ok_or_else(|| anyhow!("no daemon to crash"))?;
        daemon.crash().await?;
        self.trace.fact(
            "crashed",
            json!({ "state": state, "tokens_before": n_tokens, "last_seq": self.last_seq }),
            &format!(
                "crashed while {state}: runtime killed where it stood, HTTP server gone, data dir released"
            ),
        )?;

        let daemon = daemon::start(config(&self.data_dir, &self.mock_url)?, None).await?;
        let recovered: Vec<String> = daemon
            .report
            .recovered
            .iter()
            .map(ToString::to_string)
            .collect();
        let failed: Vec<String> = daemon
            .report
            .failed
            .iter()
            .map(|(id, why)| format!("{id}: {why}"))
            .collect();
        self.api = Client::new(&daemon.addr.to_string(), Some(daemon.token.clone()));
        self.trace.fact(
            "restarted",
            json!({
                "url": format!("http://{}", daemon.addr),
                "recovered": recovered,
                "reaped": daemon.report.reaped.len(),
                "failed": failed,
            }),
            &format!(
                "new daemon at http://{}: boot recovered {} conversation(s) from the log",
                daemon.addr,
                recovered.len()
            ),
        )?;
        self.daemon = Some(daemon);
        ensure!(
            recovered == [self.id.clone()] && failed.is_empty(),
            "boot was to recover {} alone, recovered {recovered:?}, failed {failed:?}",
            self.id
        );

        // Follow from the first event the crashed daemon did not show:
        // what boot appended comes first, then the recovered turn live.
        self.events = Some(self.api.events(&self.id, Some(self.last_seq + 1)));
        let mut action = Value::Null;
        let mut answer = Value::Null;
        self.until(|frame| {
            if is_canonical(frame, "recovered") {
                action = frame.data["action"].clone();
            }
            if is_canonical(frame, "assistant_message") {
                answer = text_of(&frame.data).into();
            }
            is_canonical(frame, "turn_completed")
        })
        .await?;
        let state = self.state().await?;
        ensure!(
            action == "rerun_request" && answer == CRASHED_TEXT && state == "idle",
            "expected the turn re-run to its answer and the conversation idle; got {action}, {answer}, {state}"
        );
        self.trace.check(
            "recovered",
            json!({ "action": action, "answer": answer, "state": state }),
            "the turn cut short was re-run from the log and answered; the conversation is idle",
        )?;
        Ok(())
    }

    /// Step 7.
    async fn read_the_log(&mut self) -> anyhow::Result<()> {
        self.trace
            .step(7, "read the log: the conversation's only truth")?;
        let log = self.whole_log().await?;
        let seqs: Vec<u64> = log
            .iter()
            .filter_map(|event| event["seq"].as_u64())
            .collect();
        let contiguous = seqs.len() == log.len()
            && seqs
                .iter()
                .enumerate()
                .all(|(idx, &seq)| seq == idx as u64 + 1);
        let tool_uses: BTreeSet<&str> = log
            .iter()
            .filter(|event| event["type"] == "assistant_message")
            .filter_map(|event| event["content"].as_array())
            .flatten()
            .filter(|block| block["type"] == "tool_use")
            .filter_map(|block| block["id"].as_str())
            .collect();
        let answered: BTreeSet<&str> = log
            .iter()
            .filter(|event| event["type"] == "tool_result")
            .filter_map(|event| event["tool_call_id"].as_str())
            .collect();
        let unanswered: Vec<&str> = tool_uses.difference(&answered).copied().collect();
        let types: Vec<&str> = log
            .iter()
            .filter_map(|event| event["type"].as_str())
            .collect();
        let mut counts: Vec<(&str, usize)> = Vec::new();
        for kind in &types {
            match counts.iter_mut().find(|(seen, _)| seen == kind) {
                Some((_, count)) => *count += 1,
                None => counts.push((kind, 1)),
            }
        }
        let summary: Vec<String> = counts
            .iter()
            .map(|(kind, count)| format!("{kind} x{count}"))
            .collect();
        self.trace.fact(
            "log_events",
            json!({ "types": types }),
            &format!("{} events: {}", log.len(), summary.join(", ")),
        )?;
        ensure!(
            contiguous && unanswered.is_empty() && !tool_uses.is_empty(),
            "the log breaks its invariants: seqs {seqs:?}, unanswered tool calls {unanswered:?}"
        );
        self.trace.check(
            "log",
            json!({
                "events": log.len(),
                "contiguous": contiguous,
                "tool_uses": tool_uses,
                "answered": answered,
                "unanswered": unanswered,
            }),
            &format!(
                "seqs 1..={} with no gap, and each of the {} tool calls has its result",
                log.len(),
                tool_uses.len()
            ),
        )?;
        Ok(())
    }

    /// Step 8: stop the daemon, remove the temporary directory, and check
    /// that no tool process is left.
    async fn clean_up(&mut self) -> anyhow::Result<()> {
        // Clean up even when the output is gone (`keel demo | head`).
        let printed = self.trace.step(8, "clean up");
        self.events = None;
        if let Some(daemon) = self.daemon.take() {
            daemon.stop().await;
        }
        let path = self
            .temp
            .as_ref()
            .map(|temp| std::fs::canonicalize(temp.path()).unwrap_or_else(|_| temp.path().into()))
            .unwrap_or_default();
        if let Some(temp) = self.temp.take() {
            temp.close()
                .with_context(|| format!("removing {}", path.display()))?;
        }
        let mut left = Vec::new();
        for &pgid in &self.tool_pgids {
            left.extend(procs::running(&self.tool_pids, pgid));
        }
        left.sort_unstable();
        left.dedup();
        ensure!(left.is_empty(), "tool processes left running: {left:?}");
        ensure!(!path.exists(), "{} is still there", path.display());
        printed?;
        self.trace.check(
            "cleaned_up",
            json!({ "temp_dir": path, "removed": true, "processes_left": left }),
            &format!(
                "daemon stopped, {} removed, no tool process left",
                path.display()
            ),
        )?;
        Ok(())
    }

    /// Send a user message, shown as the user's line.
    async fn say(&mut self, text: &str) -> anyhow::Result<()> {
        let seq = self.api.send_text(&self.id, text).await?.seq;
        self.trace.fact(
            "user",
            json!({ "text": text, "seq": seq }),
            &format!("> {}", quote(text)),
        )?;
        Ok(())
    }

    /// The conversation's state now, as the API names it.
    async fn state(&self) -> anyhow::Result<String> {
        Ok(state_name(self.api.get(&self.id).await?.state))
    }

    /// Approve a pending call, as the demo.
    async fn approve(&self, call_id: &str) -> anyhow::Result<()> {
        let request = ResolveRequest {
            tool_call_id: call_id.to_owned(),
            decision: ApiDecisionKind::Approve,
            text: None,
            by: Some(APPROVER.to_owned()),
            input: None,
        };
        self.api.resolve(&self.id, &request).await?;
        Ok(())
    }

    /// The whole log, page by page, each event as the API's JSON.
    async fn whole_log(&self) -> anyhow::Result<Vec<Value>> {
        let mut events = Vec::new();
        let mut from = 1;
        loop {
            let page = self.api.log(&self.id, from, None).await?;
            if page.events.is_empty() {
                return Ok(events);
            }
            for event in page.events {
                events.push(serde_json::to_value(event)?);
            }
            from = page.next_from;
        }
    }

    /// Read the event stream, showing each frame, until `done` says a
    /// frame is the one awaited; returns that frame.
    async fn until(
        &mut self,
        mut done: impl FnMut(&DemoFrame) -> bool,
    ) -> anyhow::Result<DemoFrame> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let events = self
                .events
                .as_mut()
                .ok_or_else(|| anyhow!("no event stream open"))?;
            let frame = match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(Ok(frame)) => DemoFrame::of(frame)?,
                Ok(Err(error)) => return Err(error.into()),
                Err(_) => bail!("nothing awaited arrived within {PATIENCE:?}"),
            };
            self.show(&frame)?;
            if done(&frame) {
                return Ok(frame);
            }
        }
    }

    /// What a frame of the event stream shows: tokens and tool output as
    /// they arrive, and the canonical events that tell the story.
    fn show(&mut self, frame: &DemoFrame) -> anyhow::Result<()> {
        let data = &frame.data;
        if frame.event == "live" {
            match data["type"].as_str() {
                Some("text_delta") => {
                    let text = data["text"].as_str().unwrap_or_default();
                    self.streamed.push_str(text);
                    self.trace.token(text)?;
                }
                Some("tool_output") => self
                    .trace
                    .tool_output(data["chunk"].as_str().unwrap_or_default())?,
                _ => {}
            }
            return Ok(());
        }
        if frame.event != "canonical" {
            return Ok(());
        }
        let seq = data["seq"].as_u64().unwrap_or_default();
        self.last_seq = self.last_seq.max(seq);
        let kind = data["type"].as_str().unwrap_or_default();
        let line = match kind {
            "assistant_message" => {
                let text = text_of(data);
                let calls: Vec<String> = data["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|block| block["type"] == "tool_use")
                    .map(|block| {
                        format!(
                            "model calls {} {}",
                            block["name"].as_str().unwrap_or("?"),
                            quote(block["input"]["command"].as_str().unwrap_or_default())
                        )
                    })
                    .collect();
                // Tokens already showed the text, unless some were missed.
                let said = if text == self.streamed || text.is_empty() {
                    None
                } else if self.streamed.is_empty() {
                    Some(format!("model: {}", quote(&text)))
                } else {
                    Some(format!(
                        "model (whole answer, from the log): {}",
                        quote(&text)
                    ))
                };
                self.streamed.clear();
                self.trace.close_line()?;
                said.into_iter()
                    .chain(calls)
                    .collect::<Vec<_>>()
                    .join("\n   ")
            }
            "suspended" => format!(
                "waiting for approval: {} {}",
                data["pending"][0]["name"].as_str().unwrap_or("?"),
                data["pending"][0]["tool_call_id"].as_str().unwrap_or("?")
            ),
            "tool_result" => format!(
                "tool result{}: {}",
                if data["synthetic"] == true {
                    " (synthetic)"
                } else {
                    ""
                },
                quote(data["content"].as_str().unwrap_or_default())
            ),
            "turn_completed" => format!("turn {} completed", data["turn"]),
            "turn_interrupted" => format!(
                "turn {} interrupted: {}",
                data["turn"],
                data["reason"].as_str().unwrap_or("?")
            ),
            "recovered" => format!(
                "recovered from the log: {}",
                data["action"].as_str().unwrap_or("?")
            ),
            // The rest is in the log, read at the end.
            _ => String::new(),
        };
        if line.is_empty() {
            return Ok(());
        }
        let mut fields = data.clone();
        if let Value::Object(object) = &mut fields {
            object.insert("event".to_owned(), kind.into());
            object.remove("type");
        }
        self.trace
            .fact("event", fields, &format!("{seq:>3} {line}"))?;
        Ok(())
    }
}

/// The daemon's configuration: this demo's data dir, any free loopback
/// port, the fake provider. Built from these settings alone, never the
/// environment, so a key in it cannot send the demo to a real provider.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_command_s_pids_are_read() {
        assert_eq!(group_in("process group 10\n").unwrap(), 10);
        assert!(group_in("nothing\n").is_err());
        assert!(group_in("process group x\n").is_err());
    }

    #[test]
    fn the_demo_config_ignores_the_environment() {
        let config = config(Path::new("/tmp/x"), "http://127.0.0.1:1").unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/tmp/x"));
        assert!(!config.builtin_mock);
        assert_eq!(
            config.providers.mock_url.as_deref(),
            Some("http://127.0.0.1:1")
        );
    }

    #[test]
    fn the_demo_walks_every_step_and_exits_clean() {
        let mut out = Vec::new();
        run(&mut out, Format::Json).unwrap();
        let text = String::from_utf8(out).unwrap();
        let kinds: Vec<String> = text
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap()["kind"].to_string())
            .collect();
        for kind in [
            "streamed",
            "bash",
            "tree_gone",
            "recovered",
            "log",
            "cleaned_up",
            "done",
        ] {
            assert!(kinds.contains(&format!("{kind:?}")), "{kind} in {text}");
        }
    }
}
