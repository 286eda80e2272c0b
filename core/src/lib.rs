//! keel-core: the pure heart of keel. Ids, canonical and live events, the
//! message model, configuration, the conversation state machine
//! (`transition`), the reducer that folds a log into a working set, and
//! recovery planning.
//!
//! Nothing here does I/O, reads a clock or draws randomness: time and jitter
//! come in as inputs, and every decision comes out as data (`Effect`s) for
//! the shell in keel-actors to carry out.

pub mod builtin;
pub mod codec;
pub mod compaction;
pub mod config;
pub mod effect;
pub mod event;
pub mod history;
pub mod ids;
pub mod input;
pub mod live;
pub mod message;
pub mod recovery;
pub mod reducer;
pub mod rejection;
pub mod retry;
pub mod snapshot;
pub mod state;
pub mod time;
pub mod tokens;
pub mod transition;
pub mod wire;

pub use config::{
    BusyPolicy, ClientTool, ConversationConfig, ModelRef, ProviderKind, RecoveryPolicy, ToolPolicy,
};
pub use effect::Effect;
pub use event::{
    Decision, Event, EventKind, InterruptReason, PendingCall, PendingKind, SubAgentOutcome,
    TurnNote,
};
pub use ids::{ConversationId, EventId, Seq, ToolCallId};
pub use input::{AssistantResponse, Input, LlmFailure, Timer};
pub use live::{ChildPendingCall, LiveEvent, StreamDelta};
pub use reducer::{Status, WorkingSet};
pub use rejection::Rejection;
pub use state::{Conversation, Generation, Phase, StateName};
pub use time::Timestamp;
pub use transition::{create, transition, NewConversation, Step};
