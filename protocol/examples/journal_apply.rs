//! The cost of one [`Machine::apply`] as a Domain's history grows (issue
//! 17's soak): one long-lived Domain whose holder session stays attached
//! while sessions come and go, each making 20 rule-approved escalation
//! requests (5 journal entries each) and disconnecting, as
//! `scripts/soak.sh` does. At each history size (requests applied so far)
//! it times a further batch of 50 requests and prints the mean cost per
//! entry. Nothing is asserted.
//!
//! `cargo run -p lazaret-protocol --release --example journal_apply -- [SIZES…]`
//! (default `1000 10000 50000`).

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

use lazaret_protocol::journal::{Event, JournalEntry, Machine, TransitionError};

const DOMAIN: &str = "bench-domain";
const REQUESTS_PER_SESSION: usize = 20;
const TIMED_REQUESTS: usize = 50;

/// Drives one Domain's machine, numbering sessions and requests.
struct Workload {
    machine: Machine,
    next_session: usize,
    next_request: usize,
    /// The current session and how many requests it has made.
    current: Option<(String, usize)>,
    entries: usize,
}

impl Workload {
    fn start() -> Result<Workload, TransitionError> {
        let mut w = Workload { machine: Machine::new(), next_session: 0, next_request: 0, current: None, entries: 0 };
        w.apply(Event::AcquireDomainLock { session: "holder".into(), fingerprint: "fp".into() })?;
        for e in [Event::MountStateAnchor, Event::CreateTrustAnchor, Event::StartSidecar, Event::StartSandbox, Event::PublishDomain] {
            w.apply(e)?;
        }
        w.attach("holder")?;
        Ok(w)
    }

    fn apply(&mut self, event: Event) -> Result<(), TransitionError> {
        self.machine.apply(&JournalEntry::now(DOMAIN, event))?;
        self.entries += 1;
        Ok(())
    }

    fn attach(&mut self, session: &str) -> Result<(), TransitionError> {
        self.apply(Event::ConnectSession { session: session.into() })?;
        self.apply(Event::RegisterSession { session: session.into(), fingerprint: "fp".into() })
    }

    /// One rule-approved request of the current session (a new session
    /// first, and the old one disconnected, every 20 requests).
    fn request(&mut self) -> Result<(), TransitionError> {
        let session = match self.current.take() {
            Some((s, made)) if made < REQUESTS_PER_SESSION => {
                self.current = Some((s.clone(), made + 1));
                s
            }
            ended => {
                if let Some((s, _)) = ended {
                    self.apply(Event::DisconnectSession { session: s })?;
                }
                let s = format!("sess-{}", self.next_session);
                self.next_session += 1;
                self.attach(&s)?;
                self.current = Some((s.clone(), 1));
                s
            }
        };
        let request = format!("req-{}", self.next_request);
        self.next_request += 1;
        let argv = vec!["true".to_owned()];
        self.apply(Event::verify_request(&session, &request, &argv, "/ws", "", true))?;
        self.apply(Event::AutoApprove { request: request.clone(), rule: "true".into() })?;
        self.apply(Event::StartHostExecution { request: request.clone() })?;
        self.apply(Event::CompleteHostExecution { request: request.clone(), exit_status: Some(0) })?;
        self.apply(Event::DeliverResult { request })
    }
}

fn main() -> ExitCode {
    let sizes: Result<Vec<usize>, _> = std::env::args().skip(1).map(|a| a.parse::<usize>()).collect();
    let mut sizes = match sizes {
        Ok(s) if s.is_empty() => vec![1_000, 10_000, 50_000],
        Ok(s) => s,
        Err(e) => {
            eprintln!("journal_apply: sizes are request counts: {e}");
            return ExitCode::from(2);
        }
    };
    sizes.sort_unstable();
    match run(&sizes) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("journal_apply: the model refused the workload: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(sizes: &[usize]) -> Result<(), TransitionError> {
    let mut w = Workload::start()?;
    let began = Instant::now();
    println!("{:>10}  {:>10}  {:>14}  {:>12}", "HISTORY", "ENTRIES", "US PER APPLY", "BUILT IN S");
    for &size in sizes {
        while w.next_request < size {
            w.request()?;
        }
        let entries_before = w.entries;
        let t = Instant::now();
        for _ in 0..TIMED_REQUESTS {
            w.request()?;
        }
        let per_entry: Duration = t.elapsed() / u32::try_from(w.entries - entries_before).unwrap_or(u32::MAX);
        println!("{:>10}  {:>10}  {:>14.1}  {:>12.1}", size, w.entries, per_entry.as_secs_f64() * 1e6, began.elapsed().as_secs_f64());
    }
    Ok(())
}
