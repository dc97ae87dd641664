//! What a site's boot server keeps: its state file and the commissioning
//! policy it learns; read by `bcd site`, and by `bcd status` and `bcd doctor`
//! too. Its settings (`[site]`) are [`crate::site_settings`], below the config.
pub(crate) mod commissioning;
pub(crate) mod state;
