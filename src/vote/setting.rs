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
