//! The one TOML configuration file, validated at startup into typed values.
//!
//! ```toml
//! [drive]
//! data = "/var/lib/nasd/drive0"
//! listen = "0.0.0.0:7400"
//! block_size = "64KiB"
//! capacity = "500GiB"
//! commit_interval_ms = 2000
//! verify_reads = true
//! master_key_file = "/etc/nasd/drive0.master.key"
//! ```

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The whole file. Unknown keys are refused so typos do not pass silently.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Settings of `nasd drive`.
    #[serde(default)]
    pub drive: DriveSection,
}

/// `[drive]`: every field optional; command-line flags override.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveSection {
    pub data: Option<PathBuf>,
    pub listen: Option<String>,
    pub block_size: Option<String>,
    pub capacity: Option<String>,
    pub commit_interval_ms: Option<u64>,
    pub verify_reads: Option<bool>,
    pub master_key_file: Option<PathBuf>,
    pub no_security: Option<bool>,
}

/// Reads and parses the file.
pub fn load(path: &Path) -> anyhow::Result<ConfigFile> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow::anyhow!("config file {} is invalid: {e}", path.display()))
}
