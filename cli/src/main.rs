//! The `lazaret` command: parses arguments, calls the coordinator, and turns
//! errors into one clear message and a non-zero exit.
//!
//! Exit status: `lazaret run` exits with the agent's status (128 + N for
//! death by signal N); Lazaret's own failures exit with 125, so they cannot
//! be mistaken for the agent's.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use lazaret_coordinator::context::{load_config, require_root, Context};
use lazaret_coordinator::identity::Developer;
use lazaret_coordinator::{doctor, launch};

/// Exit status for Lazaret's own failures (as docker and podman do).
const LAZARET_FAILED: u8 = 125;

#[derive(Parser)]
#[command(name = "lazaret", version, about = "Run AI coding agents in a gVisor sandbox, from a git checkout.")]
struct Cli {
    /// Configuration file (default: $LAZARET_CONFIG, else ~/.config/lazaret/config.toml of the developer).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
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
        /// Command to run instead of the profile's.
        #[arg(last = true)]
        args: Vec<String>,
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
    /// Check this machine's prerequisites.
    Doctor,
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Validate the configuration and print each profile's fingerprint.
    Check,
    /// Print the validated configuration with defaults filled in.
    Show {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ImageAction {
    /// Import a rootfs directory or tarball (.tar, .tar.gz, .tar.zst), an OCI layout or an oci-archive as NAME.
    Import {
        /// The name profiles use in `image = "..."`.
        name: String,
        /// The source.
        source: PathBuf,
    },
    /// List imported images.
    Ls,
    /// Remove an image.
    Rm {
        /// The image name.
        name: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { profile, dir, args } => run(cli.config, profile, dir, args),
        other => match dispatch(cli.config, other) {
            Ok(code) => code,
            Err(e) => report(e),
        },
    }
}

fn report(e: anyhow::Error) -> ExitCode {
    eprintln!("lazaret: error: {e:#}");
    ExitCode::from(LAZARET_FAILED)
}

fn run(config: Option<PathBuf>, profile: Option<String>, dir: Option<PathBuf>, args: Vec<String>) -> ExitCode {
    let dir = match dir.map(Ok).unwrap_or_else(std::env::current_dir) {
        Ok(d) => d,
        Err(e) => return report(anyhow::Error::new(e).context("reading the current directory")),
    };
    let req = launch::RunRequest { config, profile, dir, args };
    match launch::run_isolated(&req) {
        Ok(status) => ExitCode::from(u8::try_from(status.0 & 0xff).unwrap_or(LAZARET_FAILED)),
        Err(e) => report(e.into()),
    }
}

fn dispatch(config: Option<PathBuf>, command: Command) -> Result<ExitCode> {
    match command {
        Command::Run { .. } => unreachable!("handled in main"),
        Command::Doctor => {
            let checks = doctor::run_checks(config.as_deref());
            for c in &checks {
                println!("{c}");
            }
            Ok(if checks.iter().all(|c| c.ok) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Config { action } => {
            let developer = Developer::from_process()?;
            let cfg = load_config(config.as_deref(), &developer)?;
            match action {
                ConfigAction::Check => {
                    println!("{}: OK", cfg.file.display());
                    for name in cfg.profiles.keys() {
                        println!("  profile {name}: fingerprint {}", cfg.fingerprint(name)?);
                    }
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
            require_root()?;
            let developer = Developer::from_process()?;
            let cfg = load_config(config.as_deref(), &developer)?;
            let store = Context::image_store(&cfg)?;
            match action {
                ImageAction::Import { name, source } => {
                    let rec = store.import(&name, &source).with_context(|| format!("importing {} as {name}", source.display()))?;
                    println!("imported {} {} ({} bytes)", rec.name, rec.digest, rec.size);
                }
                ImageAction::Ls => {
                    println!("{:<24} {:<20} {:>12}  CREATED", "NAME", "DIGEST", "SIZE");
                    for rec in store.list()? {
                        let short = rec.digest.trim_start_matches("sha256:").chars().take(12).collect::<String>();
                        println!("{:<24} sha256:{:<13} {:>12}  {}", rec.name, short, rec.size, rec.created);
                    }
                }
                ImageAction::Rm { name } => {
                    store.remove(&name)?;
                    println!("removed {name}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
