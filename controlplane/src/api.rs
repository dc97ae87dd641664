//! The transport: HTTPS, its client authentication, connection limits and
//! the error headers, over the services of [`crate::plane`]. Nothing below
//! imports it.

pub mod client_auth;
pub mod connlimit;
pub mod dist_serve;
pub mod header_errors;
pub mod http;
