//! A Domain's start-up as a typed stack, and its teardown as the same stack
//! popped.
//!
//! Each [`Stage`] runs in order: its journal event is recorded first (the
//! protocol model must allow it, else nothing happens), then the effect
//! acts, then what it made is pushed on the [`Stack`], then the test hook's
//! crash point for that stage is passed. Teardown pops the stack: each
//! undo's journal event, then the undo. A start that fails part-way unwinds
//! exactly what was done, in reverse, and reports every undo that failed
//! along with the cause.
//!
//! The effects themselves (runsc, network, mounts, files) sit behind the
//! [`Effects`] trait, so the order and the unwinding are tested without
//! root through a recording double; [`super::host::HostEffects`] is the real
//! one.

use std::fmt;

use lazaret_protocol::journal::Event;

use crate::journal::{DomainJournal, JournalError};
pub use crate::startup::Stage;

use super::StartError;

/// What each stage tells the journal (the stage itself is
/// [`crate::startup::Stage`]).
impl Stage {
    /// The journal event recorded before the stage acts, if it has one.
    fn event(self, launch: &Launch) -> Option<Event> {
        match self {
            Stage::Lock => Some(Event::AcquireDomainLock { session: launch.session.clone(), fingerprint: launch.fingerprint.clone() }),
            Stage::StateAnchor => Some(Event::MountStateAnchor),
            Stage::TrustAnchor => Some(Event::CreateTrustAnchor),
            Stage::Sidecar => Some(Event::StartSidecar),
            Stage::SandboxCreated => Some(Event::StartSandbox),
            Stage::Published => Some(Event::PublishDomain),
            Stage::Recovery | Stage::Image | Stage::RunDir | Stage::Provision | Stage::SandboxStarted => None,
        }
    }

    /// The journal event that takes back what [`Stage::event`] told the
    /// model, if the stage has one to take back.
    fn undo_event(self) -> Option<Event> {
        match self {
            Stage::Lock => Some(Event::ReleaseDomainLock),
            Stage::StateAnchor => Some(Event::UnmountStateAnchor),
            Stage::TrustAnchor => Some(Event::DestroyTrustAnchor),
            Stage::Sidecar => Some(Event::StopSidecar),
            Stage::SandboxCreated => Some(Event::StopSandbox),
            Stage::Recovery | Stage::Image | Stage::RunDir | Stage::Provision | Stage::SandboxStarted | Stage::Published => None,
        }
    }
}

/// Who started the Domain: the launching session and its configuration.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The launcher's Session ID.
    pub session: String,
    /// The Configuration Fingerprint the Domain starts with.
    pub fingerprint: String,
}

/// The side effects of start-up and teardown. Every resource a stage makes
/// is a value the stack owns until its undo consumes it; the types are
/// `Clone` so that later stages can use them too (the real ones are cheap
/// handles).
pub trait Effects {
    /// The image and runsc a Domain runs.
    type Image: Clone;
    /// The run directory.
    type RunDir: Clone;
    /// What the State Anchor stage mounted, and the binds it produced.
    type Filesystem: Clone;
    /// The Trust Anchor.
    type Trust: Clone;
    /// The sidecar network.
    type Network: Clone;
    /// The created sandbox.
    type Sandbox: Clone;
    /// The published socket's listener.
    type Listener;

    /// Passed after each stage has acted (the real one crashes here when
    /// the test hook asks for `stage`).
    fn reached(&mut self, stage: Stage);

    /// [`Stage::Lock`]: nothing to do beyond the journal (the flock is held).
    fn lock(&mut self) -> Result<(), StartError>;
    /// [`Stage::Recovery`].
    fn recover(&mut self) -> Result<(), StartError>;
    /// [`Stage::Image`].
    fn prepare_image(&mut self) -> Result<Self::Image, StartError>;
    /// [`Stage::RunDir`].
    fn create_run_dir(&mut self) -> Result<Self::RunDir, StartError>;
    /// [`Stage::StateAnchor`].
    fn mount_filesystem(&mut self, image: &Self::Image, run: &Self::RunDir) -> Result<Self::Filesystem, StartError>;
    /// [`Stage::TrustAnchor`].
    fn create_trust_anchor(&mut self) -> Result<Self::Trust, StartError>;
    /// [`Stage::Sidecar`].
    fn start_sidecar(&mut self, run: &Self::RunDir) -> Result<Self::Network, StartError>;
    /// [`Stage::Provision`]: runs the profile's setup if due, in a sandbox
    /// of its own that is gone again when this returns (nothing to undo).
    fn provision(&mut self, image: &Self::Image, run: &Self::RunDir, fs: &Self::Filesystem, net: &Self::Network) -> Result<(), StartError>;
    /// [`Stage::SandboxCreated`].
    fn create_sandbox(
        &mut self,
        image: &Self::Image,
        run: &Self::RunDir,
        fs: &Self::Filesystem,
        net: &Self::Network,
    ) -> Result<Self::Sandbox, StartError>;
    /// [`Stage::SandboxStarted`].
    fn start_sandbox(&mut self, sandbox: &Self::Sandbox, net: &Self::Network) -> Result<(), StartError>;
    /// [`Stage::Published`].
    fn publish(&mut self) -> Result<Self::Listener, StartError>;

    /// Undoes [`Stage::Published`]: withdraws the socket.
    fn withdraw(&mut self) -> Result<(), StartError>;
    /// Undoes [`Stage::SandboxCreated`].
    fn delete_sandbox(&mut self, sandbox: Self::Sandbox) -> Result<(), StartError>;
    /// Undoes [`Stage::Sidecar`].
    fn stop_sidecar(&mut self, net: Self::Network) -> Result<(), StartError>;
    /// Undoes [`Stage::TrustAnchor`].
    fn destroy_trust_anchor(&mut self, trust: Self::Trust) -> Result<(), StartError>;
    /// Undoes [`Stage::StateAnchor`].
    fn unmount_filesystem(&mut self, fs: Self::Filesystem) -> Result<(), StartError>;
    /// Undoes [`Stage::RunDir`].
    fn remove_run_dir(&mut self, run: Self::RunDir) -> Result<(), StartError>;
}

/// What a stage left for teardown.
enum Done<E: Effects> {
    Lock,
    RunDir(E::RunDir),
    Filesystem(E::Filesystem),
    Trust(E::Trust),
    Network(E::Network),
    Sandbox(E::Sandbox),
    Published,
}

impl<E: Effects> Done<E> {
    fn stage(&self) -> Stage {
        match self {
            Done::Lock => Stage::Lock,
            Done::RunDir(_) => Stage::RunDir,
            Done::Filesystem(_) => Stage::StateAnchor,
            Done::Trust(_) => Stage::TrustAnchor,
            Done::Network(_) => Stage::Sidecar,
            Done::Sandbox(_) => Stage::SandboxCreated,
            Done::Published => Stage::Published,
        }
    }

    fn undo(self, fx: &mut E) -> Result<(), StartError> {
        match self {
            Done::Lock => Ok(()),
            Done::RunDir(r) => fx.remove_run_dir(r),
            Done::Filesystem(f) => fx.unmount_filesystem(f),
            Done::Trust(t) => fx.destroy_trust_anchor(t),
            Done::Network(n) => fx.stop_sidecar(n),
            Done::Sandbox(s) => fx.delete_sandbox(s),
            Done::Published => fx.withdraw(),
        }
    }
}

/// An undo (or its journal entry) that failed during teardown.
#[derive(Debug)]
pub struct UndoFailure {
    /// The stage being undone.
    pub stage: Stage,
    /// What went wrong.
    pub error: StartError,
}

impl fmt::Display for UndoFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "undoing {}: {}", self.stage, self.error)
    }
}

/// What start-up has done, newest last.
pub struct Stack<E: Effects> {
    done: Vec<Done<E>>,
}

impl<E: Effects> Stack<E> {
    fn new() -> Stack<E> {
        Stack { done: Vec::new() }
    }

    /// The stages done, in start-up order.
    pub fn stages(&self) -> Vec<Stage> {
        self.done.iter().map(Done::stage).collect()
    }

    /// Undoes everything, newest first: each undo's journal event, then the
    /// undo itself. An event the model refuses (or that cannot be written)
    /// is reported and the undo still done: leaving resources behind would
    /// be worse. Returns every failure.
    pub fn unwind(mut self, fx: &mut E, journal: &mut DomainJournal) -> Vec<UndoFailure> {
        let mut failures = Vec::new();
        while let Some(done) = self.done.pop() {
            let stage = done.stage();
            if let Some(event) = stage.undo_event() {
                if let Err(e) = journal.record(event) {
                    failures.push(UndoFailure { stage, error: e.into() });
                }
            }
            if let Err(error) = done.undo(fx) {
                failures.push(UndoFailure { stage, error });
            }
        }
        failures
    }
}

/// A started Domain: every resource exists, and the stack that undoes them.
pub struct Started<E: Effects> {
    /// Undoes everything below, in reverse (drop the handles below first).
    pub stack: Stack<E>,
    /// The image and runsc.
    pub image: E::Image,
    /// The run directory.
    pub run_dir: E::RunDir,
    /// The Trust Anchor.
    pub trust: E::Trust,
    /// The sidecar network.
    pub network: E::Network,
    /// The running sandbox.
    pub sandbox: E::Sandbox,
    /// The published socket.
    pub listener: E::Listener,
}

/// A start-up that failed, after unwinding what it had done.
#[derive(Debug)]
pub struct FailedStart {
    /// The stage that failed.
    pub stage: Stage,
    /// Why.
    pub cause: Box<StartError>,
    /// Undos that failed too.
    pub undo_failures: Vec<UndoFailure>,
}

impl fmt::Display for FailedStart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.cause)?;
        for u in &self.undo_failures {
            write!(f, "\n  and then, cleaning up: {u}")?;
        }
        Ok(())
    }
}

/// Runs every stage in order. On failure, records `FailDomain`, unwinds
/// what was done and returns the cause with any undo failures.
pub fn start_up<E: Effects>(fx: &mut E, journal: &mut DomainJournal, launch: &Launch) -> Result<Started<E>, FailedStart> {
    let mut stack = Stack::new();
    let mut at = (Stage::Lock, false);
    match run_stages(fx, journal, launch, &mut stack, &mut at) {
        Ok(started) => Ok(started),
        Err(cause) => {
            let (at, recorded) = at;
            let mut undo_failures = Vec::new();
            if let Err(e) = journal.record(Event::FailDomain { reason: cause.to_string() }) {
                undo_failures.push(UndoFailure { stage: at, error: e.into() });
            }
            // The failed stage's event told the model its resource exists;
            // the act cleaned up after itself, so only the model is told.
            if let Some(event) = stage_undo_if(recorded, at) {
                if let Err(e) = journal.record(event) {
                    undo_failures.push(UndoFailure { stage: at, error: e.into() });
                }
            }
            undo_failures.extend(stack.unwind(fx, journal));
            Err(FailedStart { stage: at, cause: Box::new(cause), undo_failures })
        }
    }
}

fn stage_undo_if(recorded: bool, stage: Stage) -> Option<Event> {
    if recorded { stage.undo_event() } else { None }
}

/// Runs the stages; `at` follows the current stage and whether its journal
/// event was recorded.
fn run_stages<E: Effects>(
    fx: &mut E,
    journal: &mut DomainJournal,
    launch: &Launch,
    stack: &mut Stack<E>,
    at: &mut (Stage, bool),
) -> Result<Started<E>, StartError> {
    let mut begin = |stage: Stage, journal: &mut DomainJournal| -> Result<(), JournalError> {
        *at = (stage, false);
        if let Some(event) = stage.event(launch) {
            journal.record(event)?;
            at.1 = true;
        }
        Ok(())
    };
    begin(Stage::Lock, journal)?;
    fx.lock()?;
    stack.done.push(Done::Lock);
    fx.reached(Stage::Lock);

    begin(Stage::Recovery, journal)?;
    fx.recover()?;
    fx.reached(Stage::Recovery);

    begin(Stage::Image, journal)?;
    let image = fx.prepare_image()?;
    fx.reached(Stage::Image);

    begin(Stage::RunDir, journal)?;
    let run_dir = fx.create_run_dir()?;
    stack.done.push(Done::RunDir(run_dir.clone()));
    fx.reached(Stage::RunDir);

    begin(Stage::StateAnchor, journal)?;
    let fs = fx.mount_filesystem(&image, &run_dir)?;
    stack.done.push(Done::Filesystem(fs.clone()));
    fx.reached(Stage::StateAnchor);

    begin(Stage::TrustAnchor, journal)?;
    let trust = fx.create_trust_anchor()?;
    stack.done.push(Done::Trust(trust.clone()));
    fx.reached(Stage::TrustAnchor);

    // The sidecar's policy is installed and verified before the sandbox
    // exists (OrderedNetworkStartup).
    begin(Stage::Sidecar, journal)?;
    let network = fx.start_sidecar(&run_dir)?;
    stack.done.push(Done::Network(network.clone()));
    fx.reached(Stage::Sidecar);

    // Before the agent's sandbox exists, so no session can start before
    // the setup ended.
    begin(Stage::Provision, journal)?;
    fx.provision(&image, &run_dir, &fs, &network)?;
    fx.reached(Stage::Provision);

    begin(Stage::SandboxCreated, journal)?;
    let sandbox = fx.create_sandbox(&image, &run_dir, &fs, &network)?;
    stack.done.push(Done::Sandbox(sandbox.clone()));
    fx.reached(Stage::SandboxCreated);

    begin(Stage::SandboxStarted, journal)?;
    fx.start_sandbox(&sandbox, &network)?;
    fx.reached(Stage::SandboxStarted);

    begin(Stage::Published, journal)?;
    let listener = fx.publish()?;
    stack.done.push(Done::Published);
    fx.reached(Stage::Published);

    drop(fs);
    Ok(Started { stack: std::mem::replace(stack, Stack::new()), image, run_dir, trust, network, sandbox, listener })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Records every effect; fails the act of `fail_at` and the undo of
    /// every stage in `fail_undo`.
    #[derive(Default)]
    struct Recorder {
        log: Vec<String>,
        fail_at: Option<Stage>,
        fail_undo: BTreeSet<Stage>,
    }

    impl Recorder {
        fn act(&mut self, stage: Stage) -> Result<(), StartError> {
            self.log.push(format!("do {stage}"));
            if self.fail_at == Some(stage) {
                return Err(StartError::Io { context: format!("injected failure at {stage}"), source: std::io::Error::other("boom") });
            }
            Ok(())
        }

        fn undo(&mut self, stage: Stage) -> Result<(), StartError> {
            self.log.push(format!("undo {stage}"));
            if self.fail_undo.contains(&stage) {
                return Err(StartError::Io { context: format!("injected undo failure at {stage}"), source: std::io::Error::other("bang") });
            }
            Ok(())
        }
    }

    impl Effects for Recorder {
        type Image = ();
        type RunDir = ();
        type Filesystem = ();
        type Trust = ();
        type Network = ();
        type Sandbox = ();
        type Listener = ();

        fn reached(&mut self, stage: Stage) {
            self.log.push(format!("reached {stage}"));
        }
        fn lock(&mut self) -> Result<(), StartError> {
            self.act(Stage::Lock)
        }
        fn recover(&mut self) -> Result<(), StartError> {
            self.act(Stage::Recovery)
        }
        fn prepare_image(&mut self) -> Result<(), StartError> {
            self.act(Stage::Image)
        }
        fn create_run_dir(&mut self) -> Result<(), StartError> {
            self.act(Stage::RunDir)
        }
        fn mount_filesystem(&mut self, _: &(), _: &()) -> Result<(), StartError> {
            self.act(Stage::StateAnchor)
        }
        fn create_trust_anchor(&mut self) -> Result<(), StartError> {
            self.act(Stage::TrustAnchor)
        }
        fn start_sidecar(&mut self, _: &()) -> Result<(), StartError> {
            self.act(Stage::Sidecar)
        }
        fn provision(&mut self, _: &(), _: &(), _: &(), _: &()) -> Result<(), StartError> {
            self.act(Stage::Provision)
        }
        fn create_sandbox(&mut self, _: &(), _: &(), _: &(), _: &()) -> Result<(), StartError> {
            self.act(Stage::SandboxCreated)
        }
        fn start_sandbox(&mut self, _: &(), _: &()) -> Result<(), StartError> {
            self.act(Stage::SandboxStarted)
        }
        fn publish(&mut self) -> Result<(), StartError> {
            self.act(Stage::Published)
        }
        fn withdraw(&mut self) -> Result<(), StartError> {
            self.undo(Stage::Published)
        }
        fn delete_sandbox(&mut self, _: ()) -> Result<(), StartError> {
            self.undo(Stage::SandboxCreated)
        }
        fn stop_sidecar(&mut self, _: ()) -> Result<(), StartError> {
            self.undo(Stage::Sidecar)
        }
        fn destroy_trust_anchor(&mut self, _: ()) -> Result<(), StartError> {
            self.undo(Stage::TrustAnchor)
        }
        fn unmount_filesystem(&mut self, _: ()) -> Result<(), StartError> {
            self.undo(Stage::StateAnchor)
        }
        fn remove_run_dir(&mut self, _: ()) -> Result<(), StartError> {
            self.undo(Stage::RunDir)
        }
    }

    /// Stages whose effect leaves something to undo.
    fn has_undo(stage: Stage) -> bool {
        !matches!(stage, Stage::Recovery | Stage::Image | Stage::Provision | Stage::SandboxStarted)
    }

    fn launch() -> Launch {
        Launch { session: "s-launcher".into(), fingerprint: "fp".into() }
    }

    fn journal(dir: &tempfile::TempDir) -> DomainJournal {
        DomainJournal::open_for_run(dir.path(), "d1").expect("journal").0
    }

    /// The undo log expected after the stages before `failed` succeeded.
    fn expected_unwind(failed: Stage) -> Vec<String> {
        let done: Vec<Stage> =
            Stage::ALL.iter().copied().take_while(|s| *s != failed).filter(|s| has_undo(*s) && *s != Stage::Lock).collect();
        done.iter().rev().map(|s| format!("undo {s}")).collect()
    }

    #[test]
    fn a_full_start_runs_every_stage_in_order_and_teardown_reverses_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut j = journal(&dir);
        let mut fx = Recorder::default();
        let started = start_up(&mut fx, &mut j, &launch()).map_err(|e| e.to_string()).expect("starts");
        let expected: Vec<String> = Stage::ALL.iter().flat_map(|s| [format!("do {s}"), format!("reached {s}")]).collect();
        assert_eq!(fx.log, expected);
        assert_eq!(started.stack.stages(), Stage::ALL.iter().copied().filter(|s| has_undo(*s)).collect::<Vec<_>>());

        fx.log.clear();
        j.record(Event::BeginTeardown).expect("begin teardown");
        let failures = started.stack.unwind(&mut fx, &mut j);
        assert!(failures.is_empty(), "{failures:?}");
        let teardown: Vec<String> = ["published", "sandbox-created", "sidecar", "trust-anchor", "state-anchor", "run-dir"]
            .iter()
            .map(|s| format!("undo {s}"))
            .collect();
        assert_eq!(fx.log, teardown);
        let checked = crate::journal::check_all(dir.path()).expect("the journal replays");
        assert!(checked.iter().all(|c| c.complete), "{checked:?}");
    }

    #[test]
    fn a_failure_at_each_stage_unwinds_exactly_the_stages_before_it_in_reverse() {
        for failed in Stage::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut j = journal(&dir);
            let mut fx = Recorder { fail_at: Some(failed), ..Recorder::default() };
            let err = match start_up(&mut fx, &mut j, &launch()) {
                Ok(_) => panic!("stage {failed}: the injected failure was not reported"),
                Err(e) => e,
            };
            assert_eq!(err.stage, failed);
            assert!(err.undo_failures.is_empty(), "stage {failed}: {:?}", err.undo_failures);
            assert!(err.to_string().contains(&format!("injected failure at {failed}")), "{err}");
            let before: Vec<Stage> = Stage::ALL.iter().copied().take_while(|s| *s != failed).collect();
            let mut expected: Vec<String> = before.iter().flat_map(|s| [format!("do {s}"), format!("reached {s}")]).collect();
            expected.push(format!("do {failed}"));
            expected.extend(expected_unwind(failed));
            assert_eq!(fx.log, expected, "stage {failed}");
            // Whatever failed, the journal still replays against the model
            // and ends with the Domain absent again.
            let checked = crate::journal::check_all(dir.path()).unwrap_or_else(|e| panic!("stage {failed}: {e}"));
            assert!(checked.iter().all(|c| c.complete), "stage {failed}: {checked:?}");
        }
    }

    #[test]
    fn a_failing_undo_is_reported_with_the_cause_and_the_rest_still_unwinds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut j = journal(&dir);
        let mut fx = Recorder {
            fail_at: Some(Stage::SandboxCreated),
            fail_undo: [Stage::Sidecar, Stage::StateAnchor].into(),
            ..Recorder::default()
        };
        let err = match start_up(&mut fx, &mut j, &launch()) {
            Ok(_) => panic!("must fail"),
            Err(e) => e,
        };
        let failed: Vec<Stage> = err.undo_failures.iter().map(|u| u.stage).collect();
        assert_eq!(failed, [Stage::Sidecar, Stage::StateAnchor]);
        let text = err.to_string();
        assert!(text.contains("injected failure at sandbox-created"), "{text}");
        assert!(text.contains("undoing sidecar: injected undo failure at sidecar"), "{text}");
        assert!(text.contains("undoing state-anchor: injected undo failure at state-anchor"), "{text}");
        assert_eq!(fx.log.iter().filter(|l| l.starts_with("undo")).count(), 4, "{:?}", fx.log);
    }

    #[test]
    fn a_step_the_model_refuses_is_not_done() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut j = journal(&dir);
        // The Domain is already owned in the model: a second AcquireDomainLock
        // must be refused before any effect runs.
        j.record(Event::AcquireDomainLock { session: "other".into(), fingerprint: "fp".into() }).expect("first lock");
        let mut fx = Recorder::default();
        let err = match start_up(&mut fx, &mut j, &launch()) {
            Ok(_) => panic!("must be refused"),
            Err(e) => e,
        };
        assert_eq!(err.stage, Stage::Lock);
        assert!(matches!(*err.cause, StartError::Journal(JournalError::Refused(_))), "{err}");
        assert!(fx.log.is_empty(), "{:?}", fx.log);
    }

    #[test]
    fn stage_names_round_trip_and_are_unique() {
        let names: BTreeSet<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), Stage::ALL.len());
        for s in Stage::ALL {
            assert_eq!(Stage::from_name(s.name()), Some(s));
        }
        assert_eq!(Stage::from_name("teardown"), None);
        let mut sorted = Stage::ALL;
        sorted.sort();
        assert_eq!(sorted, Stage::ALL, "ALL is in declaration (start-up) order");
    }
}
