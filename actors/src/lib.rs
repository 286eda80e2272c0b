//! keel-actors: the imperative shell that carries out keel-core's effects.
//!
//! Empty for now: the ractor supervisor tree, `ensure_started`, the
//! conversation actor and its stream and tool workers come with the actor
//! runtime (see ARCHITECTURE.md). The crate exists so the dependency arrows
//! bin → actors → store → core hold from the start.

pub use keel_core as core;
pub use keel_store as store;
