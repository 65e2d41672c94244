//! Commands about how files lie on drives and how the drives are doing:
//! `nasd layout`, `nasd status`, `nasd repair`, and the administrator's
//! `drive-out`/`drive-in`.

use crate::fs_cmd::Login;
use crate::size;
use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use nasd_fs::{ClusterStatus, DriveState, FsClient, Layout, Progress, RepairAction};
use std::io::IsTerminal;
use std::time::Duration;

/// How often `repair --wait` polls the manager.
const REPAIR_POLL_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Subcommand)]
pub enum LayoutCommand {
    /// Show a file's layout and components, or the layout new files in a directory get.
    Get {
        /// A path in nasd.
        path: String,
        #[command(flatten)]
        login: Login,
    },
    /// Set the layout new files in a directory get, or re-place an empty file.
    ///
    /// LAYOUT is stripe:W (W columns, no redundancy), mirror:C (C copies),
    /// mirror:CxW (C copies of W columns) or rs:K+M (Reed-Solomon: K data
    /// and M parity components; survives M lost drives), optionally followed
    /// by @UNIT, the stripe unit (e.g. rs:4+2@1M, mirror:2x4@256K; default
    /// 1M). `inherit` clears a directory's own layout.
    Set {
        /// A directory (or an empty file) in nasd.
        path: String,
        /// The layout, or `inherit`.
        layout: String,
        #[command(flatten)]
        login: Login,
    },
}

impl LayoutCommand {
    /// How this command logs in.
    pub fn login(&self) -> &Login {
        match self {
            LayoutCommand::Get { login, .. } | LayoutCommand::Set { login, .. } => login,
        }
    }
}

/// What `nasd repair` starts.
#[derive(Clone, Copy, ValueEnum)]
pub enum RepairWhat {
    /// Rebuild stale and lost components now.
    Rebuild,
    /// Scrub every drive and heal rot from redundancy.
    Scrub,
    /// Move components onto drives holding less than their share.
    Rebalance,
}

#[derive(Args)]
pub struct RepairArgs {
    /// What to start.
    #[arg(value_enum, default_value = "rebuild")]
    pub what: RepairWhat,
    /// Start it and return without following its progress.
    #[arg(long)]
    pub no_wait: bool,
    #[command(flatten)]
    pub login: Login,
}

/// `nasd layout get|set`.
pub async fn layout(fs: &FsClient, cmd: LayoutCommand) -> anyhow::Result<()> {
    match cmd {
        LayoutCommand::Get { path, .. } => {
            let info = fs.get_layout(&path).await.with_context(|| format!("layout get {path}"))?;
            let how = if info.explicit || !info.components.is_empty() { "" } else { " (inherited)" };
            println!("{path}: {}{how}", describe(&info.layout));
            for (i, (c, addr)) in info.components.iter().enumerate() {
                println!(
                    "  component {i:>2}: drive {:>3} ({addr}) object {} {:?}",
                    c.object.drive, c.object.object, c.state
                );
            }
            Ok(())
        }
        LayoutCommand::Set { path, layout, .. } => {
            let parsed = match layout.as_str() {
                "inherit" => None,
                text => Some(Layout::parse(text).map_err(|e| anyhow::anyhow!("{e}"))?),
            };
            fs.set_layout(&path, parsed).await.with_context(|| format!("layout set {path} {layout}"))?;
            Ok(())
        }
    }
}

/// A layout in words: "rs:2+1@1M (Reed-Solomon 2+1, survives 1 lost drive)".
fn describe(l: &Layout) -> String {
    let what = match l.scheme {
        nasd_fs::Scheme::Stripe { width } => format!("striped over {width}, no redundancy"),
        nasd_fs::Scheme::Mirror { width, copies } => format!("{copies} copies of {width} column(s)"),
        nasd_fs::Scheme::ReedSolomon { data, parity } => format!("Reed-Solomon {data}+{parity}"),
    };
    let survives = match l.tolerates() {
        0 => "a lost drive loses data".to_string(),
        1 => "survives 1 lost drive".to_string(),
        n => format!("survives {n} lost drives"),
    };
    format!("{l} ({what}, {} stripe unit; {survives})", size::human(l.stripe_unit as u64))
}

/// `nasd status`.
pub async fn status(fs: &FsClient) -> anyhow::Result<()> {
    let s = fs.cluster_status().await.context("status")?;
    print!("{}", render_status(&s));
    Ok(())
}

fn render_status(s: &ClusterStatus) -> String {
    let mut out = format!("cluster map epoch {}\n", s.map_epoch);
    out += &format!(
        "{:>5}  {:<22} {:<10} {:<8} {:>10} {:>10} {:>10}\n",
        "drive", "address", "domain", "state", "size", "used", "components"
    );
    for d in &s.drives {
        let state = match (d.state, d.up) {
            (DriveState::Out, _) => "out",
            (DriveState::In, true) => "up",
            (DriveState::In, false) => "DOWN",
        };
        let domain = if d.failure_domain.is_empty() { "-" } else { d.failure_domain.as_str() };
        out += &format!(
            "{:>5}  {:<22} {:<10} {:<8} {:>10} {:>10} {:>10}\n",
            d.drive,
            d.addr,
            domain,
            state,
            size::human(d.capacity_bytes),
            size::human(d.used_bytes),
            d.components
        );
    }
    out += &match s.files_degraded {
        0 => "every file has all its redundancy\n".to_string(),
        n => format!("{n} files degraded (a component stale or on a drive that is down)\n"),
    };
    for (name, p) in [("rebuild", s.rebuild), ("rebalance", s.rebalance)] {
        if p != Progress::default() {
            out += &format!(
                "{name}: {}/{} files, {}/{}\n",
                p.files_done,
                p.files_total,
                size::human(p.bytes_done),
                size::human(p.bytes_total)
            );
        }
    }
    if s.scrub.files_total > 0 {
        out += &format!("scrub: {}/{} drives\n", s.scrub.files_done, s.scrub.files_total);
    }
    let l = s.last_scrub;
    if l.blocks_checked > 0 {
        out += &format!(
            "last scrub: {} blocks checked, {} corrupt, {} healed, {} unrecoverable\n",
            l.blocks_checked, l.corrupt, l.healed, l.unrecoverable
        );
    }
    out
}

/// `nasd repair`: starts the task and, unless told not to, follows it to the end.
pub async fn repair(fs: &FsClient, args: RepairArgs) -> anyhow::Result<()> {
    let action = match args.what {
        RepairWhat::Rebuild => RepairAction::Rebuild,
        RepairWhat::Scrub => RepairAction::Scrub,
        RepairWhat::Rebalance => RepairAction::Rebalance,
    };
    fs.repair(action).await.context("repair")?;
    if args.no_wait {
        println!("started; `nasd status` shows its progress");
        return Ok(());
    }
    let s = follow(fs, action).await?;
    print!("{}", render_status(&s));
    Ok(())
}

/// Follows a repair task the manager was asked to start until it is done;
/// the status then. (The manager shows a scrub as started from the moment
/// it is asked for, so a scrub not begun yet is not taken for one done.)
async fn follow(fs: &FsClient, action: RepairAction) -> anyhow::Result<ClusterStatus> {
    let pick = |s: &ClusterStatus| match action {
        RepairAction::Rebuild => s.rebuild,
        RepairAction::Rebalance => s.rebalance,
        RepairAction::Scrub => s.scrub,
    };
    let bar = progress_bar(action);
    loop {
        let s = fs.cluster_status().await.context("status")?;
        let p = pick(&s);
        show(&bar, action, &p);
        // A scrub or rebalance shows in the status from its request until it has finished (its
        // total of files grows as it goes); a requested rebuild from its request until the repair
        // pass that took it has ended (at least one file more than done meanwhile).
        let finished = match action {
            RepairAction::Rebuild => p.files_total == 0 || p.files_done >= p.files_total,
            RepairAction::Scrub | RepairAction::Rebalance => p == Progress::default(),
        };
        if finished {
            bar.finish_and_clear();
            return Ok(s);
        }
        tokio::time::sleep(REPAIR_POLL_INTERVAL).await;
    }
}

/// `nasd scrub` without a drive: every drive re-reads every block it
/// stores, and the manager heals each rotten one from the file's
/// redundancy (administrators).
pub async fn scrub_all(fs: &FsClient) -> anyhow::Result<()> {
    fs.repair(RepairAction::Scrub).await.context("cannot start a scrub (it takes an administrator)")?;
    let s = follow(fs, RepairAction::Scrub).await?;
    let l = s.last_scrub;
    let up = s.drives.iter().filter(|d| d.up).count();
    println!(
        "scrubbed {up} drives: {} blocks checked, {} corrupt, {} healed from redundancy, {} unrecoverable",
        l.blocks_checked, l.corrupt, l.healed, l.unrecoverable
    );
    let pending = l.corrupt.saturating_sub(l.healed + l.unrecoverable);
    if pending > 0 {
        println!("{pending} corrupt blocks are not healed yet (their file was busy or a drive failed): run `nasd scrub` again");
    }
    anyhow::ensure!(
        l.unrecoverable == 0,
        "{} corrupt blocks could not be healed: their files have no redundancy (or they belong to no file). \
         `nasd scrub --drive N` names the objects; restore those files from a backup",
        l.unrecoverable
    );
    Ok(())
}

fn progress_bar(action: RepairAction) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    let template = match action {
        RepairAction::Scrub => "{msg} [{bar:30}] {pos}/{len} drives",
        _ => "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
    };
    bar.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    bar
}

fn show(bar: &ProgressBar, action: RepairAction, p: &Progress) {
    match action {
        RepairAction::Scrub => {
            bar.set_length(p.files_total);
            bar.set_position(p.files_done);
            bar.set_message("scrub");
        }
        RepairAction::Rebuild | RepairAction::Rebalance => {
            bar.set_length(p.bytes_total);
            bar.set_position(p.bytes_done);
            bar.set_message(format!("{}/{} files", p.files_done, p.files_total));
        }
    }
}

/// `nasd admin drive-out|drive-in`.
pub async fn drive_state(fs: &FsClient, drive: u32, state: DriveState) -> anyhow::Result<()> {
    fs.set_drive_state(drive, state).await.with_context(|| format!("drive {drive}"))?;
    match state {
        DriveState::Out => println!(
            "drive {drive} is out of service: its components are being rebuilt elsewhere (`nasd repair` follows it)"
        ),
        DriveState::In => println!("drive {drive} is back in service"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_fs::{DriveStatus, ScrubSummary};

    #[test]
    fn status_names_down_drives_and_progress() {
        let drive = |n: u32, up: bool, state| DriveStatus {
            drive: n,
            addr: format!("127.0.0.1:740{n}"),
            failure_domain: if n < 2 { "rack-a".into() } else { String::new() },
            state,
            up,
            capacity_bytes: 1 << 30,
            used_bytes: 1 << 20,
            components: 3,
        };
        let s = ClusterStatus {
            map_epoch: 9,
            drives: vec![
                drive(0, true, DriveState::In),
                drive(1, false, DriveState::In),
                drive(2, true, DriveState::Out),
            ],
            files_degraded: 2,
            rebuild: Progress { files_done: 1, files_total: 2, bytes_done: 1 << 20, bytes_total: 2 << 20 },
            rebalance: Progress::default(),
            scrub: Progress::default(),
            last_scrub: ScrubSummary { blocks_checked: 100, corrupt: 1, healed: 1, unrecoverable: 0 },
        };
        let text = render_status(&s);
        assert!(text.contains("epoch 9"), "{text}");
        assert!(text.lines().any(|l| l.contains("127.0.0.1:7401") && l.contains("DOWN") && l.contains("rack-a")));
        assert!(text.lines().any(|l| l.contains("127.0.0.1:7402") && l.contains(" out ")));
        assert!(text.contains("2 files degraded"), "{text}");
        assert!(text.contains("rebuild: 1/2 files, 1.0 MiB/2.0 MiB"), "{text}");
        assert!(!text.contains("rebalance:"), "idle tasks are not shown: {text}");
        assert!(text.contains("100 blocks checked, 1 corrupt, 1 healed"), "{text}");
        // A rebalance asked for and not started yet: what it is to move, nothing moved.
        let pending = ClusterStatus { rebalance: Progress { bytes_total: 3 << 20, ..Progress::default() }, ..s };
        assert!(render_status(&pending).contains("rebalance: 0/0 files, 0 B/3.0 MiB"), "{}", render_status(&pending));
    }

    #[test]
    fn layouts_are_described_in_words() {
        let d = describe(&Layout::parse("rs:2+1").unwrap());
        assert_eq!(d, "rs:2+1@1M (Reed-Solomon 2+1, 1.0 MiB stripe unit; survives 1 lost drive)");
        assert!(describe(&Layout::parse("stripe:4@64K").unwrap()).contains("a lost drive loses data"));
        assert!(describe(&Layout::parse("mirror:3x2").unwrap()).contains("3 copies of 2 column(s)"));
    }
}
