//! Sticky isolation at the planning level (no mounts, no root needed): a
//! path isolated once stays in the plan whatever happens to the ignore
//! rules, until the record is reset.

use std::path::{Path, PathBuf};
use std::process::Command;

use lazaret_mounts::ignore_eval::HostGitSettings;
use lazaret_mounts::ignored_state::{IsolationRecord, RecordReset, reset_isolation};
use lazaret_mounts::plan::{WorkspaceOptions, WorkspacePlan, plan_workspace};
use lazaret_mounts::repo::GitDirPath;

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = Fixture { dir };
        for d in ["home", "ws", "domain"] {
            std::fs::create_dir_all(f.path(d)).expect("mkdir");
        }
        f.git(&f.ws(), &["init", "-q"]);
        std::fs::write(f.ws().join(".gitignore"), ".env\n").expect(".gitignore");
        std::fs::create_dir_all(f.ws().join("app")).expect("app");
        std::fs::write(f.ws().join("app/.env"), "host secret").expect("app/.env");
        std::fs::write(f.ws().join(".env"), "host secret").expect(".env");
        f
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn ws(&self) -> PathBuf {
        self.path("ws")
    }
    fn git(&self, cwd: &Path, args: &[&str]) {
        let status = Command::new("git")
            .current_dir(cwd)
            .env("HOME", self.path("home"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .args(args)
            .status()
            .expect("git");
        assert!(status.success(), "git {args:?}");
    }
    fn plan(&self) -> WorkspacePlan {
        let opts = WorkspaceOptions {
            isolate_gitignored: true,
            host_git: HostGitSettings { home: Some(self.path("home")), xdg_config_home: None, system_config: None },
            sandbox_workspace: PathBuf::from("/workspace"),
            gate_repository_configs: false,
        };
        plan_workspace(&self.ws(), &self.path("domain"), &opts).expect("plan")
    }
}

fn isolated(plan: &WorkspacePlan) -> Vec<String> {
    plan.ignored.iter().map(|m| m.workspace_rel.display().to_string()).collect()
}

#[test]
fn every_way_of_un_ignoring_leaves_the_path_isolated_until_reset() {
    type Untie = fn(&Fixture);
    let routes: [(&str, Untie); 4] = [
        ("the pattern removed", |f| std::fs::write(f.ws().join(".gitignore"), "").expect("write")),
        ("a negation added", |f| std::fs::write(f.ws().join(".gitignore"), ".env\n!.env\n").expect("write")),
        ("a nested .gitignore negating it", |f| std::fs::write(f.ws().join("app/.gitignore"), "!.env\n").expect("write")),
        ("a nested repository above it", |f| f.git(&f.ws().join("app"), &["init", "-q"])),
    ];
    for (route, untie) in routes {
        let f = Fixture::new();
        let first = f.plan();
        assert_eq!(isolated(&first), [".env", "app/.env"], "{route}");
        assert!(first.sentry.pinned.contains(&GitDirPath::Inside(PathBuf::from("app"))), "{route}: the parent of app/.env is not pinned");
        assert!(first.sticky.isolated.is_empty(), "{route}");
        assert_eq!(first.sticky.newly_recorded, 2, "{route}");
        untie(&f);
        let second = f.plan();
        assert!(isolated(&second).contains(&"app/.env".to_string()), "{route}: app/.env exposed: {:?}", isolated(&second));
        assert!(second.sticky.isolated.contains(&PathBuf::from("app/.env")), "{route}: {:?}", second.sticky);
        assert!(second.sentry.pinned.contains(&GitDirPath::Inside(PathBuf::from("app"))), "{route}: the parent of app/.env is not pinned");
        assert_eq!(second.sticky.newly_recorded, 0, "{route}");
        // The record survives planning again, then the reset drops it.
        assert_eq!(isolated(&f.plan()), isolated(&second), "{route}");
        assert_eq!(reset_isolation(&f.path("domain")).expect("reset"), RecordReset::Forgotten(2), "{route}");
        let third = f.plan();
        assert!(!isolated(&third).contains(&"app/.env".to_string()), "{route}: the reset did not apply: {:?}", isolated(&third));
    }
}

#[test]
fn a_deleted_then_recreated_path_is_isolated_again() {
    let f = Fixture::new();
    f.plan();
    std::fs::write(f.ws().join(".gitignore"), "").expect("un-ignore");
    std::fs::remove_file(f.ws().join(".env")).expect("rm");
    let absent = f.plan();
    assert_eq!(absent.sticky.absent, [PathBuf::from(".env")]);
    assert!(!f.ws().join(".env").exists(), "a missing recorded file is not recreated");
    std::fs::write(f.ws().join(".env"), "new secret").expect("recreate");
    assert!(isolated(&f.plan()).contains(&".env".to_string()));
}

#[test]
fn a_newly_ignored_path_is_isolated_and_recorded_at_the_next_plan() {
    let f = Fixture::new();
    f.plan();
    std::fs::create_dir_all(f.ws().join("cache")).expect("cache");
    assert!(!isolated(&f.plan()).contains(&"cache".to_string()));
    std::fs::write(f.ws().join(".gitignore"), ".env\ncache/\n").expect("ignore");
    let plan = f.plan();
    assert!(isolated(&plan).contains(&"cache".to_string()));
    assert_eq!(plan.sticky.newly_recorded, 1);
    let record = IsolationRecord::load(&f.path("domain")).expect("load");
    assert!(record.paths().any(|(p, _)| p == Path::new("cache")));
}

#[test]
fn a_damaged_record_stops_planning() {
    let f = Fixture::new();
    std::fs::write(IsolationRecord::file(&f.path("domain")), "not json").expect("damage");
    let opts = WorkspaceOptions {
        isolate_gitignored: true,
        host_git: HostGitSettings { home: Some(f.path("home")), xdg_config_home: None, system_config: None },
        sandbox_workspace: PathBuf::from("/workspace"),
        gate_repository_configs: false,
    };
    let error = plan_workspace(&f.ws(), &f.path("domain"), &opts).expect_err("must refuse").to_string();
    assert!(error.contains("isolated-paths.json") && error.contains("reset-isolation"), "{error}");
}
