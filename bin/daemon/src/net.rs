//! The listener keel's HTTP servers (the daemon, `keel mock-llm`, the
//! daemon's built-in fake provider) accept connections on.
//!
//! Every accepted connection gets `TCP_NODELAY`. These servers write
//! streams as many small writes (SSE frames, a provider's streamed
//! answer); with Nagle's algorithm on, a small write waits for the ACK of
//! the previous one, and a peer that delays its ACKs (Linux does, about
//! 40 ms) stalls each streamed answer on a reused connection. Measured
//! against the mock: a tool turn took 92 ms of wall time, 87 of them such
//! stalls; with `TCP_NODELAY`, 5 ms.

use axum::serve::{ListenerExt as _, TapIo};
use tokio::net::{TcpListener, TcpStream};

/// `listener`, setting `TCP_NODELAY` on each connection it accepts.
pub fn no_delay(listener: TcpListener) -> TapIo<TcpListener, fn(&mut TcpStream)> {
    listener.tap_io(set_no_delay as fn(&mut TcpStream))
}

fn set_no_delay(connection: &mut TcpStream) {
    // Failing leaves a working connection that may be slower; not worth
    // refusing it, but worth a word in the log.
    if let Err(error) = connection.set_nodelay(true) {
        tracing::debug!(%error, "could not set TCP_NODELAY on an accepted connection");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use axum::serve::Listener as _;

    use super::*;

    #[tokio::test]
    async fn accepted_connections_have_tcp_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut listener = no_delay(listener);
        let _client = TcpStream::connect(address).await.unwrap();
        let (accepted, _) = listener.accept().await;
        assert!(accepted.nodelay().unwrap());
    }
}
