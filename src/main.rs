//! The `stampede` command: serve, migrate, settle, reconcile, load, seed-demo,
//! create-admin, verify-draw. `load` runs the `stampede-load` binary (`load/`).

use std::ffi::OsString;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use stampede::config::Config;
use stampede::domain::{Password, Username};
use stampede::keys::Keys;
use stampede::startup::{self, Application};
#[path = "main/verify_draw.rs"]
mod verify_draw;

/// mimalloc instead of glibc's malloc: a purchase allocates and frees many small
/// objects across two worker threads, and glibc's arenas spent about a tenth of the
/// server's CPU on the buy path (`perf`: _int_malloc, _int_free, malloc_consolidate).
/// Through [`heap::Counted`], which counts the bytes in use only when
/// `STAMPEDE_HEAP_REPORT` asks for it.
#[global_allocator]
static ALLOCATOR: heap::Counted = heap::Counted;

/// The heap's bytes in use, for finding a leak: RSS cannot tell one from the
/// allocator keeping freed pages (measured in `scripts/soak`: RSS stepped by 5 to
/// 10 MB and stayed while the bytes in use held within half a MB).
///
/// `STAMPEDE_HEAP_REPORT=FILE` makes the process count every allocation's bytes
/// (one relaxed atomic add per allocation and per free) and write the count, a
/// decimal number of bytes and a newline, to FILE every second. Counting starts
/// at `main`, so the few allocations made before it are missed: the count is
/// exact up to that constant offset, which is what a leak check needs (growth).
/// Unset, the allocator is mimalloc plus one relaxed load of a flag per call.
mod heap {
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};

    static COUNTING: AtomicBool = AtomicBool::new(false);
    static IN_USE: AtomicIsize = AtomicIsize::new(0);

    pub struct Counted;

    fn count(bytes: isize) {
        if COUNTING.load(Relaxed) {
            IN_USE.fetch_add(bytes, Relaxed);
        }
    }

    // SAFETY: every call goes to mimalloc unchanged; the counting around it reads
    // only the layouts and touches no memory.
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Counted {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let p = unsafe { mimalloc::MiMalloc.alloc(layout) };
            if !p.is_null() {
                count(layout.size() as isize);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let p = unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) };
            if !p.is_null() {
                count(layout.size() as isize);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            count(-(layout.size() as isize));
            // SAFETY: the caller's contract, passed on.
            unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            let p = unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                count(new_size as isize - layout.size() as isize);
            }
            p
        }
    }

    /// With `STAMPEDE_HEAP_REPORT` set: counts from now on, and writes the count to
    /// that file every second, from a thread of its own, for the process's life.
    pub fn report_if_asked() {
        let Some(path) = std::env::var_os("STAMPEDE_HEAP_REPORT").filter(|p| !p.is_empty()) else {
            return;
        };
        COUNTING.store(true, Relaxed);
        let path = std::path::PathBuf::from(path);
        let spawned = std::thread::Builder::new()
            .name("heap-report".into())
            .spawn(move || {
                loop {
                    let bytes = IN_USE.load(Relaxed);
                    // Written whole, then renamed: a reader never sees half a number.
                    let tmp = path.with_extension("tmp");
                    if std::fs::write(&tmp, format!("{bytes}\n")).is_ok() {
                        let _ = std::fs::rename(&tmp, &path);
                    }
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            });
        if let Err(e) = spawned {
            eprintln!("STAMPEDE_HEAP_REPORT: no reporting thread: {e}");
        }
    }
}

#[derive(Parser)]
#[command(name = "stampede", version, about = "Flash-sale and voting backend")]
struct Cli {
    /// TOML config file; environment variables override it.
    #[arg(long, global = true, env = "STAMPEDE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP server (and, unless disabled, the settlement worker).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Run only the settlement worker.
    Settle {
        /// Settle everything pending, then exit.
        #[arg(long)]
        drain: bool,
    },
    /// Compare every sale's Redis state with Postgres; exit 1 when one disagrees.
    Reconcile {
        /// Make Redis agree with Postgres for every sale that disagrees: settled
        /// buyers join the buyers hash, units left become total minus buyers.
        #[arg(long)]
        repair: bool,
    },
    /// Create demo users and demo sales (idempotent).
    SeedDemo,
    /// Rehearse a sale against a running server: prepare users and a sale (or poll),
    /// fire a storm, print throughput, latency percentiles and every answer, then
    /// check the invariants (exit 1 when one broke). See "Rehearse a sale" in docs/operations.md.
    ///
    /// Runs `stampede-load`, built beside this binary; `stampede load --help` lists
    /// its options.
    #[command(disable_help_flag = true)]
    Load {
        /// The mode and options, passed to `stampede-load` as they are.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Create an admin, its password the first line of stdin; or promote an
    /// existing user, whose password is left as it is (nothing is read).
    CreateAdmin {
        #[arg(long)]
        username: String,
    },
    /// Take the admin flag from an account and end every session it has, on every
    /// server at once: its tokens stop working, and it signs in again as a shopper.
    RevokeAdmin {
        #[arg(long)]
        username: String,
    },
    /// Check a published draw: seed against commitment, winners against the order.
    VerifyDraw(verify_draw::Args),
}

fn main() -> ExitCode {
    heap::report_if_asked();
    let cli = Cli::parse();
    let result = match cli.command {
        // Before any runtime or logging: the process becomes the load generator.
        Command::Load { args } => forward_load(cli.config.as_deref(), args),
        command => actix_web::rt::System::new().block_on(async {
            stampede::telemetry::init();
            run(cli.config.as_deref(), command).await
        }),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: Option<&Path>, command: Command) -> anyhow::Result<ExitCode> {
    let config = Config::load(config)?;
    match command {
        Command::Serve => serve(config).await,
        Command::Migrate => {
            let db = startup::connect_db(&config).await?;
            startup::migrate(&db).await?;
            println!("migrations applied");
            Ok(())
        }
        Command::Settle { drain } => startup::settle_role::settle(&config, drain).await,
        Command::Reconcile { repair } => reconcile(&config, repair).await,
        Command::Load { .. } => unreachable!("forwarded before the runtime starts"),
        Command::VerifyDraw(args) => return verify_draw::run(args),
        Command::SeedDemo => seed_demo(&config).await,
        Command::CreateAdmin { username } => create_admin(&config, &username).await,
        Command::RevokeAdmin { username } => revoke_admin(&config, &username).await,
    }
    .map(|()| ExitCode::SUCCESS)
}

/// `stampede load ...`: the load generator is a client, not part of the server, so
/// it is a binary of its own; this runs the `stampede-load` beside this executable
/// with the same arguments. `--config` goes along as `STAMPEDE_CONFIG`, which a
/// `--config` among the arguments still overrides. On Unix the process becomes
/// `stampede-load` (exec), so its exit status, output and Ctrl-C are the run's own.
fn forward_load(config: Option<&Path>, args: Vec<OsString>) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe()?;
    let load = exe.with_file_name(format!("stampede-load{}", std::env::consts::EXE_SUFFIX));
    let mut command = std::process::Command::new(&load);
    command.args(args);
    if let Some(config) = config {
        command.env("STAMPEDE_CONFIG", config);
    }
    let not_run = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow::anyhow!(
            "`stampede load` runs the load generator, {}, which is not there: build it \
             with `cargo build --release --bins` (or `--bin stampede-load`) and keep it \
             beside `stampede`",
            load.display()
        ),
        _ => anyhow::anyhow!("cannot run {}: {e}", load.display()),
    };
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // argv[0] "stampede load": its usage and errors name the command as typed.
        Err(not_run(command.arg0("stampede load").exec()))
    }
    #[cfg(not(unix))]
    {
        let status = command.status().map_err(not_run)?;
        Ok(ExitCode::from(
            status
                .code()
                .and_then(|c| u8::try_from(c).ok())
                .unwrap_or(1),
        ))
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let app = Application::build(config.clone()).await?;
    tracing::info!(url = %format!("http://{}:{}", config.listen.ip(), app.port()), "stampede is serving");
    app.run_until_signal().await
}

/// `stampede reconcile [--repair]`: every sale, Redis against Postgres; with
/// `--repair`, each one that disagrees rebuilt from Postgres and checked again.
async fn reconcile(config: &Config, repair: bool) -> anyhow::Result<()> {
    let db = startup::connect_db(config).await?;
    let mut redis = startup::connect_redis(config).await?;
    let keys = Keys::new(&config.redis_namespace);
    let recovery = stampede::recover::Recovery::new(
        db.clone(),
        redis.clone(),
        keys.clone(),
        Arc::new(stampede::metrics::Metrics::off()),
        startup::features(config),
    );
    let mut bad = 0;
    // A reader that left (`| head`) stops the lines, not the work (a repair goes on).
    let mut reading = true;
    for sale in stampede::sale::list::list_sales(&db, i64::MAX).await? {
        let id = sale.id;
        let failed = |what: &'static str| {
            move |e| anyhow::Error::from(e).context(format!("sale {id}: {what}"))
        };
        let mut r = stampede::sale::reconcile::reconcile(&db, &mut redis, &keys, &sale)
            .await
            .map_err(failed("reconciling"))?;
        let mut repaired = false;
        if repair && !r.consistent {
            recovery
                .rebuild(
                    stampede::recover::Target::Sale(id),
                    std::time::Duration::from_secs(30),
                )
                .await
                .map_err(failed("rebuilding"))?
                .ok_or_else(|| anyhow::anyhow!("sale {id}: another rebuild holds the lock"))?;
            let sale = stampede::sale::record::fetch_sale(&db, id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("sale {id} vanished"))?;
            r = stampede::sale::reconcile::reconcile(&db, &mut redis, &keys, &sale)
                .await
                .map_err(failed("reconciling after the rebuild"))?;
            repaired = true;
        }
        if reading && let Err(e) = print_reconciliation(&r, repaired) {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                return Err(e.into());
            }
            reading = false;
        }
        bad += usize::from(!r.consistent);
    }
    if bad > 0 {
        anyhow::bail!("{bad} sale(s) disagree between Redis and Postgres");
    }
    Ok(())
}

fn print_reconciliation(
    r: &stampede::sale::reconcile::Reconciliation,
    repaired: bool,
) -> std::io::Result<()> {
    use std::io::Write;
    writeln!(
        std::io::stdout().lock(),
        "{}sale {:>6}  {}  sold(redis) {:>7}  pending {:>6}  orders(pg) {:>7}  left {:>7}  total {:>7}{}",
        if repaired { "repaired: " } else { "" },
        r.sale_id,
        if r.consistent { "ok      " } else { "MISMATCH" },
        r.redis_sold,
        r.pending,
        r.postgres_orders,
        r.stock_left,
        r.stock_total + r.units_reoffered,
        if r.consistent {
            String::new()
        } else {
            format!(
                "  missing in pg: {:?}  missing in redis: {:?}",
                r.missing_in_postgres, r.missing_in_redis
            )
        }
    )
}

async fn seed_demo(config: &Config) -> anyhow::Result<()> {
    config.validate()?;
    let db = startup::connect_db(config).await?;
    startup::migrate(&db).await?;
    let mut redis = startup::connect_redis(config).await?;
    let keys = Keys::new(&config.redis_namespace);
    stampede::seed::seed_demo(&db, &mut redis, &keys, config).await?;
    println!("demo data ready");
    Ok(())
}

/// `stampede create-admin`: promotes an existing user (its password left alone),
/// else creates the admin with the password on the first line of stdin. Not from
/// STAMPEDE_ADMIN_PASSWORD: every serving pod has the bootstrap admin's in its
/// environment, and a second admin made in one would silently get it.
async fn create_admin(config: &Config, username: &str) -> anyhow::Result<()> {
    let username = Username::parse(username).map_err(|e| anyhow::anyhow!("{e}"))?;
    let db = startup::connect_db(config).await?;
    startup::migrate(&db).await?;
    if stampede::auth::promote_admin(&db, &username).await? {
        println!("{} is an admin now (password unchanged)", username.as_str());
        return Ok(());
    }
    eprintln!(
        "password for the new admin {} (one line on stdin):",
        username.as_str()
    );
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let raw = line.trim_end_matches(['\r', '\n']).to_string();
    let password = Password::parse(raw).map_err(|e| anyhow::anyhow!("{e}"))?;
    let user = stampede::auth::upsert_user(&db, &username, password, true)
        .await
        .map_err(|e| anyhow::Error::from(e).context("creating the admin"))?;
    println!("admin {} (id {}) ready", user.username, user.id);
    Ok(())
}

/// `stampede revoke-admin`: the account's admin flag taken and its sessions ended in
/// Postgres (one statement), then announced to the serving processes on Redis. When
/// the announcement fails the command says so and exits 1: the servers would go on
/// taking the account's tokens until they next load the record (a restart), and
/// running it again (a new generation, announced) is harmless.
async fn revoke_admin(config: &Config, username: &str) -> anyhow::Result<()> {
    let username = Username::parse(username).map_err(|e| anyhow::anyhow!("{e}"))?;
    let db = startup::connect_db(config).await?;
    startup::migrate(&db).await?;
    let Some((id, generation)) = stampede::auth::revoke_admin(&db, &username).await? else {
        match stampede::auth::is_admin_named(&db, &username).await? {
            None => anyhow::bail!("no account is named {}", username.as_str()),
            Some(_) => anyhow::bail!(
                "{} is not an admin: nothing changed (its sessions go on)",
                username.as_str()
            ),
        }
    };
    let user = stampede::domain::UserId::new(id)
        .ok_or_else(|| anyhow::anyhow!("account id {id} out of range"))?;
    let announced = async {
        let mut redis = startup::connect_redis(config).await?;
        let keys = Keys::new(&config.redis_namespace);
        stampede::auth::session::announce_end_all(&mut redis, &keys, user, generation).await?;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = announced {
        anyhow::bail!(
            "{} is no admin in Postgres now, but the servers were not told to end its sessions \
             ({e:#}): run this again once Redis answers",
            username.as_str()
        );
    }
    println!(
        "{} is no longer an admin; every session of it has ended",
        username.as_str()
    );
    Ok(())
}
