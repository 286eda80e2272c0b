//! keel-api: the daemon's HTTP + SSE API as its clients see it. The
//! request, response and event shapes (`types`, with their OpenAPI
//! schemas), the error codes (`error`) and the Rust client (`client`)
//! that the CLI, the lab and the tests drive the daemon with. It knows
//! neither the HTTP server (axum) nor the runtime (keel-actors): the daemon
//! depends on it, not the other way round, so a client can be built
//! without the daemon and the two cannot drift apart.

pub mod client;
pub mod error;
pub mod http;
pub mod types;

pub use error::ErrorCode;

/// The most items a page of a listing (`limit`) may hold; the client asks
/// for this many when it reads a whole listing.
pub const MAX_PAGE_LIMIT: usize = 1_000;
