//! The channel's size caps, in one leaf module: the kinds' argument bounds,
//! the commands' and the results' checks and the frames all read them.

/// The most commands one node runs at once; the agent holds further ones
/// (verified and journaled) until one finishes.
pub const MAX_RUNNING: usize = 4;
/// The largest serialized `SignedCommand` either side accepts.
pub const MAX_COMMAND: usize = 64 * 1024;
/// The most output bytes a result carries.
pub const MAX_OUTPUT: usize = 1 << 20;
/// The longest outcome (bytes).
pub const MAX_OUTCOME: usize = 1024;
/// The largest serialized `SignedCommandResult` accepted: the output cap
/// and room for the rest.
pub const MAX_RESULT: usize = MAX_OUTPUT + 8 * 1024;
