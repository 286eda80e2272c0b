//! The HTTP API's own shapes. keel-core's serde shape is the stored log
//! format; these are what clients see, converted from the runtime's types by
//! hand (the `From` impls in each module), so either can change without breaking the
//! other. Every type here is in `/openapi.json` through `ToSchema`.
//!
//! They serialise and deserialise both ways: the daemon answers with them
//! and the client (`crate::client`) reads them back, so the two share one
//! shape and cannot drift apart.

mod events;
mod requests;
mod responses;

pub use events::*;
pub use requests::*;
pub use responses::*;
