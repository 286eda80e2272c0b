//! The recording of every provider request: what came in, what answered it,
//! and how the exchange ended, above all whether the client went away before
//! the response was finished. Tests read it through `GET /_mock/requests` to
//! check, for example, that a cancel really closed the socket.
//!
//! The end of an exchange is noticed by an `Exchange` guard: it moves into
//! whatever is still answering (the response body, or the handler of a
//! request that never gets one), and when hyper drops that because the
//! connection closed, the guard's `Drop` records the disconnect.
//!
//! The recording is bounded: it keeps the latest [`KEEP_RECORDS`] requests
//! (`keel mock-llm --keep-requests N`) and drops the oldest beyond that, or
//! beyond [`KEEP_BODY_BYTES`] of request bodies, whichever comes first. A
//! provider request carries the whole conversation, so an unbounded
//! recording grows with the square of a conversation's length: a
//! 1,000-kill crash drill's in-process fake provider reached 24 GiB, and
//! `keel serve`'s built-in one would have grown the same way under any
//! long load. A test reads what it just caused, which is always the
//! latest; `seq` keeps counting, so a gap says records were dropped.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::watch;

use super::script::WireApi;

/// How many requests the recording keeps by default (the latest).
pub const KEEP_RECORDS: usize = 1_000;

/// How many bytes of request bodies (as received) the recording keeps at
/// most; the oldest records go first, the latest is always kept.
pub const KEEP_BODY_BYTES: usize = 64 * 1024 * 1024;

/// How an exchange ended, so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExchangeOutcome {
    /// Still answering (or hanging on purpose).
    Pending,
    /// The whole response was handed to the connection.
    Completed,
    /// The client closed the connection before the response was finished.
    Disconnected,
    /// The mock dropped the connection on purpose (`cut_after_events`).
    Cut,
}

/// Where the answer to a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The request was refused before an answer was chosen (bad JSON).
    None,
    /// The next entry of the script.
    Script,
    /// The request's `x-mock-fault` header.
    Header,
    /// The default behaviour (echo, `run:`, tool result summary).
    Default,
    /// The fake's own answer to a summary request no entry served.
    Summary,
    /// Refused as longer than the context window (`--context-window`,
    /// `POST /_mock/settings`), in the provider's words.
    TooLong,
}

#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// 1, 2, … in arrival order; not reset by clearing the recording.
    pub seq: u64,
    pub endpoint: WireApi,
    pub path: String,
    /// Milliseconds since the Unix epoch.
    pub received_at_ms: u64,
    /// Request headers, names in lower case.
    pub headers: BTreeMap<String, String>,
    /// The request body as JSON, or as a string when it was not JSON.
    /// Kept as the text received (a parsed `Value` of a long conversation
    /// takes several times its size).
    pub body: Box<RawValue>,
    /// Whether the request asked for a stream (`"stream": true`).
    pub stream: bool,
    /// The prompt's estimated tokens, as reported in the usage and held
    /// against the context window; `None` for a body that is not a request.
    pub prompt_tokens: Option<u64>,
    pub source: Source,
    /// The script entry (or header JSON) that answered, as given.
    pub entry: Option<Value>,
    pub outcome: ExchangeOutcome,
    /// Body pieces (SSE events, for a stream) handed to the connection.
    pub events_sent: u64,
    /// When the outcome stopped being `pending`.
    pub ended_at_ms: Option<u64>,
    /// When the client went away mid-response; `None` if it did not.
    pub disconnected_at_ms: Option<u64>,
}

/// The shared recording; cheap to clone.
#[derive(Debug, Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    records: Mutex<Records>,
    /// Bumped on every change, so `wait_ended` can wait without polling.
    changed: watch::Sender<u64>,
}

#[derive(Debug)]
struct Records {
    next_seq: u64,
    /// In `seq` order (oldest first): new ones are pushed at the back and
    /// only the front is ever dropped, or everything at once.
    records: VecDeque<Record>,
    body_bytes: usize,
    keep: usize,
    keep_bytes: usize,
}

impl Records {
    fn get_mut(&mut self, seq: u64) -> Option<&mut Record> {
        let index = self
            .records
            .binary_search_by_key(&seq, |record| record.seq)
            .ok()?;
        self.records.get_mut(index)
    }

    fn push(&mut self, record: Record) {
        self.body_bytes += record.body.get().len();
        self.records.push_back(record);
        while self.records.len() > self.keep
            || (self.body_bytes > self.keep_bytes && self.records.len() > 1)
        {
            if let Some(dropped) = self.records.pop_front() {
                self.body_bytes -= dropped.body.get().len();
            }
        }
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

impl Default for Recorder {
    fn default() -> Recorder {
        Recorder::keeping(KEEP_RECORDS)
    }
}

impl Recorder {
    /// A recording that keeps the latest `keep` requests (at least one).
    pub fn keeping(keep: usize) -> Recorder {
        Recorder::with_limits(keep, KEEP_BODY_BYTES)
    }

    fn with_limits(keep: usize, keep_bytes: usize) -> Recorder {
        Recorder {
            inner: Arc::new(Inner {
                records: Mutex::new(Records {
                    next_seq: 0,
                    records: VecDeque::new(),
                    body_bytes: 0,
                    keep: keep.max(1),
                    keep_bytes,
                }),
                changed: watch::Sender::new(0),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // A panic while holding the lock cannot leave a record half
        // written in a way that matters to a test fixture; keep serving.
        self.inner
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, seq: u64, change: impl FnOnce(&mut Record)) {
        {
            let mut records = self.lock();
            // A record cleared by `DELETE /_mock/requests` is simply gone.
            if let Some(record) = records.get_mut(seq) {
                change(record);
            }
        }
        self.inner.changed.send_modify(|version| *version += 1);
    }

    /// Record a new request; the returned guard follows it to its end.
    pub fn start(
        &self,
        endpoint: WireApi,
        path: &str,
        headers: &HeaderMap,
        body: Box<RawValue>,
        stream: bool,
    ) -> Exchange {
        let headers = headers
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        let seq = {
            let mut records = self.lock();
            records.next_seq += 1;
            let seq = records.next_seq;
            records.push(Record {
                seq,
                endpoint,
                path: path.to_owned(),
                received_at_ms: now_ms(),
                headers,
                body,
                stream,
                prompt_tokens: None,
                source: Source::None,
                entry: None,
                outcome: ExchangeOutcome::Pending,
                events_sent: 0,
                ended_at_ms: None,
                disconnected_at_ms: None,
            });
            seq
        };
        self.inner.changed.send_modify(|version| *version += 1);
        Exchange {
            recorder: self.clone(),
            seq,
            ended: false,
        }
    }

    pub fn list(&self) -> Vec<Record> {
        self.lock().records.iter().cloned().collect()
    }

    /// Forget every record; returns how many there were.
    pub fn clear(&self) -> usize {
        let n_records = {
            let mut records = self.lock();
            let n_records = records.records.len();
            records.records.clear();
            records.body_bytes = 0;
            n_records
        };
        self.inner.changed.send_modify(|version| *version += 1);
        n_records
    }

    /// The records once there are at least `n_records` (or as many as the
    /// recording keeps) and none is pending, or as they are when `timeout`
    /// runs out.
    pub async fn wait_ended(&self, n_records: usize, timeout: Duration) -> Vec<Record> {
        let mut changes = self.inner.changed.subscribe();
        let settled = async {
            loop {
                {
                    let records = self.lock();
                    let n_records = n_records.min(records.keep);
                    let ended = records
                        .records
                        .iter()
                        .all(|record| record.outcome != ExchangeOutcome::Pending);
                    if records.records.len() >= n_records && ended {
                        return;
                    }
                }
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        let _timed_out = tokio::time::timeout(timeout, settled).await;
        self.list()
    }
}

/// One request on its way through the mock. Dropping it before `finish`
/// means the connection went away: that is recorded as a disconnect.
#[derive(Debug)]
pub struct Exchange {
    recorder: Recorder,
    seq: u64,
    ended: bool,
}

impl Exchange {
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Record the prompt's estimated tokens.
    pub fn measured(&self, prompt_tokens: u64) {
        self.recorder.update(self.seq, |record| {
            record.prompt_tokens = Some(prompt_tokens);
        });
    }

    pub fn answered_by(&self, source: Source, entry: Option<Value>) {
        self.recorder.update(self.seq, |record| {
            record.source = source;
            record.entry = entry;
        });
    }

    pub fn event_sent(&self) {
        self.recorder
            .update(self.seq, |record| record.events_sent += 1);
    }

    /// Record how the exchange ended; only the first call counts.
    pub fn finish(&mut self, outcome: ExchangeOutcome) {
        if self.ended {
            return;
        }
        self.ended = true;
        let now = now_ms();
        self.recorder.update(self.seq, |record| {
            record.outcome = outcome;
            record.ended_at_ms = Some(now);
            if outcome == ExchangeOutcome::Disconnected {
                record.disconnected_at_ms = Some(now);
            }
        });
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.finish(ExchangeOutcome::Disconnected);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_owned()).unwrap()
    }

    fn start(recorder: &Recorder) -> Exchange {
        recorder.start(
            WireApi::Anthropic,
            "/v1/messages",
            &HeaderMap::new(),
            raw("null"),
            true,
        )
    }

    #[test]
    fn a_dropped_exchange_is_a_disconnect_and_a_finished_one_is_not() {
        let recorder = Recorder::default();
        let mut finished = start(&recorder);
        let abandoned = start(&recorder);
        finished.event_sent();
        finished.finish(ExchangeOutcome::Completed);
        drop(finished);
        drop(abandoned);
        let records = recorder.list();
        assert_eq!(records[0].outcome, ExchangeOutcome::Completed);
        assert_eq!(records[0].events_sent, 1);
        assert_eq!(records[0].disconnected_at_ms, None);
        assert_eq!(records[1].outcome, ExchangeOutcome::Disconnected);
        assert!(records[1].disconnected_at_ms.is_some());
        assert_eq!(recorder.clear(), 2);
        assert_eq!(start(&recorder).seq(), 3, "sequence numbers are not reused");
    }

    #[tokio::test]
    async fn waiting_returns_once_every_exchange_has_ended() {
        let recorder = Recorder::default();
        let mut exchange = start(&recorder);
        let waiter = {
            let recorder = recorder.clone();
            tokio::spawn(async move { recorder.wait_ended(1, Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        exchange.finish(ExchangeOutcome::Cut);
        let records = waiter.await.unwrap();
        assert_eq!(records[0].outcome, ExchangeOutcome::Cut);

        let _pending = start(&recorder);
        let records = recorder.wait_ended(2, Duration::from_millis(10)).await;
        assert_eq!(
            records[1].outcome,
            ExchangeOutcome::Pending,
            "a timeout returns as is"
        );
    }

    #[test]
    fn the_recording_keeps_the_latest_requests_and_finds_them_by_seq() {
        let recorder = Recorder::keeping(3);
        let exchanges: Vec<Exchange> = (0..5).map(|_| start(&recorder)).collect();
        let seqs: Vec<u64> = recorder.list().iter().map(|record| record.seq).collect();
        assert_eq!(seqs, [3, 4, 5], "the two oldest were dropped");
        // An exchange whose record was dropped ends quietly; the others
        // still find theirs.
        for mut exchange in exchanges {
            exchange.event_sent();
            exchange.finish(ExchangeOutcome::Completed);
        }
        let records = recorder.list();
        assert!(records
            .iter()
            .all(|record| record.outcome == ExchangeOutcome::Completed && record.events_sent == 1));
        assert_eq!(recorder.clear(), 3);
    }

    #[test]
    fn bodies_beyond_the_byte_budget_drop_the_oldest_but_never_the_latest() {
        let recorder = Recorder::with_limits(100, 10);
        let body = |bytes: usize| raw(&format!("\"{}\"", "a".repeat(bytes - 2)));
        let start = |bytes: usize| {
            recorder.start(
                WireApi::Openai,
                "/v1/chat/completions",
                &HeaderMap::new(),
                body(bytes),
                true,
            )
        };
        let seqs = || -> Vec<u64> { recorder.list().iter().map(|record| record.seq).collect() };
        let _first = start(6);
        let _second = start(4);
        assert_eq!(seqs(), [1, 2], "10 bytes are within the budget");
        let _third = start(3);
        assert_eq!(seqs(), [2, 3], "13 were not");
        let _huge = start(30);
        assert_eq!(seqs(), [4], "the latest stays even when it alone is over");
        assert_eq!(recorder.list()[0].body.get().len(), 30);
    }

    #[tokio::test]
    async fn waiting_for_more_than_is_kept_waits_for_what_is_kept() {
        let recorder = Recorder::keeping(2);
        for _ in 0..3 {
            start(&recorder).finish(ExchangeOutcome::Completed);
        }
        let records = recorder.wait_ended(10, Duration::from_secs(30)).await;
        assert_eq!(records.len(), 2);
    }
}
