//! The control plane's outbound HTTP: one constructor, below every client
//! (the EK services reach the TPM makers with it; the server side is
//! [`crate::api::http`]).

/// Every HTTP client the control plane makes (a maker's EK service) starts
/// here, with TCP_NODELAY, for the reason [`crate::api::http`]'s `accept` sets it.
pub(crate) fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().tcp_nodelay(true)
}

#[cfg(test)]
mod tests {
    use super::client_builder;

    /// The one constructor of the control plane's HTTP clients sets
    /// TCP_NODELAY (reqwest shows it in the builder's Debug).
    #[test]
    fn outbound_clients_set_nodelay() {
        assert!(
            format!("{:?}", client_builder()).contains("tcp_nodelay: true"),
            "{:?}",
            client_builder()
        );
    }
}
