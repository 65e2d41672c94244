//! The S3 gateway (`nasd s3`) on a real cluster, driven by real clients:
//! aws-cli (`s3 mb/cp/ls/sync`, a multipart `cp`, `s3api
//! head-object/get-object --range`, `s3 presign` fetched with curl) and a
//! boto3 script (`tests/s3/boto3_check.py`; checksums in
//! `checksum_check.py`, uploads in flight in `in_flight_check.py`, failed
//! re-sends and completions in `resend_check.py`, two gateways on one upload
//! in `two_gateways_check.py`). Keys issued with `nasd
//! s3-key`; another user's bucket refused (AccessDenied); unsigned and
//! badly signed requests get their S3 errors and change nothing; a revoked
//! key is refused at its next request.

mod common;

use common::cluster::{path_str, Cluster, Options};
use common::up::Up;
use common::Daemon;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// One user's S3 credentials.
struct Key {
    access: String,
    secret: String,
}

fn issue(c: &Cluster, keys: &Path, owner: &str) -> Key {
    let out = c.run_ok(&["s3-key", "create", "--owner", owner, "--keys", path_str(keys)]);
    let field = |name: &str| {
        out.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_string()).unwrap_or_else(|| panic!("{out}"))
    };
    Key { access: field("access key:"), secret: field("secret key:") }
}

fn aws(endpoint: &str, key: &Key, args: &[&str]) -> Output {
    let mut cmd = Command::new("aws");
    cmd.arg("--endpoint-url").arg(endpoint).args(args);
    client_env(&mut cmd, key);
    cmd.output().expect("run aws (aws-cli)")
}

fn client_env(cmd: &mut Command, key: &Key) {
    cmd.env("AWS_ACCESS_KEY_ID", &key.access)
        .env("AWS_SECRET_ACCESS_KEY", &key.secret)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN");
}

fn aws_ok(endpoint: &str, key: &Key, args: &[&str]) -> String {
    let out = aws(endpoint, key, args);
    assert!(
        out.status.success(),
        "aws {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn aws_err(endpoint: &str, key: &Key, args: &[&str]) -> String {
    let out = aws(endpoint, key, args);
    assert!(!out.status.success(), "aws {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Deterministic bytes from `seed` (xorshift).
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Every file under `dir`, by relative path, with its contents.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// A raw HTTP request (no signature): status line and body.
fn raw_http(addr: std::net::SocketAddr, request: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn s3_gateway_with_aws_cli_and_boto3() {
    let seed: u64 = std::env::var("NASD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("seed {seed} (NASD_TEST_SEED)");
    let c = Cluster::start(Options { drives: 3, manager: String::new(), drive_args: Vec::new() });
    for (name, uid) in [("alice", "2000"), ("bob", "2001")] {
        let mut cmd = c.nasd(&["admin", "add-user", name, "--uid", uid]);
        cmd.env("NASD_NEW_PASSWORD", format!("{name} password"));
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    // Users make buckets at the top level; the gateway (the administrator here) acts for them.
    c.run_ok(&["chmod", "1777", "/"]);
    c.run_ok(&["admin", "set-gateway", "admin", "--ids", "1000-60000"]);
    let keys = c.dir().join("s3-keys");
    let alice = issue(&c, &keys, "alice");
    let bob = issue(&c, &keys, "bob");
    let listed = c.run_ok(&["s3-key", "list", "--keys", path_str(&keys)]);
    assert!(listed.contains(&alice.access) && listed.contains(&bob.access), "{listed}");
    assert!(!listed.contains(&alice.secret), "list shows no secret: {listed}");
    let stored = std::fs::read_to_string(keys.join("keys.json")).unwrap();
    assert!(!stored.contains(&alice.secret), "the secret is stored sealed");

    // Plain HTTP off loopback only when asked for.
    let refused = c.run(&["s3", "--listen", "0.0.0.0:0", "--keys", path_str(&keys)]);
    assert!(!refused.status.success() && refused.stderr.contains("--plain-http-off-loopback"), "{}", refused.stderr);

    let log = c.dir().join("s3.log");
    let gateway = start_gateway(&c, &c.config, &keys, &log);
    let endpoint = format!("http://{}", gateway.addr);
    let ep = endpoint.as_str();
    let work = c.dir().join("client");
    std::fs::create_dir_all(&work).unwrap();

    // aws s3: a bucket, an object in a nested key, listing, download.
    aws_ok(ep, &alice, &["s3", "mb", "s3://alice-data"]);
    let big = bytes(seed, 5 * 1024 * 1024 + 12345);
    let big_path = work.join("big.bin");
    std::fs::write(&big_path, &big).unwrap();
    aws_ok(ep, &alice, &["s3", "cp", path_str(&big_path), "s3://alice-data/dir/sub/big.bin"]);
    let ls = aws_ok(ep, &alice, &["s3", "ls", "s3://alice-data/dir/sub/"]);
    assert!(ls.contains("big.bin") && ls.contains(&big.len().to_string()), "{ls}");
    let ls = aws_ok(ep, &alice, &["s3", "ls", "s3://alice-data/"]);
    assert!(ls.contains("PRE dir/"), "{ls}");
    let buckets = aws_ok(ep, &alice, &["s3", "ls"]);
    assert!(buckets.contains("alice-data"), "{buckets}");
    let back = work.join("back.bin");
    aws_ok(ep, &alice, &["s3", "cp", "s3://alice-data/dir/sub/big.bin", path_str(&back)]);
    assert!(std::fs::read(&back).unwrap() == big, "downloaded object differs");
    // It is a nasd file at the path the key names.
    let cat = c.nasd(&["stat", "/alice-data/dir/sub/big.bin"]).output().unwrap();
    assert!(cat.status.success(), "{}", String::from_utf8_lossy(&cat.stderr));

    // Big enough for aws-cli to upload in parts (8 MiB each): whole, with an MD5-of-MD5s-3 ETag.
    let huge = bytes(seed ^ 0x5a5a, 20 * 1024 * 1024 + 777);
    let huge_path = work.join("huge.bin");
    std::fs::write(&huge_path, &huge).unwrap();
    aws_ok(ep, &alice, &["s3", "cp", path_str(&huge_path), "s3://alice-data/huge.bin"]);
    let head = aws_ok(ep, &alice, &["s3api", "head-object", "--bucket", "alice-data", "--key", "huge.bin"]);
    assert!(head.contains("-3\\\"") && head.contains(&format!("\"ContentLength\": {}", huge.len())), "{head}");
    let huge_back = work.join("huge-back.bin");
    aws_ok(ep, &alice, &["s3", "cp", "s3://alice-data/huge.bin", path_str(&huge_back)]);
    assert!(std::fs::read(&huge_back).unwrap() == huge, "the multipart object differs");

    // s3api: ETag is the body's MD5, ranges.
    let head = aws_ok(ep, &alice, &["s3api", "head-object", "--bucket", "alice-data", "--key", "dir/sub/big.bin"]);
    let md5 = format!("{:032x}", md5_of(&big));
    assert!(head.contains(&md5) && head.contains(&format!("\"ContentLength\": {}", big.len())), "{head}");
    let part = work.join("part.bin");
    let got = aws_ok(
        ep,
        &alice,
        &[
            "s3api",
            "get-object",
            "--bucket",
            "alice-data",
            "--key",
            "dir/sub/big.bin",
            "--range",
            "bytes=1000-1999",
            path_str(&part),
        ],
    );
    assert!(got.contains("bytes 1000-1999/"), "{got}");
    assert!(std::fs::read(&part).unwrap() == big[1000..2000], "range differs");

    // A presigned URL (SigV4 in the query) fetched without any credentials.
    let url = aws_ok(ep, &alice, &["s3", "presign", "s3://alice-data/dir/sub/big.bin", "--expires-in", "300"]);
    let fetched = Command::new("curl").args(["-sf", url.trim()]).output().expect("run curl");
    assert!(
        fetched.status.success() && fetched.stdout == big,
        "presigned GET: {}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    let tampered = url.trim().replace("big.bin", "huge.bin");
    let refused = Command::new("curl").args(["-s", &tampered]).output().expect("run curl");
    let refused = String::from_utf8_lossy(&refused.stdout);
    assert!(refused.contains("<Code>SignatureDoesNotMatch</Code>"), "{refused}");

    // aws s3 sync of a tree up, and down into another directory: the same files.
    let up = work.join("tree");
    for (i, rel) in
        ["a.txt", "d1/b.txt", "d1/d2/c with space.txt", "d1/d2/plus+sign.bin", "e/f/g/h.dat"].iter().enumerate()
    {
        let p = up.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes(seed ^ (i as u64 + 1), 1000 * (i + 1))).unwrap();
    }
    aws_ok(ep, &alice, &["s3", "sync", path_str(&up), "s3://alice-data/tree"]);
    let down = work.join("tree-back");
    aws_ok(ep, &alice, &["s3", "sync", "s3://alice-data/tree", path_str(&down)]);
    assert!(tree(&up) == tree(&down), "the tree synced back differs");
    let again = aws_ok(ep, &alice, &["s3", "sync", path_str(&up), "s3://alice-data/tree"]);
    assert!(again.trim().is_empty(), "a second sync copies nothing: {again}");

    // boto3.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/boto3_check.py");
    let mut py = Command::new("python3");
    py.arg(&script).arg(ep).arg("alice-data");
    client_env(&mut py, &alice);
    let out = py.output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("boto3 ok"),
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        common::log_tail(&log)
    );

    // Checksums (checksum_check.py), and uploads in flight bounded per user (in_flight_check.py).
    python_check(ep, &alice, "checksum_check.py", &["alice-data"], "checksums ok", &log);
    let held = nasd_s3::UPLOADS_IN_FLIGHT_PER_USER_DEFAULT.to_string();
    python_check(ep, &alice, "in_flight_check.py", &["alice-data", &held], "in flight ok", &log);

    // Bob: his own bucket works, alice's is refused by nasd's modes.
    aws_ok(ep, &bob, &["s3", "mb", "s3://bob-data"]);
    let e = aws_err(ep, &bob, &["s3", "ls", "s3://alice-data/"]);
    assert!(e.contains("AccessDenied"), "{e}");
    let e = aws_err(
        ep,
        &bob,
        &["s3api", "get-object", "--bucket", "alice-data", "--key", "dir/sub/big.bin", path_str(&part)],
    );
    assert!(e.contains("AccessDenied"), "{e}");
    let e = aws_err(ep, &bob, &["s3", "cp", path_str(&big_path), "s3://alice-data/bob-was-here"]);
    assert!(e.contains("AccessDenied"), "{e}");
    let buckets = aws_ok(ep, &bob, &["s3", "ls"]);
    assert!(buckets.contains("bob-data") && !buckets.contains("alice-data"), "{buckets}");

    // Unsigned and badly signed requests: their S3 errors, nothing changed.
    let reply = raw_http(
        gateway.addr,
        "PUT /alice-data/unsigned HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert!(reply.starts_with("HTTP/1.1 403") && reply.contains("<Code>AccessDenied</Code>"), "{reply}");
    let forged = Key { access: alice.access.clone(), secret: "0".repeat(40) };
    let e = aws_err(ep, &forged, &["s3", "cp", path_str(&big_path), "s3://alice-data/forged"]);
    assert!(e.contains("SignatureDoesNotMatch"), "{e}");
    let unknown = Key { access: "NASD0000000000000000".into(), secret: alice.secret.clone() };
    let e = aws_err(ep, &unknown, &["s3", "ls", "s3://alice-data/"]);
    assert!(e.contains("InvalidAccessKeyId"), "{e}");
    let ls = aws_ok(ep, &alice, &["s3", "ls", "s3://alice-data/"]);
    assert!(!ls.contains("unsigned") && !ls.contains("forged"), "{ls}");

    // Revoked: alice's next request is refused; bob's key still works.
    c.run_ok(&["s3-key", "revoke", &alice.access, "--keys", path_str(&keys)]);
    let e = aws_err(ep, &alice, &["s3", "ls", "s3://alice-data/"]);
    assert!(e.contains("InvalidAccessKeyId"), "{e}");
    aws_ok(ep, &bob, &["s3", "ls", "s3://bob-data/"]);
    drop(gateway);
}

/// Runs `tests/s3/SCRIPT ENDPOINT ARGS...` with `key`'s credentials; it must
/// succeed and print `ok`.
fn python_check(endpoint: &str, key: &Key, script: &str, args: &[&str], ok: &str, log: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3").join(script);
    let mut py = Command::new("python3");
    py.arg(&script).arg(endpoint).args(args);
    client_env(&mut py, key);
    let out = py.output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains(ok),
        "{}: {}{}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        common::log_tail(log)
    );
}

fn md5_of(data: &[u8]) -> u128 {
    use md5::Digest;
    let d = md5::Md5::digest(data);
    u128::from_be_bytes(d.into())
}

/// `nasd up` serves S3 too: the banner names the endpoint; the
/// administrator's key is in an AWS credentials file that aws-cli takes as
/// written; a user's key made with `nasd s3-key create` works through the
/// same gateway (up gave it its grant) and sees only its own buckets; a
/// disabled user is refused at its next request and served again once
/// enabled; after a restart the same keys work, the objects are there, and
/// `--no-s3` serves none.
#[test]
fn nasd_up_serves_s3_with_the_administrators_key() {
    let tmp = tempfile::tempdir().unwrap();
    let mut up = Up::start(tmp.path(), 3, &[]);
    let ready = up.daemon.output_once("S3 gateway ready at ");
    let endpoint = s3_endpoint(&ready);
    let banner = format!("  s3        {endpoint} ");
    assert!(ready.contains(&banner), "the banner names the endpoint: {ready}");
    let credentials = up.data().join("s3").join("credentials");
    assert!(ready.contains(&format!("AWS_SHARED_CREDENTIALS_FILE={}", credentials.display())), "{ready}");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&credentials).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the secret is the owner's only");
    let admin_aws = |args: &[&str]| {
        let mut cmd = Command::new("aws");
        cmd.arg("--endpoint-url").arg(&endpoint).args(args);
        cmd.env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .env("AWS_CONFIG_FILE", "/nonexistent")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN");
        let out = cmd.output().expect("run aws (aws-cli)");
        assert!(out.status.success(), "aws {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let data = bytes(26, 3 << 20);
    let local = tmp.path().join("object.bin");
    std::fs::write(&local, &data).unwrap();
    admin_aws(&["s3", "mb", "s3://admins"]);
    admin_aws(&["s3", "cp", path_str(&local), "s3://admins/dir/object.bin"]);
    assert!(admin_aws(&["s3", "ls", "s3://admins/dir/"]).contains("object.bin"));
    assert!(up.ok(&["ls", "/admins/dir"]).contains("object.bin"), "a bucket is a directory of the file system");

    // A user's key, issued with the config `nasd up` wrote (its key store).
    let add = common::up::nasd_in(
        tmp.path(),
        &["auth", "add-user", "dora", "--uid", "1003"],
        &[("NASD_NEW_PASSWORD", "dora-secret-1")],
    );
    assert!(add.status.success(), "{}", String::from_utf8_lossy(&add.stderr));
    let out = up.ok(&["s3-key", "create", "--owner", "dora"]);
    let field = |name: &str| out.lines().find_map(|l| l.strip_prefix(name)).unwrap().trim().to_string();
    let dora = Key { access: field("access key:"), secret: field("secret key:") };
    // Users make buckets where they may make a top-level directory.
    up.ok(&["chmod", "1777", "/"]);
    aws_ok(&endpoint, &dora, &["s3", "mb", "s3://doras"]);
    aws_ok(&endpoint, &dora, &["s3", "cp", path_str(&local), "s3://doras/f"]);
    let stat = up.ok(&["stat", "/doras/f"]);
    assert!(stat.contains("1003") || stat.contains("dora"), "made as dora: {stat}");
    let buckets = aws_ok(&endpoint, &dora, &["s3", "ls"]);
    assert!(buckets.contains("doras") && !buckets.contains("admins"), "{buckets}");
    aws_err(&endpoint, &dora, &["s3", "ls", "s3://admins/"]);

    up.ok(&["auth", "disable", "dora"]);
    let refused = aws_err(&endpoint, &dora, &["s3", "ls", "s3://doras/"]);
    assert!(refused.contains("AccessDenied"), "{refused}");
    up.ok(&["auth", "enable", "dora"]);
    // `nasd auth enable` told the manager too: served again at once.
    aws_ok(&endpoint, &dora, &["s3", "ls", "s3://doras/"]);

    up.daemon.terminate();
    let mut up = Up::start_with(tmp.path(), 3, Some(up.daemon.addr), &[], &[]);
    let whole_ready_lines = |out: String| {
        out.split_inclusive('\n').filter(|l| l.starts_with("S3 gateway ready at ") && l.ends_with('\n')).count()
    };
    common::until("the second gateway", || whole_ready_lines(up.daemon.output()) == 2);
    let again = up.daemon.output();
    assert_eq!(s3_endpoint(&again), endpoint, "the recorded endpoint");
    let back = tmp.path().join("back.bin");
    admin_aws(&["s3", "cp", "s3://admins/dir/object.bin", path_str(&back)]);
    assert!(std::fs::read(&back).unwrap() == data, "read back whole after a restart");
    aws_ok(&endpoint, &dora, &["s3", "ls", "s3://doras/"]);

    up.daemon.terminate();
    let up = Up::start_with(tmp.path(), 3, Some(up.daemon.addr), &["--no-s3"], &[]);
    // The log holds every start's output: this is the third.
    common::until("the third start's banner", || up.daemon.output().matches("nasd is up").count() == 3);
    let said = up.daemon.output();
    let banner = said.rsplit("nasd is up").next().unwrap();
    assert!(banner.contains("  config  ") && !banner.contains("  s3  "), "{banner}");
    let addr: std::net::SocketAddr = endpoint.trim_start_matches("http://").parse().unwrap();
    assert!(std::net::TcpStream::connect(addr).is_err(), "nothing serves S3 with --no-s3");
}

/// `nasd up` with `[s3] tls = true` in its `nasd.toml` serves its gateway
/// over HTTPS: the ready line and the banner say `https://` and name the CA
/// (made beside the key store), aws-cli trusting that CA copies a multipart
/// file up and back, and plain HTTP to the port gets no HTTP answer.
#[test]
fn nasd_up_serves_s3_over_https_when_configured() {
    let seed = test_seed();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("nasd-data");
    std::fs::create_dir(&data).unwrap();
    let first_drive_port = common::up::free_ports(3);
    std::fs::write(
        data.join("nasd.toml"),
        format!("[up]\nfirst_drive_port = {first_drive_port}\n\n[s3]\ntls = true\n"),
    )
    .unwrap();
    let up = Up::start(tmp.path(), 3, &[]);
    let ready = up.daemon.output_once("S3 gateway ready at ");
    let endpoint = s3_endpoint(&ready);
    assert!(endpoint.starts_with("https://"), "{ready}");
    assert!(ready.contains(&format!("  s3        {endpoint} ")), "the banner names the HTTPS endpoint: {ready}");
    let ca = data.join("s3").join("tls").join("ca.pem");
    assert!(ready.contains(&format!("AWS_CA_BUNDLE={}", ca.display())), "the ready line names the CA: {ready}");
    let key = up_key(&up);
    let aws_tls = |args: &[&str]| {
        let mut all = vec!["--ca-bundle", path_str(&ca)];
        all.extend_from_slice(args);
        aws_ok(&endpoint, &key, &all)
    };
    aws_tls(&["s3", "mb", "s3://secure-up"]);
    let sent = bytes(seed, 9 * 1024 * 1024 + 77);
    let local = tmp.path().join("up.bin");
    std::fs::write(&local, &sent).unwrap();
    aws_tls(&["s3", "cp", "--no-progress", path_str(&local), "s3://secure-up/up.bin"]);
    let back = tmp.path().join("back.bin");
    aws_tls(&["s3", "cp", "--no-progress", "s3://secure-up/up.bin", path_str(&back)]);
    assert!(std::fs::read(&back).unwrap() == sent, "the file copied over HTTPS differs");
    let addr: std::net::SocketAddr = endpoint.trim_start_matches("https://").parse().unwrap();
    let plain = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /secure-up HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    assert!(!plain.contains("HTTP/1.1"), "plain HTTP to the HTTPS port gets no HTTP answer: {plain}");
}

/// The endpoint in `nasd up`'s "S3 gateway ready at http://ADDR:" line.
fn s3_endpoint(output: &str) -> String {
    let line =
        output.lines().rev().find(|l| l.starts_with("S3 gateway ready at ")).unwrap_or_else(|| panic!("{output}"));
    let rest = line.trim_start_matches("S3 gateway ready at ");
    rest.split(": ").next().unwrap().to_string()
}

/// The credentials `nasd up` wrote for its administrator.
fn up_key(up: &Up) -> Key {
    let text = std::fs::read_to_string(up.data().join("s3").join("credentials")).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("{name}"))
    };
    Key { access: field("aws_access_key_id = "), secret: field("aws_secret_access_key = ") }
}

/// Runs a third-party client, which must succeed; its standard output and error.
fn client_ok(cmd: &mut Command) -> String {
    let out = cmd.env_remove("AWS_CA_BUNDLE").output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?}: {said}");
    said
}

/// A FUSE mount the test made, unmounted when dropped.
struct FuseMount(PathBuf, std::process::Child);

impl Drop for FuseMount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount").arg("-u").arg(&self.0).status();
        let _ = self.1.kill();
        let _ = self.1.wait();
    }
}

/// rclone (`copy`, `check`, `check --download`), s3cmd (`put -r`, `get -r`,
/// `info` showing the MD5) and s3fs-fuse (a bucket mounted: a tree copied in
/// through it and compared, removed through it) against `nasd up`'s gateway.
#[test]
fn rclone_s3cmd_and_s3fs_fuse_against_the_gateway() {
    let tmp = tempfile::tempdir().unwrap();
    let up = Up::start(tmp.path(), 3, &[]);
    let endpoint = s3_endpoint(&up.daemon.output_once("S3 gateway ready at "));
    let host = endpoint.trim_start_matches("http://").to_string();
    let key = up_key(&up);
    let local = tmp.path().join("tree");
    for (i, len) in [0usize, 1, 4095, 65536, 200_000, 5 << 20].into_iter().enumerate() {
        let dir = local.join(format!("d{}", i % 3)).join("sub");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}.bin")), bytes(i as u64 + 7, len)).unwrap();
    }
    let want = tree(&local);

    // rclone, configured through its environment.
    let rclone = |args: &[&str]| {
        let mut cmd = Command::new("rclone");
        cmd.args(args)
            .env("RCLONE_CONFIG", "/nonexistent")
            .env("RCLONE_CONFIG_NASD_TYPE", "s3")
            .env("RCLONE_CONFIG_NASD_PROVIDER", "Other")
            .env("RCLONE_CONFIG_NASD_ACCESS_KEY_ID", &key.access)
            .env("RCLONE_CONFIG_NASD_SECRET_ACCESS_KEY", &key.secret)
            .env("RCLONE_CONFIG_NASD_ENDPOINT", &endpoint)
            .env("RCLONE_CONFIG_NASD_REGION", "us-east-1");
        client_ok(&mut cmd)
    };
    rclone(&["mkdir", "nasd:rclone-bucket"]);
    rclone(&["copy", path_str(&local), "nasd:rclone-bucket/tree"]);
    let checked = rclone(&["check", path_str(&local), "nasd:rclone-bucket/tree"]);
    assert!(checked.contains("0 differences found"), "{checked}");
    let downloaded = rclone(&["check", "--download", path_str(&local), "nasd:rclone-bucket/tree"]);
    assert!(downloaded.contains("0 differences found"), "{downloaded}");

    // s3cmd, with a config file of its own.
    let s3cfg = tmp.path().join("s3cfg");
    std::fs::write(
        &s3cfg,
        format!(
            "[default]\naccess_key = {}\nsecret_key = {}\nhost_base = {host}\nhost_bucket = {host}\nuse_https = \
             False\nsignature_v2 = False\nbucket_location = us-east-1\n",
            key.access, key.secret
        ),
    )
    .unwrap();
    let s3cmd = |args: &[&str]| client_ok(Command::new("s3cmd").arg("-c").arg(&s3cfg).args(args));
    s3cmd(&["mb", "s3://s3cmd-bucket"]);
    s3cmd(&["put", "-r", path_str(&local), "s3://s3cmd-bucket/"]);
    let back = tmp.path().join("s3cmd-back");
    std::fs::create_dir(&back).unwrap();
    s3cmd(&["get", "-r", "s3://s3cmd-bucket/tree", &format!("{}/", path_str(&back))]);
    assert!(tree(&back.join("tree")) == want, "s3cmd read back what it put");
    let info = s3cmd(&["info", "s3://s3cmd-bucket/tree/d1/sub/f4.bin"]);
    let md5 = format!("{:032x}", md5_of(&want[Path::new("d1/sub/f4.bin")]));
    assert!(info.contains(&md5), "the ETag is the body's MD5: {info}");

    // s3fs-fuse: a bucket mounted as a file system.
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        eprintln!("SKIPPED s3fs-fuse: /dev/fuse cannot be opened ({e}): FUSE mounts need root and the fuse module");
        return;
    }
    s3cmd(&["mb", "s3://s3fs-bucket"]);
    let passwd = tmp.path().join("passwd-s3fs");
    std::fs::write(&passwd, format!("{}:{}\n", key.access, key.secret)).unwrap();
    std::fs::set_permissions(&passwd, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let child = Command::new("s3fs")
        .arg("s3fs-bucket")
        .arg(&mnt)
        .args(["-f", "-o", &format!("url={endpoint}"), "-o", "use_path_request_style", "-o", "endpoint=us-east-1"])
        .arg("-o")
        .arg(format!("passwd_file={}", path_str(&passwd)))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run s3fs (s3fs-fuse)");
    let mount = FuseMount(mnt.clone(), child);
    common::until("the s3fs mount", || {
        std::fs::read_to_string("/proc/mounts").unwrap().contains(&format!(" {} fuse.s3fs ", path_str(&mnt)))
    });
    let copied = Command::new("cp").arg("-r").arg(&local).arg(&mnt).status().unwrap();
    assert!(copied.success(), "cp -r into the s3fs mount");
    assert!(tree(&mnt.join("tree")) == want, "read back through the s3fs mount");
    let listed = up.ok(&["ls", "/s3fs-bucket/tree/d2/sub"]);
    assert!(listed.contains("f5.bin"), "the files are nasd files: {listed}");
    std::fs::create_dir(mnt.join("empty")).unwrap();
    assert!(mnt.join("empty").is_dir(), "an empty directory made through the mount");
    std::fs::remove_dir_all(mnt.join("tree")).unwrap();
    std::fs::remove_dir(mnt.join("empty")).unwrap();
    drop(mount);
    let left = up.ok(&["ls", "/s3fs-bucket"]);
    assert!(!left.contains("tree") && !left.contains("empty"), "removed through the mount: {left}");
}

/// pandas and pyarrow at `s3://` URLs through `nasd up`'s gateway (s3fs,
/// `tests/s3/pandas_check.py`): Parquet and CSV written and read back equal,
/// a Parquet dataset of several files read with column projection.
#[test]
fn pandas_and_pyarrow_over_s3() {
    let tmp = tempfile::tempdir().unwrap();
    let up = Up::start(tmp.path(), 3, &[]);
    let endpoint = s3_endpoint(&up.daemon.output_once("S3 gateway ready at "));
    let key = up_key(&up);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/s3/pandas_check.py");
    let said = client_ok(Command::new("python3").args([script, &endpoint, &key.access, &key.secret, "pandas-bucket"]));
    assert!(said.contains("pandas and pyarrow over s3:// ok"), "{said}");
    let listed = up.ok(&["ls", "/pandas-bucket/ds"]);
    assert_eq!(listed.matches("part-").count(), 4, "the dataset's files are nasd files: {listed}");
}

/// A multipart upload left without a new part for `[s3]
/// abandoned_upload_secs` is removed by the gateway's sweep: it leaves the
/// listing of uploads and its directory goes.
#[test]
fn abandoned_multipart_uploads_are_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("nasd-data");
    std::fs::create_dir(&data).unwrap();
    let first_drive_port = common::up::free_ports(3);
    std::fs::write(
        data.join("nasd.toml"),
        // Long enough for aws-cli to start twice on a loaded machine (4 s each seen) before the
        // upload, made by the first, takes its part from the second.
        format!("[up]\nfirst_drive_port = {first_drive_port}\n\n[s3]\nabandoned_upload_secs = 15\n"),
    )
    .unwrap();
    let up = Up::start(tmp.path(), 3, &[]);
    let endpoint = s3_endpoint(&up.daemon.output_once("S3 gateway ready at "));
    let key = up_key(&up);
    aws_ok(&endpoint, &key, &["s3", "mb", "s3://expiry"]);
    let created = aws_ok(
        &endpoint,
        &key,
        &["s3api", "create-multipart-upload", "--bucket", "expiry", "--key", "left/behind.bin"],
    );
    let id = created
        .split('"')
        .skip_while(|t| *t != "UploadId")
        .nth(2)
        .unwrap_or_else(|| panic!("no UploadId in {created}"))
        .to_string();
    let part = tmp.path().join("part");
    std::fs::write(&part, bytes(3, 100_000)).unwrap();
    aws_ok(
        &endpoint,
        &key,
        &[
            "s3api",
            "upload-part",
            "--bucket",
            "expiry",
            "--key",
            "left/behind.bin",
            "--upload-id",
            &id,
            "--part-number",
            "1",
            "--body",
            path_str(&part),
        ],
    );
    common::until("the abandoned upload removed", || {
        !aws_ok(&endpoint, &key, &["s3api", "list-multipart-uploads", "--bucket", "expiry"]).contains(&id)
    });
    let left = up.ok(&["ls", "/expiry/.nasd-s3-uploads"]);
    assert!(!left.contains(&id), "its directory is gone: {left}");
    assert!(up.daemon.output().contains("removing an abandoned multipart upload"), "{}", up.daemon.log_tail());
}

/// Parts (8 MiB) or ranges aws-cli moves at once in the large copy.
const LARGE_COPY_CONCURRENCY: u32 = 4;
/// Peak memory the gateway may add, over what it held before, while
/// aws-cli copies a large file up and down, [`LARGE_COPY_CONCURRENCY`]
/// parts or ranges at once.
const LARGE_COPY_RSS_ALLOWANCE_MIB: u64 = 256;

/// Most bytes the drives may write per byte a multipart upload sends, on
/// `rs:4+2` (whose redundancy is 1.5): parts written in place cost no copy
/// at completion (a completion that copies writes 3.0). The margin covers
/// the short last part, copied once, and the drives' own records.
const LARGE_COPY_WRITES_PER_BYTE_MAX: f64 = 1.6;

/// `aws s3 cp` of a large file through `nasd s3`, up (multipart, 8 MiB
/// parts) and down (ranged GETs), [`LARGE_COPY_CONCURRENCY`] at once: the
/// same bytes (`md5sum` in and out), the gateway's peak resident memory
/// within [`LARGE_COPY_RSS_ALLOWANCE_MIB`] of what it held before — less
/// than the object, so a gateway holding one fails — and the bytes the
/// drives wrote per byte uploaded at most [`LARGE_COPY_WRITES_PER_BYTE_MAX`]
/// (counts, not timing). Size: `NASD_S3_LARGE_MIB` (default 512; 1 GiB run
/// by hand).
#[test]
fn aws_cli_copies_a_large_file_with_bounded_gateway_memory() {
    let mib: u64 = std::env::var("NASD_S3_LARGE_MIB").ok().and_then(|s| s.parse().ok()).unwrap_or(512);
    assert!(mib >= 2 * LARGE_COPY_RSS_ALLOWANCE_MIB, "NASD_S3_LARGE_MIB too small to tell");
    let seed: u64 = std::env::var("NASD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("seed {seed} (NASD_TEST_SEED), {mib} MiB (NASD_S3_LARGE_MIB)");
    // Striped over six 1 GiB drives: room for a 1 GiB object and its parts.
    let manager = "default_layout = \"rs:4+2\"".to_string();
    let drive_args = vec!["--metrics".to_string(), "127.0.0.1:0".to_string()];
    let c = Cluster::start(Options { drives: 6, manager, drive_args });
    let drive_metrics: Vec<std::net::SocketAddr> = c
        .drives
        .iter()
        .map(|d| {
            let said = d.log_tail();
            let url =
                said.lines().find_map(|l| l.split("metrics at http://").nth(1)).expect("a drive's metrics address");
            url.trim_end_matches("/metrics").trim().parse().expect("a socket address")
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let drive_writes = || -> f64 {
        drive_metrics
            .iter()
            .map(|at| {
                let samples = rt.block_on(nasd_metrics::scrape(*at)).expect("a drive's metrics");
                nasd_metrics::sum_of(&samples, "nasd_drive_data_bytes_total", &[("op", "write")])
            })
            .sum()
    };
    let keys = c.dir().join("s3-keys");
    let admin = issue(&c, &keys, "admin");
    let config: OsString = c.config.clone().into();
    let keys_arg: OsString = keys.clone().into();
    let log = c.dir().join("s3.log");
    let gateway = Daemon::start("s3", c.dir(), &log, None, move |addr| {
        let listen: OsString = addr.to_string().into();
        vec![
            "--config".into(),
            config.clone(),
            "s3".into(),
            "--listen".into(),
            listen,
            "--keys".into(),
            keys_arg.clone(),
        ]
    });
    let ep = format!("http://{}", gateway.addr);
    aws_ok(&ep, &admin, &["s3", "mb", "s3://large"]);
    let before = common::rss(gateway.pid());
    let written_before = drive_writes();
    copy_up_and_down(&c, &ep, &admin, seed, mib);
    let written = drive_writes() - written_before;
    let per_byte = written / ((mib << 20) + 12345) as f64;
    let peak = common::proc_status(gateway.pid(), "VmHWM:") * 1024;
    // Load-independent: what the drives stored per byte the client uploaded (rs:4+2 stores 1.5 per byte).
    eprintln!("drive bytes written per byte uploaded (multipart {mib} MiB, rs:4+2): {per_byte:.3}");
    eprintln!(
        "aws s3 cp of {mib} MiB up and down: gateway RSS {} MiB before, peak {} MiB",
        before / common::MIB,
        peak / common::MIB
    );
    assert!(
        peak <= before + LARGE_COPY_RSS_ALLOWANCE_MIB * common::MIB,
        "the gateway's peak RSS {} MiB is over {} MiB + {LARGE_COPY_RSS_ALLOWANCE_MIB} MiB",
        peak / common::MIB,
        before / common::MIB
    );
    assert!(
        per_byte <= LARGE_COPY_WRITES_PER_BYTE_MAX,
        "the drives wrote {per_byte:.3} bytes per byte uploaded, over {LARGE_COPY_WRITES_PER_BYTE_MAX}: \
         the completion copied the parts"
    );
    drop(gateway);
}

/// A file of `mib` MiB and a tail, written a mebibyte at a time, copied up
/// to and back from the gateway with aws-cli: the same bytes (`md5sum`).
fn copy_up_and_down(c: &Cluster, ep: &str, key: &Key, seed: u64, mib: u64) {
    use std::io::Write;
    let local = c.dir().join(format!("large-{mib}.bin"));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&local).unwrap());
    for i in 0..mib {
        f.write_all(&bytes(seed ^ i, 1 << 20)).unwrap();
    }
    f.write_all(&bytes(seed, 12345)).unwrap();
    drop(f);
    let remote = format!("s3://large/{mib}.bin");
    let config = c.dir().join("aws-config");
    std::fs::write(&config, format!("[default]\ns3 =\n  max_concurrent_requests = {LARGE_COPY_CONCURRENCY}\n"))
        .unwrap();
    let aws_cp = |from: &str, to: &str| {
        let mut cmd = Command::new("aws");
        cmd.arg("--endpoint-url").arg(ep).args(["s3", "cp", "--no-progress", from, to]);
        client_env(&mut cmd, key);
        client_ok(cmd.env("AWS_CONFIG_FILE", &config));
    };
    aws_cp(path_str(&local), &remote);
    let back = c.dir().join(format!("large-{mib}-back.bin"));
    aws_cp(&remote, path_str(&back));
    let md5sum = |p: &Path| {
        let out = Command::new("md5sum").arg(p).output().expect("run md5sum");
        String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string()
    };
    let (sent, got) = (md5sum(&local), md5sum(&back));
    assert!(sent.len() == 32 && sent == got, "{mib} MiB: md5 {sent} sent, {got} read back");
    std::fs::remove_file(&local).unwrap();
    std::fs::remove_file(&back).unwrap();
    aws_ok(ep, key, &["s3", "rm", "--only-show-errors", &remote]);
}

/// The seed a test varies its order and timing from: `NASD_TEST_SEED`, else the clock (printed).
fn test_seed() -> u64 {
    let seed: u64 = std::env::var("NASD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("seed {seed} (NASD_TEST_SEED)");
    seed
}

/// Starts `nasd s3` on `c` with config file `config` and key store `keys`, logging to `log`.
fn start_gateway(c: &Cluster, config: &Path, keys: &Path, log: &Path) -> Daemon {
    let (config, keys): (OsString, OsString) = (config.into(), keys.into());
    Daemon::start("s3", c.dir(), log, None, move |addr| {
        vec![
            "--config".into(),
            config.clone(),
            "s3".into(),
            "--listen".into(),
            addr.to_string().into(),
            "--keys".into(),
            keys.clone(),
        ]
    })
}

/// A cluster of three drives with a gateway key for its administrator, and
/// a config file with `[s3]` settings `s3` added: what a gateway test starts from.
struct S3Setup {
    c: Cluster,
    keys: PathBuf,
    admin: Key,
    config: PathBuf,
    log: PathBuf,
}

fn s3_setup(s3: &str) -> S3Setup {
    let c = Cluster::start(Options { drives: 3, manager: String::new(), drive_args: Vec::new() });
    let keys = c.dir().join("s3-keys");
    let admin = issue(&c, &keys, "admin");
    let config = config_with_s3(&c, "nasd-s3.toml", s3);
    let log = c.dir().join("s3.log");
    S3Setup { c, keys, admin, config, log }
}

/// `c`'s config file with `[s3]` settings `s3` added, as file `name`.
fn config_with_s3(c: &Cluster, name: &str, s3: &str) -> PathBuf {
    let path = c.dir().join(name);
    let text = std::fs::read_to_string(&c.config).unwrap();
    std::fs::write(&path, format!("{text}\n[s3]\n{s3}\n")).unwrap();
    path
}

/// The multipart uploads (32 hex digits) left in `bucket`'s uploads directory, and what they hold.
fn uploads_left(c: &Cluster, bucket: &str) -> String {
    let ls = |path: &str| {
        let out = c.run(&["ls", path]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace().map(String::from).collect::<Vec<_>>()
    };
    let uploads = format!("/{bucket}/.nasd-s3-uploads");
    let mut left = Vec::new();
    for id in ls(&uploads) {
        left.push(id.clone());
        left.extend(ls(&format!("{uploads}/{id}")).into_iter().map(|name| format!("{id}/{name}")));
    }
    left.join("\n")
}

/// Part minimum of the multipart tests: many parts, quickly.
const SMALL_PART_BYTES: u64 = 256 * 1024;

/// Multipart uploads with parts written in place (`multipart_check.py`,
/// boto3): out of order, parts sent again, parts of different sizes, gaps,
/// fewer parts named than sent, UploadPartCopy, abort, a stale ETag — each
/// object read back whole with its MD5-of-MD5s ETag; afterwards no upload
/// and no staging file is left in the bucket.
#[test]
fn multipart_parts_in_place_with_boto3() {
    let seed = test_seed();
    let S3Setup { c, keys, admin, config, log } = s3_setup(&format!("part_bytes_min = {SMALL_PART_BYTES}"));
    let gateway = start_gateway(&c, &config, &keys, &log);
    let ep = format!("http://{}", gateway.addr);
    aws_ok(&ep, &admin, &["s3", "mb", "s3://parts"]);
    let args = ["parts", &SMALL_PART_BYTES.to_string(), &seed.to_string()].map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    python_check(&ep, &admin, "multipart_check.py", &args, "multipart ok", &log);
    let left = uploads_left(&c, "parts");
    assert!(left.is_empty(), "nothing is left of the uploads: {left}");
    drop(gateway);
}

/// Rounds of `resend_check.py` per run.
const RESEND_ROUNDS: u32 = 6;

/// A part sent again that fails — cut off mid-body, shorter than its
/// Content-Length, a wrong Content-MD5 — and a completion that fails halfway
/// (the key's parent an object) or is cut off, each then retried, lose no
/// acknowledged part (`resend_check.py`, boto3 and raw signed requests):
/// ListParts shows the copies last acknowledged, the object is their bytes
/// with their MD5-of-MD5s ETag, a retried completion answers as the first
/// did, and nothing of the uploads is left. Part, cut point, failure and
/// completion vary from the seed.
#[test]
fn a_failed_part_resend_or_completion_keeps_the_acknowledged_parts() {
    let seed = test_seed();
    let S3Setup { c, keys, admin, config, log } = s3_setup(&format!("part_bytes_min = {SMALL_PART_BYTES}"));
    let gateway = start_gateway(&c, &config, &keys, &log);
    let ep = format!("http://{}", gateway.addr);
    aws_ok(&ep, &admin, &["s3", "mb", "s3://resend"]);
    let args =
        ["resend", &SMALL_PART_BYTES.to_string(), &seed.to_string(), &RESEND_ROUNDS.to_string()].map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    python_check(&ep, &admin, "resend_check.py", &args, "resend ok", &log);
    let left = uploads_left(&c, "resend");
    assert!(left.is_empty(), "nothing is left of the uploads: {left}");
    drop(gateway);
}

/// Rounds of `two_gateways_check.py` per run.
const TWO_GATEWAY_ROUNDS: u32 = 4;

/// Two gateways on one cluster serve one multipart upload
/// (`two_gateways_check.py`, boto3): every part number sent at once
/// through both with different bodies; each send acknowledged, ListParts
/// shows one send's ETag per part, and the object completed through either
/// is exactly the bytes of those sends — one writer per region of the
/// staging file holds across processes (claims in the name space), not only
/// within one. Order and gateways vary from the seed.
#[test]
fn two_gateways_on_one_upload_never_mix_two_sends_of_a_part() {
    let seed = test_seed();
    let S3Setup { c, keys, admin, config, log } = s3_setup(&format!("part_bytes_min = {SMALL_PART_BYTES}"));
    let gateway_a = start_gateway(&c, &config, &keys, &log);
    let gateway_b = start_gateway(&c, &config, &keys, &c.dir().join("s3-b.log"));
    let (ep_a, ep_b) = (format!("http://{}", gateway_a.addr), format!("http://{}", gateway_b.addr));
    aws_ok(&ep_a, &admin, &["s3", "mb", "s3://shared"]);
    let args = [&ep_b, "shared", &SMALL_PART_BYTES.to_string(), &seed.to_string(), &TWO_GATEWAY_ROUNDS.to_string()]
        .map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    python_check(&ep_a, &admin, "two_gateways_check.py", &args, "two gateways ok", &log);
    let left = uploads_left(&c, "shared");
    assert!(left.is_empty(), "nothing is left of the uploads: {left}");
    drop((gateway_a, gateway_b));
}

/// The drives' used bytes, as `nasd df` counts them.
fn drives_used(c: &Cluster, rt: &tokio::runtime::Runtime) -> u64 {
    rt.block_on(async {
        let fs = nasd_fs::FsClient::connect(&c.fs_config()).await.expect("log in");
        let (_, _, drives) = fs.statfs().await.expect("statfs");
        drives.iter().map(|d| d.used_bytes).sum()
    })
}

/// A gateway killed (`SIGKILL`) while `aws s3 cp` uploads a new version of
/// an object in parts — at a moment the seed picks within 1.3 times the
/// time a first upload took: before any part, among the parts, during the
/// completion or after it — leaves the old object whole or the new one whole, never a mix. The
/// abandoned upload is swept by the next gateway (after 2 s), and the
/// drives then use what they used with the old object alone: no space
/// leaked in staging files or parts.
#[test]
fn a_gateway_killed_mid_upload_leaves_no_partial_object_and_no_leaked_space() {
    use rand::{Rng, SeedableRng};
    let seed = test_seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (parts, part_mib) = (24u64, 1u64);
    let S3Setup { c, keys, admin, config, log } = s3_setup(&format!("part_bytes_min = {}", part_mib << 20));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut gateway = start_gateway(&c, &config, &keys, &log);
    let ep = format!("http://{}", gateway.addr);
    aws_ok(&ep, &admin, &["s3", "mb", "s3://crash"]);
    let aws_config = c.dir().join("aws-config");
    std::fs::write(
        &aws_config,
        format!(
            "[default]\ns3 =\n  multipart_threshold = {part_mib}MB\n  multipart_chunksize = {part_mib}MB\n  \
             max_concurrent_requests = 4\n"
        ),
    )
    .unwrap();
    let len = ((parts * part_mib) << 20) as usize - 1000;
    let (old, new) = (bytes(seed, len), bytes(seed ^ 0xa5a5, len));
    let upload = |ep: &str, version: &[u8], name: &str| {
        let file = c.dir().join(name);
        std::fs::write(&file, version).unwrap();
        let mut cmd = Command::new("aws");
        cmd.arg("--endpoint-url").arg(ep).args(["s3", "cp", "--no-progress", path_str(&file), "s3://crash/o.bin"]);
        client_env(&mut cmd, &admin);
        cmd.env("AWS_CONFIG_FILE", &aws_config).env("AWS_MAX_ATTEMPTS", "1");
        c.spawn_command(cmd, "aws s3 cp")
    };
    let began = std::time::Instant::now();
    let first = upload(&ep, &old, "old.bin").wait();
    assert!(first.status.success(), "{}", first.stderr);
    let took = began.elapsed();
    let baseline = drives_used(&c, &rt);
    // Past the first's time too: the second may end sooner, so some kills land in or after its completion.
    let at = took.mul_f64(rng.gen_range(0.0..1.3));
    eprintln!("the first upload took {took:?}; killing the gateway {at:?} into the second");
    let second = upload(&ep, &new, "new.bin");
    std::thread::sleep(at);
    gateway.kill();
    let second = second.wait();
    eprintln!("the second aws s3 cp {}", if second.status.success() { "finished" } else { "failed" });

    let swept = config_with_s3(&c, "nasd-sweep.toml", "abandoned_upload_secs = 2");
    let gateway = start_gateway(&c, &swept, &keys, &log);
    let ep = format!("http://{}", gateway.addr);
    common::until("the abandoned upload swept", || uploads_left(&c, "crash").is_empty());
    let back = c.dir().join("back.bin");
    aws_ok(&ep, &admin, &["s3", "cp", "--no-progress", "s3://crash/o.bin", path_str(&back)]);
    let got = std::fs::read(&back).unwrap();
    let which = if got == new {
        "new"
    } else if got == old {
        "old"
    } else {
        "neither"
    };
    eprintln!("the object after the crash: the {which} one");
    assert!(which != "neither", "the object is the old one or the new one, whole ({} bytes)", got.len());
    assert!(which == "new" || !second.status.success(), "aws s3 cp succeeded, yet the object is the old one");
    let slack = 2u64 << 20;
    let used = || drives_used(&c, &rt);
    common::until("the drives to give back the upload's space", || used() <= baseline + slack);
    drop(gateway);
}

/// Open multipart uploads per user are bounded by `[s3]
/// open_uploads_per_user` (`open_uploads_check.py`, boto3): one more is
/// refused with `TooManyOpenMultipartUploads`; aborting or completing one
/// makes room; a restarted gateway counts the uploads it finds and still
/// refuses one more; aborting them all opens uploads again.
#[test]
fn open_multipart_uploads_are_bounded_per_user() {
    const OPEN_MAX: usize = 5;
    let S3Setup { c, keys, admin, config, log } = s3_setup(&format!("open_uploads_per_user = {OPEN_MAX}"));
    let gateway = start_gateway(&c, &config, &keys, &log);
    let ep = format!("http://{}", gateway.addr);
    aws_ok(&ep, &admin, &["s3", "mb", "s3://bounded"]);
    let open_max = OPEN_MAX.to_string();
    python_check(&ep, &admin, "open_uploads_check.py", &["bounded", &open_max, "fill"], "open uploads ok", &log);
    drop(gateway);
    let gateway = start_gateway(&c, &config, &keys, &log);
    let ep = format!("http://{}", gateway.addr);
    python_check(&ep, &admin, "open_uploads_check.py", &["bounded", &open_max, "full"], "open uploads ok", &log);
    drop(gateway);
}

/// `[s3] tls = true`: the gateway serves HTTPS with a certificate signed by
/// a CA it made beside its key store. aws-cli (`--ca-bundle`) copies a
/// multipart file up and back; boto3 (`tls_check.py`) sends checksums in
/// aws-chunked trailers, as botocore does over HTTPS, verified and kept;
/// and plain HTTP to the HTTPS port gets no S3 answer.
#[test]
fn s3_over_https_with_aws_cli_and_boto3_trailer_checksums() {
    let seed = test_seed();
    let S3Setup { c, keys, admin, config, log } = s3_setup("tls = true");
    let gateway = start_gateway(&c, &config, &keys, &log);
    let ca = keys.join("tls").join("ca.pem");
    assert!(ca.exists(), "the CA clients trust is beside the key store: {}", gateway.log_tail());
    let ep = format!("https://{}", gateway.addr);
    let aws_tls = |args: &[&str]| {
        let mut all = vec!["--ca-bundle", path_str(&ca)];
        all.extend_from_slice(args);
        aws_ok(&ep, &admin, &all)
    };
    aws_tls(&["s3", "mb", "s3://secure"]);
    let sent = bytes(seed, 20 * 1024 * 1024 + 333);
    let file = c.dir().join("up.bin");
    std::fs::write(&file, &sent).unwrap();
    aws_tls(&["s3", "cp", "--no-progress", path_str(&file), "s3://secure/up.bin"]);
    let back = c.dir().join("back.bin");
    aws_tls(&["s3", "cp", "--no-progress", "s3://secure/up.bin", path_str(&back)]);
    assert!(std::fs::read(&back).unwrap() == sent, "the file copied over HTTPS differs");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/tls_check.py");
    let mut py = Command::new("python3");
    py.arg(&script).arg(&ep).arg("secure").env("AWS_CA_BUNDLE", &ca);
    client_env(&mut py, &admin);
    let out = py.output().expect("run python3");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.contains("tls ok"), "{said}\n{}", common::log_tail(&log));
    let plain = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(gateway.addr).unwrap();
        s.write_all(b"GET /secure HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    assert!(!plain.contains("HTTP/1.1"), "plain HTTP to the HTTPS port gets no HTTP answer: {plain}");
    drop(gateway);
}
