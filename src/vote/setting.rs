//! A poll's `results` setting (issue 51): when its tallies become visible, stored
//! in `polls.results`. What each caller then sees is `visibility.rs`.

use serde::{Deserialize, Serialize};

use crate::error::{AppError, ErrorCode};

/// When a poll's tallies become visible to voters and visitors. Admins always see
/// them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResultsVisibility {
    /// Everyone, at once (the default, and every poll made before the setting).
    #[default]
    Live,
    /// A voter once their ballot is in; everyone else never (an admin still does).
    AfterVote,
    /// Everyone once the poll is closed (run out, or closed early).
    AfterClose,
    /// Everyone once an admin revealed them, which they may do once it is closed.
    OnReveal,
}

impl ResultsVisibility {
    pub const ALL: [ResultsVisibility; 4] = [
        ResultsVisibility::Live,
        ResultsVisibility::AfterVote,
        ResultsVisibility::AfterClose,
        ResultsVisibility::OnReveal,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ResultsVisibility::Live => "live",
            ResultsVisibility::AfterVote => "after_vote",
            ResultsVisibility::AfterClose => "after_close",
            ResultsVisibility::OnReveal => "on_reveal",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == text)
    }

    /// The `results` field of a create or an edit: one of the four names, else 422
    /// `invalid_ballot_settings` naming the setting.
    pub fn from_setting(value: &serde_json::Value) -> Result<Self, AppError> {
        value.as_str().and_then(Self::parse).ok_or_else(|| {
            AppError::new(
                ErrorCode::InvalidBallotSettings,
                "results must be one of \"live\", \"after_vote\", \"after_close\", \"on_reveal\"",
            )
        })
    }
}

impl sqlx::Type<sqlx::Postgres> for ResultsVisibility {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for ResultsVisibility {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        Self::parse(text).ok_or_else(|| format!("unknown results setting {text:?}").into())
    }
}

/// What a voter sends and how it counts (`polls.ballot`, migration 0019).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BallotKind {
    /// One option (the default, and every poll made before the setting).
    #[default]
    Single,
    /// 1 to `max_choices` distinct options, each counted once.
    Multi,
    /// `votes_per_user` votes spent over any number of requests, at most
    /// `max_per_option` on one option.
    Budget,
    /// 1 to `max_choices` distinct options, most preferred first.
    Ranked,
}

impl BallotKind {
    pub const ALL: [BallotKind; 4] = [
        BallotKind::Single,
        BallotKind::Multi,
        BallotKind::Budget,
        BallotKind::Ranked,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            BallotKind::Single => "single",
            BallotKind::Multi => "multi",
            BallotKind::Budget => "budget",
            BallotKind::Ranked => "ranked",
        }
    }

    /// The letter `lua/vote_batch.lua` reads from the meta hash's `ballot` field.
    pub const fn code(self) -> &'static str {
        match self {
            BallotKind::Single => "s",
            BallotKind::Multi => "m",
            BallotKind::Budget => "b",
            BallotKind::Ranked => "r",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == text)
    }

    /// Whether a ballot lists options (`option_ids`, `ranking`).
    pub const fn lists(self) -> bool {
        matches!(self, BallotKind::Multi | BallotKind::Ranked)
    }
}

impl sqlx::Type<sqlx::Postgres> for BallotKind {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for BallotKind {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        Self::parse(text).ok_or_else(|| format!("unknown ballot kind {text:?}").into())
    }
}

/// Most votes a budget poll gives each voter.
pub const MAX_VOTES_PER_USER: i32 = 1000;

/// A poll's ballot settings, checked together (as stored in `polls`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BallotSettings {
    pub kind: BallotKind,
    /// `multi` and `ranked`: most options on one ballot (1 to the options; `None`:
    /// all of them).
    pub max_choices: Option<i32>,
    /// `budget`: votes each voter may spend (1 to 1,000).
    pub votes_per_user: Option<i32>,
    /// `budget`: most votes of one voter on one option (1 to `votes_per_user`).
    pub max_per_option: Option<i32>,
    /// `single`, `multi`, `ranked`: a later ballot replaces the earlier one.
    pub allow_change: bool,
}

/// The ballot fields of a create or an edit, as sent (`None`: not sent).
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
pub struct BallotFields {
    /// `single` (default), `multi`, `budget` or `ranked`.
    #[schema(value_type = Option<String>, example = "multi")]
    pub ballot: Option<serde_json::Value>,
    /// `multi` and `ranked`: 1 to the number of options (default: all of them;
    /// `null` in an edit: back to all of them).
    #[schema(value_type = Option<i32>)]
    #[serde(default, deserialize_with = "present")]
    pub max_choices: Option<serde_json::Value>,
    /// `budget`: 1 to 1,000 votes per voter (required for a budget poll).
    #[schema(value_type = Option<i32>)]
    pub votes_per_user: Option<serde_json::Value>,
    /// `budget`: 1 to `votes_per_user` (default `votes_per_user`; `null` in an
    /// edit: back to the default).
    #[schema(value_type = Option<i32>)]
    #[serde(default, deserialize_with = "present")]
    pub max_per_option: Option<serde_json::Value>,
    /// `single`, `multi`, `ranked`: the voter may replace the ballot until the close
    /// (default `false`).
    #[schema(value_type = Option<bool>)]
    pub allow_change: Option<serde_json::Value>,
}

/// A field that was sent, `null` included (`Some(Value::Null)`); a missing one
/// stays `None` through `#[serde(default)]`.
pub fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

fn bad(message: impl Into<String>) -> AppError {
    AppError::new(ErrorCode::InvalidBallotSettings, message.into())
}

fn whole(name: &str, value: &serde_json::Value) -> Result<i32, AppError> {
    value
        .as_i64()
        .and_then(|n| i32::try_from(n).ok())
        .ok_or_else(|| bad(format!("{name} must be a whole number")))
}

impl BallotFields {
    /// Whether any ballot field was sent.
    pub fn any(&self) -> bool {
        self.ballot.is_some()
            || self.max_choices.is_some()
            || self.votes_per_user.is_some()
            || self.max_per_option.is_some()
            || self.allow_change.is_some()
    }

    /// The settings these fields make of `old` (a create's: the defaults) for a poll
    /// of `options` options, checked together: 422 `invalid_ballot_settings` naming
    /// the setting. A field sent as `null` is not sent, except `max_choices` and
    /// `max_per_option`, which `null` returns to their defaults. A new kind starts its
    /// numbers from the defaults (a `multi` poll made `budget` keeps no
    /// `max_choices`).
    pub fn settle(&self, old: BallotSettings, options: usize) -> Result<BallotSettings, AppError> {
        let sent = |v: &Option<serde_json::Value>| v.clone().filter(|v| !v.is_null());
        let mut s = old;
        if let Some(kind) = sent(&self.ballot) {
            let kind = kind.as_str().and_then(BallotKind::parse).ok_or_else(|| {
                bad("ballot must be one of \"single\", \"multi\", \"budget\", \"ranked\"")
            })?;
            if kind != old.kind {
                s = BallotSettings {
                    kind,
                    allow_change: old.allow_change && kind != BallotKind::Budget,
                    ..BallotSettings::default()
                };
            }
        }
        match &self.max_choices {
            Some(serde_json::Value::Null) => s.max_choices = None,
            Some(v) => s.max_choices = Some(whole("max_choices", v)?),
            None => {}
        }
        if let Some(v) = sent(&self.votes_per_user) {
            // A cap of the whole budget is no cap: it follows a new budget unless
            // this edit names one (a cap below the budget stays as it was).
            if self.max_per_option.is_none() && s.max_per_option == s.votes_per_user {
                s.max_per_option = None;
            }
            s.votes_per_user = Some(whole("votes_per_user", &v)?);
        }
        match &self.max_per_option {
            Some(serde_json::Value::Null) => s.max_per_option = None,
            Some(v) => s.max_per_option = Some(whole("max_per_option", v)?),
            None => {}
        }
        if let Some(v) = sent(&self.allow_change) {
            s.allow_change = v
                .as_bool()
                .ok_or_else(|| bad("allow_change must be true or false"))?;
        }
        s.check(options)
    }
}

impl BallotSettings {
    /// The settings with their defaults filled in, or 422 naming what is wrong.
    pub fn check(mut self, options: usize) -> Result<BallotSettings, AppError> {
        let kind = self.kind.as_str();
        let options = options as i32;
        if self.kind.lists() {
            // Not sent: every option (kept so, whatever the options become).
            if let Some(max) = self.max_choices
                && !(1..=options).contains(&max)
            {
                return Err(bad(format!(
                    "max_choices must be 1 to the number of options ({options})"
                )));
            }
        } else if self.max_choices.is_some() {
            return Err(bad(format!(
                "max_choices is for multi and ranked ballots, not {kind}"
            )));
        }
        if self.kind == BallotKind::Budget {
            let Some(budget) = self.votes_per_user else {
                return Err(bad("a budget ballot needs votes_per_user (1 to 1000)"));
            };
            if !(1..=MAX_VOTES_PER_USER).contains(&budget) {
                return Err(bad("votes_per_user must be 1 to 1000"));
            }
            let cap = self.max_per_option.unwrap_or(budget);
            if !(1..=budget).contains(&cap) {
                return Err(bad(format!(
                    "max_per_option must be 1 to votes_per_user ({budget})"
                )));
            }
            self.max_per_option = Some(cap);
            if self.allow_change {
                return Err(bad(
                    "allow_change is for single, multi and ranked ballots: a budget is spent, not replaced",
                ));
            }
        } else if self.votes_per_user.is_some() || self.max_per_option.is_some() {
            return Err(bad(format!(
                "votes_per_user and max_per_option are for budget ballots, not {kind}"
            )));
        }
        Ok(self)
    }

    /// Most options on one ballot of this poll of `options` options (1 for single
    /// and budget).
    pub fn choices_allowed(&self, options: usize) -> usize {
        match self.max_choices {
            _ if !self.kind.lists() => 1,
            Some(max) => (max.max(1) as usize).min(options),
            None => options,
        }
    }

    /// The meta hash's `ballot` field (`lua/vote_batch.lua`):
    /// `<kind letter>:<max_choices>:<votes_per_user>:<max_per_option>:<allow_change>`,
    /// 0 for what the kind has not (a `max_choices` of 0: every option). A single
    /// ballot without changes is `s:0:0:0:0`.
    pub fn redis_field(&self) -> String {
        format!(
            "{}:{}:{}:{}:{}",
            self.kind.code(),
            self.max_choices.unwrap_or(0),
            self.votes_per_user.unwrap_or(0),
            self.max_per_option.unwrap_or(0),
            u8::from(self.allow_change)
        )
    }
}
