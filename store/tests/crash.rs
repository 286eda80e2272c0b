//! Crash test, for sled and for redb: a real child process appends with many
//! concurrent writers and is killed with SIGKILL at random moments, hundreds
//! of times. Successive children work in the same data directory (for
//! `KILLS_PER_DIR` kills, then a new one), continuing the conversations the
//! previous one left, as recovery does. After every kill the parent reopens
//! the store and checks that it opens, that every append acknowledged in
//! that directory is there (from this run and every earlier one), that the
//! logs read back (nothing torn), that seqs run 1..=n with `Created` first,
//! that nothing seen after an earlier kill has changed or gone, and that
//! each index entry is exactly what its log folds to (index and log are
//! written in one batch). Now and then a child is also killed while it
//! creates a store in a new directory, which must open afterwards.
//!
//! redb must pass every check. sled 0.34.7 sometimes refuses to reopen after
//! a kill (this test found it: see `tolerated`), which is why redb is the
//! default; on sled the test counts those refusals and checks everything
//! else as strictly.
//!
//! The child is this test binary itself, run as
//! `crash --exact child_writer --nocapture --test-threads=1` with
//! `KEEL_CRASH_CHILD_DIR` set; without it `child_writer` does nothing. It
//! prints `ack <conversation> <last seq>` on stdout after each append that
//! returned, which is the parent's record of what was acknowledged.
//!
//! Knobs: `KEEL_CRASH_ITERATIONS` (kills per backend, default 200) and
//! `KEEL_CRASH_SEED` (to replay the random choices of a run; the timing of a
//! kill against the child's progress is never exactly reproducible).

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keel_core::config::{ConversationConfig, ProviderKind};
use keel_core::event::{Event, EventKind};
use keel_core::ids::{ConversationId, Seq};
use keel_core::message::{AssistantBlock, StopReason, Usage};
use keel_core::time::Timestamp;
use keel_store::{Backend, BackendKind, EventLog, IndexEntry, Store};

const CHILD_DIR: &str = "KEEL_CRASH_CHILD_DIR";
const CHILD_BACKEND: &str = "KEEL_CRASH_BACKEND";
const CHILD_SEED: &str = "KEEL_CRASH_CHILD_SEED";
const CHILD_RUN: &str = "KEEL_CRASH_RUN";

/// Concurrent writer tasks in the child.
const WRITERS: usize = 32;
/// Conversations each writer continues from run to run (what recovery does).
const POOL_PER_WRITER: usize = 2;
/// A writer starts a new conversation about once in this many appends.
const NEW_CONVERSATION_ONE_IN: u64 = 100;
/// Most conversations a writer keeps appending to at once.
const MAX_ACTIVE: usize = 4;

const SIGKILL: i32 = 9;
/// Kills in one directory, whose logs accumulate, before the test goes on
/// in a new one (which bounds the cost of each reopen and check). The last
/// check in each directory reads every log whole; the others read each log
/// from the tail the previous check saw.
const KILLS_PER_DIR: u64 = 20;
/// About one kill in this many is followed by a kill of a child creating a
/// store in a new directory.
const CREATE_KILL_ONE_IN: u64 = 8;
/// The longest sled may go on holding its lock after the store is dropped.
const SLED_LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a child may take to open the store and acknowledge an append.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Randomness: xorshift64*, seeded from the clock unless KEEL_CRASH_SEED says.

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so that nearby seeds diverge at once.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `low..=high`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    /// In `low..=high` (0 < low <= high), uniform on a log scale.
    fn log_uniform(&mut self, low: u64, high: u64) -> u64 {
        let unit = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        let (low_ln, high_ln) = ((low as f64).ln(), (high as f64).ln());
        ((low_ln + unit * (high_ln - low_ln)).exp() as u64).clamp(low, high)
    }
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// The events the child writes. Message texts start with `<conversation>#<seq> `
// so the parent can tell a record that landed under the wrong key.

fn tag(conversation: &ConversationId, seq: Seq) -> String {
    format!("{conversation}#{seq} ")
}

fn text_for(conversation: &ConversationId, seq: Seq, rng: &mut Rng) -> String {
    let mut text = tag(conversation, seq);
    let len = rng.between(100, 1000) as usize;
    const WORDS: [&str; 8] = [
        "the ", "log ", "is ", "truth ", "durable ", "append ", "seq ", "keel ",
    ];
    while text.len() < len {
        text.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
    }
    text.truncate(len);
    text
}

/// Event `seq` of `conversation`: `Created` at 1, then turns of user
/// message, turn start, assistant message and turn end.
fn make_event(conversation: &ConversationId, seq: Seq, rng: &mut Rng) -> Event {
    let turn = (seq / 4) as u32;
    let (parent, triggers_turn, kind) = match (seq, seq % 4) {
        (1, _) => (
            None,
            false,
            EventKind::Created {
                conversation: conversation.clone(),
                cwd: "/tmp/keel-crash".to_owned(),
                config: ConversationConfig::default(),
                parent_conversation: None,
                user_initiated: true,
                forked_from: None,
            },
        ),
        (_, 2) => (
            None,
            true,
            EventKind::UserMessage {
                text: text_for(conversation, seq, rng),
                images: Vec::new(),
            },
        ),
        (_, 3) => (Some(seq - 1), false, EventKind::TurnStarted { turn }),
        (_, 0) => (
            Some(seq - 1),
            false,
            EventKind::AssistantMessage {
                blocks: vec![AssistantBlock::Text {
                    text: text_for(conversation, seq, rng),
                }],
                stop_reason: StopReason::EndTurn,
                usage: Usage {
                    input_tokens: rng.between(10, 5000),
                    output_tokens: rng.between(10, 1000),
                    ..Usage::default()
                },
                provider: ProviderKind::Anthropic,
                model: "claude-crash-test".to_owned(),
            },
        ),
        _ => (
            Some(seq - 2),
            false,
            EventKind::TurnCompleted {
                turn: turn.saturating_sub(1),
                duration_ms: rng.between(100, 20_000),
                note: None,
            },
        ),
    };
    Event {
        seq,
        at: Timestamp::from_millis(now_millis()),
        parent,
        triggers_turn,
        kind,
    }
}

/// The tag a stored event's text must carry, if it has text.
fn stored_tag(event: &Event) -> Option<&str> {
    match &event.kind {
        EventKind::UserMessage { text, .. } => Some(text),
        EventKind::AssistantMessage { blocks, .. } => match blocks.first() {
            Some(AssistantBlock::Text { text }) => Some(text),
            _ => Some(""),
        },
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// The child.

fn die(message: String) -> ! {
    eprintln!("crash child: {message}");
    let _ = std::io::stderr().flush();
    std::process::exit(3)
}

/// One line to the parent, whole, flushed at once.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(error) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        die(format!("cannot write to stdout: {error}"));
    }
}

fn ack(conversation: &ConversationId, seq: Seq) {
    say(&format!("ack {conversation} {seq}"));
}

/// Run only as the child of `sled_survives_sigkill` / `redb_survives_sigkill`:
/// append forever from many tasks until killed.
#[test]
fn child_writer() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| die(format!("{name} unset")));
    let backend: BackendKind = env(CHILD_BACKEND).parse().unwrap_or_else(|e| die(e));
    let seed: u64 = env(CHILD_SEED)
        .parse()
        .unwrap_or_else(|_| die("bad seed".into()));
    let run: u64 = env(CHILD_RUN)
        .parse()
        .unwrap_or_else(|_| die("bad run".into()));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap_or_else(|e| die(format!("runtime: {e}")));
    runtime.block_on(async move {
        // The harness has printed `test child_writer ... ` without a newline.
        say("\nopening");
        let store = keel_store::open(backend, Path::new(&dir), None)
            .unwrap_or_else(|error| die(format!("opening the {backend} store failed: {error}")));
        say("opened");
        let mut writers = tokio::task::JoinSet::new();
        for writer in 0..WRITERS {
            let seed = seed ^ (writer as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            writers.spawn(write_forever(Arc::clone(&store), writer, run, seed));
        }
        if let Some(ended) = writers.join_next().await {
            die(format!("a writer stopped: {ended:?}"));
        }
    });
}

async fn write_forever(store: Arc<dyn EventLog>, writer: usize, run: u64, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut active: Vec<(ConversationId, Seq)> = Vec::new();
    for k in 0..POOL_PER_WRITER {
        let id = ConversationId::new(format!("p{writer:02}-{k}")).unwrap();
        let last = store
            .last_seq(&id)
            .await
            .unwrap_or_else(|error| die(format!("last_seq({id}) failed: {error}")));
        active.push((id, last));
    }
    let mut fresh = 0;
    loop {
        if rng.below(NEW_CONVERSATION_ONE_IN) == 0 {
            let id = ConversationId::new(format!("r{run}-w{writer:02}-{fresh}")).unwrap();
            fresh += 1;
            if active.len() >= MAX_ACTIVE {
                active.remove(POOL_PER_WRITER);
            }
            active.push((id, 0));
        }
        let slot = rng.below(active.len() as u64) as usize;
        let (id, last) = active[slot].clone();
        let count = rng.between(1, 5);
        let events = (last + 1..=last + count)
            .map(|seq| make_event(&id, seq, &mut rng))
            .collect();
        if let Err(error) = store.append(&id, events).await {
            die(format!("append to {id} after seq {last} failed: {error}"));
        }
        active[slot].1 = last + count;
        ack(&id, last + count);
        // A pause now and then, as between turns; the other writers go on.
        if rng.below(2) == 0 {
            tokio::time::sleep(Duration::from_millis(rng.between(1, 8))).await;
        }
    }
}

// ---------------------------------------------------------------------------
// The parent.

/// When to kill a child.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// This long after it starts opening the store: in the middle of
    /// recovery, or of creating the files when the directory is new.
    AfterOpening(Duration),
    /// This long after its first acknowledged append: while many appends
    /// and their group commits are under way.
    AfterFirstAck(Duration),
}

/// What the child said before it was killed.
struct ChildRun {
    acks: Vec<(String, Seq)>,
    /// It had finished opening the store.
    opened: bool,
    /// From its `opening` line to its `opened` line, if it got that far.
    open_took: Option<Duration>,
}

enum Marker {
    Opening,
    FirstAck,
}

/// Held while spawning a child and while closing a store. A child spawned
/// by one test's thread gets a copy of every descriptor of this process
/// until it execs (close-on-exec), the other test's store files and their
/// locks included; a store closed in that window stays locked a moment
/// longer, and the other test's next child may then find it in use.
static SPAWNING: Mutex<()> = Mutex::new(());

fn spawn_child(backend: &str, dir: &Path, run: u64, seed: u64) -> Child {
    let _spawning = SPAWNING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir)
        .env(CHILD_BACKEND, backend)
        .env(CHILD_SEED, seed.to_string())
        .env(CHILD_RUN, run.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Read the child's lines until it dies; a line cut off by the kill (no
/// newline) does not count.
fn read_child(
    stdout: impl Read + Send + 'static,
    markers: mpsc::Sender<Marker>,
) -> JoinHandle<ChildRun> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut run = ChildRun {
            acks: Vec::new(),
            opened: false,
            open_took: None,
        };
        let mut line = Vec::new();
        let mut opening = None;
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) if line.last() != Some(&b'\n') => break,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let mut words = text.split_whitespace();
            match words.next() {
                Some("opening") => {
                    opening = Some(Instant::now());
                    let _ = markers.send(Marker::Opening);
                }
                Some("opened") => {
                    run.opened = true;
                    run.open_took = opening.map(|opening| opening.elapsed());
                }
                Some("ack") => {
                    let (Some(conversation), Some(Ok(seq)), None) =
                        (words.next(), words.next().map(str::parse), words.next())
                    else {
                        panic!("malformed ack line from the child: {text:?}");
                    };
                    if run.acks.is_empty() {
                        let _ = markers.send(Marker::FirstAck);
                    }
                    run.acks.push((conversation.to_owned(), seq));
                }
                _ => {}
            }
        }
        run
    })
}

/// Run a child in `dir` and SIGKILL it as `kill` says.
fn run_child(
    backend: &str,
    dir: &Path,
    run: u64,
    seed: u64,
    kill: Kill,
) -> Result<ChildRun, String> {
    let mut child = spawn_child(backend, dir, run, seed);
    let (markers_tx, markers) = mpsc::channel();
    let said = read_child(child.stdout.take().unwrap(), markers_tx);
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    let deadline = Instant::now() + CHILD_TIMEOUT;
    let mut trouble = None;
    loop {
        match markers.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Marker::Opening) => {
                if let Kill::AfterOpening(wait) = kill {
                    std::thread::sleep(wait);
                    break;
                }
            }
            Ok(Marker::FirstAck) => {
                if let Kill::AfterFirstAck(wait) = kill {
                    std::thread::sleep(wait);
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                trouble = Some(format!(
                    "the child was not ready to kill ({kill:?}) within {CHILD_TIMEOUT:?}"
                ));
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                trouble = Some(format!("the child closed stdout before {kill:?}"));
                break;
            }
        }
    }
    let _ = child.kill();
    let status = child.wait().unwrap();
    let said = said.join().unwrap();
    let stderr = stderr.join().unwrap();
    if status.signal() != Some(SIGKILL) {
        return Err(format!(
            "the child ended by itself ({status}) instead of being killed; its stderr:\n{stderr}"
        ));
    }
    match trouble {
        Some(trouble) => Err(format!("{trouble}; the child's stderr:\n{stderr}")),
        None => Ok(said),
    }
}

/// What the parent saw in the reopened store.
#[derive(Default)]
struct Seen {
    conversations: usize,
    events: u64,
}

const OPEN_FAILED: &str = "the store does not open";

fn open(backend: &str, dir: &Path) -> Result<Box<dyn Verify>, String> {
    let opened: keel_store::Result<Box<dyn Verify>> = match backend {
        "sled" => keel_store::open_sled(dir).map(|store| Box::new(store) as Box<dyn Verify>),
        "redb" => keel_store::open_redb(dir).map(|store| Box::new(store) as Box<dyn Verify>),
        other => panic!("no such backend {other}"),
    };
    opened.map_err(|error| format!("{OPEN_FAILED}: {error}"))
}

/// What the parent has verified of one conversation so far.
struct Known {
    /// What the verified log folds to; must equal the index entry.
    folded: IndexEntry,
    /// The last few verified events, which must read back unchanged.
    tail: Vec<Event>,
}

/// Events of the verified tail each later check reads again.
const KNOWN_TAIL: usize = 4;

#[async_trait::async_trait]
trait Verify {
    /// Check the reopened store against every acknowledged append and
    /// against what earlier checks saw. `full` reads every log from seq 1
    /// and scans the whole event key space; otherwise each log is read
    /// from the tail the last check saw.
    async fn verify(
        &self,
        acked: &HashMap<String, Seq>,
        known: &mut HashMap<ConversationId, Known>,
        full: bool,
    ) -> Result<Seen, String>;
}

#[async_trait::async_trait]
impl<B: Backend> Verify for Store<B> {
    async fn verify(
        &self,
        acked: &HashMap<String, Seq>,
        known: &mut HashMap<ConversationId, Known>,
        full: bool,
    ) -> Result<Seen, String> {
        let entries = self
            .list(true)
            .await
            .map_err(|error| format!("list failed: {error}"))?;
        let mut seen = Seen::default();
        let mut lengths: HashMap<String, Seq> = HashMap::new();
        let mut now_known = HashMap::new();
        for entry in entries {
            let id = entry.id.clone();
            let before = known.get(&id);
            let from = match before {
                Some(before) if !full => before.tail.first().map_or(1, |event| event.seq),
                _ => 1,
            };
            let events = self.read(&id, from, usize::MAX).await.map_err(|error| {
                format!("reading {id} from seq {from} failed (torn record?): {error}")
            })?;
            let folded = check_log(&id, from, &events, &entry, before)?;
            let last = from + events.len() as Seq - 1;
            let index_last = self
                .index_entry(&id)
                .await
                .map_err(|error| format!("index_entry({id}) failed: {error}"))?
                .map(|entry| entry.last_seq);
            if index_last != Some(last) {
                return Err(format!(
                    "index_entry({id}).last_seq is {index_last:?} but the log ends at {last}"
                ));
            }
            let last_seq = self
                .last_seq(&id)
                .await
                .map_err(|error| format!("last_seq({id}) failed: {error}"))?;
            if last_seq != last {
                return Err(format!(
                    "last_seq({id}) is {last_seq} but the log reads to {last}"
                ));
            }
            seen.conversations += 1;
            seen.events += last;
            lengths.insert(id.as_str().to_owned(), last);
            let tail = events[events.len().saturating_sub(KNOWN_TAIL)..].to_vec();
            now_known.insert(id, Known { folded, tail });
        }

        if let Some(gone) = known.keys().find(|id| !now_known.contains_key(*id)) {
            return Err(format!(
                "{gone} was in the store after an earlier kill and is gone"
            ));
        }
        for (conversation, &acked_seq) in acked {
            match lengths.get(conversation) {
                Some(&last) if last >= acked_seq => {}
                Some(&last) => {
                    return Err(format!(
                        "lost acknowledged appends: {conversation} was acknowledged up to seq \
                         {acked_seq} but its log ends at seq {last}"
                    ))
                }
                None => {
                    return Err(format!(
                        "lost a conversation: {conversation} was acknowledged up to seq \
                         {acked_seq} but is not in the index"
                    ))
                }
            }
        }

        if full {
            // Events under no index entry: scan the whole event key space.
            let mut counted: HashMap<Vec<u8>, Seq> = HashMap::new();
            let all = self
                .backend()
                .range(b"e", b"f", usize::MAX)
                .map_err(|error| format!("scanning the event keys failed: {error}"))?;
            for (key, _) in &all {
                let conversation = key
                    .get(1..key.len().saturating_sub(9))
                    .ok_or_else(|| format!("short event key {key:?}"))?;
                *counted.entry(conversation.to_vec()).or_default() += 1;
            }
            for (conversation, count) in counted {
                let name = String::from_utf8_lossy(&conversation).into_owned();
                if lengths.get(&name) != Some(&count) {
                    return Err(format!(
                        "{count} events stored under {name:?}, but the index says {:?}",
                        lengths.get(&name)
                    ));
                }
            }
        }
        *known = now_known;
        Ok(seen)
    }
}

/// Check `events`, the log of `id` from seq `from` on: seqs contiguous,
/// `Created` first and naming `id`, every text under its own key, what an
/// earlier check saw still there unchanged, and the index entry exactly
/// what the log folds to. Returns the folded entry.
fn check_log(
    id: &ConversationId,
    from: Seq,
    events: &[Event],
    entry: &IndexEntry,
    before: Option<&Known>,
) -> Result<IndexEntry, String> {
    let first = events
        .first()
        .ok_or_else(|| format!("{id} is in the index but has no events from seq {from}"))?;
    for (position, event) in events.iter().enumerate() {
        let expected = from + position as Seq;
        if event.seq != expected {
            return Err(format!(
                "{id}: seqs not contiguous, found seq {} where {expected} belongs",
                event.seq
            ));
        }
        if let Some(text) = stored_tag(event) {
            if !text.starts_with(&tag(id, expected)) {
                return Err(format!(
                    "{id}:{expected} holds text of another record: {:?}",
                    &text[..text.len().min(40)]
                ));
            }
        }
    }
    if let Some(before) = before {
        for old in &before.tail {
            let now = old
                .seq
                .checked_sub(from)
                .and_then(|at| events.get(at as usize));
            if now != Some(old) {
                return Err(format!(
                    "{id}:{} reads back differently than after an earlier kill: {now:?}",
                    old.seq
                ));
            }
        }
    }
    let folded = if from == 1 {
        match &first.kind {
            EventKind::Created { conversation, .. } if conversation == id => {}
            other => return Err(format!("{id} starts with {other:?}, not its Created")),
        }
        let mut folded = IndexEntry::created(first).ok_or("Created makes no index entry")?;
        for event in &events[1..] {
            folded.apply(event);
        }
        folded
    } else {
        let before = before.ok_or("read from the middle of an unknown log")?;
        let mut folded = before.folded.clone();
        for event in events
            .iter()
            .filter(|event| event.seq > before.folded.last_seq)
        {
            folded.apply(event);
        }
        folded
    };
    if folded != *entry {
        return Err(format!(
            "{id}: the index entry {entry:?} is not what its log folds to: {folded:?}"
        ));
    }
    Ok(folded)
}

fn iterations() -> u64 {
    std::env::var("KEEL_CRASH_ITERATIONS")
        .ok()
        .and_then(|raw| raw.parse().ok())
        .unwrap_or(200)
}

fn seed() -> u64 {
    std::env::var("KEEL_CRASH_SEED")
        .ok()
        .and_then(|raw| raw.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|elapsed| elapsed.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// Reopen the store in `dir`, check it against `acked`, and close it again.
/// Returns what it saw, how long the open took, and how long sled went on
/// holding its own lock on its files after the store was dropped.
fn reopen_and_check(
    backend: &str,
    dir: &Path,
    acked: &HashMap<String, Seq>,
    known: &mut HashMap<ConversationId, Known>,
    full: bool,
) -> Result<(Seen, Duration, Duration), String> {
    let opening = Instant::now();
    let store = open(backend, dir)?;
    let took = opening.elapsed();
    // The store's reads are async; a runtime of one thread is enough to
    // wait for them (they run on its blocking pool).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|error| format!("cannot start a tokio runtime: {error}"))?;
    let seen = runtime.block_on(store.verify(acked, known, full))?;
    {
        let _spawning = SPAWNING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        drop(store);
    }
    let lingered = if backend == "sled" {
        wait_for_sled_lock(&dir.join("sled").join("db"))?
    } else {
        Duration::ZERO
    };
    Ok((seen, took, lingered))
}

/// sled 0.34 locks its `db` file itself, and under load that lock can
/// outlive the dropped store by some milliseconds (presumably while its
/// background threads still hold the file); a child started meanwhile could
/// not open the store. Wait for the lock, and say how long it took.
fn wait_for_sled_lock(db: &Path) -> Result<Duration, String> {
    let waiting = Instant::now();
    loop {
        let free = {
            // Not while a child is being spawned: it would inherit the lock.
            let _spawning = SPAWNING
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(db)
                .map_err(|error| format!("cannot open {}: {error}", db.display()))?;
            file.try_lock().is_ok()
        };
        if free {
            return Ok(waiting.elapsed());
        }
        if waiting.elapsed() > SLED_LOCK_TIMEOUT {
            return Err(format!(
                "sled still holds the lock on {} {SLED_LOCK_TIMEOUT:?} after the store was \
                 dropped",
                db.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Remember the highest acknowledged seq of each conversation.
fn record(acked: &mut HashMap<String, Seq>, acks: Vec<(String, Seq)>) {
    for (conversation, seq) in acks {
        let highest = acked.entry(conversation).or_default();
        *highest = (*highest).max(seq);
    }
}

#[derive(Default)]
struct Tally {
    kills: u64,
    /// Killed while opening (or about to open) the accumulated store.
    during_open: u64,
    /// Of those, killed before its open returned.
    before_opened: u64,
    /// Extra kills of a child creating a store in a new directory.
    fresh: u64,
    fresh_before_opened: u64,
    acks: u64,
    open_total: Duration,
    open_max: Duration,
    /// Reopen, check and close, after the main kills.
    check_total: Duration,
    /// sled: how long its lock outlived the store, at worst, and how often
    /// it outlived it by more than a millisecond.
    lingered_max: Duration,
    lingered: u64,
}

impl Tally {
    fn checked(&mut self, took: Duration, lingered: Duration) {
        self.open_total += took;
        self.open_max = self.open_max.max(took);
        self.lingered_max = self.lingered_max.max(lingered);
        self.lingered += u64::from(lingered > Duration::from_millis(1));
    }
}

/// One kill-and-check in the directory that accumulates logs across kills.
/// `open_took` is set to how long the child took to open the store, if it
/// got that far.
#[allow(clippy::too_many_arguments)]
fn kill_and_check(
    backend: &str,
    dir: &Path,
    iteration: u64,
    kill: Kill,
    full: bool,
    rng: &mut Rng,
    acked: &mut HashMap<String, Seq>,
    known: &mut HashMap<ConversationId, Known>,
    open_took: &mut Option<Duration>,
    tally: &mut Tally,
) -> Result<Seen, String> {
    let run = run_child(backend, dir, iteration, rng.next(), kill)?;
    tally.kills += 1;
    if let Kill::AfterOpening(_) = kill {
        tally.during_open += 1;
        tally.before_opened += u64::from(!run.opened);
    }
    *open_took = run.open_took;
    tally.acks += run.acks.len() as u64;
    record(acked, run.acks);
    let checking = Instant::now();
    let (seen, took, lingered) = reopen_and_check(backend, dir, acked, known, full)?;
    tally.check_total += checking.elapsed();
    tally.checked(took, lingered);
    Ok(seen)
}

/// Kill a child while it creates a store in a new directory; the store must
/// open afterwards, with whatever it acknowledged.
fn kill_creating(
    backend: &str,
    wait: Duration,
    rng: &mut Rng,
    tally: &mut Tally,
) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let outcome =
        run_child(backend, dir.path(), 0, rng.next(), Kill::AfterOpening(wait)).and_then(|run| {
            tally.fresh += 1;
            tally.fresh_before_opened += u64::from(!run.opened);
            let mut acked = HashMap::new();
            record(&mut acked, run.acks);
            let (_, took, lingered) =
                reopen_and_check(backend, dir.path(), &acked, &mut HashMap::new(), true)?;
            tally.checked(took, lingered);
            Ok(())
        });
    outcome.map_err(|error| {
        let kept = dir.keep();
        format!(
            "a child killed {wait:?} into creating a new store: {error} (directory kept: {})",
            kept.display()
        )
    })
}

fn survives_sigkill(backend: &str) {
    let iterations = iterations();
    let seed = seed();
    println!(
        "[crash {backend}] seed {seed}, {iterations} kills (replay the random choices with \
         KEEL_CRASH_SEED={seed})"
    );
    let mut rng = Rng::new(seed ^ u64::from(backend.as_bytes()[0]));
    let started = Instant::now();
    let mut dir = tempfile::tempdir().unwrap();
    // Highest seq acknowledged per conversation, over every run in `dir`.
    let mut acked: HashMap<String, Seq> = HashMap::new();
    // What the checks so far have seen of each conversation in `dir`.
    let mut known: HashMap<ConversationId, Known> = HashMap::new();
    // How long the last child that got that far took to open an existing
    // store, and to create a new one: the windows the kills aim at.
    let mut open_time = Duration::from_millis(50);
    let mut create_time = Duration::from_millis(100);
    let mut kills_in_dir = 0;
    let mut kept_one = false;
    let mut failures: Vec<String> = Vec::new();
    // sled only: stores that refused to open after a kill (see `tolerated`).
    let mut unopenable: Vec<String> = Vec::new();
    let mut tally = Tally::default();
    let mut last_seen = Seen::default();

    for iteration in 0..iterations {
        let kill = if rng.below(4) == 0 {
            Kill::AfterOpening(random_within(&mut rng, open_time * 3 / 2))
        } else {
            // 5 to 150 ms, log-uniform: as many kills in 5-15 ms as in 50-150.
            Kill::AfterFirstAck(Duration::from_micros(rng.log_uniform(5_000, 150_000)))
        };
        kills_in_dir += 1;
        // Every log is read from seq 1 on a directory's last kill (and the
        // test's); in between, from the tail the previous check saw.
        let last_in_dir = kills_in_dir == KILLS_PER_DIR || iteration + 1 == iterations;
        let new_dir = kills_in_dir == 1;
        let mut open_took = None;
        let outcome = kill_and_check(
            backend,
            dir.path(),
            iteration,
            kill,
            last_in_dir,
            &mut rng,
            &mut acked,
            &mut known,
            &mut open_took,
            &mut tally,
        );
        match open_took {
            Some(took) if new_dir => create_time = took,
            Some(took) => open_time = took,
            None => {}
        }
        let failed = outcome.is_err();
        match outcome {
            Ok(seen) => last_seen = seen,
            Err(error) => {
                let failure = format!("iteration {iteration} (seed {seed}): {error}");
                eprintln!("[crash {backend}] FAILURE {failure}");
                if tolerated(backend, &error) {
                    unopenable.push(failure);
                } else {
                    failures.push(failure);
                }
            }
        }
        // A failure, or enough kills: go on in a new directory. The first
        // broken one is kept for a post-mortem.
        if failed || last_in_dir {
            let old = std::mem::replace(&mut dir, tempfile::tempdir().unwrap());
            if failed && !kept_one {
                let path = old.keep();
                eprintln!(
                    "[crash {backend}] kept the failing directory {}",
                    path.display()
                );
                kept_one = true;
            }
            acked.clear();
            known.clear();
            kills_in_dir = 0;
        }

        // Now and then, also kill a child that is creating a new store.
        if rng.below(CREATE_KILL_ONE_IN) == 0 {
            let wait = random_within(&mut rng, create_time * 3 / 2);
            if let Err(error) = kill_creating(backend, wait, &mut rng, &mut tally) {
                let failure = format!("iteration {iteration} (seed {seed}): {error}");
                eprintln!("[crash {backend}] FAILURE {failure}");
                if tolerated(backend, &error) {
                    unopenable.push(failure);
                } else {
                    failures.push(failure);
                }
            }
        }
    }

    println!(
        "[crash {backend}] {} kills in {:.1} s, {KILLS_PER_DIR} per directory: {} while \
         opening ({} before the open returned), {} after the first ack; plus {} kills creating \
         a new store ({} before the open returned). {} acknowledged appends, each found after \
         its kill and every later one in its directory; last store checked: {} conversations, \
         {} events. Parent reopen {:.1} ms mean, {:.1} ms max; reopen+check+close {:.1} s in \
         all.{} {} failures{}",
        tally.kills,
        started.elapsed().as_secs_f64(),
        tally.during_open,
        tally.before_opened,
        tally.kills - tally.during_open,
        tally.fresh,
        tally.fresh_before_opened,
        tally.acks,
        last_seen.conversations,
        last_seen.events,
        tally.open_total.as_secs_f64() * 1000.0 / (tally.kills + tally.fresh).max(1) as f64,
        tally.open_max.as_secs_f64() * 1000.0,
        tally.check_total.as_secs_f64(),
        if backend == "sled" {
            format!(
                " sled held its lock past the drop of the store {} times, at most {:.1} ms.",
                tally.lingered,
                tally.lingered_max.as_secs_f64() * 1000.0
            )
        } else {
            String::new()
        },
        failures.len(),
        if backend == "sled" {
            format!(
                "; the store refused to open after {} of {} kills",
                unopenable.len(),
                tally.kills + tally.fresh
            )
        } else {
            String::new()
        },
    );
    assert!(
        failures.is_empty(),
        "{backend} failed {} of {iterations} crash iterations:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Whether a failure is what sled is known to do rather than a defect of
/// keel. sled 0.34.7 sometimes refuses to reopen a database after a SIGKILL
/// ("corruption at None"); this test found it (about one kill in 200-400),
/// and it is why redb is the default. What keel must still guarantee on
/// sled is checked as strictly as on redb: the failure to open is a clear
/// `Error::Corrupt`-style error, not a panic, and whenever the store does
/// open, every acknowledged append is there.
fn tolerated(backend: &str, error: &str) -> bool {
    backend == "sled" && error.contains(OPEN_FAILED) && error.contains("corrupt")
}

/// Uniform in `0..=limit`, to the microsecond.
fn random_within(rng: &mut Rng, limit: Duration) -> Duration {
    Duration::from_micros(rng.between(0, limit.as_micros() as u64))
}

#[test]
fn sled_survives_sigkill() {
    survives_sigkill("sled");
}

#[test]
fn redb_survives_sigkill() {
    survives_sigkill("redb");
}
