//! Upgrades: an older server starts against a schema a newer release expanded
//! (docs/operations.md, "A version with a migration").

use crate::helpers::spawn_app;

/// A migration the database has and this binary does not (a newer release's
/// expand step) does not stop this binary from migrating, so from starting: an
/// old pod that restarts mid roll-over, or a rollback, comes up.
#[tokio::test]
async fn a_newer_releases_migration_does_not_stop_an_older_server() {
    let app = spawn_app().await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (99990101000000, 'a newer release', true, '\\x00', 1)",
    )
    .execute(&app.db)
    .await
    .unwrap();
    stampede::startup::migrate(&app.db)
        .await
        .expect("migrating with a newer migration applied");
    // What it carries stays applied, the newer one untouched.
    let (mine, newer): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE version < 99990101000000),
                count(*) FILTER (WHERE version = 99990101000000)
         FROM _sqlx_migrations WHERE success",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(newer, 1);
    assert_eq!(
        usize::try_from(mine).unwrap(),
        std::fs::read_dir("migrations").unwrap().count()
    );
}
