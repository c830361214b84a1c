#![forbid(unsafe_code)]
//! The `lazaret` command: parses arguments, calls the coordinator, and turns
//! errors into one clear message and a non-zero exit.
//!
//! Exit status ([`EXIT_STATUS_HELP`]): `lazaret run` exits with the
//! agent's status (128 + N for death by signal N), 126 or 127 when its
//! command cannot be run or is not found; Lazaret's own failures exit with
//! 125, so they cannot be mistaken for the agent's.

mod generate;
mod init;
mod json;
mod progress;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{CommandFactory as _, Parser, Subcommand};
use lazaret_coordinator::context::{Context, load_config, require_root};
use lazaret_coordinator::identity::Developer;
use lazaret_coordinator::startup::SetupMode;
use lazaret_coordinator::{client, doctor, journal as domain_journal, network};

/// Exit status for Lazaret's own failures (as docker and podman do): the
/// coordinator's [`lazaret_coordinator::LAZARET_FAILED`], as an exit code.
const LAZARET_FAILED: u8 = lazaret_coordinator::LAZARET_FAILED as u8;

/// The exit status table and the environment, at the end of `--help` and
/// in the man page.
const EXIT_STATUS_HELP: &str = "\
Without a command, lazaret runs the default profile's agent on the current workspace (as `lazaret run`).

Exit status:
  0-124, 128+N  the agent's own status (128+N: it died of signal N); other commands: 0 on success
  125           Lazaret itself failed (configuration, sandbox, coordinator); the message says why
  126           the agent's command exists but cannot be executed
  127           the agent's command was not found
  1             lazaret doctor: a check failed

Environment:
  LAZARET_CONFIG  the configuration file (--config wins)
  NO_COLOR        set and not empty: no color in help and error messages (colors only ever go to a terminal)";

#[derive(Parser)]
#[command(name = "lazaret", version, about = "Run AI coding agents in a gVisor sandbox, from a git checkout.", after_help = EXIT_STATUS_HELP)]
struct Cli {
    /// Configuration file (default: $LAZARET_CONFIG, else ~/.config/lazaret/config.toml of the developer).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Say nothing of Lazaret's own on stderr but errors: no warnings, notes, progress or status line.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Say more on stderr: the start-up stages with their times, the coordinator's log file.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

impl Cli {
    /// Parses the command line; without a command, `lazaret [OPTIONS]` is
    /// `lazaret [OPTIONS] run` (only global options can precede it).
    fn parse_or_run() -> Cli {
        let cli = Cli::parse();
        if cli.command.is_some() {
            return cli;
        }
        Cli::parse_from(std::env::args_os().chain([std::ffi::OsString::from("run")]))
    }

    fn verbosity(&self) -> client::Verbosity {
        match (self.quiet, self.verbose) {
            (true, _) => client::Verbosity::Quiet,
            (false, true) => client::Verbosity::Verbose,
            (false, false) => client::Verbosity::Normal,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a profile's agent (or ARGS) in a sandbox on the current workspace.
    Run {
        /// The profile (default: `default_profile`, or the only one).
        profile: Option<String>,
        /// Use the git checkout containing DIR instead of the current directory.
        #[arg(short = 'C', value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Discard the Domain's State Anchor (persistent system directories) first.
        #[arg(long)]
        reset_anchor: bool,
        /// Start the Domain without running the profile's setup steps (a fix-up shell after a failed setup).
        #[arg(long, conflicts_with = "reprovision")]
        no_setup: bool,
        /// Run every setup step again, even if the recorded setup is current (the Domain must be stopped).
        #[arg(long)]
        reprovision: bool,
        /// Command to run instead of the profile's.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Write a commented configuration with profiles for claude, codex, gemini, grok, opencode and shell.
    Init {
        /// Replace an existing file (kept as FILE.bak).
        #[arg(long)]
        force: bool,
        /// Where to write it (default: --config, $LAZARET_CONFIG, else ~/.config/lazaret/config.toml of the developer).
        path: Option<PathBuf>,
    },
    /// Check or show the configuration.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Manage images in the local store.
    Image {
        #[command(subcommand)]
        action: ImageAction,
    },
    /// Show a profile's compiled egress policy, or explain one verdict.
    Policy {
        #[command(subcommand)]
        action: PolicyAction,
    },
    /// Check this machine's prerequisites.
    Doctor {
        /// As JSON: an array of {name, ok, detail, fix, warning}.
        #[arg(long)]
        json: bool,
    },
    /// End a running Domain gracefully: sessions are told, agents get SIGTERM, then SIGKILL after the grace period.
    Stop {
        /// The profile whose Domain (on this workspace) to stop.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        profile: Option<String>,
        /// Stop every running Domain of this developer.
        #[arg(long)]
        all: bool,
        /// Use the git checkout containing DIR instead of the current directory.
        #[arg(short = 'C', value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Seconds between SIGTERM and SIGKILL.
        #[arg(long, default_value_t = 5)]
        grace: u64,
    },
    /// Forget which workspace paths a Domain isolated in earlier runs; from its next start only the current ignore rules decide (the Domain must be stopped).
    ResetIsolation {
        /// The profile whose Domain (on this workspace) to reset.
        profile: String,
        /// Use the git checkout containing DIR instead of the current directory.
        #[arg(short = 'C', value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Forget a profile's `profile_state` (agent logins and settings kept per profile) in every checkout; no Domain of the profile may be running.
    ResetProfileState {
        /// The profile whose state to forget.
        profile: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// List running Domains: profile, workspace, state, sessions, uptime, sandbox and sidecar IDs.
    Ls {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a Domain's journal (every protocol transition), or check it against the protocol model.
    Journal {
        /// The profile (default: `default_profile`, or the only one).
        profile: Option<String>,
        /// Use the git checkout containing DIR instead of the current directory.
        #[arg(short = 'C', value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Keep printing new entries as they are written.
        #[arg(long)]
        follow: bool,
        /// Replay the journal (and those of crashed runs) against the protocol model.
        #[arg(long)]
        check: bool,
        /// Check or print this journal file instead of the Domain's.
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
        /// As JSON: an array of the entries; with --check, of {path, entries, complete}.
        #[arg(long, conflicts_with = "follow")]
        json: bool,
    },
    /// List what the Workspace Guard neutralised in a Domain (with the files it quarantined), or put one quarantined file back.
    Audit {
        /// The profile (default: `default_profile`, or the only one).
        profile: Option<String>,
        /// Use the git checkout containing DIR instead of the current directory.
        #[arg(short = 'C', value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Put quarantine entry ID back where it was (owned by the developer, without setuid/setgid); refused if that path is occupied.
        #[arg(long, value_name = "ID")]
        restore: Option<String>,
        /// As JSON: an array of {time, root, path, kind, summary, reason, found_by, quarantine_id, in_quarantine, quarantined}; with --restore, {restored: {id, root, path}}.
        #[arg(long)]
        json: bool,
    },
    /// Show a running Domain's namespaces, routes and mounts as its coordinator sees them.
    Debug {
        /// The profile.
        profile: Option<String>,
        /// Use the git checkout containing DIR instead of the current directory.
        #[arg(short = 'C', value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Print a shell completion script, generated from this command's definition.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), generated from this command's definition.
    Man,
    /// Internal: the coordinator daemon of one Domain (started by `lazaret run`).
    #[command(name = "__coordinator", hide = true)]
    Coordinator {
        /// The Domain runtime directory the launcher computed.
        #[arg(long)]
        domain_dir: PathBuf,
        /// The launcher's Session ID.
        #[arg(long)]
        session: String,
        /// The profile.
        #[arg(long)]
        profile: String,
        /// The launcher's directory.
        #[arg(short = 'C')]
        dir: PathBuf,
        /// Discard the State Anchor first.
        #[arg(long)]
        reset_anchor: bool,
        /// Skip the profile's setup.
        #[arg(long, conflicts_with = "reprovision")]
        no_setup: bool,
        /// Rerun the profile's setup.
        #[arg(long)]
        reprovision: bool,
    },
}

#[derive(Subcommand)]
enum PolicyAction {
    /// Print the compiled routing table the sidecar installs.
    Show {
        /// The profile.
        profile: String,
        /// As JSON: {rules: [{prefix, action, origin}], resolvers, ipv6}.
        #[arg(long)]
        json: bool,
    },
    /// Print the verdict for an ADDRESS, or a NAME (locked egress), and the rule that decided it.
    Explain {
        /// The profile.
        profile: String,
        /// An IPv4 or IPv6 address, or a DNS name.
        target: String,
        /// As JSON: {address, action, rule: {prefix, action, origin}}, for a name {name, action, rules: [{rule, origin}]}.
        #[arg(long)]
        json: bool,
    },
    /// Show the destinations (address, protocol, port) a running Domain's
    /// sidecar refused in the last hour, with the rule that refuses each,
    /// and the names a locked Domain refused, with counts.
    Log {
        /// The profile.
        profile: String,
        /// Use the git checkout containing DIR instead of the current directory.
        #[arg(short = 'C', value_name = "DIR")]
        dir: Option<PathBuf>,
        /// As JSON: {egress, destinations: [{address, protocol, port, packets, last_unix, rule}], names: [{name, count, last_unix}] or null}.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Validate the configuration and print each profile's fingerprint.
    Check {
        /// As JSON: {file, profiles: [{name, fingerprint}]}.
        #[arg(long)]
        json: bool,
    },
    /// Print the validated configuration with defaults filled in.
    Show {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ImageAction {
    /// Pull REF from a registry (`debian` means docker.io/library/debian:latest; tags and @sha256: digests).
    Pull {
        /// The image reference; stored under its full form, e.g. docker.io/library/debian:trixie.
        reference: String,
        /// The platform to take from a multi-platform image (default: linux/<this machine>).
        #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
        platform: Option<String>,
        /// Allow plain HTTP to this registry (never the default).
        #[arg(long)]
        insecure: bool,
        /// Trust this CA certificate (PEM) for the registry; repeatable.
        #[arg(long = "ca-cert", value_name = "FILE")]
        ca_certs: Vec<PathBuf>,
        /// Credentials file in docker's format, searched before Lazaret's and docker's.
        #[arg(long, value_name = "FILE")]
        authfile: Option<PathBuf>,
    },
    /// Save credentials for a registry (password read from standard input).
    Login {
        /// The registry host[:port], e.g. ghcr.io or registry.example:5000.
        registry: String,
        /// The user name.
        #[arg(short, long)]
        username: String,
        /// Read the password or token from standard input (required).
        #[arg(long)]
        password_stdin: bool,
        /// Write this file instead of ~/.config/lazaret/registry-auth.json.
        #[arg(long, value_name = "FILE")]
        authfile: Option<PathBuf>,
    },
    /// Import a rootfs directory or tarball (.tar, .tar.gz, .tar.zst), an OCI layout or an oci-archive as NAME.
    Import {
        /// The name profiles use in `image = "..."`.
        name: String,
        /// The source.
        source: PathBuf,
    },
    /// List images: name, digest, size, created.
    Ls {
        /// As JSON: an array of {name, digest, size, created}.
        #[arg(long)]
        json: bool,
    },
    /// Show everything the store records about an image, as JSON.
    Inspect {
        /// The image name (or a reference that normalises to it).
        name: String,
        /// As JSON (the only format; accepted like every listing command's).
        #[arg(long)]
        json: bool,
    },
    /// Remove an image (and every blob and rootfs no other image uses).
    Rm {
        /// The image name.
        name: String,
    },
    /// Delete blobs and root filesystems no image references, and leftovers of interrupted pulls.
    Gc,
}

fn main() -> ExitCode {
    let cli = Cli::parse_or_run();
    let verbosity = cli.verbosity();
    let Some(command) = cli.command else { return report(anyhow::anyhow!("no command")) };
    match command {
        Command::Run { profile, dir, reset_anchor, no_setup, reprovision, args } => {
            run(cli.config, verbosity, profile, dir, reset_anchor, setup_mode(no_setup, reprovision), args)
        }
        Command::Init { force, path } => match init::init(cli.config, path, force) {
            Ok(code) => code,
            Err(e) => report(e),
        },
        Command::Coordinator { domain_dir, session, profile, dir, reset_anchor, no_setup, reprovision } => {
            let setup = setup_mode(no_setup, reprovision);
            let args =
                lazaret_coordinator::daemon::CoordinatorArgs { config: cli.config, profile, dir, session, reset_anchor, setup, domain_dir };
            ExitCode::from(u8::try_from(lazaret_coordinator::daemon::coordinator_main(&args) & 0xff).unwrap_or(LAZARET_FAILED))
        }
        other => match dispatch(cli.config, verbosity, other) {
            Ok(code) => code,
            Err(e) => report(e),
        },
    }
}

fn report(e: anyhow::Error) -> ExitCode {
    eprintln!("lazaret: error: {e:#}");
    ExitCode::from(LAZARET_FAILED)
}

/// One check of `lazaret doctor` as the terminal shows it: `OK`, `WARN` or
/// `FAIL`, what was found, and why and how to fix it when there is more to
/// say.
fn doctor_line(check: &doctor::Check) -> String {
    let status = match (check.ok, &check.warning) {
        (false, _) => "FAIL",
        (true, Some(_)) => "WARN",
        (true, None) => "OK",
    };
    let mut line = format!("{status:<4} {}: {}", check.name, check.detail);
    if let Some(why) = &check.warning {
        line.push_str(&format!("\n     why: {why}"));
    }
    if let Some(fix) = &check.fix {
        line.push_str(&format!("\n     fix: {fix}"));
    }
    line
}

/// `--no-setup` / `--reprovision` (clap refuses both at once).
fn setup_mode(no_setup: bool, reprovision: bool) -> SetupMode {
    match (no_setup, reprovision) {
        (true, _) => SetupMode::Skip,
        (false, true) => SetupMode::Rerun,
        (false, false) => SetupMode::Normal,
    }
}

fn run(
    config: Option<PathBuf>,
    verbosity: client::Verbosity,
    profile: Option<String>,
    dir: Option<PathBuf>,
    reset_anchor: bool,
    setup: SetupMode,
    args: Vec<String>,
) -> ExitCode {
    let dir = match dir.map(Ok).unwrap_or_else(std::env::current_dir) {
        Ok(d) => d,
        Err(e) => return report(anyhow::Error::new(e).context("reading the current directory")),
    };
    let req = client::RunRequest { config, verbosity, profile, dir, args, reset_anchor, setup };
    match client::run(&req) {
        Ok(status) => ExitCode::from(u8::try_from(status.0 & 0xff).unwrap_or(LAZARET_FAILED)),
        Err(e) => report(e.into()),
    }
}

fn dispatch(config: Option<PathBuf>, verbosity: client::Verbosity, command: Command) -> Result<ExitCode> {
    match command {
        Command::Run { .. } | Command::Init { .. } | Command::Coordinator { .. } => unreachable!("handled in main"),
        Command::Stop { profile, all, dir, grace } => {
            let grace = std::time::Duration::from_secs(grace);
            if all {
                let stopped = client::stop_all(config.as_deref(), grace)?;
                println!("stopped {} Domain(s)", stopped.len());
            } else {
                let dir = current_dir(dir)?;
                let id = client::stop(config.as_deref(), profile.as_deref(), &dir, grace)?;
                println!("stopped Domain {id}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::ResetIsolation { profile, dir } => {
            use lazaret_coordinator::filesystem::RecordReset;
            let dir = current_dir(dir)?;
            let reset = lazaret_coordinator::filesystem::reset_isolation(config.as_deref(), Some(&profile), &dir)?;
            let record = reset.record_file.display();
            match reset.outcome {
                RecordReset::Absent => println!("nothing to reset: no isolated paths are recorded ({record})"),
                RecordReset::Forgotten(n) => println!(
                    "forgot {n} recorded isolated path(s) ({record} deleted); from the next start only the current ignore rules apply"
                ),
                RecordReset::Unreadable => {
                    println!("deleted the unreadable {record}; from the next start only the current ignore rules apply")
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::ResetProfileState { profile, json } => {
            let reset = lazaret_coordinator::filesystem::reset_profile_state(config.as_deref(), &profile)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reset)?);
            } else if reset.removed {
                println!(
                    "forgot the profile state of {:?} ({} removed); its Domains start with empty state directories",
                    reset.profile,
                    reset.store.display()
                );
            } else {
                println!("nothing to reset: profile {:?} keeps no state ({} does not exist)", reset.profile, reset.store.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Ls { json } => {
            let domains = client::list(config.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&domains)?);
            } else {
                println!(
                    "{:<18} {:<12} {:<9} {:>8} {:>8}  {:<24} {:<10} WORKSPACE",
                    "DOMAIN", "PROFILE", "STATE", "SESSIONS", "UPTIME", "SANDBOX", "SIDECAR"
                );
                for d in domains {
                    println!(
                        "{:<18} {:<12} {:<9} {:>8} {:>7}s  {:<24} {:<10} {}",
                        d.domain.chars().take(16).collect::<String>(),
                        d.profile,
                        d.state,
                        d.sessions.len(),
                        d.uptime_secs,
                        d.sandbox,
                        d.sidecar,
                        d.workspace
                    );
                    // Agent-controlled argv: shell-quoted and made inert.
                    for p in &d.pending {
                        let command = lazaret_protocol::display::inert(&lazaret_protocol::shell::quote_argv(&p.argv), 200);
                        println!(
                            "  request {} of session {}: {} for {}s: {}",
                            &p.request[..p.request.len().min(12)],
                            p.session,
                            p.state,
                            p.age_secs,
                            command
                        );
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Journal { profile, dir, follow, check, file, json } => journal(config.as_deref(), profile, dir, follow, check, file, json),
        Command::Audit { profile, dir, restore, json } => audit(config.as_deref(), profile, dir, restore, json),
        Command::Debug { profile, dir } => {
            let dir = current_dir(dir)?;
            print!("{}", client::debug(config.as_deref(), profile.as_deref(), &dir)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor { json } => {
            let checks = doctor::run_checks(config.as_deref(), &current_dir(None)?);
            if json {
                json::print(
                    &checks
                        .iter()
                        .map(|c| json::Check {
                            name: &c.name,
                            ok: c.ok,
                            detail: &c.detail,
                            fix: c.fix.as_deref(),
                            warning: c.warning.as_deref(),
                        })
                        .collect::<Vec<_>>(),
                )?;
            } else {
                for c in &checks {
                    println!("{}", doctor_line(c));
                }
            }
            Ok(if checks.iter().all(|c| c.ok) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            generate::completions(Cli::command(), "lazaret", shell, &mut script)?;
            generate::to_stdout(&script)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            let mut page = Vec::new();
            generate::man(Cli::command(), &mut page)?;
            generate::to_stdout(&page)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy { action } => {
            require_root()?;
            let developer = Developer::from_process()?;
            let cfg = load_config(config.as_deref(), &developer)?;
            let (name, target, as_json) = match &action {
                PolicyAction::Show { profile, json } => (profile, None, *json),
                PolicyAction::Explain { profile, target, json } => (profile, Some(target.as_str()), *json),
                PolicyAction::Log { profile, dir, json } => {
                    let dir = current_dir(dir.clone())?;
                    let names = client::refused_names(config.as_deref(), Some(profile), &dir)?;
                    let destinations = client::refused_destinations(config.as_deref(), Some(profile), &dir)?;
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
                    // Which line refuses each one, so the developer knows what to
                    // change: the profile's policy as `policy explain` computes it now.
                    let policy = cfg.profile(profile).ok().and_then(|p| network::preview(&cfg, p).ok());
                    let rule_of = |address: &str| -> Option<lazaret_netpolicy::policy::Rule> {
                        Some(policy.as_ref()?.decide(address.parse().ok()?).rule)
                    };
                    if *json {
                        json::print(&json::PolicyLog {
                            egress: if names.is_some() { "locked" } else { "open" }.to_string(),
                            destinations: destinations
                                .iter()
                                .map(|d| json::RefusedDestination {
                                    address: d.address.clone(),
                                    protocol: d.protocol.clone(),
                                    port: d.port,
                                    packets: d.packets,
                                    last_unix: now.saturating_sub(d.last_secs),
                                    rule: rule_of(&d.address).as_ref().map(json::Rule::from),
                                })
                                .collect(),
                            names,
                        })?;
                        return Ok(ExitCode::SUCCESS);
                    }
                    if destinations.is_empty() {
                        println!("no destinations refused in the last hour");
                    } else {
                        let width = destinations.iter().map(|d| d.address.len()).max().unwrap_or(11).max(11);
                        println!(
                            "{:>7}  {:<width$}  {:<6}  {:>5}  {:<19}  REFUSED BY",
                            "PACKETS", "DESTINATION", "PROTO", "PORT", "LAST (UTC)"
                        );
                        for d in &destinations {
                            let port = d.port.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
                            let why = rule_of(&d.address).map_or_else(|| "?".to_string(), |r| format!("{} ({})", r.prefix, r.origin));
                            println!(
                                "{:>7}  {:<width$}  {:<6}  {:>5}  {}  {why}",
                                d.packets,
                                d.address,
                                d.protocol,
                                port,
                                humantime_utc(now.saturating_sub(d.last_secs))
                            );
                        }
                        println!(
                            "(to open one: an allow_egress entry covering it in profile {profile:?}; `lazaret policy explain {profile} ADDRESS` shows the deciding rule)"
                        );
                    }
                    println!();
                    match names {
                        None => println!(
                            "profile {profile:?} has open egress: its Domain has no resolver of its own, so no names are refused (set egress = \"locked\")"
                        ),
                        Some(names) if names.is_empty() => println!("no names refused"),
                        Some(names) => {
                            let width = names.iter().map(|n| n.name.len()).max().unwrap_or(4).max(4);
                            println!("{:>7}  {:<width$}  LAST (UTC)", "COUNT", "NAME");
                            for n in names {
                                println!("{:>7}  {:<width$}  {}", n.count, n.name, humantime_utc(n.last_unix));
                            }
                        }
                    }
                    return Ok(ExitCode::SUCCESS);
                }
            };
            let profile = cfg.profile(name)?;
            let policy = network::preview(&cfg, profile)?;
            // A name (not an address): the name rules decide.
            if let Some(name) = target.filter(|t| t.parse::<std::net::IpAddr>().is_err()) {
                if !policy.locked() {
                    anyhow::bail!(
                        "{name:?} is not an IP address, and profile {:?} has open egress, where names are not policed (every public address is allowed); explain an address instead, or set egress = \"locked\"",
                        profile.name
                    );
                }
                let verdict = policy.names().decide(name);
                if as_json {
                    json::print(&json::NameVerdict {
                        name: name.to_string(),
                        action: if verdict.allowed() { "allow" } else { "refuse" }.to_string(),
                        rules: verdict.rules.iter().map(|r| json::NameRule { rule: r.to_string(), origin: r.origin.clone() }).collect(),
                    })?;
                } else {
                    println!("{}", policy.names().explain(name));
                }
                return Ok(ExitCode::SUCCESS);
            }
            let address = match target {
                Some(text) => Some(text.parse::<std::net::IpAddr>()?),
                None => None,
            };
            match (address, as_json) {
                (None, false) => print!("{}", policy.render_table()),
                (Some(a), false) => println!("{}", policy.explain(a)),
                (None, true) => json::print(&json::Policy {
                    rules: policy.rules().iter().map(json::Rule::from).collect(),
                    resolvers: policy.resolvers().iter().map(ToString::to_string).collect(),
                    ipv6: policy.ipv6_enabled(),
                    egress: if policy.locked() { "locked" } else { "open" }.to_string(),
                    names: policy
                        .names()
                        .rules()
                        .iter()
                        .map(|r| json::NameRule { rule: r.to_string(), origin: r.origin.clone() })
                        .collect(),
                })?,
                (Some(a), true) => {
                    let verdict = policy.decide(a);
                    json::print(&json::Verdict {
                        address: a.to_string(),
                        action: verdict.action.to_string(),
                        rule: json::Rule::from(&verdict.rule),
                    })?
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Config { action } => {
            let developer = Developer::from_process()?;
            let cfg = load_config(config.as_deref(), &developer)?;
            match action {
                ConfigAction::Check { json: false } => {
                    println!("{}: OK", cfg.file.display());
                    for (name, profile) in &cfg.profiles {
                        println!("  profile {name}: fingerprint {}", cfg.fingerprint(name)?);
                        // The steps are the configuration's own text, made inert all the same.
                        for (i, step) in profile.setup.iter().enumerate() {
                            println!(
                                "    setup {}/{}: {}",
                                i + 1,
                                profile.setup.len(),
                                lazaret_protocol::display::inert(&lazaret_protocol::shell::quote_argv(step), 400)
                            );
                        }
                    }
                }
                ConfigAction::Check { json: true } => {
                    let profiles = cfg
                        .profiles
                        .keys()
                        .map(|name| Ok(json::ProfileFingerprint { name: name.clone(), fingerprint: cfg.fingerprint(name)?.to_string() }))
                        .collect::<Result<_>>()?;
                    json::print(&json::ConfigCheck { file: cfg.file.display().to_string(), profiles })?;
                }
                ConfigAction::Show { json } => {
                    if json {
                        println!("{}", cfg.render_json()?);
                    } else {
                        print!("{}", cfg.render_toml()?);
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Image { action } => {
            use lazaret_coordinator::images;
            require_root()?;
            let developer = Developer::from_process()?;
            let cfg = load_config(config.as_deref(), &developer)?;
            match action {
                ImageAction::Pull { reference, platform, insecure, ca_certs, authfile } => {
                    let quiet = verbosity == client::Verbosity::Quiet;
                    let request = images::PullRequest { reference: reference.clone(), platform, insecure, ca_certs, authfile };
                    let shown = progress::for_stderr(quiet);
                    let rec = images::pull(&cfg, &request, shown.as_ref()).with_context(|| format!("pulling {reference}"))?;
                    println!("pulled {} {} ({} bytes)", rec.name, rec.digest, rec.size);
                }
                ImageAction::Login { registry, username, password_stdin, authfile } => {
                    if !password_stdin {
                        anyhow::bail!(
                            "pass the password on standard input with --password-stdin (it is never taken from the command line)"
                        );
                    }
                    let mut password = String::new();
                    std::io::Read::read_to_string(&mut std::io::stdin(), &mut password)
                        .context("reading the password from standard input")?;
                    let password = password.trim_end_matches(['\n', '\r']).to_string();
                    if password.is_empty() {
                        anyhow::bail!("the password read from standard input is empty");
                    }
                    let creds = lazaret_coordinator::images::Credentials { username, password };
                    let file = images::login(&registry, &creds, authfile.as_deref())?;
                    println!("credentials for {registry} saved in {}", file.display());
                }
                ImageAction::Import { name, source } => {
                    let store = Context::image_store(&cfg)?;
                    let rec = store.import(&name, &source).with_context(|| format!("importing {} as {name}", source.display()))?;
                    println!("imported {} {} ({} bytes)", rec.name, rec.digest, rec.size);
                }
                ImageAction::Ls { json: true } => {
                    let records = Context::image_store(&cfg)?.list()?;
                    json::print(
                        &records
                            .iter()
                            .map(|r| json::Image { name: &r.name, digest: &r.digest, size: r.size, created: &r.created })
                            .collect::<Vec<_>>(),
                    )?;
                }
                ImageAction::Ls { json: false } => {
                    let store = Context::image_store(&cfg)?;
                    let records = store.list()?;
                    let width = records.iter().map(|r| r.name.len()).max().unwrap_or(0).max(24);
                    println!("{:<width$} {:<19} {:>12}  CREATED", "NAME", "DIGEST", "SIZE");
                    for rec in records {
                        let short = rec.digest.trim_start_matches("sha256:").chars().take(12).collect::<String>();
                        println!("{:<width$} sha256:{:<12} {:>12}  {}", rec.name, short, rec.size, rec.created);
                    }
                }
                // JSON either way: `--json` only for uniformity.
                ImageAction::Inspect { name, json: _ } => {
                    println!("{}", serde_json::to_string_pretty(&images::inspect(&cfg, &name)?)?);
                }
                ImageAction::Rm { name } => {
                    let store = Context::image_store(&cfg)?;
                    store.remove(&name)?;
                    println!("removed {name}");
                }
                ImageAction::Gc => {
                    let stats = images::gc(&cfg)?;
                    println!("removed {} blobs and {} root filesystems", stats.blobs_removed, stats.rootfs_removed);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn current_dir(dir: Option<PathBuf>) -> Result<PathBuf> {
    match dir {
        Some(d) => Ok(d),
        None => std::env::current_dir().context("reading the current directory"),
    }
}

/// `lazaret audit`: the Workspace Guard's neutralisations, or a restore.
fn audit(
    config: Option<&std::path::Path>,
    profile: Option<String>,
    dir: Option<PathBuf>,
    restore: Option<String>,
    as_json: bool,
) -> Result<ExitCode> {
    use lazaret_coordinator::workspace_guard;
    let dir = current_dir(dir)?;
    if let Some(id) = restore {
        let restored = workspace_guard::restore(config, profile.as_deref(), &dir, &id)?;
        let path = restored.path.to_string_lossy().into_owned();
        if as_json {
            json::print(&json::Restored { restored: json::RestoredFile { id: &id, root: &restored.root, path: &path } })?;
        } else {
            println!("restored {}:{} from quarantine entry {id}", restored.root, lazaret_protocol::display::escaped(&restored.path));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let report = workspace_guard::audit(config, profile.as_deref(), &dir)?;
    if as_json {
        json::print(&report.entries.iter().map(json::AuditEntry::from).collect::<Vec<_>>())?;
        return Ok(ExitCode::SUCCESS);
    }
    if report.entries.is_empty() {
        println!("the Workspace Guard neutralised nothing in this Domain (journals in {})", report.domain_root.display());
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<19}  {:<24}  {:<10}  WHAT", "TIME (UTC)", "QUARANTINE", "STATE");
    for e in &report.entries {
        let state = match (&e.quarantine_id, e.in_quarantine) {
            (None, _) => "-",
            (Some(_), true) => "kept",
            (Some(_), false) if e.quarantined.as_ref().is_some_and(|q| q.dropped.is_some()) => "dropped",
            (Some(_), false) => "restored",
        };
        // Journal text names agent-chosen paths: shown inert.
        let what = lazaret_protocol::display::inert(e.summary.strip_prefix("workspace guard: ").unwrap_or(&e.summary), 400);
        println!(
            "{:<19}  {:<24}  {:<10}  {what}",
            workspace_guard::format_utc(e.time_ms),
            e.quarantine_id.as_deref().map(|i| lazaret_protocol::display::inert(i, 40)).unwrap_or_else(|| "-".into()),
            state
        );
    }
    let kept = report.entries.iter().filter(|e| e.in_quarantine).count();
    if kept > 0 {
        println!(
            "{kept} file(s) kept in {}; `lazaret audit {} --restore ID` puts one back",
            report.quarantine_dir.display(),
            profile.as_deref().unwrap_or("PROFILE")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `lazaret journal`: print, follow or check a Domain's journal.
fn journal(
    config: Option<&std::path::Path>,
    profile: Option<String>,
    dir: Option<PathBuf>,
    follow: bool,
    check: bool,
    file: Option<PathBuf>,
    as_json: bool,
) -> Result<ExitCode> {
    use std::io::{BufRead, Read, Seek, Write};
    if check {
        let checked = match &file {
            Some(f) => {
                let reader = std::io::BufReader::new(std::fs::File::open(f).with_context(|| format!("opening {}", f.display()))?);
                let machine = lazaret_protocol::replay_reader(reader)
                    .map_err(|e| anyhow::anyhow!("{}: does not conform to the protocol model: {e}", f.display()))?;
                let entries =
                    std::io::BufReader::new(std::fs::File::open(f)?).lines().map_while(Result::ok).filter(|l| !l.trim().is_empty()).count();
                let complete = machine.state().domains.iter().all(|d| d.phase == lazaret_protocol::model::DomainPhase::Absent);
                vec![domain_journal::CheckedJournal { path: f.clone(), entries, complete }]
            }
            None => {
                let dir = current_dir(dir)?;
                let root = client::journal_location(config, profile.as_deref(), &dir)?;
                domain_journal::check_all(&root)?
            }
        };
        if checked.is_empty() {
            anyhow::bail!("no journal found: the Domain has never run");
        }
        if as_json {
            json::print(
                &checked
                    .iter()
                    .map(|c| json::JournalCheck { path: c.path.display().to_string(), entries: c.entries, complete: c.complete })
                    .collect::<Vec<_>>(),
            )?;
            return Ok(ExitCode::SUCCESS);
        }
        for c in checked {
            let end = if c.complete { "run complete" } else { "run incomplete (running, or crashed)" };
            println!("{}: {} transitions, conforms to the protocol model; {end}", c.path.display(), c.entries);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let path = match file {
        Some(f) => f,
        None => {
            let dir = current_dir(dir)?;
            client::journal_location(config, profile.as_deref(), &dir)?.join(domain_journal::JOURNAL_FILE)
        }
    };
    if as_json {
        json::print(&json::journal_entries(&path)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut f = std::fs::File::open(&path).with_context(|| format!("opening {} (has the Domain ever run?)", path.display()))?;
    let mut out = std::io::stdout();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        f.read_to_end(&mut buf)?;
        out.write_all(&buf)?;
        out.flush()?;
        if !follow {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        // A new run after a crash moves the file aside: reopen by name.
        let pos = f.stream_position()?;
        if std::fs::metadata(&path).map(|m| m.len() < pos).unwrap_or(false) {
            f = std::fs::File::open(&path)?;
        }
    }
}

/// `SECONDS` since the epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
fn humantime_utc(seconds: u64) -> String {
    lazaret_protocol::utc::Utc::from_unix(seconds).readable()
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::humantime_utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::humantime_utc(1_795_000_000), "2026-11-18 11:06:40");
        assert_eq!(super::humantime_utc(951_782_400), "2000-02-29 00:00:00");
    }
}

#[cfg(test)]
mod doctor_tests {
    use lazaret_coordinator::doctor::Check;

    fn check(ok: bool, detail: &str, fix: Option<&str>, warning: Option<&str>) -> Check {
        Check { name: "kernel".into(), ok, detail: detail.into(), fix: fix.map(Into::into), warning: warning.map(Into::into) }
    }

    #[test]
    fn a_warning_shows_its_reason_and_a_failure_its_fix() {
        assert_eq!(
            super::doctor_line(&check(true, "Linux 6.1.0", None, Some("not tested"))),
            "WARN kernel: Linux 6.1.0\n     why: not tested"
        );
        assert_eq!(
            super::doctor_line(&check(false, "Linux 5.10: too old", Some("upgrade"), None)),
            "FAIL kernel: Linux 5.10: too old\n     fix: upgrade"
        );
        assert_eq!(super::doctor_line(&check(true, "Linux 6.18.1", None, None)), "OK   kernel: Linux 6.18.1");
    }
}
