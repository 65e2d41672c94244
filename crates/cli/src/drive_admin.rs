//! Tools that talk to one drive directly with its own keys: inquiry,
//! drive key, audit trail, scrub. Drives are named by address or, for the
//! drives the config file records (`[[drives]]`, which `nasd up` writes),
//! by the manager's number for them.

use crate::config::{ConfigFile, KnownDrive};
use crate::size;
use anyhow::Context;
use nasd_crypto::Key;
use std::path::{Path, PathBuf};

/// Where a standalone `nasd drive` listens unless told otherwise.
pub const DRIVE_LISTEN_DEFAULT: &str = "127.0.0.1:7400";

/// A drive a tool was pointed at.
#[derive(Debug, Clone)]
pub struct DriveRef {
    /// Its address.
    pub addr: String,
    /// Its entry in the config file, if it has one.
    pub known: Option<KnownDrive>,
}

impl DriveRef {
    fn name(&self) -> String {
        match &self.known {
            Some(k) => format!("drive {} ({})", k.number, self.addr),
            None => format!("the drive at {}", self.addr),
        }
    }

    /// The drive key file: the one given, else the one the config file records.
    fn drive_key_file(&self, given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
        given.or_else(|| self.known.as_ref().and_then(|k| k.drive_key_file.clone())).with_context(|| {
            format!(
                "no drive key for {}: pass --drive-key-file FILE (the config file records drive keys for the \
                 drives of `nasd up`)",
                self.name()
            )
        })
    }
}

/// The drives `--drive` names: a number from `[[drives]]`, or HOST:PORT.
/// Without one: every drive of `[[drives]]`, else the `[drive]` section's
/// address, else [`DRIVE_LISTEN_DEFAULT`].
pub fn resolve(arg: Option<&str>, file: &ConfigFile) -> anyhow::Result<Vec<DriveRef>> {
    let known = |addr: &str| file.drives.iter().find(|k| k.addr == addr).cloned();
    match arg {
        Some(n) if n.parse::<u32>().is_ok() => {
            let n: u32 = n.parse().expect("checked");
            let k = file.drives.iter().find(|k| k.number == n).cloned().with_context(|| {
                if file.drives.is_empty() {
                    format!(
                        "no drive {n}: the config file records no drives (`nasd up` writes them); give --drive HOST:PORT"
                    )
                } else {
                    let numbers: Vec<String> = file.drives.iter().map(|k| k.number.to_string()).collect();
                    format!("no drive {n} in the config file; its drives are {}", numbers.join(", "))
                }
            })?;
            Ok(vec![DriveRef { addr: k.addr.clone(), known: Some(k) }])
        }
        Some(addr) => Ok(vec![DriveRef { addr: addr.to_string(), known: known(addr) }]),
        None if !file.drives.is_empty() => {
            Ok(file.drives.iter().map(|k| DriveRef { addr: k.addr.clone(), known: Some(k.clone()) }).collect())
        }
        None => {
            let addr = file.drive.listen.clone().unwrap_or_else(|| DRIVE_LISTEN_DEFAULT.into());
            // A drive listening on every address is reached on this machine's loopback.
            let addr = match addr.parse::<std::net::SocketAddr>() {
                Ok(a) if a.ip().is_unspecified() => format!("127.0.0.1:{}", a.port()),
                _ => addr,
            };
            Ok(vec![DriveRef { known: known(&addr), addr }])
        }
    }
}

/// Exactly one drive: `--drive`, or the only one the config file knows.
pub fn resolve_one(arg: Option<&str>, file: &ConfigFile) -> anyhow::Result<DriveRef> {
    let mut drives = resolve(arg, file)?;
    if drives.len() > 1 {
        let numbers: Vec<String> = file.drives.iter().map(|k| k.number.to_string()).collect();
        anyhow::bail!("which drive? pass --drive N (one of {}) or --drive HOST:PORT", numbers.join(", "));
    }
    Ok(drives.remove(0))
}

/// Reads a key file (64 hex digits).
pub fn read_key(path: &Path) -> anyhow::Result<Key> {
    Ok(nasd_crypto::read_key_file(path)?)
}

async fn connect(addr: &str) -> anyhow::Result<nasd_client::DriveClient> {
    nasd_client::DriveClient::connect(addr)
        .await
        .with_context(|| format!("cannot reach a drive at {addr}: is `nasd drive` (or `nasd up`) running there?"))
}

pub async fn set_drive_key(drive: &DriveRef, master_file: &Path, out: &Path) -> anyhow::Result<()> {
    if let Some(k) = &drive.known {
        anyhow::bail!(
            "drive {} ({}) is looked after by a manager, which holds its drive key: a new one would lock the \
             manager out. `nasd audit --drive {}` and `nasd scrub --drive {}` use the key file the config file \
             records",
            k.number,
            drive.addr,
            k.number,
            k.number
        );
    }
    let addr = drive.addr.as_str();
    let master = read_key(master_file)?;
    let key = Key::random();
    // Write the file first: a key the drive holds but nobody kept would lock the admin out.
    nasd_crypto::create_key_file(out, &key)?;
    let mut c = connect(addr).await?;
    if let Err(e) = c.set_drive_key(&master, &key).await {
        let _ = std::fs::remove_file(out);
        return Err(e).context("the drive refused the new drive key (is this its master key?)");
    }
    println!("drive key set; saved to {}", out.display());
    Ok(())
}

/// `nasd audit`: the audit trail of each drive in `drives` (without
/// `--drive`, every drive the config file records), each under its name
/// when there are several.
pub async fn audit(drives: &[DriveRef], drive_key_file: Option<PathBuf>, after: u64, max: u16) -> anyhow::Result<()> {
    if drives.len() > 1 && drive_key_file.is_some() {
        anyhow::bail!("--drive-key-file is one drive's key: name that drive with --drive N or --drive HOST:PORT");
    }
    for (i, drive) in drives.iter().enumerate() {
        if drives.len() > 1 {
            if i > 0 {
                println!();
            }
            println!("{}:", drive.name());
        }
        audit_one(drive, drive_key_file.clone(), after, max)
            .await
            .with_context(|| format!("audit of {}", drive.name()))?;
    }
    Ok(())
}

async fn audit_one(drive: &DriveRef, drive_key_file: Option<PathBuf>, after: u64, max: u16) -> anyhow::Result<()> {
    let key = read_key(&drive.drive_key_file(drive_key_file)?)?;
    let mut c = connect(&drive.addr).await?;
    let records = c.read_audit(&key, after, max).await.context("the drive refused to show its audit trail")?;
    println!(
        "{:>8}  {:>20}  {:>8}  {:>6}  {:>6}  {:>22}  {:>8}  {:>10}  region",
        "seq", "time (ns)", "audit id", "key", "op", "status", "part", "object"
    );
    for r in &records {
        if r.opcode == nasd_proto::opcode::NOT_ITEMIZED {
            let why = match r.partition {
                nasd_proto::not_itemized::UNAUTHENTICATED_REFUSALS => "refusals of requests that proved no key",
                nasd_proto::not_itemized::BUFFER_FULL => "requests arriving while the audit buffer was full",
                _ => "requests",
            };
            println!(
                "{:>8}  {:>20}  {} {why} not itemized (drive time {}..={})",
                r.sequence, r.time_ns, r.object, r.region.offset, r.region.length
            );
            continue;
        }
        let status =
            nasd_proto::Status::from_code(r.status).map_or_else(|| r.status.to_string(), |s| s.name().to_string());
        println!(
            "{:>8}  {:>20}  {:>8}  {:>6}  {:#06x}  {:>22}  {:>8}  {:>10}  {}+{}",
            r.sequence,
            r.time_ns,
            r.audit_id,
            r.key_type,
            r.opcode,
            status,
            r.partition,
            r.object,
            r.region.offset,
            r.region.length
        );
    }
    if records.is_empty() {
        println!("(no records after {after})");
    }
    Ok(())
}

/// `nasd scrub --drive`: one drive re-reads its blocks and reports rot
/// (healing is the manager's: `nasd scrub` without a drive).
pub async fn scrub(drive: &DriveRef, drive_key_file: Option<PathBuf>) -> anyhow::Result<()> {
    let key = read_key(&drive.drive_key_file(drive_key_file)?)?;
    let mut c = connect(&drive.addr).await?;
    let (checked, total, corrupt) = c.scrub(&key, 1024).await.context("the drive refused to scrub")?;
    println!("{}: checked {checked} blocks, {total} corrupt", drive.name());
    for (p, o, b) in &corrupt {
        println!("  partition {p} object {o} block {b}: bytes no longer match the stored digest");
    }
    if total > 0 && drive.known.is_some() {
        anyhow::bail!("{total} corrupt blocks: `nasd scrub` (without --drive) heals them from the files' redundancy");
    }
    anyhow::ensure!(total == 0, "{total} corrupt blocks: restore them from a replica or backup");
    Ok(())
}

pub fn hex_id(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// `nasd inquiry`: each drive's identity, capacity and partitions.
pub async fn inquiry(drives: &[DriveRef]) -> anyhow::Result<()> {
    for (i, drive) in drives.iter().enumerate() {
        if i > 0 {
            println!();
        }
        inquiry_one(drive).await?;
    }
    Ok(())
}

async fn inquiry_one(drive: &DriveRef) -> anyhow::Result<()> {
    let mut c = connect(&drive.addr).await?;
    let d = c.inquiry().await.with_context(|| format!("inquiry of {}", drive.name()))?;
    if let Some(k) = &drive.known {
        println!("number    {} ({})", k.number, drive.addr);
    } else {
        println!("address   {}", drive.addr);
    }
    println!("drive     {}", hex_id(&d.drive_id));
    println!("vendor    {} {} {}", d.vendor, d.model, d.firmware);
    if !d.failure_domain.is_empty() {
        println!("failure domain {}", d.failure_domain);
    }
    println!(
        "capacity  {} ({} used), block size {}",
        size::human(d.capacity_bytes),
        size::human(d.used_bytes),
        size::human(d.block_size as u64)
    );
    println!("partitions {}", d.partitions.len());
    for p in &d.partitions {
        println!(
            "  {:>6}  quota {:>10}  used {:>10}  objects {}",
            p.partition,
            size::human(p.quota_bytes),
            size::human(p.used_bytes),
            p.objects
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up_config() -> ConfigFile {
        let mut c = ConfigFile::default();
        for n in 0..3 {
            c.drives.push(KnownDrive {
                number: n,
                addr: format!("127.0.0.1:{}", 7401 + n),
                drive_key_file: Some(format!("/d/drive-{n}/drive.key").into()),
            });
        }
        c
    }

    #[test]
    fn drives_are_named_by_number_or_address_and_default_to_the_configured_ones() {
        let c = up_config();
        let all = resolve(None, &c).unwrap();
        assert_eq!(
            all.iter().map(|d| d.addr.as_str()).collect::<Vec<_>>(),
            ["127.0.0.1:7401", "127.0.0.1:7402", "127.0.0.1:7403"]
        );
        let two = resolve_one(Some("2"), &c).unwrap();
        assert_eq!(two.addr, "127.0.0.1:7403");
        assert_eq!(two.drive_key_file(None).unwrap(), PathBuf::from("/d/drive-2/drive.key"));
        let by_addr = resolve_one(Some("127.0.0.1:7402"), &c).unwrap();
        assert_eq!(by_addr.known.as_ref().map(|k| k.number), Some(1), "an address of a known drive finds its key");
        let e = resolve_one(None, &c).unwrap_err().to_string();
        assert!(e.contains("which drive?") && e.contains("0, 1, 2"), "{e}");
        let e = resolve(Some("7"), &c).unwrap_err().to_string();
        assert!(e.contains("no drive 7") && e.contains("0, 1, 2"), "{e}");

        // No config: a standalone drive's default address; its key must be given.
        let none = ConfigFile::default();
        let d = resolve_one(None, &none).unwrap();
        assert_eq!(d.addr, DRIVE_LISTEN_DEFAULT);
        assert!(d.drive_key_file(None).unwrap_err().to_string().contains("--drive-key-file"));
        let mut standalone = ConfigFile::default();
        standalone.drive.listen = Some("0.0.0.0:7500".into());
        assert_eq!(resolve_one(None, &standalone).unwrap().addr, "127.0.0.1:7500");
    }
}
