//! What a site's boot server is configured with (`[site]`), the state file
//! it keeps, and the commissioning policy it learns: read by `bcd site`,
//! and by `bcd status`, `bcd doctor` and the config too.
pub mod commissioning;
pub mod settings;
pub mod state;
