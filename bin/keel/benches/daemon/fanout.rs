//! Part 1: fan-out to many subscribers of one conversation.

use super::client::{open_many, Api, Sse};
use super::processes::{self_cpu_seconds, Daemon};
use super::*;

/// What one subscriber read: each canonical frame's seq, whether it was
/// the `user_message`, and when its bytes were read.
pub(crate) struct Seen {
    pub(crate) seq: u64,
    pub(crate) user_message: bool,
    pub(crate) at: Instant,
}

pub(crate) struct Fanout {
    pub(crate) subscribers: usize,
    pub(crate) open_time: Duration,
    /// User-message frames, from the first sign of the publish.
    pub(crate) from_publish: Vec<Duration>,
    /// The same frames, from the POST being sent.
    pub(crate) from_post: Vec<Duration>,
    /// Every canonical frame, from the first subscriber's read.
    pub(crate) spread: Vec<Duration>,
    /// Message frames a subscriber never read (must be 0).
    pub(crate) missing: usize,
    pub(crate) lagged: usize,
    pub(crate) cpu_per_message_ms: f64,
    /// This process's CPU per message: the client reading every frame.
    pub(crate) client_cpu_per_message_ms: f64,
}

pub(crate) async fn fanout(mock_url: &str, subscribers: usize, messages: usize) -> Fanout {
    let daemon = Daemon::start(mock_url);
    let api = Api::new(&daemon);
    let id = api.create().await;
    // Warm up: one watched turn before anything is counted.
    let mut warm = Sse::open(daemon.addr, &id).await;
    api.send(&id, "warm up").await;
    warm.until_turn_completed().await;
    drop(warm);

    let started = Instant::now();
    let streams = open_many(daemon.addr, vec![id.clone(); subscribers]).await;
    let open_time = started.elapsed();

    let done = TurnTally::new(subscribers);
    let mut followers = JoinSet::new();
    for (_, sse, _) in streams {
        followers.spawn(follow(sse, messages, done.follower()));
    }
    let mut sent = Vec::new();
    let cpu_before = daemon.cpu_seconds();
    let client_cpu_before = self_cpu_seconds();
    let mut took = Vec::new();
    for message in 0..messages {
        let posted = Instant::now();
        let seq = api.send(&id, &format!("message {message}")).await;
        let accepted = Instant::now();
        sent.push((seq, posted, accepted));
        done.wait_for(message + 1)
            .await
            .expect("a subscriber stopped");
        took.push(posted.elapsed());
    }
    let cpu = daemon.cpu_seconds() - cpu_before;
    let client_cpu = self_cpu_seconds() - client_cpu_before;
    let mut seen = Vec::new();
    let mut lagged = 0;
    while let Some(joined) = followers.join_next().await {
        // The stream closes only now, after every subscriber has read
        // every turn: a thousand closes are the daemon's work too, and
        // would land amid the last turn's deliveries.
        let (frames, lags, _stream) = joined.unwrap();
        seen.push(frames);
        lagged += lags;
    }

    let mut from_publish = Vec::new();
    let mut from_post = Vec::new();
    let mut missing = 0;
    for &(seq, posted, accepted) in &sent {
        let reads: Vec<Instant> = seen
            .iter()
            .filter_map(|frames| {
                frames
                    .iter()
                    .find(|frame| frame.user_message && frame.seq == seq)
                    .map(|frame| frame.at)
            })
            .collect();
        missing += subscribers - reads.len();
        let first = reads.iter().min().copied().unwrap_or(accepted);
        let published = first.min(accepted);
        for at in reads {
            from_publish.push(at - published);
            from_post.push(at - posted);
        }
    }
    let mut firsts = std::collections::HashMap::<u64, Instant>::new();
    for frame in seen.iter().flatten() {
        let first = firsts.entry(frame.seq).or_insert(frame.at);
        *first = (*first).min(frame.at);
    }
    // `KEEL_BENCH_WAVES=1`: each message's turn as its subscribers read
    // it, its first four canonical frames from the first read of the
    // `user_message` (to see one slow turn among fast ones, or frames of
    // one step that did not reach a stream together).
    if std::env::var_os("KEEL_BENCH_WAVES").is_some() {
        let mut reads = std::collections::HashMap::<u64, Vec<Instant>>::new();
        for frame in seen.iter().flatten() {
            reads.entry(frame.seq).or_default().push(frame.at);
        }
        for (index, (&(seq, _, _), took)) in sent.iter().zip(&took).enumerate() {
            let start = firsts[&seq];
            let ms = |at: Instant| (at - start).as_secs_f64() * 1000.0;
            let mut line = format!(
                "message {}: turn {:.1} ms |",
                index + 1,
                took.as_secs_f64() * 1000.0
            );
            for (offset, frame) in (seq..seq + 4).enumerate() {
                if let Some(at) = reads.get_mut(&frame) {
                    at.sort();
                    line += &format!(
                        " seq+{offset}: first {:.2} p50 {:.2} p99 {:.2} |",
                        ms(at[0]),
                        ms(at[at.len() / 2]),
                        ms(at[at.len() * 99 / 100])
                    );
                }
            }
            println!("{line}");
        }
    }
    let spread = seen
        .iter()
        .flatten()
        .map(|frame| frame.at - firsts[&frame.seq])
        .collect();
    Fanout {
        subscribers,
        open_time,
        from_publish,
        from_post,
        spread,
        missing,
        lagged,
        cpu_per_message_ms: cpu * 1000.0 / messages as f64,
        client_cpu_per_message_ms: client_cpu * 1000.0 / messages as f64,
    }
}

/// Read one subscriber's stream until it has seen `turns` turns end; the
/// stream is given back open.
pub(crate) async fn follow(
    mut sse: Sse,
    turns: usize,
    done: TallyFollower,
) -> (Vec<Seen>, usize, Sse) {
    let mut seen = Vec::with_capacity(turns * 8);
    let mut lagged = 0;
    let mut completed = 0;
    while completed < turns {
        let at = sse.fill().await.expect("a stream ended");
        while let Some(frame) = sse.next_frame() {
            match frame {
                Scanned::Canonical { seq, kind } => {
                    seen.push(Seen {
                        seq,
                        user_message: kind == ScannedKind::UserMessage,
                        at,
                    });
                    if kind == ScannedKind::TurnCompleted {
                        completed += 1;
                        done.turn_completed();
                    }
                }
                Scanned::Live { lagged: true } => lagged += 1,
                _ => {}
            }
        }
    }
    done.finish();
    (seen, lagged, sse)
}

impl Fanout {
    pub(crate) fn print(&self, messages: usize) {
        println!(
            "fan-out: {} subscribers of one conversation opened in {:.2} s; {} messages",
            self.subscribers,
            self.open_time.as_secs_f64(),
            messages
        );
        println!(
            "  user_message from publish: {}; from POST sent: {}",
            summary(&self.from_publish),
            summary(&self.from_post)
        );
        println!(
            "  every canonical frame from its first read: {}",
            summary(&self.spread)
        );
        println!(
            "  user_message from publish, how many within: {}",
            histogram(&self.from_publish)
        );
        println!(
            "  missing {}, lagged {}, CPU per message (a whole turn to every subscriber): daemon {:.1} ms, client {:.1} ms",
            self.missing, self.lagged, self.cpu_per_message_ms, self.client_cpu_per_message_ms
        );
    }
}
