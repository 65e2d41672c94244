//! The Python package's own test suite (python/tests: fsspec's abstract
//! suite, pandas and pyarrow, logins, errors, threads) as part of the test
//! command: the package is built and installed with `maturin develop` into a
//! virtual environment under the target directory (made once, seeing the
//! machine's packages), and pytest runs it against a real `nasd up` started
//! from the debug `nasd` binary.
//!
//! Python with maturin, fsspec, pytest, pandas and pyarrow must be installed
//! (`.ci/run` installs them). Without them the test says what is missing
//! and passes — except under `CI=true`, where it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// The Python modules the package and its tests need.
const PYTHON_MODULES: [&str; 5] = ["maturin", "fsspec", "pytest", "pandas", "pyarrow"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository")
}

fn target_dir(repo: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo.join("target"), PathBuf::from)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run(cmd: &mut Command, what: &str) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(out.status.success(), "{what} failed ({}):\n{}\n{}", out.status, text(&out.stdout), text(&out.stderr));
    out
}

/// The modules of [`PYTHON_MODULES`] `python` cannot import, or why Python itself cannot run.
fn missing_modules(python: &str) -> Result<Vec<String>, String> {
    let probe = "import importlib.util, sys\n\
                 print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))";
    let out = Command::new(python)
        .args(["-c", probe])
        .args(PYTHON_MODULES)
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{python} failed: {}", text(&out.stderr)));
    }
    Ok(text(&out.stdout).split_whitespace().map(str::to_string).collect())
}

/// The `maturin` program installed beside `python` (its scripts directory), else the one on `$PATH`.
fn maturin(python: &str) -> PathBuf {
    let out = Command::new(python)
        .args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"])
        .output()
        .expect("ask python for its scripts directory");
    let beside = PathBuf::from(text(&out.stdout).trim()).join("maturin");
    if beside.exists() {
        beside
    } else {
        PathBuf::from("maturin")
    }
}

/// The virtual environment the package is installed into (made on first use).
fn venv(python: &str, target: &Path) -> PathBuf {
    let venv = target.join("python-venv");
    if !venv.join("bin/python").exists() {
        // The machine's packages (fsspec, pytest, pandas, pyarrow) are seen from inside it.
        run(Command::new(python).args(["-m", "venv", "--system-site-packages"]).arg(&venv), "python -m venv");
    }
    venv
}

/// The debug `nasd` binary the tests start `nasd up` with: the one `cargo
/// test --workspace` built for the CLI's tests, else built now.
fn nasd_binary(repo: &Path, target: &Path) -> PathBuf {
    let binary = target.join("debug/nasd");
    if !binary.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        run(Command::new(cargo).args(["build", "-p", "nasd-cli", "--bin", "nasd"]).current_dir(repo), "cargo build");
    }
    binary
}

#[test]
fn the_python_package_passes_its_test_suite_against_nasd_up() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let missing = match missing_modules(&python) {
        Ok(m) if m.is_empty() => None,
        Ok(m) => Some(format!("Python modules missing: {} (pip install {})", m.join(", "), m.join(" "))),
        Err(e) => Some(e),
    };
    if let Some(why) = missing {
        assert!(!ci, "{why}: .ci/run installs them");
        eprintln!("skipped: {why}");
        return;
    }
    let repo = repo();
    let target = target_dir(&repo);
    let venv = venv(&python, &target);
    let venv_python = venv.join("bin/python");
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());

    let started = Instant::now();
    run(
        Command::new(maturin(&python))
            .args(["develop", "--quiet"])
            // A target directory of its own: maturin builds with another environment (pyo3's
            // extension-module setting, the C compiler's), which would make the next `cargo test`
            // rebuild ring, rustls and pyo3 in the shared one, and this build them again.
            .env("CARGO_TARGET_DIR", target.join("python-build"))
            .current_dir(repo.join("python"))
            .env("VIRTUAL_ENV", &venv)
            .env("PATH", &path),
        "maturin develop",
    );
    let built = started.elapsed();

    let nasd = nasd_binary(&repo, &target);
    let out = Command::new(&venv_python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "python/tests"])
        .current_dir(&repo)
        .env("NASD_BIN", &nasd)
        .env("PATH", &path)
        .env_remove("NASD_CONFIG")
        .output()
        .expect("run pytest");
    let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "pytest failed ({}):\n{report}", out.status);
    let summary = report.lines().rev().find(|l| l.contains(" passed")).unwrap_or("").to_string();
    assert!(!summary.contains("skipped"), "no test may be skipped: {summary}");
    eprintln!("maturin develop {:.1?}; pytest: {summary}", built);
}
