//! Bundle generation: golden files and input validation.
//!
//! Golden files live in `tests/golden/*.json`. After an intended change to the
//! generated spec, regenerate them with
//! `LAZARET_BLESS=1 cargo test -p lazaret-oci --test bundle` and review the diff.

use std::path::{Path, PathBuf};

use lazaret_oci::bundle::{
    BindMount, BundleError, BundleSpec, CapabilityPolicy, Rlimit, build_process, build_spec, render_process, render_spec, write_bundle,
};
use oci_spec::runtime::{Capability, LinuxNamespaceType, PosixRlimitType};

/// A non-root agent in a new, empty network namespace.
fn agent_spec() -> BundleSpec {
    BundleSpec {
        args: vec!["claude".into(), "--dangerously-skip-permissions".into()],
        env: vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("HOME".into(), "/home/dev".into()),
            ("TERM".into(), "xterm-256color".into()),
        ],
        cwd: PathBuf::from("/home/dev/src/project"),
        uid: 1000,
        gid: 1000,
        additional_gids: vec![],
        hostname: "lazaret-claude".into(),
        terminal: true,
        rootfs: PathBuf::from("/var/lib/lazaret/domains/d1/rootfs"),
        mounts: vec![BindMount {
            source: PathBuf::from("/home/dev/src/project"),
            destination: PathBuf::from("/home/dev/src/project"),
            readonly: false,
        }],
        network_namespace: None,
        cgroups_path: "/lazaret/d1/agent".into(),
        capabilities: CapabilityPolicy::None,
        rlimits: vec![],
        memory_limit: None,
        pids_limit: None,
    }
}

/// Root inside, joined to the sidecar's namespace, with limits and volumes.
fn root_spec() -> BundleSpec {
    BundleSpec {
        args: vec!["/bin/bash".into(), "-l".into()],
        env: vec![("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into())],
        cwd: PathBuf::from("/work/repo"),
        uid: 0,
        gid: 0,
        additional_gids: vec![27, 100],
        hostname: "sandbox.d2".into(),
        terminal: false,
        rootfs: PathBuf::from("/run/lazaret/d2/merged"),
        mounts: vec![
            BindMount { source: PathBuf::from("/work/repo"), destination: PathBuf::from("/work/repo"), readonly: false },
            BindMount {
                source: PathBuf::from("/work/repo/.git/hooks"),
                destination: PathBuf::from("/work/repo/.git/hooks"),
                readonly: true,
            },
            BindMount {
                source: PathBuf::from("/var/lib/lazaret/d2/volumes/cache"),
                destination: PathBuf::from("/root/.cache"),
                readonly: false,
            },
        ],
        network_namespace: Some(PathBuf::from("/run/lazaret/netns/d2-sidecar")),
        cgroups_path: "/lazaret/d2/sandbox-1".into(),
        capabilities: CapabilityPolicy::DefaultRoot,
        rlimits: vec![
            Rlimit { resource: PosixRlimitType::RlimitNofile, soft: 4096, hard: 8192 },
            Rlimit { resource: PosixRlimitType::RlimitCore, soft: 0, hard: 0 },
        ],
        memory_limit: Some(4 << 30),
        pids_limit: Some(4096),
    }
}

/// An explicit capability list for a non-root user.
fn explicit_caps_spec() -> BundleSpec {
    BundleSpec {
        capabilities: CapabilityPolicy::Explicit(vec![Capability::NetBindService, Capability::Kill]),
        uid: 1500,
        gid: 1500,
        additional_gids: vec![1500],
        network_namespace: Some(PathBuf::from("/run/lazaret/netns/explicit-test")),
        ..agent_spec()
    }
}

fn golden(name: &str, spec: &BundleSpec) {
    let rendered = render_spec(&build_spec(spec).expect("valid spec")).expect("render");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(format!("{name}.json"));
    if std::env::var_os("LAZARET_BLESS").is_some() {
        std::fs::write(&path, &rendered).expect("bless golden file");
        return;
    }
    let expected =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (run with LAZARET_BLESS=1 to create it)", path.display()));
    assert_eq!(rendered, expected, "{name}: generated spec differs from {}", path.display());
}

#[test]
fn golden_agent() {
    golden("agent", &agent_spec());
}

#[test]
fn golden_root_with_sidecar_netns() {
    golden("root-sidecar", &root_spec());
}

#[test]
fn golden_explicit_capabilities() {
    golden("explicit-caps", &explicit_caps_spec());
}

#[test]
fn security_fields_are_explicit_whatever_the_input() {
    for spec in [agent_spec(), root_spec(), explicit_caps_spec()] {
        let built = build_spec(&spec).expect("valid");
        assert_ne!(built.hostname().as_deref(), Some("youki"));
        let process = built.process().as_ref().expect("process");
        assert_eq!(process.no_new_privileges(), Some(true));
        assert_eq!(process.args().as_deref(), Some(spec.args.as_slice()));
        let caps = process.capabilities().as_ref().expect("capabilities");
        for set in [caps.bounding(), caps.effective(), caps.permitted(), caps.inheritable(), caps.ambient()] {
            let set = set.as_ref().expect("every capability set is explicit");
            assert!(!set.contains(&Capability::NetAdmin) && !set.contains(&Capability::SysAdmin));
        }
        assert!(caps.inheritable().as_ref().is_some_and(|s| s.is_empty()));
        assert!(caps.ambient().as_ref().is_some_and(|s| s.is_empty()));
        let root = built.root().as_ref().expect("root");
        assert_eq!(root.readonly(), Some(false));
        let linux = built.linux().as_ref().expect("linux");
        let kinds: Vec<LinuxNamespaceType> = linux.namespaces().as_ref().expect("namespaces").iter().map(|n| n.typ()).collect();
        assert_eq!(
            kinds,
            [
                LinuxNamespaceType::Pid,
                LinuxNamespaceType::Ipc,
                LinuxNamespaceType::Uts,
                LinuxNamespaceType::Mount,
                LinuxNamespaceType::Network
            ]
        );
        for ns in linux.namespaces().as_ref().expect("namespaces") {
            if ns.typ() == LinuxNamespaceType::Network {
                assert_eq!(ns.path(), &spec.network_namespace);
            } else {
                assert!(ns.path().is_none(), "{:?} must be a new namespace", ns.typ());
            }
        }
        assert!(linux.cgroups_path().as_ref().is_some_and(|p| p.starts_with("/lazaret/")));
        let mounts = built.mounts().as_ref().expect("mounts");
        let workspace = mounts.iter().find(|m| m.destination() == &spec.mounts[0].destination).expect("workspace mounted");
        assert_eq!(workspace.source().as_ref(), Some(&spec.mounts[0].source), "same path inside and out");
        let rlimits = process.rlimits().as_ref().expect("rlimits");
        assert!(rlimits.iter().any(|r| r.typ() == PosixRlimitType::RlimitNofile));
    }
}

fn expect_invalid(mutate: impl FnOnce(&mut BundleSpec)) -> BundleError {
    let mut spec = agent_spec();
    mutate(&mut spec);
    build_spec(&spec).expect_err("must be refused")
}

#[test]
fn invalid_inputs_get_typed_errors() {
    use BundleError::*;
    assert!(matches!(expect_invalid(|s| s.args.clear()), InvalidField { .. }));
    assert!(matches!(expect_invalid(|s| s.args = vec!["a\0b".into()]), InvalidField { .. }));
    assert!(matches!(expect_invalid(|s| s.cwd = "relative/dir".into()), InvalidPath { .. }));
    assert!(matches!(expect_invalid(|s| s.cwd = "/a/../etc".into()), InvalidPath { .. }));
    assert!(matches!(expect_invalid(|s| s.rootfs = "/".into()), InvalidPath { .. }));
    assert!(matches!(expect_invalid(|s| s.env.push(("BAD=KEY".into(), "v".into()))), InvalidEnv { .. }));
    assert!(matches!(expect_invalid(|s| s.env.push(("".into(), "v".into()))), InvalidEnv { .. }));
    assert!(matches!(expect_invalid(|s| s.env.push(("PATH".into(), "dup".into()))), InvalidEnv { .. }));
    assert!(matches!(expect_invalid(|s| s.env.push(("K".into(), "nul\0".into()))), InvalidEnv { .. }));
    let bind = |dest: &str| BindMount { source: PathBuf::from("/srv/x"), destination: PathBuf::from(dest), readonly: false };
    for dest in ["/", "relative", "/proc/sys", "/dev", "/sys/fs", "/x/../etc", "/home/dev/src/project"] {
        let err = expect_invalid(|s| s.mounts.push(bind(dest)));
        assert!(matches!(err, InvalidPath { .. }), "{dest}: {err}");
    }
    assert!(matches!(
        expect_invalid(|s| s.mounts.push(BindMount { source: PathBuf::from("/a/\0b"), destination: PathBuf::from("/ok"), readonly: true })),
        InvalidPath { .. }
    ));
    for hostname in ["", "-bad", "has space", "under_score", &"x".repeat(70)] {
        let err = expect_invalid(|s| s.hostname = hostname.to_string());
        assert!(matches!(err, InvalidField { .. }), "{hostname:?}: {err}");
    }
    for path in ["/system.slice/x", "/lazaret", "/lazaret/", "/lazaret/../x", "relative"] {
        let err = expect_invalid(|s| s.cgroups_path = path.to_string());
        assert!(matches!(err, InvalidField { .. }), "{path}: {err}");
    }
    for cap in [Capability::NetAdmin, Capability::SysAdmin] {
        let err = expect_invalid(|s| s.capabilities = CapabilityPolicy::Explicit(vec![Capability::Chown, cap]));
        assert!(matches!(err, ForbiddenCapability(_)), "{err}");
    }
    assert!(matches!(
        expect_invalid(|s| s.rlimits = vec![Rlimit { resource: PosixRlimitType::RlimitNofile, soft: 10, hard: 5 }]),
        InvalidField { .. }
    ));
    assert!(matches!(expect_invalid(|s| s.memory_limit = Some(0)), InvalidField { .. }));
    assert!(matches!(expect_invalid(|s| s.pids_limit = Some(-1)), InvalidField { .. }));
    assert!(matches!(expect_invalid(|s| s.network_namespace = Some("netns".into())), InvalidPath { .. }));
    // (/proc/1 is not always readable, e.g. in this CI; our own netns is.)
    for host_netns in ["/proc/self/ns/net", "/proc/thread-self/ns/net"] {
        let err = expect_invalid(|s| s.network_namespace = Some(host_netns.into()));
        assert!(matches!(err, InvalidPath { .. }), "{host_netns}: {err}");
    }
}

#[test]
fn write_bundle_writes_the_rendered_spec() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = dir.path().join("bundle");
    let path = write_bundle(&bundle, &root_spec()).expect("write");
    assert_eq!(path, bundle.join("config.json"));
    let written = std::fs::read_to_string(&path).expect("read");
    let expected = render_spec(&build_spec(&root_spec()).expect("valid")).expect("render");
    assert_eq!(written, expected);
    let parsed = oci_spec::runtime::Spec::load(&path).expect("config.json parses back");
    assert_eq!(parsed.hostname().as_deref(), Some("sandbox.d2"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&bundle).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn the_process_alone_is_the_whole_specs_process() {
    for spec in [agent_spec(), root_spec(), explicit_caps_spec()] {
        let process = build_process(&spec).expect("process");
        let whole = build_spec(&spec).expect("spec");
        let rendered = render_process(&process).expect("render");
        let from_whole: serde_json::Value = serde_json::from_str(&render_spec(&whole).expect("render spec")).expect("json");
        let alone: serde_json::Value = serde_json::from_str(&rendered).expect("json");
        assert_eq!(Some(&alone), from_whole.get("process"), "{rendered}");
    }
    // The same validation as a whole bundle.
    let mut bad = agent_spec();
    bad.cwd = "relative".into();
    assert!(build_process(&bad).is_err());
}

/// Destinations of the generated spec's bind mounts, in spec order.
fn bind_destinations(spec: &BundleSpec) -> Vec<PathBuf> {
    build_spec(spec)
        .expect("valid spec")
        .mounts()
        .as_ref()
        .expect("mounts")
        .iter()
        .filter(|m| m.typ().as_deref() == Some("bind"))
        .map(|m| m.destination().clone())
        .collect()
}

fn bind(dest: &str, readonly: bool) -> BindMount {
    BindMount { source: PathBuf::from(format!("/src{dest}")), destination: PathBuf::from(dest), readonly }
}

/// Issue 14: the persistent home (`/home/dev`) was collected after the
/// workspace below it and its Git Sentry binds, so runsc could not resolve
/// the workspace's mount point. Whatever the collection order, a parent is
/// mounted before everything below it.
#[test]
fn home_is_mounted_before_the_workspace_below_it() {
    let spec = BundleSpec {
        mounts: vec![
            bind("/home/dev/src/project", false),
            bind("/home/dev/src/project/.git/hooks", true),
            bind("/home/dev/src/project/.git/config", true),
            bind("/home/dev/src/project/node_modules", false),
            bind("/home/dev", false),
            bind("/etc/resolv.conf", true),
        ],
        ..agent_spec()
    };
    let order: Vec<String> = bind_destinations(&spec).iter().map(|p| p.display().to_string()).collect();
    assert_eq!(
        order,
        [
            "/home/dev",
            "/etc/resolv.conf",
            "/home/dev/src/project",
            "/home/dev/src/project/node_modules",
            "/home/dev/src/project/.git/hooks",
            "/home/dev/src/project/.git/config",
        ]
    );
    // Sources and read-only flags travel with their destinations.
    let built = build_spec(&spec).expect("valid");
    let hooks = built
        .mounts()
        .as_ref()
        .expect("mounts")
        .iter()
        .find(|m| m.destination() == Path::new("/home/dev/src/project/.git/hooks"))
        .expect("hooks bind");
    assert_eq!(hooks.source().as_deref(), Some(Path::new("/src/home/dev/src/project/.git/hooks")));
    assert!(hooks.options().as_ref().is_some_and(|o| o.iter().any(|x| x == "ro")));
    // The system mounts still come first, in their fixed order.
    let all: Vec<String> = built.mounts().as_ref().expect("mounts").iter().take(7).map(|m| m.destination().display().to_string()).collect();
    assert_eq!(all, ["/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/tmp"]);
}

/// Every permutation of a nested set gives an order in which each mount
/// comes after every mount whose destination contains it, and in which
/// mounts of equal depth keep the order they were given in.
#[test]
fn every_collection_order_gives_parents_first() {
    let set = [
        bind("/w", false),
        bind("/w/repo", false),
        bind("/w/repo/.git/hooks", true),
        bind("/w/repo/target", false),
        bind("/root/.cache", false),
        bind("/w/repo/.git/hooks/x", false),
    ];
    fn permutations(items: Vec<BindMount>) -> Vec<Vec<BindMount>> {
        if items.len() <= 1 {
            return vec![items];
        }
        let mut out = Vec::new();
        for i in 0..items.len() {
            let mut rest = items.clone();
            let first = rest.remove(i);
            for mut p in permutations(rest) {
                p.insert(0, first.clone());
                out.push(p);
            }
        }
        out
    }
    let all = permutations(set.to_vec());
    assert_eq!(all.len(), 720);
    for collected in all {
        let spec = BundleSpec { mounts: collected.clone(), ..agent_spec() };
        let order = bind_destinations(&spec);
        assert_eq!(order.len(), collected.len());
        for (i, a) in order.iter().enumerate() {
            for b in &order[i + 1..] {
                assert!(
                    !a.starts_with(b),
                    "{} is mounted before its parent {} (collected {:?})",
                    a.display(),
                    b.display(),
                    collected.iter().map(|m| &m.destination).collect::<Vec<_>>()
                );
            }
        }
        let depth = |p: &Path| p.components().count();
        for d in 1..=5 {
            let given: Vec<&PathBuf> = collected.iter().map(|m| &m.destination).filter(|p| depth(p) == d).collect();
            let generated: Vec<&PathBuf> = order.iter().filter(|p| depth(p) == d).collect();
            assert_eq!(generated, given, "equal-depth mounts keep their order");
        }
    }
}

/// Repeated and trailing slashes do not change a destination's depth.
#[test]
fn depth_ignores_repeated_and_trailing_slashes() {
    let spec = BundleSpec { mounts: vec![bind("/home//dev/src/project/", false), bind("/home/dev/", false)], ..agent_spec() };
    let order = bind_destinations(&spec);
    assert_eq!(order, [PathBuf::from("/home/dev/"), PathBuf::from("/home//dev/src/project/")]);
}
