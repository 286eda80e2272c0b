//! keel-actors: the imperative shell that carries out keel-core's effects.
//!
//! So far it holds the two pieces of I/O the actors will lean on: the HTTP
//! client that streams a response from a provider ([`provider`]) and the
//! validation and downscaling of attached images ([`image`]). The ractor
//! supervisor tree, `ensure_started`, the conversation actor and its stream
//! and tool workers come with the actor runtime (see ARCHITECTURE.md).

pub mod image;
pub mod provider;

pub use keel_core as core;
pub use keel_store as store;

/// Failures of keel-actors that are not a domain outcome. A failed LLM
/// request is not one of them: it is a [`keel_core::LlmFailure`] value that
/// goes back into `transition()`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An attached image was refused; the message is safe to show the user.
    #[error("invalid image: {0}")]
    Image(#[from] image::ImageProblem),
    /// The HTTP client could not be built (TLS roots, for one).
    #[error("cannot build the HTTP client")]
    HttpClient(#[source] reqwest::Error),
    /// Work handed to tokio's blocking pool panicked or was cancelled.
    #[error("a blocking task did not finish")]
    Blocking(#[source] tokio::task::JoinError),
}
