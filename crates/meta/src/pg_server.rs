//! A real, throw-away PostgreSQL server (feature `pg-server`; the tests get
//! it through `testing::PgServer`, `nasd bench untar` directly): `initdb`
//! into a fresh directory (UTF-8, default collation ICU `en-US`, which does
//! not sort by bytes), `postgres` on a free 127.0.0.1 port with trust
//! authentication, removed again when the process is done with it.
//!
//! `initdb` and `postgres` refuse to run as root: as root the server runs
//! as the unprivileged user `postgres` (Debian's package makes it), through
//! `setpriv`, in a directory that user owns; otherwise as the current user.
//! The binaries are looked for in `$NASD_PG_BIN`, then the newest
//! `/usr/lib/postgresql/*/bin`, then `$PATH`; `.ci/run` installs Debian's
//! `postgresql` package where they are missing.
//!
//! The server is watched by a small shell (its guardian) whose standard
//! input is a pipe from the test process: when the pipe closes — the
//! [`PgServer`] is dropped, or the test process exits or is killed — the
//! guardian stops the server (fast shutdown) and removes its directory. So
//! a server kept in a `static` for a whole test binary does not outlive it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Longest wait for a started server to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Tries at a free port: another process may take the one we picked before
/// the server binds it.
const PORT_TRIES: u32 = 5;
/// The unprivileged account the server runs as when the tests run as root.
const SERVER_USER: &str = "postgres";

/// A running test server. See the module documentation.
pub struct PgServer {
    port: u16,
    /// The address it listens on.
    host: std::net::IpAddr,
    dir: PathBuf,
    guardian: Child,
    /// The guardian's standard output (what it answers to `kill` and `start`).
    answers: std::sync::Mutex<BufReader<std::process::ChildStdout>>,
    databases: AtomicU64,
    /// The CA that signed the server's certificate (PEM file), with [`PgServerOptions::tls`].
    ca: Option<PathBuf>,
}

/// The role [`PgServerOptions::password`] makes: it logs in with that password only
/// (`scram-sha-256`), and may create databases.
pub const PASSWORD_ROLE: &str = "nasd";

/// How [`PgServer::start_with`] sets a server up; the default is
/// [`PgServer::start`]'s: clear text, trust, on 127.0.0.1.
#[derive(Debug, Clone, Default)]
pub struct PgServerOptions {
    /// Serve TLS with a certificate for `listen` (and `localhost`) signed by
    /// a CA of its own ([`PgServer::ca_cert`]).
    pub tls: bool,
    /// Make the role [`PASSWORD_ROLE`] with this password (set over SQL, on
    /// no command line). With `tls`, it may log in over TLS only.
    pub password: Option<String>,
    /// The address to listen on [default: 127.0.0.1].
    pub listen: Option<std::net::IpAddr>,
    /// A command the server runs under (e.g. `ip netns exec NS`), before
    /// `setpriv` and `postgres`.
    pub wrap: Vec<String>,
    /// Commit synchronously (`synchronous_commit=on`), so that a commit the
    /// server acknowledged survives [`PgServer::kill`]; the default
    /// (`off`, faster) may lose the last ones.
    pub durable_commits: bool,
}

impl std::fmt::Debug for PgServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgServer").field("port", &self.port).field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// Output of a command that must succeed.
fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("cannot run {what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The directory holding `initdb` and `postgres`.
fn bin_dir() -> Result<PathBuf, String> {
    let has = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Some(d) = std::env::var_os("NASD_PG_BIN") {
        let d = PathBuf::from(d);
        return if has(&d) { Ok(d) } else { Err(format!("$NASD_PG_BIN={} holds no initdb and postgres", d.display())) };
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, d)| has(d))
        .collect();
    versions.sort();
    if let Some((_, d)) = versions.pop() {
        return Ok(d);
    }
    for d in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        if let Ok(initdb) = d.join("initdb").canonicalize() {
            if let Some(real) = initdb.parent().filter(|r| has(r)) {
                return Ok(real.to_path_buf());
            }
        }
    }
    Err("PostgreSQL server binaries (initdb, postgres) not found in $NASD_PG_BIN, /usr/lib/postgresql/*/bin or \
         $PATH: install them (`apt-get install -y postgresql`; .ci/run does)"
        .into())
}

/// `(uid, gid)` of the server's account when running as root, `None` when
/// not root.
fn server_account() -> Result<Option<(u32, u32)>, String> {
    let me = run(Command::new("id").arg("-u"), "id -u")?;
    if me != "0" {
        return Ok(None);
    }
    let id = |flag: &str| -> Result<u32, String> {
        run(Command::new("id").args([flag, SERVER_USER]), &format!("id {flag} {SERVER_USER}"))
            .map_err(|e| format!("tests run as root need the user '{SERVER_USER}' to run PostgreSQL: {e}"))?
            .parse()
            .map_err(|e| format!("id {flag} {SERVER_USER}: {e}"))
    };
    Ok(Some((id("-u")?, id("-g")?)))
}

/// `program` as the server's account (through `setpriv` as root).
fn as_server(account: Option<(u32, u32)>, program: &Path) -> Command {
    match account {
        None => Command::new(program),
        Some((uid, gid)) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={gid}"))
                .arg("--clear-groups")
                .arg("--reset-env")
                .arg("--")
                .arg(program);
            c
        }
    }
}

/// Whether process `pid` runs (not gone, not a zombie its parent has not
/// reaped yet).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z' | 'X'))
}

fn free_port() -> Result<u16, String> {
    free_loopback_port().map_err(|e| format!("no free port: {e}"))
}

/// Lowest port [`free_loopback_port`] hands out.
const TEST_PORT_MIN: u16 = 10_000;

/// A loopback port free now, chosen at random below the kernel's ephemeral
/// range (`ip_local_port_range`) so that no outgoing connection takes it
/// while it is closed: a server restarted on it later (this module's
/// `start` after `kill`), or a daemon started on it after others have
/// dialled out, still finds it free. A port from `bind(:0)` comes from that
/// range, and a `nasd up` found its drive's port taken by its own manager's
/// connection to the authentication server (CI, stop 35).
pub fn free_loopback_port() -> std::io::Result<u16> {
    let below = ephemeral_range_start();
    if below <= TEST_PORT_MIN + 1_000 {
        return Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
    }
    let env = nasd_env::Env::real();
    for _ in 0..10_000 {
        let port = TEST_PORT_MIN + (env.random_u64() % u64::from(below - TEST_PORT_MIN)) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return Ok(l.local_addr()?.port());
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "no free loopback port below the ephemeral range"))
}

/// The first port of the kernel's ephemeral range (32768 if it cannot be read).
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// The guardian: starts the server in the background, prints its pid, and
/// when its standard input closes, stops the server (fast shutdown; killed
/// if it is not gone within [`STOP_TIMEOUT_SECS`]) and removes `$DIR`.
/// Before that it obeys lines on its standard input: `kill` (SIGKILL the
/// server, as a crash; prints `stopped` once it is gone) and `start` (starts
/// it again on the same directory and port; prints its pid).
const GUARDIAN: &str = r#"
"$@" >>"$DIR/server.log" 2>&1 &
pid=$!
echo "$pid"
while read -r cmd; do
  case "$cmd" in
    kill) kill -KILL "$pid" 2>/dev/null; wait "$pid"; echo stopped ;;
    start) "$@" >>"$DIR/server.log" 2>&1 & pid=$!; echo "$pid" ;;
  esac
done
kill -INT "$pid" 2>/dev/null
( sleep "$STOP_TIMEOUT_SECS"; kill -KILL "$pid" ) >/dev/null 2>&1 &
killer=$!
wait "$pid"
kill "$killer" 2>/dev/null
rm -rf "$DIR"
"#;
/// Writes `pg_hba.conf`: the superuser `postgres` by trust (locally, and
/// over TCP without TLS as before); with a password, [`PASSWORD_ROLE`] by
/// `scram-sha-256`, over TLS only when the server serves TLS.
fn write_hba(data: &Path, options: &PgServerOptions) -> Result<(), String> {
    let mut hba = String::from("local all all trust\nhost all postgres all trust\n");
    if options.password.is_some() {
        let kind = if options.tls { "hostssl" } else { "host" };
        hba += &format!("{kind} all {PASSWORD_ROLE} all scram-sha-256\n");
    }
    std::fs::write(data.join("pg_hba.conf"), hba).map_err(|e| format!("cannot write pg_hba.conf: {e}"))
}

/// A CA (`DIR/ca.pem`) and a server certificate for `host` and `localhost`
/// signed by it (`DIR/server.pem`, its key `DIR/server.key`, 0600, owned by
/// the server's account).
fn write_certificates(dir: &Path, host: std::net::IpAddr, account: Option<(u32, u32)>) -> Result<(), String> {
    let e = |e: rcgen::Error| format!("cannot make the test server's certificates: {e}");
    let ca_key = rcgen::KeyPair::generate().map_err(e)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "nasd test PostgreSQL CA");
    let ca = ca_params.self_signed(&ca_key).map_err(e)?;
    let key = rcgen::KeyPair::generate().map_err(e)?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).map_err(e)?;
    params.subject_alt_names.push(rcgen::SanType::IpAddress(host));
    params.distinguished_name.push(rcgen::DnType::CommonName, "nasd test PostgreSQL server");
    let cert = params.signed_by(&key, &ca, &ca_key).map_err(e)?;
    let write = |name: &str, text: String, mode: u32| -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = account {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(|e| format!("chown: {e}"))?;
        }
        Ok(())
    };
    write("ca.pem", ca.pem(), 0o644)?;
    write("server.pem", cert.pem(), 0o644)?;
    write("server.key", key.serialize_pem(), 0o600)
}

/// Longest the guardian waits for the server to stop before killing it.
const STOP_TIMEOUT_SECS: u32 = 30;

impl PgServer {
    /// Makes a new cluster and starts a server on it.
    ///
    /// # Errors
    /// A message saying what failed (binaries missing, `initdb` failing,
    /// the server not starting, with its log).
    pub fn start() -> Result<PgServer, String> {
        PgServer::start_with(&PgServerOptions::default())
    }

    /// Makes a new cluster and starts a server on it as `options` says.
    ///
    /// # Errors
    /// As [`PgServer::start`]; the role or certificates cannot be made.
    pub fn start_with(options: &PgServerOptions) -> Result<PgServer, String> {
        let bin = bin_dir()?;
        let account = server_account()?;
        let mut last = String::new();
        for _ in 0..PORT_TRIES {
            match PgServer::try_start(&bin, account, options) {
                Ok(server) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// `initdb` into a new directory, then the server on a free port under
    /// a guardian; waits until it accepts connections.
    fn try_start(bin: &Path, account: Option<(u32, u32)>, options: &PgServerOptions) -> Result<PgServer, String> {
        let host = options.listen.unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
        static SERVERS: AtomicU64 = AtomicU64::new(0);
        let n = SERVERS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("nasd-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let data = dir.join("data");
        let made = (|| {
            if let Some((uid, gid)) = account {
                std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).map_err(|e| format!("chown: {e}"))?;
            }
            let mut initdb = as_server(account, &bin.join("initdb"));
            // A linguistic default collation (ICU en-US sorts "a" before "B"), so that a query
            // relying on the database's default to sort names by bytes fails the tests.
            initdb.arg("-D").arg(&data).args([
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--locale-provider=icu",
                "--icu-locale=en-US",
                "--no-sync",
                "--no-instructions",
            ]);
            run(&mut initdb, "initdb").map(drop)?;
            write_hba(&data, options)?;
            if options.tls {
                write_certificates(&dir, host, account)?;
            }
            free_port()
        })();
        let port = match made {
            Ok(port) => port,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let server = as_server(account, &bin.join("postgres"));
        let mut guardian = Command::new("sh");
        guardian.arg("-c").arg(GUARDIAN).arg("nasd-pg-guardian").env("DIR", &dir);
        guardian.env("STOP_TIMEOUT_SECS", STOP_TIMEOUT_SECS.to_string());
        guardian.args(&options.wrap);
        guardian.arg(server.get_program()).args(server.get_args());
        guardian.arg("-D").arg(&data).arg("-p").arg(port.to_string());
        let mut settings = vec![format!("listen_addresses={host}")];
        let synchronous = if options.durable_commits { "on" } else { "off" };
        settings.push(format!("synchronous_commit={synchronous}"));
        if options.tls {
            settings.extend([
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", dir.join("server.pem").display()),
                format!("ssl_key_file={}", dir.join("server.key").display()),
            ]);
        }
        for setting in settings.into_iter().chain([
            format!("unix_socket_directories={}", dir.display()),
            "max_connections=200".into(),
            "fsync=off".into(),
            "full_page_writes=off".into(),
            // Every error with its statement and database, and waits on locks: what
            // `PgServer::serialization_failures` and a reader of the log need.
            "log_min_error_statement=error".into(),
            "log_lock_waits=on".into(),
            "log_line_prefix=%m [%p] db=%d ".into(),
        ]) {
            guardian.arg("-c").arg(setting);
        }
        let spawned = guardian.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(format!("cannot start sh: {e}"));
            }
        };
        let stdout = child.stdout.take().expect("piped");
        // From here on, dropping `server` stops the postgres process and removes the directory.
        let ca = options.tls.then(|| dir.join("ca.pem"));
        let server = PgServer {
            port,
            host,
            dir: dir.clone(),
            guardian: child,
            answers: std::sync::Mutex::new(BufReader::new(stdout)),
            databases: AtomicU64::new(0),
            ca,
        };
        let pid = server.answer()?.parse().map_err(|_| "the guardian printed no pid".to_string())?;
        server.wait_ready(pid)?;
        if let Some(password) = &options.password {
            server.make_password_role(password)?;
        }
        Ok(server)
    }

    /// The guardian's next line.
    fn answer(&self) -> Result<String, String> {
        let mut line = String::new();
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        answers.read_line(&mut line).map_err(|e| format!("guardian: {e}"))?;
        Ok(line.trim().to_string())
    }

    /// Waits until the server `pid` accepts connections.
    fn wait_ready(&self, pid: u32) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let status = std::fs::read_to_string(self.dir.join("data").join("postmaster.pid")).unwrap_or_default();
            let up = status.lines().next().is_some_and(|l| l.trim() == pid.to_string());
            if up
                && status.lines().any(|l| l.trim() == "ready")
                && std::net::TcpStream::connect((self.host, self.port)).is_ok()
            {
                return Ok(());
            }
            if !alive(pid) || Instant::now() > deadline {
                return Err(format!("the PostgreSQL test server did not start on port {}:\n{}", self.port, self.log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends the guardian a command line.
    fn tell(&mut self, command: &str) -> Result<(), String> {
        use std::io::Write;
        let stdin = self.guardian.stdin.as_mut().ok_or("the guardian is gone")?;
        writeln!(stdin, "{command}").and_then(|()| stdin.flush()).map_err(|e| format!("guardian: {e}"))
    }

    /// SIGKILLs the server, as a crash would stop it, and returns once it is
    /// gone: connections to it break, new ones are refused. Commits it
    /// acknowledged survive only with [`PgServerOptions::durable_commits`].
    ///
    /// # Errors
    /// The guardian does not answer.
    pub fn kill(&mut self) -> Result<(), String> {
        self.tell("kill")?;
        match self.answer()?.as_str() {
            "stopped" => Ok(()),
            other => Err(format!("the guardian answered {other:?} to kill")),
        }
    }

    /// Starts the server again (after [`PgServer::kill`]) on the same data and
    /// port, and waits until it accepts connections (its crash recovery done).
    ///
    /// # Errors
    /// It does not start (with its log).
    pub fn start_again(&mut self) -> Result<(), String> {
        self.tell("start")?;
        let pid = self.answer()?.parse().map_err(|_| "the guardian printed no pid".to_string())?;
        self.wait_ready(pid)
    }

    /// The server's log so far (errors with their `DETAIL` and `STATEMENT`
    /// lines, each line prefixed with `db=DATABASE`); empty if unreadable.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// How many serialization failures (SQLSTATE `40001`: "could not
    /// serialize access") the server has reported so far in database `db`,
    /// as its log tells: the conflicts of every client of that database,
    /// whichever process it is.
    pub fn serialization_failures(&self, db: &str) -> usize {
        let tag = format!(" db={db} ");
        self.log().lines().filter(|l| l.contains(&tag) && l.contains("ERROR:  could not serialize access")).count()
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db` on this server (created on first use by
    /// [`crate::Postgres::open`]).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@{}/{db}", self.host_port())
    }

    /// `HOST:PORT` of the server.
    pub fn host_port(&self) -> String {
        std::net::SocketAddr::new(self.host, self.port).to_string()
    }

    /// The CA certificate (PEM file) that signed the server's, with TLS.
    pub fn ca_cert(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// The process id of the `postgres` server (its postmaster), from its
    /// pid file.
    pub fn server_pid(&self) -> Option<u32> {
        let status = std::fs::read_to_string(self.dir.join("data").join("postmaster.pid")).ok()?;
        status.lines().next()?.trim().parse().ok()
    }

    /// Makes [`PASSWORD_ROLE`] with `password`, over SQL as the superuser.
    fn make_password_role(&self, password: &str) -> Result<(), String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let mut config = tokio_postgres::Config::new();
        config.host(self.host.to_string()).port(self.port).user("postgres").dbname("postgres");
        rt.block_on(async {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await.map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            let literal = password.replace('\'', "''");
            client
                .batch_execute(&format!("CREATE ROLE {PASSWORD_ROLE} LOGIN CREATEDB PASSWORD '{literal}'"))
                .await
                .map_err(|e| format!("cannot make the role {PASSWORD_ROLE}: {e}"))
        })
    }

    /// Runs `sql` (statements separated by `;`) in database `db` as the
    /// superuser, over a connection of its own: what a test does to the
    /// database behind the code under test (a trigger, a check).
    ///
    /// # Errors
    /// The connection or a statement fails (with the server's message).
    pub fn execute(&self, db: &str, sql: &str) -> Result<(), String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let mut config = tokio_postgres::Config::new();
        config.host(self.host.to_string()).port(self.port).user("postgres").dbname(db);
        rt.block_on(async {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await.map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            client
                .batch_execute(sql)
                .await
                .map_err(|e| e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string()))
        })
    }

    /// The URL of a database no one has used yet.
    pub fn fresh_url(&self) -> String {
        self.url(&format!("nasd_test_{}", self.databases.fetch_add(1, Ordering::Relaxed)))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Closing the guardian's stdin stops the server and removes the directory.
        drop(self.guardian.stdin.take());
        let _ = self.guardian.wait();
    }
}

/// Longest a [`DelayProxy`] may hold bytes back each way.
pub const DELAY_ONE_WAY_MAX: Duration = Duration::from_secs(1);
/// Bytes a [`DelayProxy`] reads at a time from either side.
const DELAY_CHUNK_BYTES: usize = 64 * 1024;

/// A TCP proxy in front of a server (a [`PgServer`]) that holds every byte
/// back for a fixed time in each direction, as a network link with that
/// latency would: what `nasd bench untar` measures several managers over
/// when the database is not on the same machine (`tc netem` is not on every
/// kernel). Each connection gets two threads per direction — one reads and
/// stamps each chunk with when it arrived, one writes it out once its time
/// has come — so the delay does not add up across chunks and order is kept;
/// `std::thread::sleep` keeps the delay within tens of microseconds, where
/// a tokio timer rounds up to whole milliseconds. Stopped (listener and
/// every connection closed) when dropped.
pub struct DelayProxy {
    addr: std::net::SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    accepter: Option<std::thread::JoinHandle<()>>,
}

impl DelayProxy {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to
    /// `upstream`, each byte `one_way` late in each direction.
    ///
    /// # Errors
    /// No port to listen on, or `one_way` above [`DELAY_ONE_WAY_MAX`].
    pub fn start(upstream: std::net::SocketAddr, one_way: Duration) -> Result<DelayProxy, String> {
        if one_way > DELAY_ONE_WAY_MAX {
            return Err(format!("a delay of {one_way:?} each way is more than {DELAY_ONE_WAY_MAX:?}"));
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no port for the proxy: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (stop2, conns2) = (stop.clone(), conns.clone());
        let accepter = std::thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if stop2.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = std::net::TcpStream::connect(upstream) else { continue };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let mut kept = conns2.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                        kept.extend([c, s]);
                    }
                    drop(kept);
                    for (from, to) in [(&client, &server), (&server, &client)] {
                        if let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) {
                            delay_one_way(from, to, one_way);
                        }
                    }
                }
            })
            .map_err(|e| format!("cannot start the proxy: {e}"))?;
        Ok(DelayProxy { addr, stop, conns, accepter: Some(accepter) })
    }

    /// The address to connect to instead of the server's.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

/// Copies `from` to `to`, every chunk `delay` after it arrived, until
/// either side closes.
fn delay_one_way(mut from: std::net::TcpStream, mut to: std::net::TcpStream, delay: Duration) {
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let _ = std::thread::Builder::new().name("delay-proxy-read".into()).spawn(move || {
        let mut buf = vec![0u8; DELAY_CHUNK_BYTES];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = from.shutdown(std::net::Shutdown::Read);
    });
    let _ = std::thread::Builder::new().name("delay-proxy-write".into()).spawn(move || {
        for (due, bytes) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accepting thread so that it sees the flag.
        let _ = std::net::TcpStream::connect(self.addr);
        if let Some(accepter) = self.accepter.take() {
            let _ = accepter.join();
        }
        for s in self.conns.lock().unwrap_or_else(std::sync::PoisonError::into_inner).drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}
