//! PostgreSQL's errors as the store's: what the server said when it said
//! something, else the driver's error with its causes.

use crate::error::Error;

/// The name the store's errors give this backend.
pub(super) const NAME: &str = "postgres";

pub(super) fn backend_error(error: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: NAME,
        reason: error.to_string(),
    }
}

/// A driver error with what the server said, when it said something,
/// else with its causes (a refused connection says why).
pub(super) fn database_error(error: tokio_postgres::Error) -> Error {
    match error.as_db_error() {
        Some(db) => backend_error(format!("{} ({})", db.message(), db.code().code())),
        None => backend_error(with_causes(&error)),
    }
}

pub(super) fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

pub(super) fn pool_error(error: deadpool_postgres::PoolError) -> Error {
    match error {
        deadpool_postgres::PoolError::Backend(error) => database_error(error),
        other => backend_error(other),
    }
}
