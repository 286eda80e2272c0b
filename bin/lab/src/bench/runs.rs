//! The runs `keel bench` measures, each against the daemon it is given:
//! SSE fan-out, turns (one after the other per conversation, all
//! conversations at once, and client-shaped), idle memory per
//! conversation, cancels, and on-demand compaction of a long history; and
//! how their figures are taken (`Turns`, `Latency`, `Compactions`, which
//! `bench`'s report re-exports). `bench` calls into this
//! module, never the other way round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use futures_util::{Stream, StreamExt as _};
use serde::{Deserialize, Serialize};
use serde_json::json;
use serde_json::value::RawValue;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use keel_api::client::{Client, Error as ClientError, Events, Frame};
use keel_api::types::{ApiEventKind, ApiLiveEvent, ApiProvider, ApiState, CreateConversation};
use keel_test_support::{self as rig, stats, FrameScanner, Scanned, ScannedKind, TurnTally};

/// Conversations being created, or streams opened, at once.
const OPENING: usize = 128;
/// How long one turn may take before the bench gives up on it.
const TURN_LIMIT: Duration = Duration::from_secs(120);

/// One run of turns.
#[derive(Debug, Clone, Serialize)]
pub struct Turns {
    pub kind: &'static str,
    pub conversations: usize,
    /// Event streams of another conversation held open meanwhile.
    pub other_streams_open: usize,
    pub turns: usize,
    pub turns_per_second: f64,
    /// keel's CPU (user + system) per turn, in milliseconds; `None` when
    /// the daemon's process is unknown (`--addr` of another machine's).
    pub cpu_ms_per_turn: Option<f64>,
    /// The CPU of the daemon's process spawner (docs/tools.md) per turn,
    /// which starts each tool: keel's too, but a process of its own, so
    /// not in `cpu_ms_per_turn`. `None` when the daemon's process is
    /// unknown or it has no spawner.
    pub spawner_cpu_ms_per_turn: Option<f64>,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
}

impl Turns {
    /// keel's CPU per turn: the daemon's and its spawner's.
    pub fn total_cpu_ms_per_turn(&self) -> Option<f64> {
        self.cpu_ms_per_turn
            .map(|daemon| daemon + self.spawner_cpu_ms_per_turn.unwrap_or(0.0))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub samples: usize,
}

/// `subscribers` streams of one conversation and `messages` messages sent
/// to it, each once the turn before it reached every subscriber: the time
/// from each message's publish to each subscriber reading its
/// `user_message` frame. The daemon publishes the frame right after the
/// append is durable and just before it answers 202, so the publish is
/// taken as the earlier of the 202 and the first subscriber's read.
pub(super) async fn fanout(
    client: &Client,
    cwd: &str,
    subscribers: usize,
    messages: usize,
) -> anyhow::Result<Latency> {
    let id = create_many(client, cwd, 1)
        .await?
        .pop()
        .ok_or_else(|| anyhow!("no conversation was created"))?;
    // Each subscriber scans its stream's bytes rather than parsing every
    // frame: the readers share the machine with the daemon they measure.
    let mut streams = Vec::with_capacity(subscribers);
    for _ in 0..subscribers {
        streams.push(ScannedStream::open(client, &id).await?);
    }
    let tally = TurnTally::new(subscribers);
    let mut readers = JoinSet::new();
    for mut stream in streams {
        let done = tally.follower();
        readers.spawn(async move {
            // (seq, read at) of every user_message frame.
            let mut reads = Vec::with_capacity(messages);
            let mut completed = 0;
            while completed < messages {
                let at = stream.fill().await?;
                while let Some(frame) = stream.frames.next_frame() {
                    match frame {
                        Scanned::Canonical {
                            seq,
                            kind: ScannedKind::UserMessage,
                        } => reads.push((seq, at)),
                        Scanned::Canonical {
                            kind: ScannedKind::TurnCompleted,
                            ..
                        } => {
                            completed += 1;
                            done.turn_completed();
                        }
                        Scanned::Error(data) => {
                            return Err(anyhow!("the daemon ended a stream: {data}"))
                        }
                        _ => {}
                    }
                }
            }
            done.finish();
            // The stream goes back open: it closes once every subscriber
            // has read every turn, so that a thousand closes are not
            // measured with the last turn's deliveries.
            Ok::<_, anyhow::Error>((reads, stream))
        });
    }
    let mut sent = Vec::with_capacity(messages);
    for message in 0..messages {
        let accepted = client.send_text(&id, &format!("fan-out {message}")).await?;
        sent.push((accepted.seq, Instant::now()));
        tokio::time::timeout(TURN_LIMIT, tally.wait_for(message + 1))
            .await
            .map_err(|_| {
                anyhow!("a turn did not reach every subscriber within {TURN_LIMIT:?}")
            })??;
    }
    let mut all_reads = Vec::with_capacity(subscribers);
    let mut open = Vec::with_capacity(subscribers);
    while let Some(joined) = readers.join_next().await {
        let (reads, stream) = joined.context("a subscriber's task failed")??;
        all_reads.push(reads);
        open.push(stream);
    }
    drop(open);
    let mut samples = Vec::with_capacity(subscribers * messages);
    for (seq, answered) in sent {
        let reads: Vec<Instant> = all_reads
            .iter()
            .filter_map(|reads| {
                reads
                    .iter()
                    .find(|(read, _)| *read == seq)
                    .map(|(_, at)| *at)
            })
            .collect();
        if reads.len() != subscribers {
            return Err(anyhow!(
                "message {seq} reached {} of {subscribers} subscribers",
                reads.len()
            ));
        }
        let published = reads.iter().copied().fold(answered, Instant::min);
        samples.extend(reads.iter().map(|at| *at - published));
    }
    Ok(latency(samples))
}

pub(super) fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

pub(super) fn latency(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    Latency {
        p50_ms: percentile(&samples, 0.50),
        p99_ms: percentile(&samples, 0.99),
        samples: samples.len(),
    }
}

pub(super) fn percentile(sorted: &[Duration], quantile: f64) -> f64 {
    stats::rounded_rank(sorted, quantile).map_or(0.0, ms)
}

/// `task(i)` for every `i` below `count`, at most `OPENING` at once; the
/// results in the order they ended. What the bench does to many
/// conversations or streams before it measures: creating, opening.
pub(super) async fn at_most_opening<T, F, Fut>(count: usize, task: F) -> anyhow::Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
{
    let gate = Arc::new(Semaphore::new(OPENING));
    let mut tasks = JoinSet::new();
    for index in 0..count {
        let gate = gate.clone();
        let work = task(index);
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await;
            work.await
        });
    }
    let mut done = Vec::with_capacity(count);
    while let Some(joined) = tasks.join_next().await {
        done.push(joined.context("a bench task failed")??);
    }
    Ok(done)
}

/// Create `count` conversations, `OPENING` at a time.
pub(super) async fn create_many(
    client: &Client,
    cwd: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    create_many_with(client, cwd, count, &[]).await
}

/// [`create_many`] of conversations that may use the daemon's MCP servers
/// `mcp_servers`.
pub(super) async fn create_many_with(
    client: &Client,
    cwd: &str,
    count: usize,
    mcp_servers: &[String],
) -> anyhow::Result<Vec<String>> {
    at_most_opening(count, |_| {
        let client = client.clone();
        // The fake provider, named: a daemon at `--addr` with a real
        // provider configured must refuse rather than be billed.
        let request = CreateConversation {
            cwd: Some(cwd.to_owned()),
            provider: Some(ApiProvider::Mock),
            mcp_servers: mcp_servers.to_vec(),
            ..CreateConversation::default()
        };
        async move { Ok(client.create(&request).await?.id) }
    })
    .await
}

/// One connection to an event stream, read as bytes and scanned.
pub(super) struct ScannedStream {
    pub(super) body:
        std::pin::Pin<Box<dyn Stream<Item = Result<bytes::Bytes, ClientError>> + Send>>,
    pub(super) frames: FrameScanner,
}

impl ScannedStream {
    /// Connect and wait for the snapshot.
    pub(super) async fn open(client: &Client, id: &str) -> anyhow::Result<ScannedStream> {
        let mut stream = ScannedStream {
            body: Box::pin(client.event_bytes(id).await?),
            frames: FrameScanner::default(),
        };
        loop {
            match stream.frames.next_frame() {
                Some(Scanned::Snapshot) => return Ok(stream),
                Some(other) => return Err(anyhow!("a stream began with {other:?}")),
                None => {
                    stream.fill().await?;
                }
            }
        }
    }

    /// Read the next bytes; when they came (taken before any scanning).
    pub(super) async fn fill(&mut self) -> anyhow::Result<Instant> {
        let chunk = self
            .body
            .next()
            .await
            .ok_or_else(|| anyhow!("the daemon closed an event stream"))??;
        let at = Instant::now();
        self.frames.push(&chunk);
        Ok(at)
    }
}

/// Open `id`'s event stream and wait for its snapshot.
pub(super) async fn open(client: &Client, id: &str) -> anyhow::Result<Events> {
    let mut events = client.events(id, None);
    match events.next().await? {
        Frame::Snapshot(_) => Ok(events),
        other => Err(anyhow!("a stream began with {other:?}")),
    }
}

/// Send `text` and read the stream to the turn's end; how long it took.
/// The send waits for a permit of `sending`: every open stream holds a
/// connection already, and 10,000 sends at once would need as many more.
pub(super) async fn one_turn(
    client: &Client,
    sending: &Semaphore,
    events: &mut Events,
    id: &str,
    text: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let accepted = {
        let _permit = sending.acquire().await?;
        client.send_text(id, text).await?
    };
    let ended = tokio::time::timeout(TURN_LIMIT, async {
        loop {
            if let Frame::Canonical(event) = events.next().await? {
                match event.kind {
                    ApiEventKind::TurnCompleted { .. } if event.seq > accepted.seq => {
                        return Ok::<_, anyhow::Error>(());
                    }
                    ApiEventKind::TurnFailed { error, .. } if event.seq > accepted.seq => {
                        return Err(anyhow!("a turn failed: {error}"));
                    }
                    _ => {}
                }
            }
        }
    })
    .await;
    match ended {
        Ok(outcome) => outcome.map(|()| started.elapsed()),
        Err(_) => Err(anyhow!("a turn of {id} did not end within {TURN_LIMIT:?}")),
    }
}

/// Tool turns shaped like the clients met in the wild
/// (docs/bench.md, "Client-shaped tool turns"): each turn sends its
/// message over a new connection, then opens a new event stream from the
/// message's seq (the snapshot first) and reads it to the turn's end, and
/// closes it; the conversation talks OpenAI's wire to the fake provider
/// (the bench's own daemon; at `--addr`, `provider` says which). The same
/// figures as [`turn_run`]; keel's CPU covers the connections and the
/// snapshots, as it does for such clients.
pub(super) async fn shaped_run(
    client: &Client,
    pid: Option<u32>,
    cwd: &str,
    provider: ApiProvider,
    conversations: usize,
    each: usize,
) -> anyhow::Result<Turns> {
    let mut ids = Vec::with_capacity(conversations);
    for _ in 0..conversations {
        let request = CreateConversation {
            cwd: Some(cwd.to_owned()),
            provider: Some(provider),
            ..CreateConversation::default()
        };
        ids.push(client.create(&request).await?.id);
    }
    // One client that keeps no connection: every send and every stream
    // opens its own.
    let unpooled = client.unpooled();
    let measuring = Measuring::start(pid)?;
    let mut working = JoinSet::new();
    for id in ids {
        let client = unpooled.clone();
        working.spawn(async move {
            let mut latencies = Vec::with_capacity(each);
            for _ in 0..each {
                latencies.push(shaped_turn(&client, &id).await?);
            }
            Ok::<_, anyhow::Error>(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(conversations * each);
    while let Some(joined) = working.join_next().await {
        latencies.extend(joined.context("a turn task failed")??);
    }
    measuring.turns("tool, client-shaped", conversations, latencies)
}

/// Tool turns of one conversation, one after the other, while `streams`
/// event streams of another conversation (idle: nothing but keep-alives
/// crosses them) are open: each open stream is a descriptor in the
/// daemon's table, which a `fork` of the daemon would copy for every
/// tool it starts (docs/bench.md, "Tool turns among open streams").
pub(super) async fn crowded_run(
    client: &Client,
    pid: Option<u32>,
    cwd: &str,
    streams: usize,
    each: usize,
) -> anyhow::Result<Turns> {
    let quiet = create_many(client, cwd, 1).await?;
    let quiet = quiet.first().context("no conversation was created")?;
    let open_streams = at_most_opening(streams, |_| {
        let client = client.clone();
        let quiet = quiet.clone();
        async move { ScannedStream::open(&client, &quiet).await }
    })
    .await?;
    let (mut run, _) = turn_run(client, pid, cwd, "tool", 1, each).await?;
    run.kind = "tool, among open streams";
    run.other_streams_open = streams;
    drop(open_streams);
    Ok(run)
}

/// One client-shaped turn through `client`, which keeps no connection
/// ([`Client::unpooled`]): a new connection sends, another follows from
/// the message on (its snapshot first) to the turn's end.
pub(super) async fn shaped_turn(client: &Client, id: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let accepted = client.send_text(id, "run: true").await?;
    let mut events = client.events(id, Some(accepted.seq));
    let ended = tokio::time::timeout(TURN_LIMIT, async {
        loop {
            match events.next().await? {
                Frame::Canonical(event) => match event.kind {
                    ApiEventKind::TurnCompleted { .. } => return Ok::<_, anyhow::Error>(()),
                    ApiEventKind::TurnFailed { error, .. } => {
                        return Err(anyhow!("a turn failed: {error}"));
                    }
                    _ => {}
                },
                Frame::Snapshot(_) | Frame::Live(_) | Frame::Reconnecting { .. } => {}
                Frame::Error(error) => return Err(anyhow!("the stream failed: {error:?}")),
            }
        }
    })
    .await;
    match ended {
        Ok(outcome) => outcome.map(|()| started.elapsed()),
        Err(_) => Err(anyhow!("a turn of {id} did not end within {TURN_LIMIT:?}")),
    }
}

/// `conversations` conversations, each doing `each` turns one after the
/// other, all at once; keel's CPU over the turns alone (creating the
/// conversations and opening their streams is left out).
pub(super) async fn turn_run(
    client: &Client,
    pid: Option<u32>,
    cwd: &str,
    kind: &'static str,
    conversations: usize,
    each: usize,
) -> anyhow::Result<(Turns, Vec<String>)> {
    let ids = create_many(client, cwd, conversations).await?;
    let text = if kind == "tool" { "run: true" } else { "hello" };
    let run = turns_of(client, pid, kind, &ids, text, each).await?;
    Ok((run, ids))
}

/// The conversations `ids`, each doing `each` turns of `text` one after
/// the other, all at once; keel's CPU over the turns alone (opening the
/// streams is left out). [`turn_run`] of conversations already created.
pub(super) async fn turns_of(
    client: &Client,
    pid: Option<u32>,
    kind: &'static str,
    ids: &[String],
    text: &str,
    each: usize,
) -> anyhow::Result<Turns> {
    let conversations = ids.len();
    let streams = at_most_opening(ids.len(), |index| {
        let client = client.clone();
        let id = ids[index].clone();
        async move { open(&client, &id).await.map(|events| (id, events)) }
    })
    .await?;
    // Sends take turns as the openings did.
    let gate = Arc::new(Semaphore::new(OPENING));
    let measuring = Measuring::start(pid)?;
    let mut working = JoinSet::new();
    for (id, mut events) in streams {
        let client = client.clone();
        let sending = gate.clone();
        let text = text.to_owned();
        working.spawn(async move {
            let mut latencies = Vec::with_capacity(each);
            for _ in 0..each {
                latencies.push(one_turn(&client, &sending, &mut events, &id, &text).await?);
            }
            Ok::<_, anyhow::Error>(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(conversations * each);
    while let Some(joined) = working.join_next().await {
        latencies.extend(joined.context("a turn task failed")??);
    }
    measuring.turns(kind, conversations, latencies)
}

/// A run of turns being measured: its start, and the daemon's CPU time
/// then (when its process is known).
pub(super) struct Measuring {
    pub(super) pid: Option<u32>,
    pub(super) started: Instant,
    pub(super) cpu_before: Option<Duration>,
    /// The daemon's spawner and its CPU time when the run began.
    pub(super) spawner_before: Option<(u32, Duration)>,
}

impl Measuring {
    pub(super) fn start(pid: Option<u32>) -> anyhow::Result<Measuring> {
        let spawner_before = pid
            .and_then(rig::spawner_of)
            .and_then(|spawner| Some((spawner, rig::cpu_time(spawner)?)));
        Ok(Measuring {
            pid,
            cpu_before: cpu_time(pid)?,
            spawner_before,
            started: Instant::now(),
        })
    }

    /// The run's figures, now that its turns (each one's latency given)
    /// are done.
    pub(super) fn turns(
        self,
        kind: &'static str,
        conversations: usize,
        latencies: Vec<Duration>,
    ) -> anyhow::Result<Turns> {
        let wall = self.started.elapsed();
        let cpu_after = cpu_time(self.pid)?;
        let spawner_after = self
            .spawner_before
            .and_then(|(spawner, before)| Some((before, rig::cpu_time(spawner)?)));
        let count = latencies.len();
        let measured = latency(latencies);
        Ok(Turns {
            kind,
            conversations,
            other_streams_open: 0,
            turns: count,
            turns_per_second: count as f64 / wall.as_secs_f64(),
            cpu_ms_per_turn: self
                .cpu_before
                .zip(cpu_after)
                .map(|(before, after)| ms(after.saturating_sub(before)) / count as f64),
            spawner_cpu_ms_per_turn: spawner_after
                .map(|(before, after)| ms(after.saturating_sub(before)) / count as f64),
            latency_p50_ms: measured.p50_ms,
            latency_p99_ms: measured.p99_ms,
        })
    }
}

/// The CPU time (user + system) of process `pid`, if one is given.
pub(super) fn cpu_time(pid: Option<u32>) -> anyhow::Result<Option<Duration>> {
    pid.map(|pid| {
        rig::cpu_time(pid).ok_or_else(|| anyhow!("cannot read the CPU time of pid {pid}"))
    })
    .transpose()
}

/// Resident memory per live idle conversation: the daemon's RSS before and
/// after `count` new conversations have each done one turn and rest, live.
pub(super) async fn idle_memory(
    client: &Client,
    pid: u32,
    cwd: &str,
    text_runs: &[(usize, usize)],
) -> anyhow::Result<(usize, f64)> {
    let count = text_runs
        .iter()
        .map(|(conversations, _)| *conversations)
        .max()
        .unwrap_or(1);
    let before = rig::rss_bytes(pid).ok_or_else(|| anyhow!("cannot read the daemon's memory"))?;
    let ids = create_many(client, cwd, count).await?;
    let gate = Arc::new(Semaphore::new(OPENING));
    let mut tasks = JoinSet::new();
    for id in ids {
        let client = client.clone();
        let gate = gate.clone();
        tasks.spawn(async move {
            // Streams stay open (the conversations' turns run at once), so
            // only the opening and the sending take turns.
            let mut events = {
                let _permit = gate.acquire().await?;
                open(&client, &id).await?
            };
            one_turn(&client, &gate, &mut events, &id, "hello").await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("a turn task failed")??;
    }
    let live = client.actors().await?.actors.len();
    let after = rig::rss_bytes(pid).ok_or_else(|| anyhow!("cannot read the daemon's memory"))?;
    Ok((live, after.saturating_sub(before) as f64 / count as f64))
}

/// Cancel a turn while it streams (the fake provider at `stream_of` holds
/// the answer) or, without one, while `bash` runs a process tree, `count`
/// times; how long each cancel took to bring the conversation to rest.
pub(super) async fn cancels(
    client: &Client,
    stream_of: Option<&str>,
    cwd: &str,
    count: usize,
) -> anyhow::Result<Latency> {
    let http = keel_api::http::client();
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let id = create_many(client, cwd, 1)
            .await?
            .pop()
            .ok_or_else(|| anyhow!("no conversation was created"))?;
        let mut events = open(client, &id).await?;
        let (text, busy) = match stream_of {
            None => (
                "run: sleep 30 & sleep 30 & (sleep 30; true) & wait".to_owned(),
                ApiState::ExecutingTools,
            ),
            Some(mock_url) => {
                // Only this conversation's request takes the entry: a cancel
                // that lands before the request reaches the provider leaves
                // it queued, and it must not answer a later request.
                let text = format!("hold the stream of {id}");
                http.post(format!("{mock_url}/_mock/script"))
                    .json(&json!([{"when": text, "text": "held", "hang_after_events": 1}]))
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status)
                    .with_context(|| format!("scripting the fake provider at {mock_url}"))?;
                (text, ApiState::Streaming)
            }
        };
        client.send_text(&id, &text).await?;
        tokio::time::timeout(TURN_LIMIT, async {
            loop {
                if let Frame::Live(ApiLiveEvent::StateChanged { state }) = events.next().await? {
                    if state == busy {
                        return Ok::<_, anyhow::Error>(());
                    }
                }
            }
        })
        .await
        .map_err(|_| anyhow!("the conversation never became {busy:?}"))??;
        let started = Instant::now();
        let rest = client.cancel(&id).await?;
        samples.push(started.elapsed());
        if rest.state != ApiState::Idle {
            return Err(anyhow!("a cancel left the conversation {:?}", rest.state));
        }
    }
    Ok(latency(samples))
}

/// The context window of the conversations `compaction_run` builds: far
/// above their history, so that keel never compacts them on its own.
const COMPACTION_WINDOW: u64 = 1_000_000;
/// The most turns `compaction_run` builds a conversation with before it
/// gives up on reaching its tokens.
const MOST_BUILD_TURNS: usize = 2_000;

/// On-demand compactions of conversations with a long history
/// (`compaction_run`).
#[derive(Debug, Clone, Serialize)]
pub struct Compactions {
    /// Conversations built.
    pub conversations: usize,
    /// The history each was built to: its `context_tokens` at least this.
    pub target_tokens: u64,
    /// `bash` turns each took to get there.
    pub turns_each: usize,
    /// Building them all at once, wall.
    pub build_seconds: f64,
    /// keel's CPU per turn while building (the history growing from none
    /// to `target_tokens`); `None` when the process is unknown.
    pub build_cpu_ms_per_turn: Option<f64>,
    /// Rounds of compacting every conversation once, each followed by a
    /// rewind to the history as built.
    pub rounds: usize,
    /// `conversations` × `rounds`.
    pub compactions: usize,
    /// `POST …/compact` until the `compacted` event is read from the
    /// conversation's event stream (opened before).
    pub wall_p50_ms: f64,
    pub wall_max_ms: f64,
    /// keel's CPU (user + system) per compaction: read around each round's
    /// compactions, done one after the other with nothing between them,
    /// and divided by their number (`/proc` counts in clock ticks of
    /// 10 ms, too coarse for one); `None` when the process is unknown.
    pub cpu_ms_per_compaction: Option<f64>,
    pub samples: Vec<CompactionSample>,
}

/// One compaction of `Compactions`.
#[derive(Debug, Clone, Serialize)]
pub struct CompactionSample {
    pub round: usize,
    pub wall_ms: f64,
    /// `context_tokens` of `GET /v1/conversations/{id}` before and after.
    pub context_tokens_before: u64,
    pub context_tokens_after: u64,
    /// Of the `compacted` event.
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub replaced_messages: u32,
    pub summary_bytes: usize,
    /// The summary request as the fake provider received it: its body's
    /// bytes and its estimate of the prompt's tokens; `None` without the
    /// fake provider's address (`--addr` without `--mock-url`).
    pub summary_request_bytes: Option<usize>,
    pub summary_request_prompt_tokens: Option<u64>,
    /// From the fake's receiving it to its answer handed over, in whole
    /// milliseconds.
    pub summary_request_ms: Option<u64>,
}

/// The fields of the fake provider's recording (`GET /_mock/requests`)
/// that `compaction_run` reads.
#[derive(Debug, Deserialize)]
struct RecordedRequest {
    source: String,
    /// As received: its length is the body's.
    body: Box<RawValue>,
    prompt_tokens: Option<u64>,
    received_at_ms: u64,
    ended_at_ms: Option<u64>,
}

/// The `n`th turn of a conversation `compaction_run` builds: `seq`
/// printing 300 to 799 numbers of six digits (2.1 to 5.6 KB), which the
/// fake provider's answer repeats; deterministic, and different turn to
/// turn.
fn build_turn(n: usize) -> String {
    let start = 100_000 + n * 1_000;
    let lines = 300 + (n * 197) % 500;
    format!("run: seq {start} {}", start + lines - 1)
}

/// A conversation `compaction_run` built: its id, its event stream, how
/// many turns it took, and the seq its history as built ends at.
struct Built {
    id: String,
    events: Events,
    turns: usize,
    built_seq: u64,
    context_tokens: u64,
}

/// `conversations` conversations, each built through the daemon with
/// `bash` turns (a few KB of output each) until its `context_tokens`
/// reaches `tokens`, all at once; then `rounds` rounds of compacting each
/// on demand, one after the other (`POST …/compact` until its `compacted`
/// event arrives on its event stream, opened before), with keel's CPU read
/// around the round, and afterwards rewinding each to its history as
/// built (`POST …/rewind`), so that the next round compacts the same
/// history again. The summary requests are read from the fake provider's
/// recording at `mock_url` (cleared before each round).
pub(super) async fn compaction_run(
    client: &Client,
    pid: Option<u32>,
    mock_url: Option<&str>,
    cwd: &str,
    conversations: usize,
    tokens: u64,
    rounds: usize,
) -> anyhow::Result<Compactions> {
    let mut streams = Vec::with_capacity(conversations);
    for _ in 0..conversations {
        let request = CreateConversation {
            cwd: Some(cwd.to_owned()),
            provider: Some(ApiProvider::Mock),
            context_window: Some(COMPACTION_WINDOW.max(tokens.saturating_mul(10))),
            ..CreateConversation::default()
        };
        let id = client.create(&request).await?.id;
        let events = open(client, &id).await?;
        streams.push((id, events));
    }
    let measuring = Measuring::start(pid)?;
    let mut building = JoinSet::new();
    for (index, (id, mut events)) in streams.into_iter().enumerate() {
        let client = client.clone();
        building.spawn(async move {
            let sending = Semaphore::new(1);
            let mut turns = 0;
            loop {
                if turns == MOST_BUILD_TURNS {
                    return Err(anyhow!(
                        "{id} has not reached {tokens} tokens after {turns} turns"
                    ));
                }
                one_turn(&client, &sending, &mut events, &id, &build_turn(turns)).await?;
                turns += 1;
                let detail = client.get(&id).await?;
                if detail.context_tokens >= tokens {
                    let built = Built {
                        id,
                        events,
                        turns,
                        built_seq: detail.last_seq,
                        context_tokens: detail.context_tokens,
                    };
                    return Ok::<_, anyhow::Error>((index, built));
                }
            }
        });
    }
    let mut built = Vec::with_capacity(conversations);
    while let Some(joined) = building.join_next().await {
        built.push(joined.context("a conversation's building failed")??);
    }
    built.sort_by_key(|(index, _)| *index);
    let mut built: Vec<Built> = built.into_iter().map(|(_, built)| built).collect();
    let build_wall = measuring.started.elapsed();
    let build_cpu = measuring
        .cpu_before
        .zip(cpu_time(pid)?)
        .map(|(before, after)| after.saturating_sub(before));
    let all_turns: usize = built.iter().map(|built| built.turns).sum();
    let turns_each = built.iter().map(|built| built.turns).max().unwrap_or(0);

    let http = keel_api::http::client();
    let mut samples = Vec::with_capacity(conversations * rounds);
    let mut cpu_total = Some(Duration::ZERO);
    for round in 0..rounds {
        if let Some(mock_url) = mock_url {
            http.delete(format!("{mock_url}/_mock/requests"))
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .with_context(|| {
                    format!("clearing the recording of the fake provider at {mock_url}")
                })?;
        }
        let cpu_before = cpu_time(pid)?;
        let mut compacted = Vec::with_capacity(built.len());
        for conversation in &mut built {
            compacted.push(compact(client, conversation).await?);
        }
        let cpu = cpu_before
            .zip(cpu_time(pid)?)
            .map(|(before, after)| after.saturating_sub(before));
        cpu_total = cpu_total.zip(cpu).map(|(total, cpu)| total + cpu);
        let requests = match mock_url {
            Some(mock_url) => summary_requests(&http, mock_url, built.len()).await?,
            None => Vec::new(),
        };
        let mut requests = requests.into_iter();
        for (conversation, (wall, event)) in built.iter_mut().zip(compacted) {
            let after = client.get(&conversation.id).await?.context_tokens;
            let request = requests.next();
            samples.push(CompactionSample {
                round,
                wall_ms: ms(wall),
                context_tokens_before: conversation.context_tokens,
                context_tokens_after: after,
                tokens_before: event.tokens_before,
                tokens_after: event.tokens_after,
                replaced_messages: event.replaced_messages,
                summary_bytes: event.summary_bytes,
                summary_request_bytes: request.as_ref().map(|request| request.body.get().len()),
                summary_request_prompt_tokens: request
                    .as_ref()
                    .and_then(|request| request.prompt_tokens),
                summary_request_ms: request.as_ref().and_then(|request| {
                    request
                        .ended_at_ms
                        .map(|ended| ended.saturating_sub(request.received_at_ms))
                }),
            });
            if round + 1 < rounds {
                client
                    .rewind(&conversation.id, conversation.built_seq)
                    .await?;
                conversation.context_tokens = client.get(&conversation.id).await?.context_tokens;
            }
        }
    }
    let walls = latency(
        samples
            .iter()
            .map(|sample| Duration::from_secs_f64(sample.wall_ms / 1000.0))
            .collect(),
    );
    let compactions = samples.len();
    Ok(Compactions {
        conversations,
        target_tokens: tokens,
        turns_each,
        build_seconds: build_wall.as_secs_f64(),
        build_cpu_ms_per_turn: build_cpu.map(|cpu| ms(cpu) / all_turns.max(1) as f64),
        rounds,
        compactions,
        wall_p50_ms: walls.p50_ms,
        wall_max_ms: samples
            .iter()
            .map(|sample| sample.wall_ms)
            .fold(0.0, f64::max),
        cpu_ms_per_compaction: cpu_total.map(|cpu| ms(cpu) / compactions.max(1) as f64),
        samples,
    })
}

/// What `compaction_run` reads of a `compacted` event.
struct CompactedEvent {
    replaced_messages: u32,
    summary_bytes: usize,
    tokens_before: u64,
    tokens_after: u64,
}

/// `POST …/compact` of `conversation`, and its stream read until the
/// `compacted` event; how long that took, and the event.
async fn compact(
    client: &Client,
    conversation: &mut Built,
) -> anyhow::Result<(Duration, CompactedEvent)> {
    let id = &conversation.id;
    let events = &mut conversation.events;
    let started = Instant::now();
    client.compact(id).await?;
    let compacted = tokio::time::timeout(TURN_LIMIT, async {
        loop {
            match events.next().await? {
                Frame::Canonical(event) => {
                    if let ApiEventKind::Compacted {
                        replaced_messages,
                        summary,
                        tokens_before,
                        tokens_after,
                        ..
                    } = event.kind
                    {
                        return Ok::<_, anyhow::Error>(CompactedEvent {
                            replaced_messages,
                            summary_bytes: summary.map_or(0, |summary| summary.len()),
                            tokens_before,
                            tokens_after,
                        });
                    }
                }
                Frame::Live(ApiLiveEvent::CompactionFailed { error }) => {
                    return Err(anyhow!("a compaction of {id} failed: {error}"));
                }
                Frame::Error(error) => {
                    return Err(anyhow!("the stream of {id} failed: {error:?}"));
                }
                Frame::Snapshot(_) | Frame::Live(_) | Frame::Reconnecting { .. } => {}
            }
        }
    })
    .await
    .map_err(|_| anyhow!("a compaction of {id} did not end within {TURN_LIMIT:?}"))??;
    Ok((started.elapsed(), compacted))
}

/// The `count` summary requests the fake provider at `mock_url` recorded
/// since its recording was cleared, oldest first, once they have ended.
async fn summary_requests(
    http: &reqwest::Client,
    mock_url: &str,
    count: usize,
) -> anyhow::Result<Vec<RecordedRequest>> {
    let body = http
        .get(format!("{mock_url}/_mock/requests?wait_ended={count}"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("reading the recording of the fake provider at {mock_url}"))?
        .bytes()
        .await?;
    let recorded: Vec<RecordedRequest> =
        serde_json::from_slice(&body).context("reading the fake provider's recording")?;
    let summaries: Vec<RecordedRequest> = recorded
        .into_iter()
        .filter(|request| request.source == "summary")
        .collect();
    if summaries.len() != count {
        return Err(anyhow!(
            "the fake provider at {mock_url} recorded {} summary requests, not {count}",
            summaries.len()
        ));
    }
    Ok(summaries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 0.5), 51.0);
        assert_eq!(percentile(&samples, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        let measured = latency(vec![Duration::from_millis(3), Duration::from_millis(1)]);
        assert_eq!(measured.samples, 2);
        assert_eq!(measured.p99_ms, 3.0);
    }
}
