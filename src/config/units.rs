//! Durations as the configuration writes them: whole milliseconds or seconds (the
//! unit is in the key's name, `sweep_ms = 2000`, `keep_alive_secs = 5`), held as
//! [`Duration`]s. For `#[serde(rename = "sweep_ms", with = "units::millis")]`.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A whole number of milliseconds.
pub mod millis {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// A whole number of seconds.
pub mod secs {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}
