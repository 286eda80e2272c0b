//! `keel demo`: a walkthrough of keel's pure core with this process playing
//! the shell's part. It creates a conversation, asks for a command to be run
//! (the scripted model answers with a `bash` call, which runs for real), sends
//! a plain message, cancels a turn midway through its stream, and finally
//! replays the log it kept to show that the log alone gives back the state.
//!
//! The shell here is deliberately simple: the log is a `Vec`, the model is
//! `provider::reply`, and a tool runs to its end before the next input. The
//! actor runtime replaces each of these; the core and its contract stay.

mod provider;
mod tool;
mod trace;

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, ensure, Context};
use keel_actors::core::{
    create, transition, Conversation, ConversationConfig, ConversationId, Effect, Event,
    Generation, Input, NewConversation, StateName, Timer, Timestamp, ToolCallId,
};

pub use trace::Format;
use trace::Trace;

/// The message whose turn the demo cancels; the scripted model echoes it.
const CANCELLED_MESSAGE: &str = "count slowly to five: one two three four five";

/// Stream deltas delivered before the cancel.
const DELTAS_BEFORE_CANCEL: usize = 2;

pub fn run(out: impl Write, format: Format) -> anyhow::Result<()> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let cwd = cwd
        .to_str()
        .ok_or_else(|| anyhow!("the current directory {} is not UTF-8", cwd.display()))?
        .to_owned();
    let id = ConversationId::new(conversation_id(now()))
        .map_err(|err| anyhow!("invalid conversation id: {err}"))?;
    let mut shell = Shell::new(Trace::new(out, format, id.clone()));
    shell.trace.intro(&cwd)?;

    shell.trace.scene("1. create a conversation")?;
    let conversation = shell.create(NewConversation {
        id,
        cwd,
        config: ConversationConfig::default(),
        parent_conversation: None,
    })?;

    shell
        .trace
        .scene("2. ask for a command: the model calls bash, the shell runs it")?;
    let conversation = shell.send(conversation, "run: echo hello from keel")?;

    shell
        .trace
        .scene("3. a plain message: the model echoes it")?;
    let conversation = shell.send(conversation, "hello")?;

    shell
        .trace
        .scene("4. cancel a turn while its response is streaming")?;
    let conversation = shell.feed(conversation, user_message(CANCELLED_MESSAGE))?;
    let conversation = shell.deliver(conversation, DELTAS_BEFORE_CANCEL)?;
    // busy_policy = reject: a message mid-turn is refused, the turn goes on.
    let conversation = shell.feed(conversation, user_message("are you still there?"))?;
    let conversation = shell.feed(conversation, Input::Cancel)?;
    let conversation = shell.settle(conversation)?;
    let state = conversation.state_name();
    ensure!(
        state == StateName::Idle,
        "cancel left the conversation {state}"
    );

    shell
        .trace
        .scene("5. replay the log: it alone gives back the state")?;
    let replayed = Conversation::replay(&shell.log).context("replaying the log")?;
    let equal = replayed.working == conversation.working && replayed.state_name() == state;
    shell.trace.replay(shell.log.len(), equal, state)?;
    ensure!(
        equal,
        "the replayed working set differs from the live one:\nlive: {:?}\nreplayed: {:?}",
        conversation.working,
        replayed.working
    );

    shell.trace.done(state, conversation.working.turn)?;
    shell.trace.flush()?;
    Ok(())
}

/// Reports a worker has yet to deliver, tagged with what they belong to.
struct Worker<K> {
    key: K,
    reports: VecDeque<Input>,
}

/// The demo's stand-in for the actor: it feeds inputs to `transition`, keeps
/// the log, and carries out effects in order.
struct Shell<W: Write> {
    trace: Trace<W>,
    /// Every canonical event appended so far: the demo's event log.
    log: Vec<Event>,
    /// The model's reply to the request in flight, not yet delivered.
    stream: Option<Worker<Generation>>,
    /// The running tool's output and result, not yet delivered.
    tool: Option<Worker<ToolCallId>>,
    /// Timers the core asked for, fired when nothing else is left to do.
    timers: Vec<(Timer, Timestamp)>,
}

impl<W: Write> Shell<W> {
    fn new(trace: Trace<W>) -> Self {
        Shell {
            trace,
            log: Vec::new(),
            stream: None,
            tool: None,
            timers: Vec::new(),
        }
    }

    fn create(&mut self, new: NewConversation) -> anyhow::Result<Conversation> {
        let step = create(new, now());
        self.carry_out(&step.state, step.effects)?;
        Ok(step.state)
    }

    /// Send a user message and run the turn it starts to its end.
    fn send(&mut self, conversation: Conversation, text: &str) -> anyhow::Result<Conversation> {
        let conversation = self.feed(conversation, user_message(text))?;
        self.settle(conversation)
    }

    /// One transition. The new state is kept only once its effects (the log
    /// append first) are carried out; an error drops it.
    fn feed(&mut self, conversation: Conversation, input: Input) -> anyhow::Result<Conversation> {
        let at = now();
        self.trace.input(&input, at)?;
        let step = transition(conversation, input, at);
        if let Some(rejection) = &step.rejection {
            self.trace.rejected(rejection)?;
        }
        self.carry_out(&step.state, step.effects)?;
        Ok(step.state)
    }

    /// Deliver up to `n` worker reports.
    fn deliver(
        &mut self,
        mut conversation: Conversation,
        n: usize,
    ) -> anyhow::Result<Conversation> {
        for _ in 0..n {
            let Some(report) = self.next_report() else {
                break;
            };
            conversation = self.feed(conversation, report)?;
        }
        Ok(conversation)
    }

    /// Deliver reports and fire timers until nothing is left to do.
    fn settle(&mut self, mut conversation: Conversation) -> anyhow::Result<Conversation> {
        loop {
            let input = match self.next_report() {
                Some(report) => report,
                None => match self.next_timer() {
                    Some(timer) => timer,
                    None => return Ok(conversation),
                },
            };
            conversation = self.feed(conversation, input)?;
        }
    }

    fn next_report(&mut self) -> Option<Input> {
        for reports in [
            self.stream.as_mut().map(|worker| &mut worker.reports),
            self.tool.as_mut().map(|worker| &mut worker.reports),
        ]
        .into_iter()
        .flatten()
        {
            if let Some(report) = reports.pop_front() {
                return Some(report);
            }
        }
        None
    }

    /// The earliest timer, once it is due: the demo waits for it.
    fn next_timer(&mut self) -> Option<Input> {
        let earliest = (0..self.timers.len()).min_by_key(|&idx| self.timers[idx].1)?;
        let (timer, at) = self.timers.remove(earliest);
        let wait = at.millis_since(now());
        std::thread::sleep(std::time::Duration::from_millis(wait));
        Some(Input::TimerFired { timer })
    }

    fn carry_out(&mut self, state: &Conversation, effects: Vec<Effect>) -> anyhow::Result<()> {
        for effect in effects {
            match effect {
                Effect::Append { events } => {
                    // In the daemon this is an fsync'd write; here the Vec is the log.
                    for event in &events {
                        self.trace.event(event)?;
                    }
                    self.log.extend(events);
                }
                Effect::Publish { event } => self.trace.live(&event)?,
                Effect::StartStream {
                    generation,
                    ref model,
                    ..
                } => {
                    self.trace.effect(&effect)?;
                    let reply = provider::reply(&state.working.messages, generation, model);
                    let mut reports: VecDeque<Input> = reply
                        .deltas
                        .into_iter()
                        .map(|delta| Input::StreamDelta { generation, delta })
                        .collect();
                    reports.push_back(Input::StreamFinished {
                        generation,
                        response: reply.response,
                    });
                    self.stream = Some(Worker {
                        key: generation,
                        reports,
                    });
                }
                Effect::AbortStream { generation } => {
                    self.trace.effect(&effect)?;
                    if self
                        .stream
                        .as_ref()
                        .is_some_and(|worker| worker.key == generation)
                    {
                        self.stream = None;
                    }
                }
                // `spawn_agents` needs the actor runtime; the tool runner
                // refuses any tool but bash, so the model learns it.
                Effect::StartTool { ref call } | Effect::SpawnSubAgents { ref call } => {
                    self.trace.effect(&effect)?;
                    let cwd = PathBuf::from(&state.working.cwd);
                    let run = tool::run(call, &cwd);
                    self.trace
                        .tool_exited(call.id.as_str(), run.exit_code, run.duration_ms)?;
                    let mut reports: VecDeque<Input> = run
                        .chunks
                        .into_iter()
                        .map(|chunk| Input::ToolOutput {
                            tool_call_id: call.id.clone(),
                            chunk,
                        })
                        .collect();
                    reports.push_back(Input::ToolFinished {
                        tool_call_id: call.id.clone(),
                        content: run.content,
                        is_error: run.is_error,
                    });
                    self.tool = Some(Worker {
                        key: call.id.clone(),
                        reports,
                    });
                }
                Effect::AbortTool { ref tool_call_id } => {
                    self.trace.effect(&effect)?;
                    if self
                        .tool
                        .as_ref()
                        .is_some_and(|worker| worker.key == *tool_call_id)
                    {
                        self.tool = None;
                    }
                }
                Effect::SetTimer { timer, at } => {
                    self.trace.effect(&effect)?;
                    self.timers.push((timer, at));
                }
                Effect::CancelTimer { timer } => {
                    self.trace.effect(&effect)?;
                    self.timers.retain(|(set, _)| *set != timer);
                }
                // Nothing to persist or stop in-process.
                Effect::SaveSnapshot | Effect::Stop => self.trace.effect(&effect)?,
            }
        }
        Ok(())
    }
}

fn user_message(text: &str) -> Input {
    Input::UserMessage {
        text: text.to_owned(),
        images: Vec::new(),
    }
}

/// Wall-clock time: the shell's to read, never the core's.
fn now() -> Timestamp {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp::from_millis(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
}

/// A short id that differs from run to run: `demo-` and the time in base 36.
fn conversation_id(at: Timestamp) -> String {
    format!("demo-{}", base36(at.as_millis()))
}

fn base36(mut value: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut digits = Vec::new();
    loop {
        digits.push(DIGITS[(value % 36) as usize]);
        value /= 36;
        if value == 0 {
            break;
        }
    }
    digits
        .iter()
        .rev()
        .map(|&digit| char::from(digit))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base36_counts_in_digits_then_letters() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        assert_eq!(base36(u64::MAX), "3w5e11264sgsf");
    }

    #[test]
    fn conversation_ids_are_valid_ids() {
        let id = conversation_id(Timestamp::from_millis(1_700_000_000_000));
        assert_eq!(id, "demo-loyw3v28");
        assert!(ConversationId::new(id).is_ok());
    }

    #[test]
    fn the_demo_runs_to_an_equal_replay() {
        let mut out = Vec::new();
        run(&mut out, Format::Human).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("tool output call-1-1 \"hello from keel\\n\""),
            "{text}"
        );
        assert!(
            text.contains("the working set equals the live one"),
            "{text}"
        );
        assert!(text.contains("final state: idle"), "{text}");
    }
}
