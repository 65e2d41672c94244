//! Commands that talk to one drive directly with its own keys: inquiry,
//! drive key, audit trail, scrub.

use crate::size;
use anyhow::Context;
use nasd_crypto::Key;
use std::path::Path;

/// Reads a key file (64 hex digits).
pub fn read_key(path: &Path) -> anyhow::Result<Key> {
    Ok(nasd_crypto::read_key_file(path)?)
}

async fn connect(addr: &str) -> anyhow::Result<nasd_client::DriveClient> {
    nasd_client::DriveClient::connect(addr)
        .await
        .with_context(|| format!("cannot reach a drive at {addr}: is `nasd drive` running there?"))
}

pub async fn set_drive_key(addr: &str, master_file: &Path, out: &Path) -> anyhow::Result<()> {
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

pub async fn audit(addr: &str, drive_key_file: &Path, after: u64, max: u16) -> anyhow::Result<()> {
    let key = read_key(drive_key_file)?;
    let mut c = connect(addr).await?;
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

pub async fn scrub(addr: &str, drive_key_file: &Path) -> anyhow::Result<()> {
    let key = read_key(drive_key_file)?;
    let mut c = connect(addr).await?;
    let (checked, total, corrupt) = c.scrub(&key, 1024).await.context("the drive refused to scrub")?;
    println!("checked {checked} blocks: {total} corrupt");
    for (p, o, b) in &corrupt {
        println!("  partition {p} object {o} block {b}: bytes no longer match the stored digest");
    }
    anyhow::ensure!(total == 0, "{total} corrupt blocks: restore them from a replica or backup");
    Ok(())
}

pub fn hex_id(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

pub async fn inquiry(addr: &str) -> anyhow::Result<()> {
    let mut c = nasd_client::DriveClient::connect(addr)
        .await
        .with_context(|| format!("cannot reach a drive at {addr}: is `nasd drive` running there?"))?;
    let d = c.inquiry().await?;
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
