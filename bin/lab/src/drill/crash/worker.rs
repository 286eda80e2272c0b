//! A worker: one conversation's client. It sends messages in a loop, gives
//! approvals, queues faults now and then, and follows the conversation's
//! event stream across the daemon's lives, keeping what it was told.
//! `keel drill nodes` runs the same workers against several nodes: each
//! message and approval through a node picked at random (`senders`), the
//! stream followed from seq 1 through another (`stream_from`), and checked
//! gap-free as it comes.

use super::checks::{ends_a_turn, read_log};
use super::*;

pub(in crate::drill) struct Worker {
    /// Follows the event stream and reads the log; sends and approves
    /// when there are no `senders`.
    pub(in crate::drill) client: Client,
    /// Each message and approval goes through one of these, picked at
    /// random (the nodes drill's nodes); empty: through `client`.
    pub(in crate::drill) senders: Vec<Client>,
    /// Where the stream starts (`Client::events`): from now (`None`), or
    /// from a seq, in which case every seq it delivers must follow the one
    /// before ("every client stream is gap-free").
    pub(in crate::drill) stream_from: Option<u64>,
    /// Told once the event stream is open; the first kill waits for every
    /// worker's.
    pub(in crate::drill) opened: Option<tokio::sync::mpsc::Sender<()>>,
    /// The calls it approves, and those that wait untouched.
    pub(in crate::drill) approvals: Approvals,
    pub(in crate::drill) shared: Shared,
    pub(in crate::drill) id: String,
    pub(in crate::drill) rng: fastrand::Rng,
    pub(in crate::drill) effects: PathBuf,
    /// The run id its commands mark themselves with, at `--addr`
    /// (`running::mark_command`).
    pub(in crate::drill) mark: Option<String>,
    pub(in crate::drill) nonce: u64,
    pub(in crate::drill) index: usize,
    /// Its `bash` calls wait for an approval.
    pub(in crate::drill) gated: bool,
    /// How many messages in 256 spawn sub-agents (ungated conversations).
    pub(in crate::drill) spawn_per_256: u8,
}

impl Worker {
    pub(in crate::drill) async fn run(mut self) {
        let mut events = self
            .client
            .events(&self.id, self.stream_from)
            .with_patience(None);
        let mut next_seq = self.stream_from;
        // Open before the first message, so nothing of its turn is missed.
        loop {
            match events.next().await {
                Ok(Frame::Snapshot(snapshot)) => {
                    self.set_state(snapshot.state);
                    if let Some(opened) = self.opened.take() {
                        // The drill stops waiting for this worker either
                        // way; a closed channel means it stopped already.
                        let _ = opened.send(()).await;
                    }
                    break;
                }
                Ok(_) => {}
                Err(error) => {
                    self.shared.violation(
                        "the event stream opens",
                        Some(&self.id),
                        None,
                        error.to_string(),
                    );
                    return;
                }
            }
        }
        while !self.shared.stop.load(Ordering::SeqCst) {
            let text = self.next_message();
            self.shared.book().sending += 1;
            let sent = self.sender().send_text(&self.id, &text).await;
            self.shared.book().sending -= 1;
            match sent {
                Ok(accepted) => {
                    self.shared
                        .book()
                        .acked
                        .entry(self.id.clone())
                        .or_default()
                        .push(accepted.seq);
                    let after = accepted.seq;
                    let ended = self
                        .follow_until(&mut events, &mut next_seq, |event| {
                            event.seq > after && ends_a_turn(event)
                        })
                        .await;
                    match ended {
                        Ok(()) => self.shared.book().turns += 1,
                        Err(error) => {
                            // The log says whether the turn ended: if it
                            // did, what failed is the stream's delivery.
                            let ended_in_log = read_log(&self.client, &self.id, after + 1)
                                .await
                                .is_ok_and(|events| events.iter().any(ends_a_turn));
                            let check = if ended_in_log {
                                "every event in the log reaches the client's stream"
                            } else {
                                "no conversation stays busy"
                            };
                            self.shared
                                .violation(check, Some(&self.id), Some(after), error);
                            return;
                        }
                    }
                }
                // A recovered turn runs, or the daemon is between lives:
                // wait a little and send again.
                Err(ClientError::Busy { .. }) | Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    pub(in crate::drill) fn next_message(&mut self) -> String {
        self.nonce += 1;
        // Sub-agents inherit the parent's tool policies, so only a
        // conversation whose calls need no approval spawns them: one task
        // that answers, one that runs a side effect of its own.
        if !self.gated && self.rng.u8(..) < self.spawn_per_256 {
            let nonce = format!("{NONCE}{}-{}", self.index, self.nonce);
            let command = self.command(&format!(
                "echo \"$KEEL_TOOL_CALL_ID {nonce}\" >> {}; sleep 0.05",
                self.effects.display()
            ));
            return format!(
                "spawn: hello from a sub-agent of worker {} | run: {command}",
                self.index
            );
        }
        if self.rng.bool() {
            let nonce = format!("{NONCE}{}-{}", self.index, self.nonce);
            let pause = self.rng.u32(5..30);
            let command = self.command(&format!(
                "echo \"$KEEL_TOOL_CALL_ID {nonce}\" >> {}; sleep 0.{pause:02}",
                self.effects.display()
            ));
            format!("run: {command}")
        } else {
            format!("hello {} from worker {}", self.nonce, self.index)
        }
    }

    /// Who the next message or approval goes through.
    pub(in crate::drill) fn sender(&mut self) -> Client {
        if self.senders.is_empty() {
            return self.client.clone();
        }
        self.senders[self.rng.usize(..self.senders.len())].clone()
    }

    /// `command` as the daemon should run it: marked at `--addr`.
    pub(in crate::drill) fn command(&self, command: &str) -> String {
        match &self.mark {
            Some(run) => running::mark_command(command, run),
            None => command.to_owned(),
        }
    }

    /// Read the stream until `done` says an event ends the wait, giving
    /// approvals as calls suspend. `Err` (why) if that takes too long.
    /// `next_seq`, when known, is the seq the stream must deliver next.
    pub(in crate::drill) async fn follow_until(
        &mut self,
        events: &mut keel_api::client::Events,
        next_seq: &mut Option<u64>,
        mut done: impl FnMut(&ApiEvent) -> bool,
    ) -> Result<(), String> {
        let started = Instant::now();
        let mut reconnecting = false;
        loop {
            // One `next` is polled until it gives a frame, approvals given
            // as they fall due meanwhile. It is never dropped half-way: a
            // reconnection in progress (a connect, a backoff) that was
            // started over every few milliseconds would never finish on a
            // loaded machine, and the drill would call its own impatience
            // a stuck conversation.
            let next = {
                let next = events.next();
                tokio::pin!(next);
                loop {
                    if started.elapsed() > TURN_PATIENCE {
                        return Err(format!("no end of the turn within {TURN_PATIENCE:?}"));
                    }
                    if let Some(call) = self.approvals.next_due(Instant::now()) {
                        self.approve(&call).await;
                    }
                    if let Ok(next) =
                        tokio::time::timeout(Duration::from_millis(10), &mut next).await
                    {
                        break next;
                    }
                }
            };
            let frame = match next {
                Ok(frame) => frame,
                Err(error) => return Err(format!("the event stream failed: {error}")),
            };
            match frame {
                Frame::Snapshot(snapshot) => {
                    self.set_state(snapshot.state);
                    let pending: HashSet<&str> = snapshot
                        .pending
                        .iter()
                        .map(|call| call.tool_call_id.as_str())
                        .collect();
                    if reconnecting {
                        self.check_untouched(&pending);
                    }
                    reconnecting = false;
                    for call in &snapshot.pending {
                        self.approvals.pending(&call.tool_call_id, Instant::now());
                    }
                }
                Frame::Reconnecting { .. } | Frame::Error(_) => reconnecting = true,
                Frame::Live(ApiLiveEvent::StateChanged { state }) => self.set_state(state),
                Frame::Live(ApiLiveEvent::ChildState { child, state, .. }) => {
                    self.shared
                        .book()
                        .children
                        .insert((self.id.clone(), child), state);
                }
                Frame::Live(_) => {}
                Frame::Canonical(event) => {
                    // Only a stream followed from a known seq is checked.
                    if let Some(expected) = next_seq.take() {
                        *next_seq = Some(event.seq + 1);
                        if event.seq == expected {
                            self.shared.passed(1);
                        } else {
                            self.shared.violation(
                                "every client stream is gap-free",
                                Some(&self.id),
                                Some(event.seq),
                                format!("seq {} came where {expected} was due", event.seq),
                            );
                        }
                    }
                    let value = serde_json::to_value(&event).unwrap_or(Value::Null);
                    let mut book = self.shared.book();
                    book.appended += 1;
                    book.seen
                        .entry(self.id.clone())
                        .or_default()
                        .insert(event.seq, value);
                    drop(book);
                    if let ApiEventKind::Suspended { pending } = &event.kind {
                        for call in pending {
                            let pause = Duration::from_millis(self.rng.u64(0..150));
                            self.approvals
                                .suspended(&call.tool_call_id, Instant::now() + pause);
                        }
                    }
                    if done(&event) {
                        return Ok(());
                    }
                }
            }
        }
    }

    pub(in crate::drill) fn set_state(&self, state: ApiState) {
        let mut book = self.shared.book();
        book.states.insert(self.id.clone(), state);
        if !at_work(state) {
            // Its turn is over (or waits for a person): so are its
            // children's, whatever their last word was.
            book.children.retain(|(parent, _), _| *parent != self.id);
        }
    }

    /// After a restart: every call that waited for an approval nobody had
    /// tried to give still waits (or got its result in the meantime,
    /// which the log check sees).
    pub(in crate::drill) fn check_untouched(&self, pending: &HashSet<&str>) {
        let reconnected = self.approvals.reconnected(pending);
        self.shared.passed(reconnected.still_pending as u64);
        for call in reconnected.gone {
            self.shared.violation(
                "pending approvals stay pending",
                Some(&self.id),
                None,
                format!("call {call} waited for an approval before the kill and not after"),
            );
        }
    }

    pub(in crate::drill) async fn approve(&mut self, call: &str) {
        match self
            .sender()
            .decide(
                &self.id,
                call,
                ApiDecisionKind::Approve,
                None,
                Some(DRILL.to_owned()),
            )
            .await
        {
            Ok(_) => self.shared.book().approvals += 1,
            // Settled meanwhile (a cancel, a restart under `idle`): done.
            Err(ClientError::Api { status: 409, .. } | ClientError::NotFound { .. }) => {}
            // The daemon is between lives: try again soon.
            Err(_) => self
                .approvals
                .retry(call, Instant::now() + Duration::from_millis(50)),
        }
    }
}
