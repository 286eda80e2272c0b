//! The runs `keel bench` measures, each against the daemon it is given:
//! SSE fan-out, turns (one after the other per conversation, all
//! conversations at once, and client-shaped), idle memory per
//! conversation, and cancels; and how their figures are taken (`Turns`,
//! `Latency`, which `bench`'s report re-exports). `bench` calls into this
//! module, never the other way round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use futures_util::{Stream, StreamExt as _};
use serde::Serialize;
use serde_json::json;
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
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
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
    at_most_opening(count, |_| {
        let client = client.clone();
        // The fake provider, named: a daemon at `--addr` with a real
        // provider configured must refuse rather than be billed.
        let request = CreateConversation {
            cwd: Some(cwd.to_owned()),
            provider: Some(ApiProvider::Mock),
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
    let measuring = Measuring::start(pid)?;
    let mut working = JoinSet::new();
    for id in ids {
        let client = client.clone();
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

/// One client-shaped turn: a new connection sends, another follows from
/// the message on (its snapshot first) to the turn's end.
pub(super) async fn shaped_turn(client: &Client, id: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let accepted = client.fresh().send_text(id, "run: true").await?;
    let mut events = client.fresh().events(id, Some(accepted.seq));
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
    let streams = at_most_opening(ids.len(), |index| {
        let client = client.clone();
        let id = ids[index].clone();
        async move { open(&client, &id).await.map(|events| (id, events)) }
    })
    .await?;
    let text = if kind == "tool" { "run: true" } else { "hello" };
    // Sends take turns as the openings did.
    let gate = Arc::new(Semaphore::new(OPENING));
    let measuring = Measuring::start(pid)?;
    let mut working = JoinSet::new();
    for (id, mut events) in streams {
        let client = client.clone();
        let sending = gate.clone();
        working.spawn(async move {
            let mut latencies = Vec::with_capacity(each);
            for _ in 0..each {
                latencies.push(one_turn(&client, &sending, &mut events, &id, text).await?);
            }
            Ok::<_, anyhow::Error>(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(conversations * each);
    while let Some(joined) = working.join_next().await {
        latencies.extend(joined.context("a turn task failed")??);
    }
    Ok((measuring.turns(kind, conversations, latencies)?, ids))
}

/// A run of turns being measured: its start, and the daemon's CPU time
/// then (when its process is known).
pub(super) struct Measuring {
    pub(super) pid: Option<u32>,
    pub(super) started: Instant,
    pub(super) cpu_before: Option<Duration>,
}

impl Measuring {
    pub(super) fn start(pid: Option<u32>) -> anyhow::Result<Measuring> {
        Ok(Measuring {
            pid,
            cpu_before: cpu_time(pid)?,
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
