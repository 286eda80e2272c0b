//! Effects: what the shell must do after a transition, in order. `Append` is
//! always first, and nothing else may happen until it is durable.

use serde::{Deserialize, Serialize};

use crate::config::ModelRef;
use crate::event::Event;
use crate::ids::{Seq, ToolCallId};
use crate::input::Timer;
use crate::live::LiveEvent;
use crate::message::ToolCall;
use crate::state::Generation;
use crate::time::Timestamp;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Effect {
    /// Append to the log and wait for durability; then publish each event live.
    Append { events: Vec<Event> },
    /// Broadcast a live-only event.
    Publish { event: LiveEvent },
    /// Send the working set's messages to `model`; report back tagged `generation`.
    StartStream {
        generation: Generation,
        model: ModelRef,
        timeout_ms: u64,
        /// Set for a summary request: send not the prompt but a request for
        /// a summary of its first this many messages
        /// (`compaction::summary_request`, with `compaction::SUMMARY_SYSTEM`
        /// and no tools).
        #[serde(default)]
        summarise: Option<u32>,
    },
    /// Drop the stream of `generation` and close its connection now.
    AbortStream { generation: Generation },
    /// Run a tool in the conversation's working directory.
    StartTool { call: ToolCall },
    /// Run `spawn_agents`: start sub-agent conversations in parallel and report
    /// their aggregated results as this call's result.
    SpawnSubAgents {
        call: ToolCall,
        /// Seq of the `AssistantMessage` holding the call: with the call's
        /// id and the task's index, what each child's id is derived from.
        /// A provider may reuse tool call ids across responses; a seq is
        /// unique in the parent's log, and the same when the call is
        /// re-dispatched after a restart.
        seq: Seq,
    },
    /// Cancel the sub-agents of a `spawn_agents` call nothing follows any
    /// more: an earlier life of the actor dispatched it, and recovery
    /// closed it (`recovery = idle`, a resume limit, a repaired log). The
    /// children are found as `SpawnSubAgents` names them; none may exist.
    CancelSubAgents { call: ToolCall, seq: Seq },
    /// Kill a running tool (its whole process group) or its sub-agents.
    AbortTool { tool_call_id: ToolCallId },
    /// Feed `Input::TimerFired { timer }` back at `at`.
    SetTimer { timer: Timer, at: Timestamp },
    /// Forget a timer set earlier: what it was for is over (a cancel ended
    /// the retry wait or the debounce). A stale timer would change nothing,
    /// but it would keep the conversation from counting as at rest.
    CancelTimer { timer: Timer },
    /// Persist the small fsm_state and a checkpoint of the working set; only
    /// ever in idle or awaiting input.
    SaveSnapshot,
    /// Stop the actor.
    Stop,
}
