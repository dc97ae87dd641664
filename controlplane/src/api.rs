//! The transport: HTTPS, its client authentication, connection limits and
//! the error headers, over the services of [`crate::plane`]. Nothing below
//! imports it.

pub(crate) mod channel;
pub(crate) mod client_auth;
pub(crate) mod connlimit;
pub(crate) mod dist_serve;
pub(crate) mod header_errors;
pub(crate) mod http;
pub(crate) mod images_serve;
