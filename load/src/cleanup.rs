//! `stampede load --cleanup`: the rehearsals removed, nothing fired.

use stampede::config::Config;

/// `stampede load --cleanup`: every rehearsal sale and user out of Postgres and
/// Redis (`stampede::rehearse::cleanup`, as the admin API does); prints the counts.
pub async fn cleanup(config: &Config, json: bool) -> anyhow::Result<()> {
    let cleaned = stampede::rehearse::cleanup(config).await?;
    if json {
        println!("{}", serde_json::to_string(&cleaned)?);
    } else {
        println!(
            "removed {} rehearsal sales, {} orders, {} users, {} admin accounts of the load tool{}",
            cleaned.sales,
            cleaned.orders,
            cleaned.users,
            cleaned.admins,
            match cleaned.users_kept {
                0 => String::new(),
                n => format!(" ({n} rehearsal users kept: a real sale, poll or change names them)"),
            }
        );
    }
    Ok(())
}
