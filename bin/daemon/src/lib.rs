//! keel-daemon: `keel serve`, the HTTP + SSE server over the runtime. Its
//! configuration (`config`), bearer token (`token`), the routes, handlers,
//! event streams and paging (`api`), the runtime's views as the API shows
//! them (`convert`), start-up and graceful stop (`daemon`), and the logs,
//! traces and metrics it installs (`telemetry`), and a daemon as one
//! node among several over PostgreSQL (`cluster`, docs/nodes.md). The API's shapes and
//! error codes are keel-api's; which fake provider runs when none is
//! configured is the composition root's choice (the `keel` binary), given
//! to [`daemon::run`] as [`daemon::Options::fake_provider`].

pub mod api;
pub mod cluster;
pub mod config;
pub mod convert;
pub mod daemon;
pub mod net;
mod retention;
pub mod telemetry;
pub mod token;
