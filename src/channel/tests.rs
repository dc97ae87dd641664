//! The channel against an in-process WebSocket peer.
