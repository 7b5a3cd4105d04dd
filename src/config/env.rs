//! The environment variables that override the configuration: one table, `ENV`,
//! of each variable's name and the setter that parses it into its field.

use std::time::Duration;

use super::{Config, ConfigError};

/// The variable's value, trimmed, parsed; an error names the variable.
fn parse<T: std::str::FromStr>(var: &'static str, value: String) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    value.trim().parse().map_err(|e: T::Err| ConfigError::Env {
        var,
        message: e.to_string(),
    })
}

/// A comma-separated list, blanks dropped.
fn list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// How one environment variable sets its part of the configuration: given the
/// configuration, the variable's name (for errors) and its value.
type Setter = fn(&mut Config, &'static str, String) -> Result<(), ConfigError>;

/// `parsed!(field)`: the variable's value parsed into `field` (see [`parse`]);
/// `parsed!(millis field)`, `parsed!(secs field)`: a whole number of milliseconds
/// or seconds, into a `Duration` field.
macro_rules! parsed {
    (millis $($field:ident).+) => {
        |c: &mut Config, name: &'static str, v: String| -> Result<(), ConfigError> {
            c.$($field).+ = Duration::from_millis(parse(name, v)?);
            Ok(())
        }
    };
    (secs $($field:ident).+) => {
        |c: &mut Config, name: &'static str, v: String| -> Result<(), ConfigError> {
            c.$($field).+ = Duration::from_secs(parse(name, v)?);
            Ok(())
        }
    };
    ($($field:ident).+) => {
        |c: &mut Config, name: &'static str, v: String| -> Result<(), ConfigError> {
            c.$($field).+ = parse(name, v)?;
            Ok(())
        }
    };
}

/// `text!(field)`: the variable's value as it is; `text!(Some field)`: in an `Option`.
macro_rules! text {
    ($field:ident) => {
        |c: &mut Config, _: &'static str, v: String| -> Result<(), ConfigError> {
            c.$field = v;
            Ok(())
        }
    };
    (Some $field:ident) => {
        |c: &mut Config, _: &'static str, v: String| -> Result<(), ConfigError> {
            c.$field = Some(v);
            Ok(())
        }
    };
}

/// Every environment variable [`Config::apply_env`] reads, in the order it applies
/// them, with what each sets.
pub(super) const ENV: &[(&str, Setter)] = &[
    ("STAMPEDE_LISTEN", parsed!(listen)),
    ("STAMPEDE_METRICS_LISTEN", |c, name, v| {
        c.metrics_listen = match v.trim() {
            "" | "off" => None,
            _ => Some(parse(name, v)?),
        };
        Ok(())
    }),
    ("STAMPEDE_METRICS_TOKEN", |c, _, v| {
        c.metrics_token = Some(v).filter(|t| !t.is_empty());
        Ok(())
    }),
    ("STAMPEDE_SESSION_SYNC_MS", parsed!(millis session_sync)),
    ("STAMPEDE_LIVE_INTERVAL_MS", parsed!(millis live_interval)),
    ("DATABASE_URL", text!(database_url)),
    ("REDIS_URL", text!(redis_url)),
    ("STAMPEDE_REDIS_CLUSTER", |c, _, v| {
        c.redis_cluster = list(&v).map(String::from).collect();
        Ok(())
    }),
    ("STAMPEDE_REDIS_NAMESPACE", text!(redis_namespace)),
    ("STAMPEDE_TOKEN_SECRET", text!(token_secret)),
    ("STAMPEDE_TOKEN_TTL_SECS", parsed!(secs token_ttl)),
    ("STAMPEDE_COOKIE_SECURE", parsed!(cookie_secure)),
    ("STAMPEDE_MAX_BODY_BYTES", parsed!(max_body_bytes)),
    (
        "STAMPEDE_CLIENT_REQUEST_TIMEOUT_MS",
        parsed!(millis client_request_timeout),
    ),
    ("STAMPEDE_BODY_TIMEOUT_MS", parsed!(millis body_timeout)),
    ("STAMPEDE_KEEP_ALIVE_SECS", parsed!(secs keep_alive)),
    ("STAMPEDE_MAX_CONNECTIONS", parsed!(max_connections)),
    (
        "STAMPEDE_MAX_STREAMS_PER_CLIENT",
        parsed!(max_streams_per_client),
    ),
    ("STAMPEDE_MAX_HEADER_BYTES", parsed!(max_header_bytes)),
    ("STAMPEDE_SOLD_OUT_CACHE_MS", parsed!(millis sold_out_cache)),
    (
        "STAMPEDE_PURCHASE_KEY_TTL_SECS",
        parsed!(secs purchase_key_ttl),
    ),
    ("STAMPEDE_SETTLE_IN_SERVE", parsed!(settle_in_serve)),
    ("STAMPEDE_DRAIN_MS", parsed!(millis drain)),
    ("STAMPEDE_SETTLE_BATCH_SIZE", parsed!(settle.batch_size)),
    ("STAMPEDE_SETTLE_EXCLUSIVE", parsed!(settle.exclusive)),
    ("STAMPEDE_SETTLE_LINGER_MS", parsed!(millis settle.linger)),
    (
        "STAMPEDE_SETTLE_WRITE_TIMEOUT_MS",
        parsed!(millis settle.write_timeout),
    ),
    (
        "STAMPEDE_SETTLE_CLAIM_IDLE_MS",
        parsed!(millis settle.claim_idle),
    ),
    ("STAMPEDE_TRUSTED_PROXIES", |c, name, v| {
        c.trusted_proxies = list(&v)
            .map(|s| parse(name, s.to_string()))
            .collect::<Result<_, _>>()?;
        Ok(())
    }),
    ("STAMPEDE_LIMITS", |c, name, v| {
        c.limits.enabled = match v.trim().to_ascii_lowercase().as_str() {
            "on" | "true" | "1" => true,
            "off" | "false" | "0" => false,
            other => {
                return Err(ConfigError::Env {
                    var: name,
                    message: format!("expected on or off, got {other:?}"),
                });
            }
        };
        Ok(())
    }),
    ("STAMPEDE_ADMIN_USERNAME", text!(Some admin_username)),
    ("STAMPEDE_ADMIN_PASSWORD", text!(Some admin_password)),
    ("STAMPEDE_DEMO_PASSWORD", text!(Some demo_password)),
    (
        "STAMPEDE_DATABASE_MAX_CONNECTIONS",
        parsed!(database_max_connections),
    ),
    (
        "STAMPEDE_DATABASE_ACQUIRE_TIMEOUT_MS",
        parsed!(millis database_acquire_timeout),
    ),
    (
        "STAMPEDE_DATABASE_STATEMENT_TIMEOUT_MS",
        parsed!(millis database_statement_timeout),
    ),
    (
        "STAMPEDE_REDIS_RESPONSE_TIMEOUT_MS",
        parsed!(millis redis_response_timeout),
    ),
    ("STAMPEDE_REPLICA_ACKS", parsed!(replica_acks)),
    (
        "STAMPEDE_REPLICA_ACK_TIMEOUT_MS",
        parsed!(millis replica_ack_timeout),
    ),
    ("STAMPEDE_WORKERS", parsed!(workers)),
    ("STAMPEDE_BATCH_MAX", parsed!(batch_max)),
    ("STAMPEDE_BATCH_IN_FLIGHT", |c, name, v| {
        c.batch_in_flight = Some(parse(name, v)?);
        Ok(())
    }),
    ("STAMPEDE_SWEEP_MS", parsed!(millis sweep)),
    ("STAMPEDE_EXPIRE_MS", parsed!(millis expire)),
    (
        "STAMPEDE_QUEUE_ADMISSION_MS",
        parsed!(millis queue_admission),
    ),
    ("STAMPEDE_DRAW_CLAIM_MAX_MS", parsed!(millis draw_claim_max)),
];

impl Config {
    /// Environment overrides. `DATABASE_URL` and `REDIS_URL` are honoured under their
    /// customary names; everything else is `STAMPEDE_<FIELD>` (the table `ENV`).
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        for (name, set) in ENV {
            if let Some(value) = var(name) {
                set(self, name, value)?;
            }
        }
        Ok(())
    }
}
