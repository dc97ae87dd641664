//! Where every HTTP client bcd makes starts: a leaf, so the evidence layer
//! (a cloud's metadata service) and the client (the control plane) share it
//! without the evidence importing the client above it.

/// Every HTTP client bcd makes (the control plane's, a cloud's metadata
/// service) starts here, with TCP_NODELAY: a TLS handshake and a request go
/// out in several writes, and Nagle's algorithm would hold the last back
/// until the server's delayed ACK, 40 ms later (once or twice a join).
pub(crate) fn http_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().tcp_nodelay(true)
}
