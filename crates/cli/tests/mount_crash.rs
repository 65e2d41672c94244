//! What a program acknowledged through `nasd mount` survives `kill -9` of the
//! manager (issue 24.4), on real processes: two `nasd drive`s, a `nasd
//! manager` whose periodic metadata flush is set beyond the test (so only a
//! client's `fsync` flushes its log) and a `nasd mount` (FUSE; calls wait up
//! to 120 s for the manager, so a manager that does not come back fails the
//! test rather than hanging it).
//!
//! Three rounds; in each, worker processes in directories of their own
//! (`/w0`, …) create files (written, `fsync`ed, closed), rename them (onto free names and
//! over other files, the directory `fsync`ed after), unlink them, and make
//! and remove directories, each recording in a model what the mount
//! acknowledged. The manager is SIGKILLed at a moment drawn from a printed
//! seed (`NASD_SEED=N` repeats the schedule) and started again on its data
//! after another; each worker stops after the call it had in flight, which
//! may have happened or not (a create: not at all, or the name with no data
//! or all of it). Then a second, fresh `nasd mount` (nothing cached) reads
//! every directory back: names, kinds and every file's bytes must be the
//! model's, the one call in flight per worker allowed either outcome.
//!
//! The workers are processes (this test binary run again, `worker_process`),
//! not threads of the test: the test starts the manager, and a process
//! forked while one of its threads has a file open in the mount closes its
//! copy of that descriptor at `exec`, which FUSE turns into a `FLUSH` the
//! mount answers only once the manager is back — the manager being started
//! would wait for itself (found by this test: a restart that never listened).

mod common;

use common::cluster::{Cluster, Options};
use common::{nasd_command, until};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Workers, each in a directory of its own.
const WORKERS: usize = 3;
/// Kill-and-restart rounds.
const ROUNDS: u64 = 3;
/// Largest file a worker writes (some below the manager's small-file
/// threshold, some on the drives).
const FILE_BYTES_MAX: usize = 200_000;

/// Why the mount cannot be tested here, if it cannot.
fn fuse_unavailable() -> Option<String> {
    match fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => None,
        Err(e) => Some(format!("/dev/fuse cannot be opened ({e}): FUSE mounts need root and the fuse module")),
    }
}

/// The seed of the schedule: `$NASD_SEED`, else fresh; printed.
fn seed() -> u64 {
    let seed = std::env::var("NASD_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        now.as_nanos() as u64 ^ u64::from(std::process::id())
    });
    eprintln!("mount_crash: seed {seed} (NASD_SEED={seed} repeats this schedule)");
    seed
}

/// A `nasd mount` serving in the background, its output in a file.
struct Mounted {
    child: Option<Child>,
    point: PathBuf,
    log: PathBuf,
}

impl Mounted {
    fn start(cluster: &Cluster, point: &Path) -> Mounted {
        fs::create_dir_all(point).unwrap();
        let log = cluster.dir().join(format!("mount-{}.log", point.file_name().unwrap().to_string_lossy()));
        let out = fs::File::create(&log).unwrap();
        let child = nasd_command()
            .arg("--config")
            .arg(&cluster.config)
            .arg("mount")
            .arg(point)
            // Bounded: a manager that never comes back fails the test with its logs instead of
            // hanging it (the restart takes well under this).
            .args(["--manager-wait", "120s"])
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("run nasd mount");
        let mut m = Mounted { child: Some(child), point: point.to_path_buf(), log };
        until("nasd mount mounting", || {
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("nasd mount ended ({status}):\n{}", m.output());
            }
            m.output().contains("mounted at")
        });
        m
    }

    fn output(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM: it unmounts and ends.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child, not reaped yet.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) }, 0);
        let mut status = None;
        until("nasd mount ending on SIGTERM", || {
            status = child.try_wait().unwrap();
            status.is_some()
        });
        let status = status.unwrap();
        assert!(status.success(), "nasd mount ended with {status}:\n{}", self.output());
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            let path = CString::new(self.point.as_os_str().as_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// What a name in a worker's directory is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Node {
    File(Vec<u8>),
    Dir,
}

type Model = BTreeMap<String, Node>;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Op {
    Create(String, Vec<u8>),
    Rename(String, String),
    Unlink(String),
    Mkdir(String),
    Rmdir(String),
}

impl Op {
    /// The model after the call, acknowledged.
    fn apply(&self, m: &mut Model) {
        match self {
            Op::Create(name, data) => {
                m.insert(name.clone(), Node::File(data.clone()));
            }
            Op::Rename(from, to) => {
                let node = m.remove(from).expect("renames a known name");
                m.insert(to.clone(), node);
            }
            Op::Unlink(name) | Op::Rmdir(name) => {
                m.remove(name);
            }
            Op::Mkdir(name) => {
                m.insert(name.clone(), Node::Dir);
            }
        }
    }

    /// Every state the call may have left if it was in flight at the kill.
    fn outcomes(&self, m: &Model) -> Vec<Model> {
        let mut done = m.clone();
        self.apply(&mut done);
        let mut all = vec![m.clone(), done];
        if let Op::Create(name, _) = self {
            // Created, its data never committed.
            let mut empty = m.clone();
            empty.insert(name.clone(), Node::File(Vec::new()));
            all.push(empty);
        }
        all
    }

    /// Runs it through the mount in `dir`.
    fn run(&self, dir: &Path) -> std::io::Result<()> {
        match self {
            Op::Create(name, data) => {
                let mut f = fs::OpenOptions::new().write(true).create_new(true).open(dir.join(name))?;
                f.write_all(data)?;
                f.sync_all()
            }
            Op::Rename(from, to) => {
                fs::rename(dir.join(from), dir.join(to))?;
                fs::File::open(dir)?.sync_all()
            }
            Op::Unlink(name) => fs::remove_file(dir.join(name)),
            Op::Mkdir(name) => fs::create_dir(dir.join(name)),
            Op::Rmdir(name) => fs::remove_dir(dir.join(name)),
        }
    }
}

fn names_where(m: &Model, f: impl Fn(&Node) -> bool) -> Vec<String> {
    m.iter().filter(|(_, n)| f(n)).map(|(k, _)| k.clone()).collect()
}

fn pick(rng: &mut StdRng, v: &[String]) -> Option<String> {
    (!v.is_empty()).then(|| v[rng.gen_range(0..v.len())].clone())
}

/// The next call for a directory in state `m`.
fn next_op(rng: &mut StdRng, m: &Model, prefix: &str, counter: &mut u64) -> Op {
    let files = names_where(m, |n| matches!(n, Node::File(_)));
    let dirs = names_where(m, |n| *n == Node::Dir);
    *counter += 1;
    let fresh = |p: &str| format!("{p}{prefix}-{counter}");
    loop {
        let op = match rng.gen_range(0..10) {
            0..=3 => {
                let mut data = vec![0u8; rng.gen_range(0..=FILE_BYTES_MAX)];
                rng.fill(&mut data[..]);
                Some(Op::Create(fresh("f"), data))
            }
            4 | 5 => pick(rng, &files).map(|from| {
                let to = match rng.gen_bool(0.4) {
                    true => pick(rng, &files).filter(|t| *t != from).unwrap_or_else(|| fresh("r")),
                    false => fresh("r"),
                };
                Op::Rename(from, to)
            }),
            6 | 7 => pick(rng, &files).map(Op::Unlink),
            8 => Some(Op::Mkdir(fresh("d"))),
            _ => pick(rng, &dirs).map(Op::Rmdir),
        };
        if let Some(op) = op {
            return op;
        }
    }
}

/// What a worker process is given (JSON, in the file `$NASD_MOUNT_CRASH_WORKER` names).
#[derive(Serialize, Deserialize)]
struct WorkerTask {
    dir: PathBuf,
    round: u64,
    model: Model,
    seed: u64,
    /// Exists once the manager is about to be killed: no call after it.
    stop: PathBuf,
    /// Where the worker writes its [`WorkerResult`].
    result: PathBuf,
}

/// A worker's round: its model, and the call that failed after the kill, if one did.
#[derive(Serialize, Deserialize)]
struct WorkerResult {
    model: Model,
    in_flight: Option<Op>,
}

/// A worker's round: calls until the stop file exists.
fn worker(task: WorkerTask) -> WorkerResult {
    let mut rng = StdRng::seed_from_u64(task.seed);
    let mut counter = 0;
    let prefix = format!("{}", task.round);
    let mut model = task.model;
    while !task.stop.exists() {
        let op = next_op(&mut rng, &model, &prefix, &mut counter);
        match op.run(&task.dir) {
            Ok(()) => op.apply(&mut model),
            Err(e) => {
                assert!(task.stop.exists(), "{}: {op:?} failed with no kill to explain it: {e}", task.dir.display());
                return WorkerResult { model, in_flight: Some(op) };
            }
        }
    }
    WorkerResult { model, in_flight: None }
}

/// Not a test: the body of a worker process the test below starts (this
/// binary again); it returns at once when run otherwise.
#[test]
#[ignore = "run by acknowledged_calls_through_the_mount_survive_sigkill_of_the_manager"]
fn worker_process() {
    let Ok(task) = std::env::var("NASD_MOUNT_CRASH_WORKER") else {
        eprintln!("worker_process: not a test, the worker of acknowledged_calls_through_the_mount_survive_sigkill_of_the_manager");
        return;
    };
    let task: WorkerTask = serde_json::from_slice(&fs::read(task).expect("read the task")).expect("decode the task");
    let result_path = task.result.clone();
    let result = worker(task);
    fs::write(result_path, serde_json::to_vec(&result).expect("encode")).expect("write the result");
}

/// A worker process running `task`.
fn spawn_worker(task: &WorkerTask, log: &Path) -> Child {
    let task_file = task.result.with_extension("task");
    fs::write(&task_file, serde_json::to_vec(task).expect("encode")).unwrap();
    let out = fs::File::create(log).unwrap();
    Command::new(std::env::current_exe().expect("this test binary"))
        .args(["worker_process", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("NASD_MOUNT_CRASH_WORKER", &task_file)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start a worker process")
}

/// Waits for a worker process and reads its result.
fn finish_worker(mut child: Child, task: &WorkerTask, log: &Path) -> WorkerResult {
    let status = child.wait().expect("wait for a worker");
    let output = fs::read_to_string(log).unwrap_or_default();
    assert!(status.success(), "worker in {} ended with {status}:\n{output}", task.dir.display());
    let bytes = fs::read(&task.result).unwrap_or_else(|e| panic!("no result from the worker ({e}):\n{output}"));
    serde_json::from_slice(&bytes).expect("decode the result")
}

/// A directory as a fresh mount shows it.
fn read_back(dir: &Path) -> Model {
    let mut m = Model::new();
    for e in fs::read_dir(dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display())) {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let node = if e.file_type().unwrap().is_dir() {
            Node::Dir
        } else {
            Node::File(fs::read(e.path()).unwrap_or_else(|err| panic!("read {}: {err}", e.path().display())))
        };
        m.insert(name, node);
    }
    m
}

/// Names and sizes, for a failure message.
fn describe(m: &Model) -> String {
    let items: Vec<String> = m
        .iter()
        .map(|(k, n)| match n {
            Node::Dir => format!("{k}/"),
            Node::File(d) => format!("{k}({} B)", d.len()),
        })
        .collect();
    items.join(" ")
}

#[test]
fn acknowledged_calls_through_the_mount_survive_sigkill_of_the_manager() {
    if let Some(why) = fuse_unavailable() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    // The periodic flush beyond the test: what survives, survives the kill on its own or by fsync.
    let mut cluster =
        Cluster::start(Options { drives: 2, manager: "metadata_sync_ms = 60000".into(), drive_args: Vec::new() });
    let point = cluster.dir().join("mnt");
    let mount = Mounted::start(&cluster, &point);
    let mut models = vec![Model::new(); WORKERS];
    for w in 0..WORKERS {
        fs::create_dir(point.join(format!("w{w}"))).unwrap();
    }
    for round in 0..ROUNDS {
        let stop = cluster.dir().join(format!("stop{round}"));
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let task = WorkerTask {
                    dir: point.join(format!("w{w}")),
                    round,
                    model: models[w].clone(),
                    seed: seed ^ (round << 32) ^ w as u64,
                    stop: stop.clone(),
                    result: cluster.dir().join(format!("worker-{round}-{w}.result")),
                };
                let log = cluster.dir().join(format!("worker-{round}-{w}.log"));
                let child = spawn_worker(&task, &log);
                (child, task, log)
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.gen_range(300..2500)));
        fs::write(&stop, b"").unwrap();
        cluster.kill_manager();
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..1000)));
        cluster.start_manager();
        let ended: Vec<_> = workers
            .into_iter()
            .map(|(child, task, log)| {
                let r = finish_worker(child, &task, &log);
                (r.model, r.in_flight)
            })
            .collect();

        // A fresh mount: nothing it shows comes from the first mount's caches.
        let check_point = cluster.dir().join(format!("check{round}"));
        let check = Mounted::start(&cluster, &check_point);
        for (w, (model, in_flight)) in ended.into_iter().enumerate() {
            let got = read_back(&check_point.join(format!("w{w}")));
            let allowed = match &in_flight {
                Some(op) => op.outcomes(&model),
                None => vec![model.clone()],
            };
            assert!(
                allowed.contains(&got),
                "round {round}, worker {w} (seed {seed}): the mount shows [{}], acknowledged was [{}] (in flight at \
                 the kill: {in_flight:?})\n{}",
                describe(&got),
                describe(&model),
                cluster.logs()
            );
            models[w] = got;
        }
        check.stop();
        eprintln!("round {round}: {} names checked", models.iter().map(BTreeMap::len).sum::<usize>());
    }
    mount.stop();
}
