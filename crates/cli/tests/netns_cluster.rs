//! A cluster of real processes as separate hosts (issue 31): each daemon in
//! a network namespace of its own with its own address on one bridge
//! (`10.A.B.0/24`), as an operator runs them:
//!
//! - PostgreSQL (a real server the test starts) reached over TLS
//!   (`sslmode=verify-full` with the CA file) as the role `nasd` with a
//!   password from `$PGPASSWORD`;
//! - bootstrapped once by `nasd up --metadata` (on the test's own host),
//!   whose drive is taken out of service and which is stopped after `nasd
//!   admin join-bundle`; then two authentication servers (`nasd auth
//!   --join`), two managers (`nasd manager --join`, each listing both
//!   authentication servers as `[manager] auth`/`auth_failover`) and four
//!   drives (`nasd drive`, added with `nasd admin add-drive`; the files
//!   `rs:2+1`), each in its own namespace;
//! - writers (`nasd put`) and a reader (`nasd get` of acknowledged files),
//!   real `nasd` processes in a client namespace, listing both managers and
//!   both authentication servers, the writers the ones that will die first,
//!   the reader the others first.
//!
//! While they run, each kind of component is killed in turn, in an order
//! and at moments drawn from a seed (printed; `NASD_TEST_SEED` repeats the
//! schedule, the daemons' timing still varies): one authentication server
//! SIGKILLed (the one both managers' links use first, so the managers' link
//! moves to the other), one manager SIGKILLed, PostgreSQL SIGKILLed and
//! started again 10 s later, one drive SIGKILLed. Nothing killed comes
//! back. What must hold:
//!
//! - no command fails: a surviving instance of each kind is always up, and
//!   the commands that need the database wait its outage out within
//!   `[client] metadata_wait_secs`;
//! - every file whose put returned 0 reads back byte for byte, during the
//!   run and at the end, through the survivors.
//!
//! Namespaces need root and iproute2's `ip`: without them the test says
//! why and is skipped, except under CI (`CI=true`), where it fails.
//!
//! Each file's bytes name it (writer, number, offset: [`file_bytes`]), so a
//! wrong read says what it got instead ([`difference`]). On a failure,
//! with `NASD_TEST_KEEP=DIR`, the whole temporary directory (every host's
//! disk and log, `nasd up`'s) and the database's log are copied to
//! `DIR/netns-SEED` before they go.

use nasd_meta::testing::{PgServer, PgServerOptions, PASSWORD_ROLE};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::{master_key, nasd_command, ok, Daemon};

const DB_PASSWORD: &str = "db-secret-Vei4";
/// The name every daemon's certificate carries, and clients check.
const TLS_NAME: &str = "cluster.nasd.test";
/// How long the database stays down.
const OUTAGE: Duration = Duration::from_secs(10);
/// `[client] metadata_wait_secs`: the bound within which commands wait out the outage.
const METADATA_WAIT_SECS: u64 = 60;
/// Writers running at once (the reader is one more).
const WRITERS: usize = 2;
/// Longest the workload may go without one more acknowledged file (a hang, not a timing assertion).
const PROGRESS_WAIT_MAX: Duration = Duration::from_secs(240);
/// The hosts, in the order of their addresses (`.10` on).
const HOSTS: [&str; 10] =
    ["db", "auth-1", "auth-2", "manager-1", "manager-2", "drive-1", "drive-2", "drive-3", "drive-4", "client"];
const AUTH_PORT: u16 = 7299;
const MANAGER_PORT: u16 = 7300;
const DRIVE_PORT: u16 = 7400;
/// Prefix of every namespace and link the test makes (with its pid): a
/// later run removes those of a test process that died.
const PREFIX: &str = "nasdt";

/// The hosts' namespaces on one bridge in the test's own namespace (which
/// reaches them all: it starts them and checks they accept). Removed when
/// dropped.
struct Net {
    pid: u32,
    /// `10.A.B`.
    subnet: [u8; 3],
    made: Vec<String>,
    bridge: Option<String>,
}

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip").args(args).stdin(Stdio::null()).output().map_err(|e| format!("cannot run ip: {e}"))?;
    if !out.status.success() {
        return Err(format!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes the namespaces and bridge of test processes that are gone.
fn remove_leftovers() {
    let alive = |pid: &str| Path::new("/proc").join(pid).exists();
    let leftover = |name: &str| {
        let rest = name.strip_prefix(PREFIX)?;
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        (!pid.is_empty() && !alive(&pid)).then_some(())
    };
    for line in ip(&["netns", "list"]).unwrap_or_default().lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if leftover(name).is_some() {
            let _ = ip(&["netns", "del", name]);
        }
    }
    for line in ip(&["-o", "link", "show", "type", "bridge"]).unwrap_or_default().lines() {
        let name = line.split(':').nth(1).unwrap_or("").trim();
        if leftover(name).is_some() {
            let _ = ip(&["link", "del", name]);
        }
    }
}

impl Net {
    /// The bridge and a namespace per host of [`HOSTS`], each with a veth
    /// pair into the bridge and its address; or why it cannot be made.
    fn make() -> Result<Net, String> {
        remove_leftovers();
        let pid = std::process::id();
        let used = ip(&["-o", "-4", "addr", "show"])?;
        let subnet = (0..16u32)
            .map(|k| [10, 200 + (pid % 50) as u8, ((pid / 50 + k) % 256) as u8])
            .find(|s| !used.contains(&format!(" {}.{}.{}.", s[0], s[1], s[2])))
            .ok_or("no free 10.x.y.0/24 subnet")?;
        let mut net = Net { pid, subnet, made: Vec::new(), bridge: None };
        let bridge = format!("{PREFIX}{pid}b");
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        net.bridge = Some(bridge.clone());
        ip(&["addr", "add", &format!("{}/24", net.ip_text(0)), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for (i, host) in HOSTS.iter().enumerate() {
            let ns = net.ns(host);
            ip(&["netns", "add", &ns])?;
            net.made.push(ns.clone());
            let veth = format!("{PREFIX}{pid}v{i}");
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["link", "set", &veth, "master", &bridge, "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", net.addr(host)), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn ip_text(&self, last: u8) -> String {
        let [a, b, c] = self.subnet;
        format!("{a}.{b}.{c}.{last}")
    }

    fn ns(&self, host: &str) -> String {
        format!("{PREFIX}{}-{host}", self.pid)
    }

    fn addr(&self, host: &str) -> IpAddr {
        let i = HOSTS.iter().position(|h| *h == host).unwrap_or_else(|| panic!("no host {host}"));
        let [a, b, c] = self.subnet;
        IpAddr::V4(Ipv4Addr::new(a, b, c, 10 + i as u8))
    }

    /// What runs a command on `host`.
    fn wrap(&self, host: &str) -> Vec<String> {
        ["ip", "netns", "exec"].iter().map(|s| s.to_string()).chain([self.ns(host)]).collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.made {
            let _ = ip(&["netns", "del", ns]);
        }
        if let Some(b) = &self.bridge {
            let _ = ip(&["link", "del", b]);
        }
    }
}

/// Why namespaces cannot be made here, if they cannot (after saying so; a
/// failure under CI).
fn namespaces_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    let why = if unsafe { libc::geteuid() } != 0 {
        Some("not root: network namespaces need CAP_SYS_ADMIN".to_string())
    } else {
        match Command::new("ip").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status() {
            Ok(s) if s.success() => None,
            _ => Some("`ip` (iproute2) is not installed".to_string()),
        }
    };
    if let Some(why) = &why {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "network namespaces unavailable under CI: {why}");
        eprintln!("SKIPPED: {why}");
    }
    why
}

/// Bytes between two tags of [`file_bytes`].
const TAG_EVERY: usize = 512;

/// File `i` of writer `w`, `len` bytes: a tag `<w W f I @OFFSET>` every
/// [`TAG_EVERY`] bytes (cut at the end), filler derived from `w`, `i` and the
/// offset between.
fn file_bytes(w: usize, i: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + TAG_EVERY);
    while out.len() < len {
        let at = out.len();
        out.extend_from_slice(format!("<w{w} f{i} @{at}>").as_bytes());
        out.extend((out.len()..at + TAG_EVERY).map(|j| (j * 131 + w * 17 + i * 7 + (j >> 9)) as u8 | 0x80));
    }
    out.truncate(len);
    out
}

/// What a read of a file put as `want` got instead: its length, the first
/// offset that differs, and what the bytes there are (zeros, or the tags of
/// [`file_bytes`] found in them: which file's bytes, from where).
fn difference(want: &[u8], got: Option<&[u8]>) -> String {
    let Some(got) = got else { return "nothing read back".into() };
    let Some(at) =
        want.iter().zip(got).position(|(a, b)| a != b).or((want.len() != got.len()).then(|| want.len().min(got.len())))
    else {
        return "the same bytes".into();
    };
    let rest = &got[at.min(got.len())..];
    let zeros = rest.iter().take_while(|&&b| b == 0).count();
    let text = String::from_utf8_lossy(rest);
    let tags: Vec<&str> =
        text.split('<').skip(1).filter_map(|t| t.split_once('>').map(|(tag, _)| tag)).take(4).collect();
    format!(
        "{} bytes read, {} put; first difference at {at}; from there {zeros} zero bytes, tags {tags:?}",
        got.len(),
        want.len()
    )
}

/// What each kind of kill is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Auth,
    Manager,
    Database,
    Drive,
}

/// A file whose put returned 0.
#[derive(Clone)]
struct Acked {
    remote: String,
    bytes: Arc<Vec<u8>>,
    /// When its put returned 0 (since the start of the workload).
    at: Duration,
}

/// A command that failed or returned other bytes: what, when, why.
struct Failed {
    command: String,
    at: Duration,
    why: String,
}

/// What the workload threads share.
struct Shared {
    start: Instant,
    acked: Mutex<Vec<Acked>>,
    failed: Mutex<Vec<Failed>>,
    /// Commands that said they wait for the database (stderr lines), with their run time.
    waited: Mutex<Vec<(String, Duration)>>,
    /// Puts that lost their manager part-way and copied the file again.
    again: Mutex<Vec<String>>,
    commands: Mutex<usize>,
    stop: AtomicBool,
}

impl Shared {
    /// Runs `command`, records it, and returns whether it succeeded.
    fn run(&self, what: &str, mut command: Command) -> bool {
        let began = Instant::now();
        let out: Output = command.output().expect("run nasd");
        *self.commands.lock().unwrap() += 1;
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        for line in err.lines().filter(|l| l.contains("waiting up to")) {
            self.waited.lock().unwrap().push((format!("{what}: {line}"), began.elapsed()));
        }
        for line in err.lines().filter(|l| l.contains("copying it again")) {
            self.again.lock().unwrap().push(format!("{what}: {line}"));
        }
        if !out.status.success() {
            self.fail(what, format!("{}: {err}", out.status));
        }
        out.status.success()
    }

    fn fail(&self, command: &str, why: String) {
        let at = self.start.elapsed();
        eprintln!("FAILED at {at:?}: {command}: {why}");
        self.failed.lock().unwrap().push(Failed { command: command.to_string(), at, why });
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }
}

#[test]
fn a_cluster_of_hosts_survives_each_kind_of_component_killed_in_turn() {
    if namespaces_unavailable().is_some() {
        return;
    }
    let seed = std::env::var("NASD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (NASD_TEST_SEED={seed} repeats this schedule)");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kinds = [Kind::Auth, Kind::Manager, Kind::Database, Kind::Drive];
    kinds.shuffle(&mut rng);
    let (dead_auth, dead_manager, dead_drive) = (rng.gen_range(0..2), rng.gen_range(0..2), rng.gen_range(0..4));
    // Before each kill: this many more files acknowledged, then this long.
    let moments: Vec<(usize, Duration)> =
        kinds.iter().map(|_| (rng.gen_range(3..=8), Duration::from_millis(rng.gen_range(0..1500)))).collect();
    println!(
        "kills in turn: {:?} after {moments:?} (more files acknowledged, then a pause); auth-{} manager-{} drive-{}",
        kinds,
        dead_auth + 1,
        dead_manager + 1,
        dead_drive + 1
    );

    let net = match Net::make() {
        Ok(net) => net,
        Err(e) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "cannot make network namespaces under CI: {e}");
            eprintln!("SKIPPED: cannot make network namespaces: {e}");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();

    // The database, on its host, over TLS with a password.
    let mut db = PgServer::start_with(&PgServerOptions {
        tls: true,
        password: Some(DB_PASSWORD.into()),
        listen: Some(net.addr("db")),
        wrap: net.wrap("db"),
        durable_commits: true,
    })
    .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let ca = db.ca_cert().unwrap().to_str().unwrap().to_string();
    // Declared after the directories it reads, so it is dropped (and reports) before them.
    let _report =
        LogsOnFailure { root: root.to_path_buf(), database: db.ca_cert().unwrap().with_file_name("server.log"), seed };
    let url = format!("postgres://{PASSWORD_ROLE}@{}/nasd_netns?sslmode=verify-full&sslrootcert={ca}", db.host_port());
    println!("database {url}");

    let mut drives = start_drives(&net, root);
    let bundle = bootstrap(&net, root, &url);
    let mut auths = start_auth_servers(&net, root, &bundle);
    // The managers' links list the authentication server that dies first.
    let link = [auths[dead_auth].addr.to_string(), auths[1 - dead_auth].addr.to_string()];
    let mut managers = start_managers(&net, root, &bundle, &link);

    // The client host: the CA and the administrator's password, and two profiles — the writers'
    // listing first the manager and authentication server that die, the reader's the others.
    let client = host_dir(root, "client");
    let boot = root.join("boot").join("manager");
    std::fs::copy(boot.join("tls").join("ca.pem"), client.join("ca.pem")).unwrap();
    std::fs::copy(boot.join("admin.password"), client.join("admin.password")).unwrap();
    let in_order = |d: &[Daemon], first: usize| [d[first].addr.to_string(), d[1 - first].addr.to_string()];
    let writers_profile =
        client_profile(&client.join("writers.toml"), &in_order(&managers, dead_manager), &in_order(&auths, dead_auth));
    let reader_profile = client_profile(
        &client.join("reader.toml"),
        &in_order(&managers, 1 - dead_manager),
        &in_order(&auths, 1 - dead_auth),
    );
    let on_client =
        |config: &Path, args: &[&str]| ok(client_command(&net.wrap("client"), config, args).output().unwrap());
    on_client(&writers_profile, &["mkdir", "/w"]);
    on_client(&writers_profile, &["layout", "set", "/w", "rs:2+1"]);

    // The workload.
    let shared = Arc::new(Shared {
        start: Instant::now(),
        acked: Mutex::new(Vec::new()),
        failed: Mutex::new(Vec::new()),
        waited: Mutex::new(Vec::new()),
        again: Mutex::new(Vec::new()),
        commands: Mutex::new(0),
        stop: AtomicBool::new(false),
    });
    let local = client.join("local");
    std::fs::create_dir_all(&local).unwrap();
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let (shared, local, profile, wrap) =
            (shared.clone(), local.clone(), writers_profile.clone(), net.wrap("client"));
        threads.push(std::thread::spawn(move || put_files(&shared, &wrap, &profile, &local, w, seed)));
    }
    {
        let (shared, local, profile, wrap) =
            (shared.clone(), local.clone(), reader_profile.clone(), net.wrap("client"));
        threads.push(std::thread::spawn(move || get_files(&shared, &wrap, &profile, &local, seed)));
    }
    let logs = |managers: &[Daemon], auths: &[Daemon], drives: &[Daemon]| {
        let mut out = String::new();
        for d in managers.iter().chain(auths).chain(drives) {
            let text = d.output();
            let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).take(40).collect();
            out += &format!(
                "--- {} at {}: errors\n{}\n--- its end:\n{}\n",
                d.name,
                d.addr,
                errors.join("\n"),
                d.log_tail()
            );
        }
        out
    };
    let wait_for_files = |n: usize, managers: &[Daemon], auths: &[Daemon], drives: &[Daemon]| {
        let (mut last, mut last_at) = (shared.acked(), Instant::now());
        while shared.acked() < n {
            if shared.acked() > last {
                (last, last_at) = (shared.acked(), Instant::now());
            }
            assert!(
                last_at.elapsed() < PROGRESS_WAIT_MAX,
                "no file acknowledged for {PROGRESS_WAIT_MAX:?}: a hang\n{}",
                logs(managers, auths, drives)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    let mut outage = None;
    for (kind, (more, pause)) in kinds.iter().zip(&moments) {
        wait_for_files(shared.acked() + more, &managers, &auths, &drives);
        std::thread::sleep(*pause);
        let at = shared.start.elapsed();
        match kind {
            Kind::Auth => auths[dead_auth].kill(),
            Kind::Manager => managers[dead_manager].kill(),
            Kind::Drive => drives[dead_drive].kill(),
            Kind::Database => {
                db.kill().expect("the database killed");
                std::thread::sleep(OUTAGE);
                db.start_again().expect("the database started again");
                outage = Some((at, shared.start.elapsed()));
            }
        }
        println!("{kind:?} killed at {at:?} with {} files acknowledged", shared.acked());
    }
    wait_for_files(shared.acked() + 5, &managers, &auths, &drives);
    shared.stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("a workload thread panicked");
    }

    // Every acknowledged file, through the survivors (the reader's profile lists them first).
    let acked = shared.acked.lock().unwrap().clone();
    let back = client.join("final");
    on_client(&reader_profile, &["get", "-r", "/w", back.to_str().unwrap()]);
    let mut wrong = Vec::new();
    for a in &acked {
        let name = a.remote.trim_start_matches("/w/");
        let got = std::fs::read(back.join("w").join(name)).or_else(|_| std::fs::read(back.join(name)));
        if got.as_ref().ok().map(Vec::as_slice) != Some(&a.bytes[..]) {
            let why = difference(&a.bytes, got.as_ref().ok().map(Vec::as_slice));
            eprintln!("WRONG at the end: {} (acknowledged at {:?}): {why}", a.remote, a.at);
            wrong.push(a.remote.clone());
        }
    }
    let failed = std::mem::take(&mut *shared.failed.lock().unwrap());
    let waited = shared.waited.lock().unwrap().clone();
    println!("puts that copied again after losing their manager: {:#?}", shared.again.lock().unwrap());
    println!(
        "{} commands, {} files acknowledged, {} lost or wrong at the end, {} failed; database down {:?}; {} \
         commands waited for it: {waited:#?}",
        shared.commands.lock().unwrap(),
        acked.len(),
        wrong.len(),
        failed.len(),
        outage,
        waited.len()
    );
    // How the managers judged COMMITs that lost their connection as the database died (for the record).
    for m in &managers {
        for line in m.output().lines().filter(|l| l.contains("a metadata COMMIT lost its connection")) {
            println!("{} at {}: {line}", m.name, m.addr);
        }
    }
    assert!(wrong.is_empty(), "acknowledged files lost or wrong: {wrong:?}\n{}", logs(&managers, &auths, &drives));
    let failures: Vec<String> =
        failed.iter().map(|f| format!("at {:?}: `nasd {}`: {}", f.at, f.command, f.why)).collect();
    assert!(failures.is_empty(), "commands failed: {failures:#?}\n{}", logs(&managers, &auths, &drives));
    // Commands ran back to back through the outage: some met it, and each that did said once that
    // it waits, naming the database and the configured bound.
    assert!(!waited.is_empty(), "no command said it waits for the database during its outage");
    for (line, _) in &waited {
        assert!(line.contains(&format!("waiting up to {METADATA_WAIT_SECS} s")), "{line}");
        assert!(line.contains(&db.host_port()), "names the database: {line}");
    }
    for m in managers.iter_mut().filter(|m| m.running()) {
        m.terminate();
    }
    for a in auths.iter_mut().filter(|a| a.running()) {
        a.terminate();
    }
    for d in drives.iter_mut().filter(|d| d.running()) {
        d.terminate();
    }
    drop(db);
    drop(net);
}

/// On a failure (the test thread panicking), the warnings and errors and
/// the end of every daemon's log (`nasd up`'s, each host's) and of the
/// database's, which go with their temporary directories.
struct LogsOnFailure {
    root: PathBuf,
    database: PathBuf,
    seed: u64,
}

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let mut logs = vec![self.root.join("up.log"), self.database.clone()];
        for host in HOSTS {
            let dir = self.root.join("hosts").join(host);
            let found = std::fs::read_dir(&dir).into_iter().flatten().flatten().map(|e| e.path());
            logs.extend(found.filter(|p| p.extension().is_some_and(|x| x == "log")));
        }
        for log in logs.iter().filter(|l| l.exists()) {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let bad: Vec<&str> = text.lines().filter(|l| l.contains("ERROR") || l.contains("WARN")).take(40).collect();
            eprintln!(
                "=== {}: warnings and errors\n{}\n=== its end:\n{}",
                log.display(),
                bad.join("\n"),
                common::log_tail(log)
            );
        }
        self.keep();
    }
}

impl LogsOnFailure {
    /// With `NASD_TEST_KEEP=DIR`, copies the temporary directory and the
    /// database's log to `DIR/netns-SEED` (said on stderr).
    fn keep(&self) {
        let Some(dir) = std::env::var_os("NASD_TEST_KEEP") else { return };
        let to = PathBuf::from(dir).join(format!("netns-{}", self.seed));
        let _ = std::fs::create_dir_all(&to);
        let copied = Command::new("cp")
            .args(["-a", "--sparse=always"])
            .arg(&self.root)
            .arg(to.join("tmp"))
            .status()
            .is_ok_and(|s| s.success());
        let db_log = std::fs::copy(&self.database, to.join("database.log")).is_ok();
        eprintln!("=== kept in {} (directory copied: {copied}, database log: {db_log})", to.display());
    }
}

/// Where `host` keeps its files (its disk): `ROOT/hosts/HOST`, made if new.
fn host_dir(root: &Path, host: &str) -> PathBuf {
    let d = root.join("hosts").join(host);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const DRIVE_HOSTS: [&str; 4] = ["drive-1", "drive-2", "drive-3", "drive-4"];

/// The four drives, each on its host.
fn start_drives(net: &Net, root: &Path) -> Vec<Daemon> {
    DRIVE_HOSTS
        .iter()
        .map(|&h| {
            let (dir, addr) = (host_dir(root, h), SocketAddr::new(net.addr(h), DRIVE_PORT));
            let args: Vec<OsString> = vec![
                "drive".into(),
                "--data".into(),
                dir.join("data").into(),
                "--listen".into(),
                addr.to_string().into(),
                "--capacity".into(),
                "256MiB".into(),
            ];
            Daemon::start_wrapped("drive", &dir, &dir.join("drive.log"), &net.wrap(h), addr, &[], args)
        })
        .collect()
}

/// The bootstrap, on the test's own host (`ROOT/boot`): `nasd up` on the
/// database at `url`, the drives added with `nasd admin add-drive` and its
/// own drive taken out (`drive-out`), the join bundle written; then `nasd
/// up` stops. Returns the bundle.
fn bootstrap(net: &Net, root: &Path, url: &str) -> PathBuf {
    let boot = root.join("boot");
    std::fs::create_dir_all(&boot).unwrap();
    let mut up = {
        let (dir, url) = (boot.clone(), url.to_string());
        let env = [("PGPASSWORD", DB_PASSWORD)];
        Daemon::start_with_env("nasd up", &boot, &root.join("up.log"), None, &env, move |addr| {
            let mut args: Vec<OsString> = vec!["up".into(), "--data".into(), dir.clone().into()];
            args.extend(["--drives".into(), "1".into(), "--drive-capacity".into(), "64MiB".into()]);
            args.extend(["--manager-port".into(), addr.port().to_string().into()]);
            args.extend(["--first-drive-port".into(), common::free_addr().port().to_string().into()]);
            args.extend(["--metadata".into(), url.clone().into()]);
            args
        })
    };
    let boot_config = boot.join("nasd.toml");
    let boot_nasd = |args: &[&str]| ok(nasd_command().arg("--config").arg(&boot_config).args(args).output().unwrap());
    let mut added = Vec::new();
    for h in DRIVE_HOSTS {
        let data = host_dir(root, h).join("data");
        master_key(&data);
        let addr = SocketAddr::new(net.addr(h), DRIVE_PORT).to_string();
        let key = data.join("master.key");
        let said = boot_nasd(&["admin", "add-drive", &addr, "--master-key-file", key.to_str().unwrap()]);
        let number: u32 = said.trim().rsplit(' ').next().and_then(|n| n.parse().ok()).expect(&said);
        added.push(number);
    }
    let up_drive = (0..).find(|n| !added.contains(n)).unwrap();
    boot_nasd(&["admin", "drive-out", &up_drive.to_string()]);
    println!("drives {added:?} added; `nasd up`'s drive {up_drive} taken out\n{}", boot_nasd(&["status"]));
    let bundle = root.join("join.bundle");
    let manager = boot.join("manager");
    let made = boot_nasd(&[
        "admin",
        "join-bundle",
        bundle.to_str().unwrap(),
        "--data",
        manager.to_str().unwrap(),
        "--metadata",
        url,
    ]);
    assert!(made.contains("nasd auth --join"), "the bundle carries auth.key: {made}");
    up.terminate();
    bundle
}

/// The two authentication servers, each on its host, joined with `bundle`
/// (`nasd auth --join`).
fn start_auth_servers(net: &Net, root: &Path, bundle: &Path) -> Vec<Daemon> {
    ["auth-1", "auth-2"]
        .iter()
        .map(|&h| {
            let (dir, addr) = (host_dir(root, h), SocketAddr::new(net.addr(h), AUTH_PORT));
            std::fs::copy(bundle, dir.join("join.bundle")).unwrap();
            let args: Vec<OsString> = vec![
                "auth".into(),
                "--join".into(),
                dir.join("join.bundle").into(),
                "--data".into(),
                dir.join("data").into(),
                "--tls-name".into(),
                TLS_NAME.into(),
                "--listen".into(),
                addr.to_string().into(),
            ];
            let env = [("PGPASSWORD", DB_PASSWORD)];
            Daemon::start_wrapped("auth", &dir, &dir.join("auth.log"), &net.wrap(h), addr, &env, args)
        })
        .collect()
}

/// The two managers, each on its host, joined with `bundle` (`nasd manager
/// --join`), linked to the authentication servers `link` in that order
/// (`[manager] auth`, `auth_failover`, with the service token the bootstrap
/// server wrote).
fn start_managers(net: &Net, root: &Path, bundle: &Path, link: &[String; 2]) -> Vec<Daemon> {
    let token = root.join("boot").join("auth").join(nasd_auth::SERVICE_TOKEN_FILE);
    ["manager-1", "manager-2"]
        .iter()
        .map(|&h| {
            let (dir, addr) = (host_dir(root, h), SocketAddr::new(net.addr(h), MANAGER_PORT));
            std::fs::copy(bundle, dir.join("join.bundle")).unwrap();
            std::fs::copy(&token, dir.join("service.token")).unwrap();
            let data = dir.join("data");
            let config = dir.join("nasd.toml");
            std::fs::write(
                &config,
                format!(
                    "[manager]\nobject_pool = 16\nauth = \"{}\"\nauth_failover = [\"{}\"]\n\
                     auth_server_name = \"{TLS_NAME}\"\nauth_ca_cert = \"{}\"\nauth_token_file = \"{}\"\n",
                    link[0],
                    link[1],
                    data.join("tls").join("ca.pem").display(),
                    dir.join("service.token").display()
                ),
            )
            .unwrap();
            let args: Vec<OsString> = vec![
                "--config".into(),
                config.into(),
                "manager".into(),
                "--join".into(),
                dir.join("join.bundle").into(),
                "--data".into(),
                data.into(),
                "--tls-name".into(),
                TLS_NAME.into(),
                "--listen".into(),
                addr.to_string().into(),
            ];
            let env = [("PGPASSWORD", DB_PASSWORD)];
            Daemon::start_wrapped("manager", &dir, &dir.join("manager.log"), &net.wrap(h), addr, &env, args)
        })
        .collect()
}

/// A client profile at `path` on the client host (whose directory holds
/// `ca.pem` and `admin.password`): the managers and authentication servers
/// in the order given, commands waiting out a database outage for
/// [`METADATA_WAIT_SECS`].
fn client_profile(path: &Path, managers: &[String; 2], auths: &[String; 2]) -> PathBuf {
    let dir = path.parent().unwrap();
    std::fs::write(
        path,
        format!(
            "[client]\nmanager = \"{}\"\nfailover = [\"{}\"]\nauth = \"{}\"\nauth_failover = [\"{}\"]\n\
             server_name = \"{TLS_NAME}\"\nca_cert = \"{}\"\nuser = \"admin\"\npassword_file = \"{}\"\n\
             metadata_wait_secs = {METADATA_WAIT_SECS}\n",
            managers[0],
            managers[1],
            auths[0],
            auths[1],
            dir.join("ca.pem").display(),
            dir.join("admin.password").display()
        ),
    )
    .unwrap();
    path.to_path_buf()
}

/// Writer `w`: puts new files (1 KB–200 KB, sizes and pauses from `seed`)
/// until told to stop; each whose put returned 0 is acknowledged.
fn put_files(shared: &Shared, wrap: &[String], profile: &Path, local: &Path, w: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ (w as u64 + 1));
    let mut i = 0;
    while !shared.stop.load(Ordering::SeqCst) {
        let bytes = Arc::new(file_bytes(w, i, rng.gen_range(1_000..200_000)));
        let src = local.join(format!("{w}-{i}"));
        std::fs::write(&src, &*bytes).unwrap();
        let remote = format!("/w/{w}-{i}");
        let what = format!("put {remote}");
        if shared.run(&what, client_command(wrap, profile, &["put", src.to_str().unwrap(), &remote])) {
            let at = shared.start.elapsed();
            shared.acked.lock().unwrap().push(Acked { remote, bytes, at });
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..200)));
    }
}

/// The reader: gets acknowledged files (picked from `seed`) until told to
/// stop; each must hold the bytes put.
fn get_files(shared: &Shared, wrap: &[String], profile: &Path, local: &Path, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xdead);
    let back = local.join("read-back");
    while !shared.stop.load(Ordering::SeqCst) {
        let pick = {
            let acked = shared.acked.lock().unwrap();
            (!acked.is_empty()).then(|| acked[rng.gen_range(0..acked.len())].clone())
        };
        let Some(file) = pick else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let what = format!("get {}", file.remote);
        let _ = std::fs::remove_file(&back);
        if shared.run(&what, client_command(wrap, profile, &["get", &file.remote, back.to_str().unwrap()])) {
            let got = std::fs::read(&back).ok();
            if got.as_deref() != Some(&file.bytes[..]) {
                let why = difference(&file.bytes, got.as_deref());
                shared.fail(&what, format!("other bytes than were put (acknowledged at {:?}): {why}", file.at));
            }
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..200)));
    }
}

/// `WRAP… nasd --config CONFIG ARGS`, with [`nasd_command`]'s environment.
fn client_command(wrap: &[String], config: &Path, args: &[&str]) -> Command {
    let base = nasd_command();
    let mut c = Command::new(&wrap[0]);
    c.args(&wrap[1..]).arg(base.get_program()).arg("--config").arg(config).args(args);
    for (k, v) in base.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.stdin(Stdio::null());
    c
}

/// A wrong read names what it got: another file's bytes, zeros, or a short file.
#[test]
fn a_wrong_read_says_what_it_got() {
    let want = file_bytes(1, 4, 3000);
    assert_eq!(want.len(), 3000);
    assert!(want.starts_with(b"<w1 f4 @0>") && want[512..].starts_with(b"<w1 f4 @512>"));
    assert_eq!(difference(&want, Some(&want)), "the same bytes");
    let other = file_bytes(0, 5, 3000);
    assert!(difference(&want, Some(&other)).contains(r#"tags ["w0 f5 @512""#), "{}", difference(&want, Some(&other)));
    let short = difference(&want, Some(&want[..1024]));
    assert!(short.starts_with("1024 bytes read, 3000 put; first difference at 1024"), "{short}");
    let mut zeroed = want.clone();
    zeroed[2048..].fill(0);
    assert!(difference(&want, Some(&zeroed)).contains("at 2048; from there 952 zero bytes"));
    assert_eq!(difference(&want, None), "nothing read back");
}
