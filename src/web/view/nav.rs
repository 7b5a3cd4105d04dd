//! The page header's account links, and the `next` that brings a visitor back.

use actix_web::HttpRequest;
use sqlx::PgPool;

use crate::error::AppError;
use crate::routes::auth::{self, AuthUser};

/// The account part of the page header.
pub struct Nav {
    pub user: Option<NavUser>,
    /// `?next=<this page>` for the header's sign-in and sign-up links, so a visitor
    /// lands back where they were; empty on the home page and the auth pages
    /// (whose own `next` the script carries over).
    pub next: String,
}

pub struct NavUser {
    pub username: String,
    pub admin: bool,
}

impl Nav {
    pub fn anonymous() -> Self {
        Nav {
            user: None,
            next: String::new(),
        }
    }

    /// The caller and their name. One indexed query: fine for pages, which is why
    /// the buy path never calls this. A token whose user was deleted counts as
    /// signed out.
    pub async fn load(req: &HttpRequest, db: &PgPool) -> Result<(Nav, Option<AuthUser>), AppError> {
        let Some(user) = auth::optional_user(req)? else {
            return Ok((
                Nav {
                    user: None,
                    next: next_query(req.path()),
                },
                None,
            ));
        };
        Ok(match crate::auth::user_view(db, user.id).await? {
            Some(account) => (
                Nav {
                    user: Some(NavUser {
                        username: account.username,
                        admin: account.is_admin,
                    }),
                    next: String::new(),
                },
                Some(user),
            ),
            None => (
                Nav {
                    user: None,
                    next: next_query(req.path()),
                },
                None,
            ),
        })
    }
}

/// `?next=%2Fsales%2F3` for a page path; nothing for the home page and the auth
/// pages themselves.
pub fn next_query(path: &str) -> String {
    if path == "/" || path == "/signin" || path == "/signup" || !path.starts_with('/') {
        String::new()
    } else {
        format!("?next={}", encode_component(path))
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_keeps_the_page_and_encodes_it() {
        assert_eq!(next_query("/sales/3"), "?next=%2Fsales%2F3");
        assert_eq!(next_query("/polls/a b&c"), "?next=%2Fpolls%2Fa%20b%26c");
        assert_eq!(next_query("/"), "");
        assert_eq!(next_query("/signup"), "");
        assert_eq!(next_query("/signin"), "");
    }
}
