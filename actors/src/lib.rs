//! keel-actors: the imperative shell that carries out keel-core's effects.
//!
//! An embedder opens a [`Runtime`] over a store, creates conversations and
//! talks to each through a [`ConversationHandle`]. Behind them: a ractor
//! supervisor tree with one `ConversationActor` per conversation, addressed
//! only by id through `ensure_started`, and its `LlmStreamActor` and
//! `ToolActor` workers; the provider client ([`provider`]), image handling
//! ([`image`]), tools ([`tool`]), process groups ([`process_group`]) and the
//! process that starts tool processes ([`spawner`]).
//! It reports through `tracing` spans named after the OpenTelemetry GenAI
//! conventions, and counts through the `metrics` crate's facade (the names
//! are in [`metrics`]).
//! Only this crate names ractor types.

mod activation;
pub mod clock;
pub mod conversation;
mod conversation_actor;
pub mod image;
mod mailbox;
pub mod mcp;
mod message;
pub mod metrics;
pub mod ownership;
pub mod process_group;
pub mod provider;
pub mod pubsub;
mod registry;
pub mod runtime;
pub mod sandbox;
mod settings;
mod shared;
pub mod spawner;
mod stream_actor;
mod sub_agents;
mod task;
pub mod tool;
mod tool_actor;
mod tool_groups;
pub mod tool_sandbox;

pub use keel_core as core;
pub use keel_store as store;

pub use conversation::{ActorStats, ConversationHandle, Following, Inspection};
pub use image::ImageUpload;
pub use mcp::{McpHub, McpServerConfig, McpServerStatus};
pub use pubsub::{Received, Subscription, Update, View, Wave};
pub use runtime::{
    BootReport, Deletion, Fork, Runtime, RuntimeConfig, Settings, DEFAULT_LIVE_INTERVAL,
};

/// Failures of keel-actors that are not a domain outcome. A failed LLM
/// request is not one of them: it is a [`keel_core::LlmFailure`] value that
/// goes back into `transition()`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An image attached to a message was refused, so the message was not
    /// sent and none of its images stored. The message is safe to show the
    /// user: it names the image (counting from 1) and says why.
    #[error("image {} of {count} was refused: {problem}", .index + 1)]
    InvalidImage {
        /// Which image, from 0, in the order they were given.
        index: usize,
        /// How many images the message had.
        count: usize,
        problem: image::ImageProblem,
    },
    /// The HTTP client could not be built (TLS roots, for one).
    #[error("cannot build the HTTP client")]
    HttpClient(#[source] reqwest::Error),
    #[error("no conversation has id {0}")]
    NotFound(keel_core::ConversationId),
    /// The conversation refused the request; the message is safe to show.
    #[error("{0}")]
    Rejected(keel_core::Rejection),
    #[error(transparent)]
    Store(#[from] keel_store::Error),
    /// A working directory that cannot be a conversation's: it does not
    /// exist, is not a directory, or its path is not UTF-8.
    #[error("cannot work in {cwd}: {reason}")]
    InvalidCwd { cwd: String, reason: String },
    /// A configuration value (an environment variable, say) is unusable.
    #[error("{name}: {reason}")]
    Config { name: &'static str, reason: String },
    /// An actor could not be started.
    #[error("cannot start an actor")]
    Spawn(#[source] ractor::SpawnErr),
    /// An actor of this conversation kept its registry name while stopping.
    #[error("could not start conversation {0}: its name stayed taken")]
    NameTaken(keel_core::ConversationId),
    /// The runtime is stopping: it starts and creates no conversation.
    #[error("keel is shutting down")]
    ShuttingDown,
    /// Another process owns this conversation's tree (several nodes over
    /// one store, docs/nodes.md), or its owner cannot be known now.
    #[error("conversation {conversation} is not this node's to run: {reason}")]
    NotOwner {
        conversation: keel_core::ConversationId,
        reason: String,
    },
    /// The conversation's actor stopped before it answered.
    #[error("the conversation stopped before it answered; try again")]
    Stopped,
    /// The conversation took a message and stopped (crashed) before it was
    /// recorded: nothing of it is in the log, and it may be sent again.
    #[error("the conversation stopped before the message was recorded; nothing was recorded, send it again")]
    NotRecorded,
    #[error("the conversation did not answer in time")]
    Timeout,
    /// A fork (or rewind) at a seq the log does not allow; the message
    /// names the nearest turn boundaries.
    #[error("{0}")]
    History(keel_core::history::HistoryError),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}
