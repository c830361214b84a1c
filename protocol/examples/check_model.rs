//! Explores a configuration of the protocol model and prints the state count
//! and time: `cargo run -p lazaret-protocol --release --example check_model -- larger`.
//! Configurations: `user` (default), `two-domains`, `larger`.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use lazaret_protocol::checker::{CheckOptions, Violation, check};
use lazaret_protocol::model::Config;

fn main() -> ExitCode {
    let name = std::env::args().nth(1).unwrap_or_else(|| "user".to_owned());
    let config = match name.as_str() {
        "user" => Config::user_fixture(),
        "two-domains" => Config::two_domain_fixture(),
        "larger" => Config::larger_fixture(),
        other => {
            eprintln!("check_model: unknown configuration {other:?} (user, two-domains, larger)");
            return ExitCode::from(2);
        }
    };
    let report = check(&config, CheckOptions::default());
    println!(
        "{name}: {} states, {} transitions, depth {}, {} liveness instances, {:.2} s",
        report.states,
        report.transitions,
        report.depth,
        report.liveness_checked,
        report.elapsed.as_secs_f64()
    );
    match report.violation {
        None => {
            println!("no invariant or liveness violation");
            ExitCode::SUCCESS
        }
        Some(Violation::Invariant { invariant, trace }) => {
            println!("{invariant:?} violated:\n{}", trace.describe(&config));
            ExitCode::FAILURE
        }
        Some(Violation::Liveness { property, prefix, cycle }) => {
            println!("{} violated:\n{}", property.describe(&config), prefix.describe(&config));
            println!("then forever: {} step(s) of a fair cycle", cycle.len());
            ExitCode::FAILURE
        }
    }
}
