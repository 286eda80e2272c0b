//! `transition(state, input, now) -> Step`: every decision keel makes about a
//! conversation, as a pure function (REQ-BED-001).
//!
//! The handlers are split by input kind under `transition/`. They all work on
//! a `Ctx`, which emits events (stamping seq, time and parent and folding each
//! into the working set through the reducer) and collects effects. `finish`
//! puts the one `Append` first and a `StateChanged` publish right after it
//! whenever the phase's name changed, so no handler can forget either.
//!
//! The state is taken by value: a transition moves the conversation instead
//! of copying its history, which keeps it O(1) in the length of the log.

mod cancel;
mod history;
mod lifecycle;
mod message;
mod stream;
mod tools;
mod turn;

pub use lifecycle::{create, NewConversation};
pub use tools::OUTPUT_TAIL_BYTES;

use crate::effect::Effect;
use crate::event::{Event, EventKind};
use crate::ids::Seq;
use crate::input::Input;
use crate::live::LiveEvent;
use crate::message::ImageRef;
use crate::rejection::Rejection;
use crate::state::{Conversation, Phase, StateName};
use crate::time::Timestamp;

/// The outcome of one transition.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub state: Conversation,
    /// What the shell must do, in order; an `Append` is always first.
    pub effects: Vec<Effect>,
    /// Set when the input was refused; the state is then unchanged.
    pub rejection: Option<Rejection>,
}

impl Step {
    /// The events this step appends, if any.
    pub fn appended(&self) -> &[Event] {
        match self.effects.first() {
            Some(Effect::Append { events }) => events,
            _ => &[],
        }
    }
}

pub fn transition(state: Conversation, input: Input, now: Timestamp) -> Step {
    let mut ctx = Ctx::new(state, now);
    match input {
        Input::Started => lifecycle::started(&mut ctx),
        Input::UserMessage { text, images } => message::user_message(&mut ctx, text, images),
        Input::StreamDelta { generation, delta } => stream::delta(&mut ctx, generation, delta),
        Input::StreamFinished {
            generation,
            response,
        } => stream::finished(&mut ctx, generation, response),
        Input::StreamFailed {
            generation,
            failure,
            jitter,
        } => stream::failed(&mut ctx, generation, failure, jitter),
        Input::ToolOutput {
            tool_call_id,
            chunk,
        } => tools::output(&mut ctx, tool_call_id, chunk),
        Input::ToolFinished {
            tool_call_id,
            content,
            is_error,
            images,
        } => tools::finished(&mut ctx, tool_call_id, content, is_error, images),
        Input::Resolve {
            tool_call_id,
            decision,
            by,
        } => tools::resolve(&mut ctx, tool_call_id, decision, by),
        Input::Cancel => cancel::cancel(&mut ctx),
        Input::TimerFired { timer } => lifecycle::timer(&mut ctx, timer),
        Input::ChangeConfig { config } => lifecycle::change_config(&mut ctx, config),
        Input::Stop => lifecycle::stop(&mut ctx),
        Input::Compact => history::compact(&mut ctx),
        Input::Rewind { to_seq, at } => history::rewind(&mut ctx, to_seq, at),
        Input::Shutdown => lifecycle::shutdown(&mut ctx),
    }
    ctx.finish()
}

/// A transition in progress.
pub(crate) struct Ctx {
    pub(crate) conv: Conversation,
    pub(crate) now: Timestamp,
    events: Vec<Event>,
    effects: Vec<Effect>,
    rejection: Option<Rejection>,
    before: StateName,
}

impl Ctx {
    fn new(conv: Conversation, now: Timestamp) -> Ctx {
        let before = conv.phase.name();
        Ctx {
            conv,
            now,
            events: Vec::new(),
            effects: Vec::new(),
            rejection: None,
            before,
        }
    }

    /// Emit an event caused by what is going on now (see [`Ctx::cause`]).
    pub(crate) fn emit(&mut self, kind: EventKind) -> Seq {
        let parent = self.cause();
        self.push(kind, parent, false)
    }

    /// A user message; it asks for a turn.
    pub(crate) fn emit_user_message(&mut self, text: String, images: Vec<ImageRef>) -> Seq {
        let parent = self.cause();
        self.push(EventKind::UserMessage { text, images }, parent, true)
    }

    /// The causal parent of an event emitted now: the turn in progress, or
    /// else the session that records it (docs/requirements.md, "Causal
    /// links"). A log from before sessions were tracked falls back to the
    /// event before.
    fn cause(&self) -> Seq {
        let working = &self.conv.working;
        working
            .current_turn
            .as_ref()
            .map(|turn| turn.started_seq)
            .or(working.session)
            .unwrap_or(working.last_seq)
    }

    /// A session begins: it continues the log from the event before it.
    pub(crate) fn emit_session_started(&mut self) -> Seq {
        let parent = self.conv.working.last_seq;
        self.push(EventKind::SessionStarted, parent, false)
    }

    /// Turn `turn` starts, caused by the message at `trigger`.
    pub(crate) fn emit_turn_started(&mut self, turn: u32, trigger: Seq) -> Seq {
        self.push(EventKind::TurnStarted { turn }, trigger, false)
    }

    fn push(&mut self, kind: EventKind, parent: Seq, triggers_turn: bool) -> Seq {
        let event = Event {
            seq: self.conv.working.last_seq + 1,
            at: self.now,
            parent: Some(parent),
            triggers_turn,
            kind,
        };
        self.conv.working.apply(&event);
        let seq = event.seq;
        self.events.push(event);
        seq
    }

    pub(crate) fn effect(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    pub(crate) fn publish(&mut self, event: LiveEvent) {
        self.effects.push(Effect::Publish { event });
    }

    pub(crate) fn set_phase(&mut self, phase: Phase) {
        self.conv.phase = phase;
    }

    /// Refuse the input. Only called before anything was emitted.
    pub(crate) fn reject(&mut self, rejection: Rejection) {
        debug_assert!(self.events.is_empty() && self.effects.is_empty());
        self.rejection = Some(rejection);
    }

    fn finish(self) -> Step {
        let Ctx {
            conv,
            events,
            effects,
            rejection,
            before,
            ..
        } = self;
        let mut all = Vec::with_capacity(effects.len() + 2);
        if !events.is_empty() {
            all.push(Effect::Append { events });
        }
        let after = conv.phase.name();
        if after != before {
            all.push(Effect::Publish {
                event: LiveEvent::StateChanged { state: after },
            });
        }
        all.extend(effects);
        Step {
            state: conv,
            effects: all,
            rejection,
        }
    }
}
