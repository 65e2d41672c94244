//! The one TOML configuration file, validated at startup into typed values.
//! `nasd up` writes one for its cluster (`DATA/nasd.toml`); every command
//! reads the file named by `--config`, `$NASD_CONFIG`, or else
//! `./nasd-data/nasd.toml` if it exists.
//!
//! ```toml
//! [drive]                        # nasd drive
//! data = "/var/lib/nasd/drive0"
//! listen = "0.0.0.0:7400"
//! block_size = "64KiB"
//! capacity = "500GiB"
//! commit_interval_ms = 2000
//! verify_reads = true
//! master_key_file = "/etc/nasd/drive0.master.key"
//! failure_domain = "rack-3"      # drives sharing it can fail together [default: "", the drive alone]
//! throttle_mib_per_sec = 200     # test aid for benchmarks: emulated slow media [default: none]
//! connections_per_peer = 128     # most connections from one host (IPv4 address, IPv6 /64)
//! prefetch_cache = "64MiB"       # blocks read ahead for hinted reads (prefetch-v1); "0" turns it off
//!
//! [manager]                      # nasd manager
//! data = "/var/lib/nasd/manager"
//! listen = "0.0.0.0:7300"
//! tls_names = ["nasd.example.com"]
//! read_capability_secs = 300
//! write_capability_secs = 30
//! key_rotation_secs = 3600
//! object_pool = 128
//! write_data_integrity = true    # false lets writes carry data no MAC covers (not advised)
//! write_data_integrity_waived = []  # drives (numbers) whose partition alone is exempt
//! metadata = "postgres://nasd@db.example.com/nasd?sslmode=verify-full&sslrootcert=/etc/nasd/db-ca.pem"  # [default: sqlite:DATA/meta.sqlite]
//! metadata_password_file = "/etc/nasd/db.password"  # else $PGPASSWORD, else ~/.pgpass (as libpq)
//! auth = "nasd.example.com:7299" # the authentication server whose identities it accepts
//! auth_failover = ["auth2.example.com:7299"]  # more of them on one database, tried in order
//! auth_ca_cert = "/etc/nasd/ca.pem"
//! auth_token_file = "/var/lib/nasd/auth/service.token"
//! auth_scheme = "both"           # capabilities (default), pals or both
//! identity_recheck_secs = 30     # how often identity sessions are checked at the auth server
//! temporaries_age_secs = 3600    # copies a dead client left (.NAME.XXXXXXXX.nasd-tmp) removed after this
//!
//! [auth]                         # nasd auth (authentication server)
//! data = "/var/lib/nasd/auth"
//! listen = "0.0.0.0:7299"
//! tls_names = ["nasd.example.com"]
//! identity_lifetime_secs = 3600
//! metadata = "postgres://nasd@db.example.com/nasd?sslmode=verify-full&sslrootcert=/etc/nasd/db-ca.pem"  # the managers' database: several servers share it [default: DATA/auth.sqlite]
//! metadata_password_file = "/etc/nasd/db.password"  # else $PGPASSWORD, else ~/.pgpass (as libpq)
//!
//! [client]                       # ls, cp, put, get, ... and admin commands
//! manager = "nasd.example.com:7300"
//! failover = ["nasd2.example.com:7300"]  # more managers on the same metadata, tried if it is down
//! server_name = "nasd.example.com"
//! ca_cert = "/etc/nasd/ca.pem"
//! user = "alice"
//! password_file = "/home/alice/.nasd-password"
//! data_integrity = true
//! reply_timeout_secs = 60        # longest wait for the manager or a drive at any one step
//! metadata_wait_secs = 60        # how long commands wait out an outage of the metadata database
//! auth = "nasd.example.com:7299" # log in here and use the identity key with the manager
//! auth_failover = ["auth2.example.com:7299"]  # more authentication servers on one database, tried if it is down
//! role = 7                       # the role to assume [default: none]
//!
//! [mount]                        # nasd mount
//! manager_wait = "hard"          # or "30s": calls wait that long for a manager, then fail with EIO
//!
//! [s3]                           # nasd s3 (S3 gateway) and nasd s3-key
//! listen = "127.0.0.1:7500"      # plain HTTP; off loopback only with --plain-http-off-loopback
//! keys = "/var/lib/nasd/s3"      # the access-key store (store.key, keys.json)
//!
//! [nfs]                          # nasd nfs (NFSv3 gateway)
//! listen = "127.0.0.1:2049"      # NFSv3 and MOUNT v3 over TCP on one port (no portmapper)
//! exports = ["/", "/projects"]   # nasd directories clients may mount
//! clients = ["127.0.0.1/32", "10.0.0.0/8"]  # allowed client networks; others are refused at connect
//! root_squash = true             # uid 0 runs as anon_uid/anon_gid [default: true]
//! handle_key = "/var/lib/nasd/nfs/handle.key"  # seals file handles; made at first start; its directory
//!                                 # also keeps the duplicate-request journal (drc.log, drc.old.log)
//! connections_per_client = 16    # connections one client address may hold open (1 to 256)
//! [metrics]                      # Prometheus/OpenMetrics at http://ADDR/metrics: plain HTTP, no login
//! drive = "127.0.0.1:9400"       # nasd drive [default: off]; --metrics overrides
//! manager = "127.0.0.1:9300"     # nasd manager [default: off]; --metrics overrides
//! auth = "127.0.0.1:9299"        # nasd auth [default: off]; --metrics overrides
//! s3 = "127.0.0.1:9500"          # nasd s3 [default: off]; --metrics overrides
//! mount = "127.0.0.1:9600"       # nasd mount [default: off]; --metrics overrides
//! up = "127.0.0.1:9300"          # nasd up, all its daemons (loopback only) [default: manager_port + 2000, recorded]
//!
//! [log]                          # every command and daemon
//! format = "json"                # "text" [default] or "json": one JSON object a line; --log-format overrides
//!
//! [up]                           # nasd up (one machine)
//! nfs = true                     # also serve NFS ([nfs]; default off)
//! data = "./nasd-data"
//! drives = 4
//! manager_port = 7300
//! first_drive_port = 7401
//!
//! [[drives]]                     # drives the drive tools know by number (`nasd up` writes these)
//! number = 0                     # the manager's number for it, as `nasd status` shows
//! addr = "127.0.0.1:7401"
//! drive_key_file = "/var/lib/nasd/drive-0/drive.key"   # for `nasd audit` and `nasd scrub --drive`
//! ```

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where commands look for a config file when none is named.
pub const DEFAULT_CONFIG: &str = "nasd-data/nasd.toml";

/// The whole file. Unknown keys are refused so typos do not pass silently.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Settings of `nasd drive`.
    #[serde(default, skip_serializing_if = "DriveSection::is_empty")]
    pub drive: DriveSection,
    /// Settings of `nasd manager`.
    #[serde(default)]
    pub manager: ManagerSection,
    /// How user and admin commands reach the manager.
    #[serde(default)]
    pub client: ClientSection,
    /// Settings of `nasd auth`.
    #[serde(default)]
    pub auth: AuthSection,
    /// Settings of `nasd mount`.
    #[serde(default, skip_serializing_if = "MountSection::is_empty")]
    pub mount: MountSection,
    /// Settings of `nasd s3`.
    #[serde(default, skip_serializing_if = "S3Section::is_empty")]
    pub s3: S3Section,
    /// Settings of `nasd nfs`.
    #[serde(default, skip_serializing_if = "NfsSection::is_empty")]
    pub nfs: NfsSection,
    /// Where each daemon serves its metrics.
    #[serde(default, skip_serializing_if = "MetricsSection::is_empty")]
    pub metrics: MetricsSection,
    /// How log lines are written.
    #[serde(default, skip_serializing_if = "LogSection::is_empty")]
    pub log: LogSection,
    /// Settings of `nasd up`.
    #[serde(default)]
    pub up: UpSection,
    /// Drives the drive tools (`inquiry`, `audit`, `scrub --drive`) know by
    /// number, with their drive key files; `nasd up` records its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drives: Vec<KnownDrive>,
}

/// `[[drives]]`: one drive the drive tools may be pointed at with `--drive N`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KnownDrive {
    /// The manager's number for the drive (as `nasd status` shows it).
    pub number: u32,
    /// Its address, host:port.
    pub addr: String,
    /// File holding its drive key (64 hex digits, 0600): authorizes `nasd
    /// audit` and `nasd scrub --drive`.
    pub drive_key_file: Option<PathBuf>,
}

/// `[drive]`: every field optional; command-line flags override.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DriveSection {
    pub data: Option<PathBuf>,
    pub listen: Option<String>,
    pub block_size: Option<String>,
    pub capacity: Option<String>,
    pub commit_interval_ms: Option<u64>,
    pub verify_reads: Option<bool>,
    pub master_key_file: Option<PathBuf>,
    pub no_security: Option<bool>,
    /// Bytes of blocks read ahead for hinted reads (`prefetch-v1`).
    pub prefetch_cache: Option<String>,
    /// What this drive can fail together with (host, rack, power feed), as
    /// INQUIRY reports it; at most 64 bytes [default: "", the drive alone].
    pub failure_domain: Option<String>,
    /// A test aid for benchmarks, "emulated slow media": the drive paces the
    /// data bytes it moves to and from its store to this many MiB/s in all
    /// [default: no pacing].
    pub throttle_mib_per_sec: Option<u64>,
    /// Most connections one host may hold (raise it for many clients behind one NAT address).
    pub connections_per_peer: Option<usize>,
}

impl DriveSection {
    fn is_empty(&self) -> bool {
        self.data.is_none() && self.listen.is_none() && self.master_key_file.is_none()
    }
}

/// `[manager]`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ManagerSection {
    pub data: Option<PathBuf>,
    pub listen: Option<String>,
    /// Host names and addresses the manager's TLS certificate names.
    pub tls_names: Option<Vec<String>>,
    pub read_capability_secs: Option<u64>,
    pub write_capability_secs: Option<u64>,
    pub key_rotation_secs: Option<u64>,
    pub object_pool: Option<usize>,
    /// Layout of a new file system's root, which new files inherit, e.g.
    /// "rs:2+1", "mirror:2", "stripe:4@256K" (see `nasd layout --help`).
    /// An existing file system keeps its own: change it with `nasd layout set /`.
    pub default_layout: Option<String>,
    /// Bytes at the start of each new regular file kept in the metadata
    /// store and read and written through the manager (the small-file
    /// path); the rest is striped over drives [default: 65536; 0: none; at
    /// most 1048576]. A file keeps the threshold it was created with.
    pub small_file_threshold: Option<u32>,
    /// Longest an acknowledged change may wait for the disk flush that makes
    /// it survive a power loss (it survives the manager's crash at once; a
    /// client's fsync flushes at once) [default: 500; 1..=60000].
    pub metadata_sync_ms: Option<u64>,
    /// How new inodes choose their routing site when this manager makes
    /// the file system's first routing table: "mkdir-switching" (a new
    /// directory leaves its parent's site with `redirect_probability`) or
    /// "name-hashing" [default: mkdir-switching]. An existing table keeps
    /// its policy.
    pub routing: Option<String>,
    /// The probability a new directory leaves its parent's routing site
    /// under mkdir switching [default: 1/N for N managers in the table].
    pub redirect_probability: Option<f64>,
    /// The client address (host:port) this manager puts in a new routing
    /// table [default: the address it listens on].
    pub advertise: Option<String>,
    /// How long a writer may keep a write transaction open before the
    /// manager rolls it back (a writer that died) [default: 60].
    pub write_lease_secs: Option<u64>,
    /// How long a drive may be down before its components are rebuilt on
    /// other drives [default: 600].
    pub rebuild_delay_secs: Option<u64>,
    /// Whether capabilities that allow writing demand data integrity (MACs
    /// over every write's data) [default: true]. Only an explicit `false`
    /// lowers it, for a trusted network.
    pub write_data_integrity: Option<bool>,
    /// Drives (by number, as `nasd status` shows them) whose file-system
    /// partition is exempt from data integrity for writes, each partition on a
    /// network the administrator trusts; every other keeps it [default: none].
    pub write_data_integrity_waived: Option<Vec<u32>>,
    /// Where the metadata lives: "sqlite:PATH" or
    /// "postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?sslmode=…&sslrootcert=…]"
    /// (created on first use) [default: sqlite:DATA/meta.sqlite]. A password
    /// here makes this file a secret: keep it 0600 — or leave it out and use
    /// `metadata_password_file`, `$PGPASSWORD` or `~/.pgpass`, as libpq.
    pub metadata: Option<String>,
    /// A file (0600) whose first line is the database password, when the
    /// URL has none [default: $PGPASSWORD, else $PGPASSFILE or ~/.pgpass].
    pub metadata_password_file: Option<PathBuf>,
    /// The authentication server (`host:port`) whose identity keys the
    /// manager accepts (`LOGIN_IDENTITY`) and installs on its drives.
    pub auth: Option<String>,
    /// More authentication servers sharing the first one's database (and
    /// `auth.key`, `service.token`), tried in order when it does not answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub auth_failover: Vec<String>,
    /// The name its certificate carries [default: localhost].
    pub auth_server_name: Option<String>,
    /// The CA certificate that signed its certificate: required with
    /// `auth` (`nasd auth` keeps its CA in DATA/tls/ca.pem of its data
    /// directory; `nasd up` gives it the manager's certificate and sets this
    /// itself).
    pub auth_ca_cert: Option<PathBuf>,
    /// The service token file the authentication server wrote (`service.token`).
    pub auth_token_file: Option<PathBuf>,
    /// Which credentials the file system's partition accepts on every drive:
    /// "capabilities", "pals" (identities checked against the PALs the
    /// manager flattens from each file's ACL) or "both" [default:
    /// capabilities]. Takes effect with `auth` (identity keys installed).
    pub auth_scheme: Option<String>,
    /// How often a session that logged in with an identity asks the
    /// authentication server again whether its user is enabled and holds
    /// its role; a disabled user's sessions end within this long
    /// [default: 30; 0: before every request].
    pub identity_recheck_secs: Option<u64>,
    /// How long a client's temporary copy (`.NAME.XXXXXXXX.nasd-tmp`) may go
    /// unwritten, with no write open, before the manager removes it (its
    /// client died mid-copy) [default: 3600; 0: never].
    pub temporaries_age_secs: Option<u64>,
}

/// `[auth]`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    pub data: Option<PathBuf>,
    pub listen: Option<String>,
    /// Host names and addresses its TLS certificate names.
    pub tls_names: Option<Vec<String>>,
    /// How long an identity key is valid after login [default: 3600].
    pub identity_lifetime_secs: Option<u64>,
    /// Where the users, roles, groups and shared keys live: the file
    /// managers' PostgreSQL database ("postgres://…", as `[manager]
    /// metadata`), which several authentication servers share [default:
    /// DATA/auth.sqlite, one server alone]. `nasd up` uses the managers'.
    pub metadata: Option<String>,
    /// A file (0600) whose first line is the database password, when the
    /// URL has none [default: $PGPASSWORD, else $PGPASSFILE or ~/.pgpass].
    pub metadata_password_file: Option<PathBuf>,
}

/// `[client]`: shared with the other clients (the Python package) in `nasd-profile`.
pub use nasd_profile::ClientSection;

/// `[nfs]`: the NFSv3 gateway (`nasd nfs`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NfsSection {
    /// Where it serves NFSv3 and MOUNT [default: "127.0.0.1:2049"].
    pub listen: Option<String>,
    /// The exported nasd directories [default: ["/"]].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exports: Vec<String>,
    /// Allowed client networks (`addr/prefix`) [default: ["127.0.0.1/32", "::1/128"]].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<String>,
    /// Run uid 0 as the anonymous ids [default: true].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_squash: Option<bool>,
    /// The uid squashed callers run as [default: 65534].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon_uid: Option<u32>,
    /// The gid squashed callers run as [default: 65534].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon_gid: Option<u32>,
    /// The key sealing file handles (made at the first start) [default: "nasd-data/nfs/handle.key"].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle_key: Option<PathBuf>,
    /// Connections one client address may hold open [default: 16; 1 to 256].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_per_client: Option<usize>,
}

impl NfsSection {
    fn is_empty(&self) -> bool {
        self.listen.is_none()
            && self.exports.is_empty()
            && self.clients.is_empty()
            && self.root_squash.is_none()
            && self.anon_uid.is_none()
            && self.anon_gid.is_none()
            && self.handle_key.is_none()
            && self.connections_per_client.is_none()
    }
}

/// `[s3]`: the S3 gateway (`nasd s3`) and its access keys (`nasd s3-key`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct S3Section {
    /// Where it serves S3, plain HTTP [default: "127.0.0.1:7500"].
    pub listen: Option<String>,
    /// The access-key store's directory [default: "nasd-data/s3"].
    pub keys: Option<PathBuf>,
    /// Seconds a multipart upload may go without a new part before the
    /// gateway removes it; 0: never [default: 86400, a day].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandoned_upload_secs: Option<u64>,
    /// Requests each access key may make per second, on average (twice
    /// that at once); more get `SlowDown` [default: 2000].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_key_per_sec: Option<u32>,
    /// Uploads (PUT, UploadPart, copies, completions) each user may have in
    /// flight at once; more get `SlowDown` [default: 32; at most 256].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploads_in_flight_per_user: Option<usize>,
    /// Smallest part of a multipart upload but its last; a completion with
    /// a smaller one is `EntityTooSmall` [default: 5242880, S3's 5 MiB].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part_bytes_min: Option<u64>,
    /// Multipart uploads each user may have open (created, not yet
    /// completed or aborted); one more CreateMultipartUpload gets
    /// `TooManyOpenMultipartUploads` [default: 1000; at most 100000].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_uploads_per_user: Option<usize>,
    /// Serve HTTPS rather than plain HTTP (`nasd s3`, and the gateway
    /// `nasd up` starts, from DATA/nasd.toml): with `tls_cert` and `tls_key`,
    /// those; else a certificate for `localhost`, `127.0.0.1` and the
    /// listening address, signed by a CA made beside the key store
    /// (`KEYS/tls/ca.pem`, which clients trust) [default: false].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<bool>,
    /// The certificate chain (PEM) HTTPS serves; needs `tls_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `tls_cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
}

impl S3Section {
    fn is_empty(&self) -> bool {
        self.listen.is_none()
            && self.keys.is_none()
            && self.abandoned_upload_secs.is_none()
            && self.requests_per_key_per_sec.is_none()
            && self.uploads_in_flight_per_user.is_none()
            && self.part_bytes_min.is_none()
            && self.open_uploads_per_user.is_none()
            && self.tls.is_none()
            && self.tls_cert.is_none()
            && self.tls_key.is_none()
    }

    /// The gateway as this section configures it.
    pub fn gateway(&self, vfs: nasd_vfs::Vfs, keys: nasd_s3::KeyStore) -> nasd_s3::Gateway {
        nasd_s3::Gateway::new(vfs, keys)
            .with_upload_expiry(self.upload_expiry())
            .with_request_rate(self.requests_per_key_per_sec.unwrap_or(nasd_s3::REQUESTS_PER_KEY_PER_SEC_DEFAULT))
            .with_uploads_in_flight_per_user(
                self.uploads_in_flight_per_user.unwrap_or(nasd_s3::UPLOADS_IN_FLIGHT_PER_USER_DEFAULT),
            )
            .with_part_bytes_min(self.part_bytes_min.unwrap_or(nasd_s3::PART_BYTES_MIN_DEFAULT))
            .with_open_uploads_per_user(self.open_uploads_per_user.unwrap_or(nasd_s3::OPEN_UPLOADS_PER_USER_DEFAULT))
    }

    /// How long an abandoned multipart upload is kept (`None`: for ever).
    pub fn upload_expiry(&self) -> Option<std::time::Duration> {
        match self.abandoned_upload_secs {
            None => Some(nasd_s3::UPLOAD_EXPIRY_DEFAULT),
            Some(0) => None,
            Some(secs) => Some(std::time::Duration::from_secs(secs)),
        }
    }
}

/// `[metrics]`: one address per daemon, since one file configures them all
/// (`nasd up` writes one its commands share). A daemon with none serves no
/// metrics; the endpoint has no login, so an address off loopback belongs
/// to a monitoring network only (SECURITY.md, Metrics endpoint).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// `nasd drive`'s endpoint, IP:PORT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drive: Option<String>,
    /// `nasd manager`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<String>,
    /// `nasd auth`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
    /// `nasd s3`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<String>,
    /// `nasd mount`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
    /// `nasd nfs`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nfs: Option<String>,
    /// `nasd up`'s, for every daemon it runs; loopback only (recorded at the
    /// first start: manager_port + 2000 if free, else any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up: Option<String>,
}

impl MetricsSection {
    fn is_empty(&self) -> bool {
        self.drive.is_none()
            && self.manager.is_none()
            && self.auth.is_none()
            && self.s3.is_none()
            && self.mount.is_none()
            && self.nfs.is_none()
            && self.up.is_none()
    }
}

/// `[log]`: how every command and daemon writes its log lines (to standard
/// error; which lines: `$NASD_LOG`, an `EnvFilter` directive).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `text` (the default) or `json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<LogFormat>,
}

impl LogSection {
    fn is_empty(&self) -> bool {
        self.format.is_none()
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One line of text each: time, level, target, message, fields.
    #[default]
    Text,
    /// One JSON object a line (`timestamp`, `level`, `target`, `fields` with
    /// `message`, and the `span`/`spans` it was logged in), for log shippers.
    Json,
}

/// `[mount]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MountSection {
    /// How long a call in the mount waits for a manager that cannot be
    /// reached: "hard" (until it is back; a signal ends the call with
    /// EINTR), or a duration ("30s", "500ms", "5m", at most "24h") after
    /// which it fails with EIO [default: "hard"]. `--manager-wait` overrides.
    pub manager_wait: Option<String>,
}

impl MountSection {
    fn is_empty(&self) -> bool {
        self.manager_wait.is_none()
    }

    /// The configured wait, checked: [`nasd_fuse::ManagerWait::Hard`] if none.
    pub fn manager_wait(&self) -> anyhow::Result<nasd_fuse::ManagerWait> {
        match &self.manager_wait {
            None => Ok(nasd_fuse::ManagerWait::Hard),
            Some(s) => s.parse().map_err(|e| anyhow::anyhow!("[mount] manager_wait: {e}")),
        }
    }
}

/// `[up]`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpSection {
    pub data: Option<PathBuf>,
    pub drives: Option<u32>,
    pub manager_port: Option<u16>,
    pub first_drive_port: Option<u16>,
    /// Capacity of each drive, e.g. "20GiB" [default: 90% of free space, shared].
    pub drive_capacity: Option<String>,
    /// Port of the authentication server [default: manager_port - 1].
    pub auth_port: Option<u16>,
    /// Serve S3 too, on `[s3] listen` (loopback; recorded at the first
    /// start: manager_port + 200 if free, else any) [default: true].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<bool>,
    /// Serve NFSv3 too, on `[nfs] listen` (recorded at the first start
    /// with it: manager_port + 300 on loopback unless set) [default: false].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nfs: Option<bool>,
}

/// Reads and parses the file.
pub fn load(path: &Path) -> anyhow::Result<ConfigFile> {
    nasd_profile::read_config(path)
}

/// The config file to use: the one named, else `./nasd-data/nasd.toml` if
/// it exists, else none (defaults).
pub fn find(named: Option<&Path>) -> anyhow::Result<(ConfigFile, Option<PathBuf>)> {
    match named {
        Some(p) => Ok((load(p)?, Some(p.to_path_buf()))),
        None if Path::new(DEFAULT_CONFIG).exists() => {
            let p = PathBuf::from(DEFAULT_CONFIG);
            Ok((load(&p)?, Some(p)))
        }
        None => Ok((ConfigFile::default(), None)),
    }
}

/// The settings of a first `nasd up` whose config file is named
/// (`--config`, `$NASD_CONFIG`) but not written yet: `nasd up` writes
/// `DATA/nasd.toml`, so a missing `…/nasd.toml` names the data directory;
/// another missing file is refused (a typo would otherwise start a new
/// cluster in `./nasd-data`).
pub fn for_first_up(named: &Path) -> anyhow::Result<ConfigFile> {
    let up_writes = named.file_name().is_some_and(|n| n == "nasd.toml");
    anyhow::ensure!(
        up_writes,
        "config file {} does not exist; `nasd up` writes its own as DATA/nasd.toml: name that (or nothing)",
        named.display()
    );
    let data = named.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Ok(ConfigFile { up: UpSection { data: Some(data.to_path_buf()), ..Default::default() }, ..Default::default() })
}

/// Writes `config` to `path` (replacing it atomically).
pub fn save(path: &Path, config: &ConfigFile, header: &str) -> anyhow::Result<()> {
    let text = format!("{header}{}", toml::to_string_pretty(config)?);
    // Durable like every small file the daemons keep (staged, synced, renamed, directory
    // synced), and owner-only: a metadata URL in it may carry a password.
    let tmp = path.with_extension("toml.tmp");
    nasd_crypto::durable::write_staged(&tmp, text, 0o600)?;
    nasd_crypto::durable::install(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_documented_example_parses_and_typos_are_refused() {
        let doc = include_str!("config.rs");
        let example: String = doc
            .lines()
            .skip_while(|l| !l.starts_with("//! ```toml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| l.trim_start_matches("//!").trim_start().to_string() + "\n")
            .collect();
        let c: super::ConfigFile = toml::from_str(&example).expect("example parses");
        assert_eq!(c.up.drives, Some(4));
        assert_eq!(c.client.user.as_deref(), Some("alice"));
        assert_eq!(c.drive.failure_domain.as_deref(), Some("rack-3"));
        assert_eq!(c.drive.throttle_mib_per_sec, Some(200));
        assert_eq!(c.mount.manager_wait().unwrap(), nasd_fuse::ManagerWait::Hard);
        let bounded: super::ConfigFile = toml::from_str("[mount]\nmanager_wait = \"30s\"\n").unwrap();
        assert_eq!(
            bounded.mount.manager_wait().unwrap(),
            nasd_fuse::ManagerWait::Bounded(std::time::Duration::from_secs(30))
        );
        let bad: super::ConfigFile = toml::from_str("[mount]\nmanager_wait = \"soft\"\n").unwrap();
        assert!(bad.mount.manager_wait().unwrap_err().to_string().contains("[mount] manager_wait"));
        assert_eq!(c.drives.len(), 1);
        assert_eq!((c.drives[0].number, c.drives[0].addr.as_str()), (0, "127.0.0.1:7401"));
        let metadata = c.manager.metadata.as_deref().expect("metadata");
        assert!(metadata.parse::<nasd_manager::Location>().is_ok(), "{metadata}");
        assert_eq!(c.client.auth_failover, ["auth2.example.com:7299"]);
        assert!(c.auth.metadata.as_deref().is_some_and(|m| m.parse::<nasd_manager::Location>().is_ok()));
        assert!(toml::from_str::<super::ConfigFile>("[client]\nusr = \"x\"\n").is_err());
        assert_eq!(c.metrics.drive.as_deref(), Some("127.0.0.1:9400"));
        assert_eq!(c.metrics.up.as_deref(), Some("127.0.0.1:9300"));
        assert!(toml::from_str::<super::ConfigFile>("[metrics]\nlisten = \"127.0.0.1:1\"\n").is_err());
    }
}
