//! Is the sale open, by the Redis clock? (`lua/ticket_window.lua`: reads only.)

use std::sync::LazyLock;

use redis::aio::ConnectionLike;

use crate::domain::SaleId;
use crate::error::AppError;
use crate::keys::Keys;
use crate::lua::{lua_function, unexpected_reply};

/// `no-writes`: it only reads, so a Redis whose memory is full still answers it.
static TICKET_WINDOW: LazyLock<crate::lua::Script> =
    lua_function!("ticket_window.lua", "ticket_window", "no-writes");

/// The script that reads a sale's window (for `examples/lua_function.rs`).
pub fn script() -> &'static crate::lua::Script {
    &TICKET_WINDOW
}

crate::lua::reply_codes! {
    /// What `lua/ticket_window.lua` answers, as its header lists them.
    pub enum WindowCode in "ticket_window.lua", checked_by window_codes_are_the_scripts {
        Open = 0, "open";
        NotStarted = 2, "not started";
        Ended = 3, "ended or closed";
        NotLoaded = 4, "not loaded";
        Recovering = 6, "recovering";
    }
}

/// Where a sale stands for issuing a ticket, by the Redis clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// Open at `now_ms`: a ticket may be issued.
    Open {
        now_ms: i64,
    },
    NotStarted {
        starts_in_ms: i64,
    },
    Ended,
    NotLoaded,
    Recovering,
}

/// `lua/ticket_window.lua` for one sale: reads the window and the Redis clock.
pub struct TicketWindow<'a> {
    pub keys: &'a Keys,
    pub sale: SaleId,
    /// Tests only: this Redis time instead of the Redis clock.
    pub now_ms: Option<i64>,
}

impl TicketWindow<'_> {
    pub async fn run<C: ConnectionLike>(&self, redis: &mut C) -> Result<Window, AppError> {
        let k = self.keys.sale(self.sale);
        let (code, value, now_ms): (i64, i64, i64) = TICKET_WINDOW
            .key(&k.meta)
            .key(&k.stock)
            .arg(self.now_ms.map(|t| t.to_string()).unwrap_or_default())
            .invoke_async(redis)
            .await?;
        let Some(code) = WindowCode::of(code) else {
            return Err(unexpected_reply("ticket_window.lua", (code, value)));
        };
        Ok(match code {
            WindowCode::Open => Window::Open { now_ms },
            WindowCode::NotStarted => Window::NotStarted {
                starts_in_ms: value,
            },
            WindowCode::Ended => Window::Ended,
            WindowCode::NotLoaded => Window::NotLoaded,
            WindowCode::Recovering => Window::Recovering,
        })
    }
}
