//! Where every reqwest client of keel's tools starts: the API client, the
//! lab's drills and bench, the tests.
//!
//! keel builds reqwest with `rustls-no-provider` and rustls with ring, so
//! a fresh build compiles no C crypto library (the workspace's Cargo.toml
//! says why). The price is that reqwest refuses to build a client until a
//! crypto provider is installed for the process, whether or not the client
//! ever speaks TLS. [`client_builder`] installs it first.

/// Installs ring as the process's rustls crypto provider, unless one is
/// installed already (then that one serves: installing is first come,
/// first served, and either is fine for a client).
pub fn install_crypto_provider() {
    // An error only says a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `reqwest::Client::builder()`, after the crypto provider is installed.
pub fn client_builder() -> reqwest::ClientBuilder {
    install_crypto_provider();
    reqwest::Client::builder()
}

/// A default client: `reqwest::Client::new()`, after the crypto provider
/// is installed.
pub fn client() -> reqwest::Client {
    // Building fails only without a TLS backend or a resolver, and neither
    // is configured here; the default client is the same client.
    client_builder().build().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client built here works whichever reqwest features the build
    /// unified (with `rustls-no-provider`, `reqwest::Client::new()` panics
    /// without a provider).
    #[test]
    fn a_client_can_be_built_and_the_provider_is_installed() {
        let _client = client();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
        // A second install is harmless.
        install_crypto_provider();
    }
}
