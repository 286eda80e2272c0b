//! Part 2: many open streams, and what each costs the daemon.

use super::client::{open_many, Api, Sse};
use super::processes::{self_rss_bytes, Daemon};
use super::*;

pub(crate) struct OpenStreams {
    pub(crate) connections: usize,
    pub(crate) conversations: usize,
    pub(crate) snapshots: usize,
    pub(crate) open_time: Duration,
    pub(crate) open_latency: Vec<Duration>,
    pub(crate) rss_start: u64,
    pub(crate) rss_created: u64,
    pub(crate) rss_open: u64,
    pub(crate) cpu_create: f64,
    pub(crate) cpu_open: f64,
    pub(crate) cpu_idle_per_s: f64,
    pub(crate) client_rss_per_stream: f64,
}

/// Open `connections` streams over `conversations` conversations (each
/// gets as many as the others, give or take one).
pub(crate) async fn open_streams(
    mock_url: &str,
    connections: usize,
    conversations: usize,
) -> OpenStreams {
    let daemon = Daemon::start(mock_url);
    let api = Api::new(&daemon);
    {
        let id = api.create().await;
        let mut warm = Sse::open(daemon.addr, &id).await;
        api.send(&id, "warm up").await;
        warm.until_turn_completed().await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_start = daemon.rss_bytes();
    let cpu_start = daemon.cpu_seconds();

    let mut ids = Vec::with_capacity(conversations);
    let gate = Arc::new(Semaphore::new(CREATING));
    let mut creating = JoinSet::new();
    for _ in 0..conversations {
        let api = api.clone();
        let gate = gate.clone();
        creating.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            api.create().await
        });
    }
    while let Some(id) = creating.join_next().await {
        ids.push(id.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_created = daemon.rss_bytes();
    let cpu_created = daemon.cpu_seconds();
    let client_rss_before = self_rss_bytes();

    let targets = ids.iter().cycle().take(connections).cloned().collect();
    let started = Instant::now();
    let streams = open_many(daemon.addr, targets).await;
    let open_time = started.elapsed();
    let snapshots = streams.len();
    let open_latency = streams.iter().map(|(_, _, took)| *took).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_open = daemon.rss_bytes();
    let cpu_open = daemon.cpu_seconds();
    // Idle with every stream open: nothing should be spent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu_idle_per_s = (daemon.cpu_seconds() - cpu_open) / 3.0;
    let client_rss_per_stream =
        self_rss_bytes().saturating_sub(client_rss_before) as f64 / connections as f64;
    drop(streams);
    OpenStreams {
        connections,
        conversations,
        snapshots,
        open_time,
        open_latency,
        rss_start,
        rss_created,
        rss_open,
        cpu_create: cpu_created - cpu_start,
        cpu_open: cpu_open - cpu_created,
        cpu_idle_per_s,
        client_rss_per_stream,
    }
}

impl OpenStreams {
    pub(crate) fn per_stream_kib(&self) -> f64 {
        self.rss_open.saturating_sub(self.rss_created) as f64 / self.connections as f64 / 1024.0
    }

    pub(crate) fn print(&self) {
        let n = self.connections as f64;
        let mib = |bytes: u64| bytes as f64 / 1048576.0;
        println!(
            "open streams: {} over {} conversations; {} snapshots received",
            self.connections, self.conversations, self.snapshots
        );
        println!(
            "  daemon RSS {:.1} MiB -> {:.1} MiB created ({:.1} KiB/conversation) -> {:.1} MiB streams open ({:.1} KiB/stream)",
            mib(self.rss_start),
            mib(self.rss_created),
            self.rss_created.saturating_sub(self.rss_start) as f64
                / self.conversations as f64
                / 1024.0,
            mib(self.rss_open),
            self.per_stream_kib()
        );
        println!(
            "  opened in {:.2} s ({:.0}/s, {} at a time), each {}; daemon CPU {:.1} µs/stream to open, {:.1} µs/conversation to create, {:.3} s/s idle with all open",
            self.open_time.as_secs_f64(),
            n / self.open_time.as_secs_f64(),
            OPENING,
            summary(&self.open_latency),
            self.cpu_open * 1e6 / n,
            self.cpu_create * 1e6 / self.conversations as f64,
            self.cpu_idle_per_s
        );
        println!(
            "  the client's RSS: {:.1} KiB per stream",
            self.client_rss_per_stream / 1024.0
        );
    }
}
