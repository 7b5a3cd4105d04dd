//! What templates show, computed in Rust so templates stay free of logic:
//! the header's account links, sales and polls as cards, prices, times and vote
//! shares as text.

mod ballot;
mod draw;
mod nav;
mod poll;
mod runoff;
mod sale;
mod text;

pub use ballot::{BallotForm, BallotView, MyBallot};
pub use draw::DrawFacts;
pub use nav::Nav;
pub use poll::{
    OptionResult, PollCard, ResultsChoice, hidden_words, option_results, results_choices,
    results_words,
};
pub use runoff::RunoffView;
pub use sale::{OrderState, SaleCard, sort_for_shop};
pub use text::{Moment, clock_text, format_price, group_digits, short_order_id, voters_text};
