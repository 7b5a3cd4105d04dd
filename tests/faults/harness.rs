//! The processes one fault test owns: a Postgres cluster, a Redis server and one or
//! more `stampede serve` processes, all on free loopback ports, all with their data
//! and logs in one run directory under `.data/faults/`. A test can kill, stop, wipe
//! and restart each of them. Dropping the [`Stack`] kills every process it started
//! (also when the test panics; the log tails are printed then) and removes the run
//! directory.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use stampede::auth::token::{Claims, TokenKey};
use stampede::domain::Id;
use stampede::keys::Keys;

use crate::bodies::{merged, poll_body, poll_ids, sale_body};
pub use crate::db::Db;
use crate::storm::{Plan, Storm, Work};

/// Where run directories live: git-ignored, inside the worktree, so the postgres
/// user can reach them (the run dirs are made passable for it).
fn faults_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".data/faults")
}

/// Runs a blocking step (a child process, a file operation) without stalling the
/// runtime's other tasks, such as a storm running meanwhile.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn is_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false)
    })
}

/// The newest installed Postgres server binaries (`/usr/lib/postgresql/<v>/bin`).
fn pg_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
            .expect("Postgres is installed under /usr/lib/postgresql")
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                let bin = e.path().join("bin");
                bin.join("initdb").exists().then_some((v, bin))
            })
            .collect();
        versions.sort();
        versions
            .pop()
            .expect("no /usr/lib/postgresql/<version>/bin/initdb")
            .1
    })
}

/// A Postgres tool, as the postgres user when we are root (Postgres refuses root),
/// from `/` (that user may not enter the caller's directory). As scripts/services.sh.
fn pg_command(tool: &str) -> Command {
    let path = pg_bin().join(tool);
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    };
    cmd.current_dir("/").stdin(Stdio::null());
    cmd
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}): {text}",
        out.status
    );
    text
}

fn chown_postgres(path: &Path) {
    if is_root() {
        run(
            Command::new("chown").arg("-R").arg("postgres:").arg(path),
            "chown",
        );
    }
}

/// A port outside the kernel's ephemeral range (32768+), so that no outgoing
/// connection of a server can sit on it while its owner is down for a restart.
///
/// Nothing listens on a port between this call and its owner's start, so a
/// bind probe alone could hand the same port to two tests running side by side
/// (nextest runs each in a process of its own), or twice to one test (a cluster
/// asks for twelve). Each port is therefore also reserved with a file named after
/// it, created exclusively and holding this process's id; a reservation whose
/// process is gone is taken over.
pub fn free_port() -> u16 {
    let dir = std::env::temp_dir().join("stampede-test-ports");
    let _ = fs::create_dir_all(&dir);
    let mut rng = rand::rng();
    loop {
        let port = rng.random_range(20_000..32_000);
        if TcpListener::bind(("127.0.0.1", port)).is_err() || !reserve_port(&dir, port) {
            continue;
        }
        return port;
    }
}

fn reserve_port(dir: &Path, port: u16) -> bool {
    let path = dir.join(port.to_string());
    let me = std::process::id().to_string();
    for _ in 0..2 {
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => return f.write_all(me.as_bytes()).is_ok(),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = fs::read_to_string(&path).unwrap_or_default();
                let alive = holder
                    .trim()
                    .parse::<u32>()
                    .is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
                if alive || holder.trim().is_empty() {
                    return false;
                }
                // The holder is gone: drop its reservation and try once more.
                let _ = fs::remove_file(&path);
            }
            Err(_) => return false,
        }
    }
    false
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("({} missing)", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn log_file(path: &Path) -> (Stdio, Stdio) {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open log file");
    let g = f.try_clone().expect("clone log file");
    (Stdio::from(f), Stdio::from(g))
}

/// The run directory of one test: `.data/faults/<name>-<random>/`. It records the
/// test process's pid, so a later run can clean up after a test that was killed
/// before its destructors ran ([`sweep_abandoned_runs`]).
pub struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    fn create(name: &str) -> RunDir {
        let root = faults_root();
        fs::create_dir_all(&root).expect("create .data/faults");
        sweep_abandoned_runs(&root);
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let path = root.join(format!("{name}-{suffix}"));
        fs::create_dir(&path).expect("create run dir");
        fs::write(path.join("owner.pid"), std::process::id().to_string()).unwrap();
        if is_root() {
            // The postgres user must pass through every directory down to its data.
            let mut dir = path.clone();
            loop {
                run(Command::new("chmod").arg("o+x").arg(&dir), "chmod o+x");
                if !dir.pop() || dir == Path::new(env!("CARGO_MANIFEST_DIR")) {
                    break;
                }
            }
        }
        RunDir { path }
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }

    /// Notes the pid of a child, for [`sweep_abandoned_runs`].
    fn note_pid(&self, pid: u32) {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.join("children.pid"))
            .unwrap();
        use std::io::Write;
        let _ = writeln!(f, "{pid}");
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if std::env::var_os("STAMPEDE_FAULTS_KEEP").is_some() {
            eprintln!("kept {}", self.path.display());
            return;
        }
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn process_alive_as(pid: &str, names: &[&str]) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|comm| names.iter().any(|n| comm.trim().starts_with(n)))
        .unwrap_or(false)
}

/// Run directories whose test process is gone (killed by a timeout, say) still
/// hold running servers: stop those (only the ones we recorded, checked by name)
/// and remove the directory.
fn sweep_abandoned_runs(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let dir = entry.path();
        let Ok(owner) = fs::read_to_string(dir.join("owner.pid")) else {
            continue;
        };
        if Path::new(&format!("/proc/{}", owner.trim())).exists() {
            continue;
        }
        if dir.join("pg/postmaster.pid").exists() {
            let _ = pg_command("pg_ctl")
                .arg("-D")
                .arg(dir.join("pg"))
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
        for pid in fs::read_to_string(dir.join("children.pid"))
            .unwrap_or_default()
            .lines()
        {
            if process_alive_as(pid, &["redis-server", "stampede"]) {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        let _ = fs::remove_dir_all(&dir);
    }
}

/// One initialised cluster (user `stampede`, trust auth, database `stampede`),
/// made once and shared by every test process: each test copies it (`cp -a`),
/// which is much cheaper than initdb. Made in a scratch directory and renamed into
/// place, so concurrent tests never see half a template.
fn pg_template() -> PathBuf {
    let version = pg_bin()
        .parent()
        .and_then(|p| p.file_name())
        .map(|v| v.to_string_lossy().into_owned())
        .unwrap_or_default();
    let root = faults_root();
    let template = root.join(format!("pg-template-{version}"));
    if template.join("PG_VERSION").exists() {
        return template;
    }
    let scratch = RunDir::create("pg-template-build");
    let data = scratch.join("pg");
    let sock = scratch.join("sock");
    fs::create_dir(&data).unwrap();
    fs::create_dir(&sock).unwrap();
    chown_postgres(&scratch.path);
    run(
        pg_command("initdb").arg("-D").arg(&data).args([
            "-U",
            "stampede",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
        ]),
        "initdb",
    );
    let port = free_port();
    let log = scratch.join("pg.log");
    File::create(&log).unwrap();
    chown_postgres(&log);
    run(
        pg_command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .arg("-o")
            .arg(pg_options(port, &sock))
            .args(["-w", "-t", "60", "start"]),
        "pg_ctl start (template)",
    );
    let created = Command::new(pg_bin().join("psql"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-U", "stampede", "-d", "postgres", "-qtA"])
        .args(["-c", "CREATE DATABASE stampede"])
        .output();
    run(
        pg_command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-m", "fast", "-w", "stop"]),
        "pg_ctl stop (template)",
    );
    let created = created.expect("run psql");
    assert!(
        created.status.success(),
        "CREATE DATABASE: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    let _ = fs::remove_file(data.join("postmaster.opts"));
    // Another test may have won the race; then ours is simply thrown away.
    let _ = fs::rename(&data, &template);
    assert!(template.join("PG_VERSION").exists(), "no Postgres template");
    template
}

fn pg_options(port: u16, sock: &Path) -> String {
    // fsync off: a test's data need not survive a machine crash, only a process
    // crash, and the OS keeps written pages across that. synchronous_commit stays
    // on: off, a commit is acknowledged before its WAL is even written to the OS,
    // and an immediate shutdown (a crash) loses it (the postgres_outage test lost
    // the batch committed just before the crash, once settlement began at once).
    format!(
        "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
         -c synchronous_commit=on -c full_page_writes=off -c max_connections=100 \
         -c shared_buffers=32MB",
        sock.display()
    )
}

/// A private Postgres cluster on its own port.
pub struct Postgres {
    pub port: u16,
    data: PathBuf,
    sock: PathBuf,
    log: PathBuf,
    running: bool,
}

#[derive(Clone, Copy, Debug)]
pub enum PgStop {
    /// `pg_ctl stop -m fast`: clients are disconnected, a clean shutdown.
    Fast,
    /// `pg_ctl stop -m immediate`: no shutdown checkpoint, crash recovery at start.
    Immediate,
}

impl Postgres {
    fn create(dir: &RunDir) -> Postgres {
        let template = pg_template();
        let data = dir.join("pg");
        let sock = dir.join("sock");
        let log = dir.join("pg.log");
        run(
            Command::new("cp").arg("-a").arg(&template).arg(&data),
            "cp -a template",
        );
        fs::create_dir(&sock).unwrap();
        File::create(&log).unwrap();
        chown_postgres(&sock);
        chown_postgres(&log);
        chown_postgres(&data);
        Postgres {
            port: free_port(),
            data,
            sock,
            log,
            running: false,
        }
    }

    pub fn url(&self) -> String {
        format!("postgres://stampede@127.0.0.1:{}/stampede", self.port)
    }

    pub fn start(&mut self) {
        blocking(|| {
            run(
                pg_command("pg_ctl")
                    .arg("-D")
                    .arg(&self.data)
                    .arg("-l")
                    .arg(&self.log)
                    .arg("-o")
                    .arg(pg_options(self.port, &self.sock))
                    .args(["-w", "-t", "60", "start"]),
                "pg_ctl start",
            )
        });
        self.running = true;
    }

    pub fn stop(&mut self, mode: PgStop) {
        let mode = match mode {
            PgStop::Fast => "fast",
            PgStop::Immediate => "immediate",
        };
        blocking(|| {
            run(
                pg_command("pg_ctl")
                    .arg("-D")
                    .arg(&self.data)
                    .args(["-m", mode, "-w", "stop"]),
                "pg_ctl stop",
            )
        });
        self.running = false;
    }

    pub fn log(&self) -> &Path {
        &self.log
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.running {
            let _ = pg_command("pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
    }
}

/// `appendfsync` of the test's Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    Always,
    EverySec,
}

/// A private Redis (AOF on, no RDB snapshots) as a child process.
pub struct Redis {
    pub port: u16,
    pub dir: PathBuf,
    fsync: Fsync,
    /// A Redis Cluster node (`--cluster-enabled yes`) with this cluster bus port.
    bus_port: Option<u16>,
    log: PathBuf,
    child: Option<Child>,
}

impl Redis {
    fn create(run_dir: &RunDir, fsync: Fsync) -> Redis {
        Redis::create_named(run_dir, "redis", fsync, false)
    }

    fn create_named(run_dir: &RunDir, name: &str, fsync: Fsync, cluster: bool) -> Redis {
        let dir = run_dir.join(name);
        fs::create_dir(&dir).unwrap();
        Redis {
            port: free_port(),
            dir,
            fsync,
            bus_port: cluster.then(free_port),
            log: run_dir.join(&format!("{name}.log")),
            child: None,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts it (same port, same directory, so it loads its AOF) and waits until
    /// it answers and has finished loading.
    pub async fn start(&mut self, run_dir: &RunDir) {
        assert!(self.child.is_none(), "Redis is already running");
        let (out, err) = log_file(&self.log);
        let fsync = match self.fsync {
            Fsync::Always => "always",
            Fsync::EverySec => "everysec",
        };
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--appendonly", "yes", "--appendfsync", fsync])
            .args(["--save", "", "--daemonize", "no", "--maxclients", "10000"])
            // As docs/operations.md recommends (and scripts/services.sh starts).
            .args(["--lazyfree-lazy-expire", "yes"])
            // A primary is failed over 1 s after the others stop hearing from it. The
            // bus port is a free one of its own (the default, port + 10000, may not be).
            .args(match self.bus_port {
                Some(bus) => vec![
                    "--cluster-enabled".to_string(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    "nodes.conf".into(),
                    "--cluster-node-timeout".into(),
                    "1000".into(),
                    "--cluster-port".into(),
                    bus.to_string(),
                ],
                None => Vec::new(),
            })
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start redis-server");
        run_dir.note_pid(child.id());
        self.child = Some(child);
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "redis-server exited with {status}:\n{}",
                    tail(&self.log, 30)
                );
            }
            if self.loaded().await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Redis not ready in 30 s:\n{}",
                tail(&self.log, 30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// PING answers and INFO says the dataset is loaded.
    async fn loaded(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(Ok(mut conn)) = tokio::time::timeout(
            Duration::from_secs(1),
            client.get_multiplexed_async_connection(),
        )
        .await
        else {
            return false;
        };
        let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
        let info: redis::RedisResult<String> = redis::cmd("INFO")
            .arg("persistence")
            .query_async(&mut conn)
            .await;
        matches!(pong.as_deref(), Ok("PONG"))
            && info.is_ok_and(|i| i.lines().any(|l| l.trim() == "loading:0"))
    }

    /// `kill -9`: no AOF flush, no goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the process stays, but answers nothing (replication stops too).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`Redis::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let pid = child.id().to_string();
            blocking(|| {
                let status = Command::new("kill").args([signal, &pid]).status();
                assert!(status.is_ok_and(|s| s.success()), "kill {signal} {pid}");
            });
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// `CLIENT KILL TYPE replica`: this primary drops the links of its replicas.
    /// Writes from then on stay in its own memory until a replica reconnects.
    pub fn drop_replica_links(&self) {
        let port = self.port.to_string();
        let out = blocking(|| {
            Command::new("redis-cli")
                .args(["-p", &port, "client", "kill", "type", "replica"])
                .output()
                .expect("redis-cli client kill")
        });
        assert!(out.status.success(), "CLIENT KILL TYPE replica failed");
    }

    /// `redis-cli shutdown`: Redis flushes and fsyncs its AOF, then exits.
    pub fn shutdown(&mut self) {
        let port = self.port.to_string();
        blocking(|| {
            // The connection drops when Redis exits, so the exit status says little.
            let _ = Command::new("redis-cli")
                .args(["-p", &port, "shutdown"])
                .output();
            if let Some(mut child) = self.child.take() {
                wait_for_exit(
                    &mut child,
                    Duration::from_secs(20),
                    "Redis did not shut down",
                );
            }
        });
    }

    /// The AOF increment file (Redis 7: the `type i` file of the manifest in
    /// `appendonlydir/`), where every write since the last rewrite goes.
    pub fn aof_incr_file(&self) -> PathBuf {
        let aof_dir = self.dir.join("appendonlydir");
        let manifest = fs::read_dir(&aof_dir)
            .expect("appendonlydir")
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "manifest"))
            .expect("an AOF manifest");
        let text = fs::read_to_string(&manifest).unwrap();
        // Lines like `file appendonly.aof.1.incr.aof seq 1 type i`; the last is current.
        let name = text
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .collect::<Vec<_>>()
                    .ends_with(&["type", "i"])
            })
            .filter_map(|l| l.split_whitespace().nth(1))
            .next_back()
            .unwrap_or_else(|| panic!("no increment file in {text}"));
        aof_dir.join(name)
    }

    pub fn log(&self) -> &Path {
        &self.log
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One shard of a [`Cluster`]: indexes into `Cluster::nodes`.
#[derive(Clone, Debug)]
pub struct Shard {
    pub primary: usize,
    pub replicas: Vec<usize>,
}

/// A Redis Cluster of three primaries with one replica each: six `redis-server`
/// processes with `--cluster-enabled yes`, joined by `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    async fn start(run_dir: &RunDir, fsync: Fsync) -> Cluster {
        let mut nodes: Vec<Redis> = (0..6)
            .map(|i| Redis::create_named(run_dir, &format!("cluster-{i}"), fsync, true))
            .collect();
        for node in &mut nodes {
            node.start(run_dir).await;
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = blocking(|| {
            Command::new("redis-cli")
                .arg("--cluster")
                .arg("create")
                .args(&addrs)
                .args(["--cluster-replicas", "1", "--cluster-yes"])
                .output()
                .expect("redis-cli --cluster create")
        });
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster { nodes };
        cluster.wait_healthy(Duration::from_secs(30)).await;
        cluster
    }

    /// `STAMPEDE_REDIS_CLUSTER`: every node, so the servers find the cluster even
    /// when some are down.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(Redis::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port == port)
    }

    /// `cmd` on node `node` (a second to connect, a second to answer), or `None`.
    pub async fn query<T: redis::FromRedisValue>(
        &self,
        node: usize,
        cmd: &redis::Cmd,
    ) -> Option<T> {
        let mut conn = connect_within_a_second(&self.nodes[node].url()).await?;
        tokio::time::timeout(Duration::from_secs(1), cmd.query_async(&mut conn))
            .await
            .ok()?
            .ok()
    }

    /// Waits until `replica` has applied everything `primary` had written when this
    /// was called, and returns that moment: every write answered before it is on the
    /// replica. (Replication is asynchronous: a decision answered a moment before a
    /// replica stops may still be in flight to it, in either node's socket buffers.)
    pub async fn replicated_up_to_now(&self, primary: usize, replica: usize) -> Instant {
        let at = Instant::now();
        let target = self
            .repl_offset(primary, "master_repl_offset")
            .await
            .expect("the primary's replication offset");
        let deadline = at + Duration::from_secs(10);
        loop {
            let applied = self.repl_offset(replica, "slave_repl_offset").await;
            if applied.is_some_and(|o| o >= target) {
                return at;
            }
            assert!(
                Instant::now() < deadline,
                "the replica did not reach offset {target} in 10 s (at {applied:?})"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn repl_offset(&self, node: usize, field: &str) -> Option<i64> {
        let info: String = self
            .query(node, redis::cmd("INFO").arg("replication"))
            .await?;
        info.lines()
            .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.parse().ok())
    }

    /// The shards as the first running node sees them (`CLUSTER NODES`).
    pub async fn shards(&self) -> Vec<Shard> {
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.is_running() {
                continue;
            }
            let Some(text) = self
                .query::<String>(i, redis::cmd("CLUSTER").arg("NODES"))
                .await
            else {
                continue;
            };
            // <id> <ip:port@cport> <flags> <master id or -> ... <slots>
            let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
            let port_of = |fields: &[&str]| -> Option<u16> {
                fields
                    .get(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()
            };
            let mut shards = Vec::new();
            for fields in &lines {
                let flags = fields.get(2).copied().unwrap_or("");
                if !flags.contains("master") || flags.contains("fail") {
                    continue;
                }
                let Some(primary) = port_of(fields).and_then(|p| self.index_of_port(p)) else {
                    continue;
                };
                let replicas = lines
                    .iter()
                    .filter(|r| r.get(3) == fields.first() && !r[2].contains("fail"))
                    .filter_map(|r| port_of(r).and_then(|p| self.index_of_port(p)))
                    .collect();
                shards.push(Shard { primary, replicas });
            }
            return shards;
        }
        panic!("no cluster node answers CLUSTER NODES");
    }

    /// The index of the node that is primary for `key` now.
    pub async fn primary_of(&self, key: &str) -> usize {
        let live = (0..self.nodes.len())
            .find(|&i| self.nodes[i].is_running())
            .expect("a running node");
        let slot: i64 = self
            .query(live, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .await
            .expect("CLUSTER KEYSLOT");
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.is_running() {
                continue;
            }
            let Some(ranges) = self
                .query::<Vec<Vec<redis::Value>>>(i, redis::cmd("CLUSTER").arg("SLOTS"))
                .await
            else {
                continue;
            };
            for range in ranges {
                let (Some(start), Some(end), Some(redis::Value::Array(owner))) =
                    (range.first(), range.get(1), range.get(2))
                else {
                    continue;
                };
                let start: i64 = redis::from_redis_value(start.clone()).unwrap_or(-1);
                let end: i64 = redis::from_redis_value(end.clone()).unwrap_or(-1);
                if (start..=end).contains(&slot) {
                    let port: i64 = redis::from_redis_value(owner[1].clone()).unwrap();
                    return self.index_of_port(port as u16).expect("a node of ours");
                }
            }
            break;
        }
        panic!("no owner found for the slot of {key}");
    }

    /// Waits until every running node says `cluster_state:ok` and every running
    /// replica's link to its primary is up.
    pub async fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let mut healthy = true;
            for (i, node) in self.nodes.iter().enumerate() {
                if !node.is_running() {
                    continue;
                }
                let state: Option<String> = self.query(i, redis::cmd("CLUSTER").arg("INFO")).await;
                let info: Option<String> =
                    self.query(i, redis::cmd("INFO").arg("replication")).await;
                let ok = state.is_some_and(|s| s.lines().any(|l| l.trim() == "cluster_state:ok"))
                    && info.is_some_and(|r| {
                        r.lines().any(|l| l.trim() == "role:master")
                            || r.lines().any(|l| l.trim() == "master_link_status:up")
                    });
                healthy &= ok;
            }
            if healthy {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster is not healthy after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What every `stampede serve` of one stack is started with.
#[derive(Clone)]
pub struct ServerEnv {
    pub database_url: String,
    pub redis_url: String,
    pub namespace: String,
    pub secret: String,
    /// A config file with rate-limit policies: limits on, else off.
    pub limits: Option<PathBuf>,
    /// `STAMPEDE_REDIS_CLUSTER`, when the stack runs on a [`Cluster`].
    pub redis_cluster: Option<String>,
    /// More `STAMPEDE_*` settings for every server.
    pub extra: Vec<(String, String)>,
}

/// One `stampede serve` process.
pub struct Server {
    pub port: u16,
    pub index: usize,
    log: PathBuf,
    child: Option<Child>,
    /// Its own settings (Redis and Postgres through its fault proxies), not the
    /// stack's.
    env: Option<ServerEnv>,
}

impl Server {
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn spawn(&mut self, env: &ServerEnv, run_dir: &RunDir) {
        assert!(self.child.is_none(), "server {} is running", self.index);
        let (out, err) = log_file(&self.log);
        let child = Command::new(env!("CARGO_BIN_EXE_stampede"))
            .arg("serve")
            .env("STAMPEDE_LISTEN", format!("127.0.0.1:{}", self.port))
            // Several servers run at once: no fixed metrics port; `/metrics` on
            // the main listener, with the token (`Stack::scrape`).
            .env("STAMPEDE_METRICS_LISTEN", "off")
            .env("STAMPEDE_METRICS_TOKEN", METRICS_TOKEN)
            .env("DATABASE_URL", &env.database_url)
            .env("REDIS_URL", &env.redis_url)
            .env_remove("STAMPEDE_REDIS_CLUSTER")
            .envs(
                env.redis_cluster
                    .iter()
                    .map(|c| ("STAMPEDE_REDIS_CLUSTER", c)),
            )
            .envs(env.extra.iter().map(|(k, v)| (k, v)))
            .env("STAMPEDE_REDIS_NAMESPACE", &env.namespace)
            .env("STAMPEDE_TOKEN_SECRET", &env.secret)
            .env(
                "STAMPEDE_LIMITS",
                if env.limits.is_some() { "on" } else { "off" },
            )
            // A killed server's unacknowledged entries are taken over quickly.
            .env("STAMPEDE_SETTLE_CLAIM_IDLE_MS", "2000")
            .env("STAMPEDE_WORKERS", "2")
            // Every 4xx is a warning of tracing-actix-web: too loud for a storm.
            .env(
                "RUST_LOG",
                "warn,tracing_actix_web=error,redis::cluster_handling=error",
            )
            .env_remove("STAMPEDE_CONFIG")
            .envs(env.limits.iter().map(|p| ("STAMPEDE_CONFIG", p)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start stampede serve");
        run_dir.note_pid(child.id());
        self.child = Some(child);
    }

    async fn wait_ready(&mut self, http: &Client) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let url = format!("{}/readyz", self.base());
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "stampede serve #{} exited with {status}:\n{}",
                    self.index,
                    tail(&self.log, 40)
                );
            }
            if let Ok(r) = http.get(&url).send().await
                && r.status() == StatusCode::OK
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "stampede serve #{} not ready in 60 s:\n{}",
                self.index,
                tail(&self.log, 40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `kill -9`: no graceful shutdown, the settlement worker's batch stays pending.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, and wait (up to 30 s) until it has exited.
    pub fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            blocking(|| {
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                let within = Duration::from_secs(30);
                wait_for_exit(
                    &mut child,
                    within,
                    "stampede serve did not stop after SIGTERM",
                );
            });
        }
    }

    pub fn log(&self) -> &Path {
        &self.log
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// What [`Stack::post_until_decided`] met on its way, over all its calls.
#[derive(Debug, Default)]
pub struct Retried {
    /// 503s (each with `Retry-After` and an error code), sent again.
    pub unavailable: AtomicUsize,
    /// Attempts without an answer (a killed server, a reset), sent again.
    pub unanswered: AtomicUsize,
    /// Answers that replayed an earlier attempt's (`Idempotent-Replayed: true`).
    pub replayed: AtomicUsize,
}

#[derive(Clone, Debug)]
pub struct User {
    pub id: i64,
    pub token: String,
}

/// The servers' `STAMPEDE_METRICS_TOKEN` (`/metrics` on their main listener).
const METRICS_TOKEN: &str = "fault-metrics-token";

pub struct Options {
    pub servers: usize,
    pub fsync: Fsync,
    /// Rate-limit policies (TOML `[[limits.policies]]`): limits on with these;
    /// `None`: limits off.
    pub limits: Option<&'static str>,
    /// Run on a [`Cluster`] of three primaries with a replica each, not on the one
    /// Redis (which still starts, unused).
    pub cluster: bool,
    /// More `STAMPEDE_*` settings for every server.
    pub extra: Vec<(&'static str, &'static str)>,
    /// Every server's Redis and Postgres links through fault proxies of its own
    /// ([`Stack::links`]).
    pub proxied: bool,
}

impl Options {
    /// The defaults, with `servers` servers, each linked to Redis and Postgres
    /// through fault proxies of its own ([`Stack::links`]).
    pub fn proxied(servers: usize) -> Options {
        Options {
            servers,
            proxied: true,
            ..Options::default()
        }
    }

    /// The defaults, with Redis syncing its AOF as `fsync` says.
    pub fn fsync(fsync: Fsync) -> Options {
        Options {
            fsync,
            ..Options::default()
        }
    }

    /// These options with `extra` settings (`STAMPEDE_*`) for every server.
    pub fn with(self, extra: &[(&'static str, &'static str)]) -> Options {
        Options {
            extra: extra.to_vec(),
            ..self
        }
    }

    /// The defaults, with `servers` servers.
    pub fn servers(servers: usize) -> Options {
        Options {
            servers,
            ..Options::default()
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            servers: 1,
            fsync: Fsync::Always,
            limits: None,
            cluster: false,
            extra: Vec::new(),
            proxied: false,
        }
    }
}

/// Waits (blocking) for `child` to exit; past `within`, kills it and fails the
/// test with `what`.
fn wait_for_exit(child: &mut Child, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} in {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection to the Redis at `url`, if one is made within a second.
pub async fn connect_within_a_second(url: &str) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    let connecting = client.get_multiplexed_async_connection();
    tokio::time::timeout(Duration::from_secs(1), connecting)
        .await
        .ok()?
        .ok()
}

/// One test's world. Fields drop in order: servers, then Redis, then Postgres,
/// then the run directory.
pub struct Stack {
    pub servers: Vec<Server>,
    /// The fault proxies of each server started with [`Options::proxied`] (or
    /// [`Stack::add_proxied_server`]), by server index.
    pub links: Vec<crate::proxy::Links>,
    pub cluster: Option<Cluster>,
    pub redis: Redis,
    pub pg: Postgres,
    pub db: PgPool,
    pub keys: Keys,
    pub tokens: TokenKey,
    pub http: Client,
    pub admin: User,
    pub env: ServerEnv,
    pub dir: RunDir,
    started: Instant,
}

impl Db for Stack {
    fn pool(&self) -> &PgPool {
        &self.db
    }
}

impl Stack {
    /// Starts Postgres, Redis and `options.servers` servers (which migrate the
    /// database), and creates an admin user.
    pub async fn start(name: &str, options: Options) -> Stack {
        let dir = blocking(|| RunDir::create(name));
        let started = Instant::now();
        let mut pg = blocking(|| Postgres::create(&dir));
        pg.start();
        let mut redis = Redis::create(&dir, options.fsync);
        redis.start(&dir).await;
        let cluster = match options.cluster {
            true => Some(Cluster::start(&dir, options.fsync).await),
            false => None,
        };
        let env = ServerEnv {
            redis_cluster: cluster.as_ref().map(Cluster::urls),
            extra: options
                .extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            database_url: pg.url(),
            redis_url: redis.url(),
            namespace: format!("f{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            secret: stampede::auth::random_token_hex(32),
            limits: options.limits.map(|policies| {
                let path = dir.join("limits.toml");
                std::fs::write(&path, policies).expect("write the limits config");
                path
            }),
        };
        let http = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(512)
            // Below actix's 5 s wait for a connection's first request: a connection
            // the pool opened but did not use is closed by us, not answered 408.
            .pool_idle_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(15))
            .build()
            .unwrap();
        let db = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&env.database_url)
            .await
            .expect("connect to the test's Postgres");
        let tokens = TokenKey::new(env.secret.as_bytes());
        let mut stack = Stack {
            servers: Vec::new(),
            links: Vec::new(),
            cluster,
            redis,
            pg,
            db,
            keys: Keys::new(&env.namespace),
            tokens,
            http,
            admin: User {
                id: 0,
                token: String::new(),
            },
            env,
            dir,
            started,
        };
        for _ in 0..options.servers {
            match options.proxied {
                true => stack.add_proxied_server().await,
                false => stack.add_server().await,
            };
        }
        stack.admin = stack.create_users(1, true).await.pop().unwrap();
        println!(
            "stack {name}: postgres :{}, redis :{} ({:?}), servers {:?}, ready in {:.1?}",
            stack.pg.port,
            stack.redis.port,
            options.fsync,
            stack.servers.iter().map(|s| s.port).collect::<Vec<_>>(),
            stack.started.elapsed()
        );
        stack
    }

    /// Starts one more server on the same stores; returns its index.
    pub async fn add_server(&mut self) -> usize {
        self.add_server_with(None).await
    }

    /// Starts one more server whose Redis and Postgres links go through fault
    /// proxies of its own (see `proxy.rs`, kept in [`Stack::links`]); returns its
    /// index.
    pub async fn add_proxied_server(&mut self) -> usize {
        let links = crate::proxy::Links {
            redis: crate::proxy::Proxy::start(self.redis.port).await,
            pg: crate::proxy::Proxy::start(self.pg.port).await,
        };
        let env = ServerEnv {
            redis_url: links.redis.redis_url(),
            database_url: links.pg.postgres_url(),
            ..self.env.clone()
        };
        let index = self.add_server_with(Some(env)).await;
        self.links.push(links);
        index
    }

    async fn add_server_with(&mut self, env: Option<ServerEnv>) -> usize {
        let index = self.servers.len();
        let mut server = Server {
            port: free_port(),
            index,
            log: self.dir.join(&format!("server-{index}.log")),
            child: None,
            env,
        };
        let env = server.env.clone().unwrap_or_else(|| self.env.clone());
        server.spawn(&env, &self.dir);
        server.wait_ready(&self.http).await;
        self.servers.push(server);
        index
    }

    /// Starts a stopped or killed server again, on its port.
    pub async fn restart_server(&mut self, index: usize) {
        let server = &mut self.servers[index];
        let env = server.env.clone().unwrap_or_else(|| self.env.clone());
        server.spawn(&env, &self.dir);
        server.wait_ready(&self.http).await;
    }

    pub async fn start_redis(&mut self) {
        self.redis.start(&self.dir).await;
    }

    pub fn bases(&self) -> Vec<String> {
        self.servers.iter().map(Server::base).collect()
    }

    /// The servers that run now.
    pub fn live_bases(&self) -> Vec<String> {
        self.servers
            .iter()
            .filter(|s| s.is_running())
            .map(Server::base)
            .collect()
    }

    /// POSTs `path` as `token` under the `Idempotency-Key` `key` until decided: no
    /// answer, or a 503 (which must carry `Retry-After` and an error code), is sent
    /// again after `pause` under the same key, to the next server that is up,
    /// `tries` times at most; each counted in `seen`, with the answers that were
    /// replays. Any other 5xx fails the test. Returns the status and the body.
    pub async fn post_until_decided(
        &self,
        path: &str,
        token: &str,
        key: &str,
        (tries, pause): (usize, Duration),
        seen: &Retried,
    ) -> (u16, Value) {
        for attempt in 0..tries {
            let bases = self.live_bases();
            let base = &bases[attempt % bases.len().max(1)];
            let resp = self
                .http
                .post(format!("{base}{path}"))
                .bearer_auth(token)
                .header("Idempotency-Key", key)
                .send()
                .await;
            let Ok(resp) = resp else {
                seen.unanswered.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(pause).await;
                continue;
            };
            let status = resp.status().as_u16();
            let retry_after = resp.headers().contains_key(reqwest::header::RETRY_AFTER);
            if resp
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true")
            {
                seen.replayed.fetch_add(1, Ordering::Relaxed);
            }
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            if status == 503 {
                assert!(
                    retry_after && body["error"].is_string(),
                    "a 503 to {path} without Retry-After or error code: {body}"
                );
                seen.unavailable.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(pause).await;
                continue;
            }
            assert!(status < 500, "{path}: {status} {body}");
            return (status, body);
        }
        panic!("{path} undecided after {tries} tries");
    }

    /// Accepted orders not yet in Postgres (the sales' pending hashes).
    pub async fn pending_orders(&self, sales: &[i64]) -> i64 {
        let mut pipe = redis::pipe();
        for &sale in sales {
            pipe.hlen(self.keys.sale(Id::new(sale).unwrap()).pending);
        }
        let counts: Vec<i64> = pipe
            .query_async(&mut self.redis().await)
            .await
            .expect("HLEN pending");
        counts.iter().sum()
    }

    /// Asks Postgres every 50 ms for the count `query` answers about `sales` (its
    /// `$1`) until it is `want`; fails after `within`, naming `what` it counted.
    pub async fn wait_for_count(
        &self,
        query: &'static str,
        sales: &[i64],
        want: i64,
        within: Duration,
        what: &str,
    ) {
        let deadline = Instant::now() + within;
        loop {
            let count: i64 = self.scalar(query, sales).await;
            if count == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{count} {what}, not {want}, after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every one of these sales has an order in Postgres: then the
    /// settlement workers know their streams (they re-read the list every 2 s).
    pub async fn wait_settling(&self, sales: &[i64]) {
        let query = "SELECT count(DISTINCT sale_id) FROM orders WHERE sale_id = ANY($1)";
        let (want, within) = (sales.len() as i64, Duration::from_secs(20));
        self.wait_for_count(query, sales, want, within, "sales with a settled order")
            .await;
    }

    /// Waits (up to 20 s) until no stock change of these sales is left pending,
    /// i.e. recorded (answered 202) but not yet applied to both stores.
    pub async fn wait_stock_changes_applied(&self, sales: &[i64]) {
        let query =
            "SELECT count(*) FROM stock_changes WHERE sale_id = ANY($1) AND status = 'pending'";
        let within = Duration::from_secs(20);
        self.wait_for_count(query, sales, 0, within, "stock changes still pending")
            .await;
    }

    /// Waits (up to 30 s) until Postgres holds `n` orders of these sales.
    pub async fn wait_orders_in_postgres(&self, sales: &[i64], n: i64) {
        let query = "SELECT count(*) FROM orders WHERE sale_id = ANY($1)";
        let within = Duration::from_secs(30);
        self.wait_for_count(query, sales, n, within, "orders in Postgres")
            .await;
    }

    /// The settlement consumers that have read this sale's order stream.
    pub async fn consumers(&self, sale: i64) -> Vec<String> {
        let reply: redis::RedisResult<redis::streams::StreamInfoConsumersReply> =
            redis::cmd("XINFO")
                .arg("CONSUMERS")
                .arg(self.keys.sale(Id::new(sale).unwrap()).orders)
                .arg("settle")
                .query_async(&mut self.redis().await)
                .await;
        reply
            .map(|r| r.consumers.into_iter().map(|c| c.name).collect())
            .unwrap_or_default()
    }

    /// Unacknowledged order entries per settlement consumer, over these sales. A
    /// sale whose stream or `settle` group does not exist yet (`NOGROUP`) holds
    /// none; any other error fails the test.
    pub async fn pending_by_consumer(&self, sales: &[i64]) -> BTreeMap<String, usize> {
        let mut conn = self.redis().await;
        let mut out = BTreeMap::new();
        for &sale in sales {
            let stream = self.keys.sale(Id::new(sale).unwrap()).orders;
            let reply: redis::RedisResult<redis::streams::StreamPendingReply> =
                redis::cmd("XPENDING")
                    .arg(&stream)
                    .arg("settle")
                    .query_async(&mut conn)
                    .await;
            match reply {
                Ok(redis::streams::StreamPendingReply::Data(data)) => {
                    for c in data.consumers {
                        *out.entry(c.name).or_default() += c.pending;
                    }
                }
                // `Empty`: nothing pending.
                Ok(_) => {}
                Err(e) if e.code() == Some("NOGROUP") => {}
                Err(e) => panic!("XPENDING {stream} settle: {e}"),
            }
        }
        out
    }

    /// A server that runs (for admin calls and checks).
    pub fn live_base(&self) -> String {
        self.servers
            .iter()
            .find(|s| s.is_running())
            .expect("a running server")
            .base()
    }

    /// Inserts `n` users in one statement (no argon2) and mints their tokens with
    /// the servers' secret.
    pub async fn create_users(&self, n: usize, admin: bool) -> Vec<User> {
        let ids = self.insert_users(n, admin).await;
        ids.into_iter()
            .map(|id| User {
                id,
                token: self.tokens.issue(Claims {
                    user_id: Id::new(id).unwrap(),
                    admin,
                    expires_at: chrono::Utc::now().timestamp() + 3600,
                    generation: 0,
                    session: rand::random(),
                    account_created: None,
                }),
            })
            .collect()
    }

    async fn admin_post(&self, path: &str, body: &Value) -> Value {
        let resp = self
            .http
            .post(format!("{}{path}", self.live_base()))
            .bearer_auth(&self.admin.token)
            .json(body)
            .send()
            .await
            .expect("admin request");
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert_eq!(status, StatusCode::CREATED, "POST {path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// A live sale (opened 5 s ago, open for an hour) with this stock.
    pub async fn create_sale(&self, stock: i64) -> i64 {
        self.create_sale_with(stock, json!({})).await
    }

    /// A live sale like [`Stack::create_sale`] with a payment step: settled orders
    /// wait `window_s` seconds for their payment; `rebuy` is `rebuy_after_expiry`.
    pub async fn create_payment_sale(&self, stock: i64, window_s: i64, rebuy: bool) -> i64 {
        let extra = json!({ "payment_window_s": window_s, "rebuy_after_expiry": rebuy });
        self.create_sale_with(stock, extra).await
    }

    /// [`Stack::create_sale`] with `extra` fields over its defaults.
    pub async fn create_sale_with(&self, stock: i64, extra: Value) -> i64 {
        let described = json!({ "description": "fault injection" });
        let sale = merged(
            sale_body("Fault test phone", 19_900, stock, 5, &described),
            &extra,
        );
        self.admin_post("/api/admin/sales", &sale).await["id"]
            .as_i64()
            .unwrap()
    }

    /// The shoppers and sales of the storm scenarios: 1,500 users and a live sale of
    /// each of [`crate::STOCKS`].
    pub async fn shoppers_and_sales(&self) -> (Vec<User>, Vec<i64>) {
        let users = self.create_users(1500, false).await;
        let sales = self.create_sales(&crate::STOCKS).await;
        (users, sales)
    }

    /// A storm of `work` over the stack's servers, paced by `plan`.
    pub fn storm(&self, work: Vec<Work>, plan: Plan) -> Storm {
        Storm::start(&self.http, self.bases(), work, plan)
    }

    pub async fn create_sales(&self, stocks: &[i64]) -> Vec<i64> {
        let mut ids = Vec::new();
        for &s in stocks {
            ids.push(self.create_sale(s).await);
        }
        ids
    }

    /// An open poll; returns its id and option ids.
    pub async fn create_poll(&self, options: &[&str]) -> (i64, Vec<i64>) {
        self.create_poll_with(options, json!({})).await
    }

    /// [`Stack::create_poll`] with `extra` fields over its defaults (a ballot kind
    /// and its settings).
    pub async fn create_poll_with(&self, options: &[&str], extra: Value) -> (i64, Vec<i64>) {
        let poll = poll_body("Which colour?", options, (-5, 3600), &extra);
        poll_ids(&self.admin_post("/api/admin/polls", &poll).await)
    }

    /// A fresh connection to the test's Redis (it may have been restarted): the
    /// cluster when the stack runs on one.
    pub async fn redis(&self) -> stampede::redis_conn::Redis {
        self.try_redis().await.expect("connect to the test's Redis")
    }

    /// [`Stack::redis`], or `None` while it cannot connect.
    pub async fn try_redis(&self) -> Option<stampede::redis_conn::Redis> {
        let target = match &self.cluster {
            Some(c) => stampede::redis_conn::Target::Cluster(
                c.nodes
                    .iter()
                    .filter(|n| n.is_running())
                    .map(Redis::url)
                    .collect(),
            ),
            None => stampede::redis_conn::Target::Node(self.redis.url()),
        };
        stampede::redis_conn::Redis::connect(
            &target,
            stampede::redis_conn::Timeouts {
                connect: Duration::from_secs(2),
                response: Some(Duration::from_secs(5)),
                resend: true,
            },
        )
        .await
        .ok()
    }

    /// `FLUSHALL`: Redis forgets everything, the servers keep running.
    pub async fn flushall(&self) {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut self.redis().await)
            .await
            .expect("FLUSHALL");
    }

    /// `GET /readyz` of one server (ready to decide: Redis answers): status and body.
    pub async fn readyz(&self, index: usize) -> Option<(StatusCode, Value)> {
        self.readiness(index, "/readyz").await
    }

    /// One scrape of a server's `/metrics`, as Prometheus makes it (answered
    /// within its 5 s scrape timeout, else `None`).
    pub async fn scrape(&self, index: usize) -> Option<String> {
        let resp = self
            .http
            .get(format!("{}/metrics", self.servers[index].base()))
            .bearer_auth(METRICS_TOKEN)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.text().await.ok()
    }

    /// `GET /readyz/postgres` of one server (every route: Postgres answers too).
    pub async fn readyz_postgres(&self, index: usize) -> Option<(StatusCode, Value)> {
        self.readiness(index, "/readyz/postgres").await
    }

    async fn readiness(&self, index: usize, path: &str) -> Option<(StatusCode, Value)> {
        let resp = self
            .http
            .get(format!("{}{path}", self.servers[index].base()))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        let status = resp.status();
        Some((status, resp.json().await.unwrap_or(Value::Null)))
    }

    /// Prints the tail of every log (the test is failing).
    fn print_logs(&self) {
        for s in &self.servers {
            eprintln!(
                "----- server #{} log ({}):\n{}",
                s.index,
                s.log.display(),
                tail(&s.log, 40)
            );
            // Errors first seen earlier than the tail.
            let errors: Vec<String> = fs::read_to_string(&s.log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(" ERROR "))
                .take(10)
                .map(String::from)
                .collect();
            if !errors.is_empty() {
                eprintln!("----- server #{} errors:\n{}", s.index, errors.join("\n"));
            }
        }
        eprintln!("----- redis log:\n{}", tail(self.redis.log(), 20));
        for (i, node) in self.cluster.iter().flat_map(|c| c.nodes.iter().enumerate()) {
            eprintln!("----- cluster node {i} log:\n{}", tail(node.log(), 15));
        }
        eprintln!("----- postgres log:\n{}", tail(self.pg.log(), 20));
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_logs();
        }
    }
}
