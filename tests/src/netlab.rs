//! A fake internet for the network tests, built entirely inside network
//! namespaces the test creates: a "host" namespace (where lazaret runs and
//! builds its sidecar) and a "world" namespace joined to it by a veth pair,
//! with test servers on addresses of the world's loopback. Nothing touches
//! this machine's real interfaces. Each namespace is held by a `sleep`
//! process the lab starts (no `ip netns` bind mounts, so nothing appears in
//! the host's mount table); dropping the lab ends its servers and holders
//! by PID, and the namespaces with their veths disappear with them.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The lab host's own address (its "public" interface).
pub const HOST_ADDR: &str = "203.0.113.2";
/// The world side of the host's link (the host's default gateway).
pub const WORLD_GATEWAY: &str = "203.0.113.1";
/// A public server (a globally routed address, served only inside the
/// lab's world namespace; the documentation ranges are denied by default).
pub const PUBLIC: &str = "11.1.1.1";
/// A public server that a `deny_egress` rule can close.
pub const PUBLIC_DENIED: &str = "11.1.1.77";
/// Servers in the default-denied ranges.
pub const PRIVATE: [&str; 6] = ["10.1.1.1", "10.222.1.1", "10.223.1.1", "172.16.1.1", "192.168.1.1", "169.254.169.254"];
/// The DNS server, inside a denied range.
pub const DNS: &str = "10.53.0.53";
/// A public IPv6 server (globally routed, served only inside the lab).
pub const PUBLIC_V6: &str = "2a0b:100::1";
/// An IPv6 server at a unique-local (ULA) address, denied by default.
pub const ULA_V6: &str = "fd00:1::1";
/// The lab host's own IPv6 address.
pub const HOST_ADDR_V6: &str = "2001:db8:1::2";
/// The port every test server listens on (TCP and UDP).
pub const PORT: u16 = 8080;

/// The environment variable that makes the lab's host IPv4-only when set
/// to `0` (scripts/matrix.sh's IPv4-only cell): no IPv6 address or route
/// on the host, and IPv6 disabled on its interfaces. Unset or `1`, the
/// host is dual-stack.
pub const LAB_IPV6_VAR: &str = "LAZARET_TEST_LAB_IPV6";

/// Whether the lab's host has IPv6 ([`LAB_IPV6_VAR`]); fails the test on a
/// value other than `0` or `1`.
pub fn lab_has_ipv6() -> bool {
    match std::env::var(LAB_IPV6_VAR).as_deref() {
        Err(_) | Ok("") | Ok("1") => true,
        Ok("0") => false,
        Ok(other) => panic!("{LAB_IPV6_VAR}={other:?}: expected 0 (IPv4-only host) or 1 (dual-stack)"),
    }
}

/// The lab. See the module documentation.
pub struct NetLab {
    holders: Vec<Child>,
    /// Path of the host namespace (for `nsenter --net=`).
    pub host: PathBuf,
    /// Path of the world namespace.
    pub world: PathBuf,
    servers: Vec<Child>,
    /// Where the world's UDP log goes (one line per datagram received).
    pub log: PathBuf,
}

/// Runs `ip ARGS` inside the namespace at `ns`.
fn ip(ns: &Path, args: &[&str]) {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", ns.display()))
        .arg("--")
        .arg("ip")
        .args(args)
        .output()
        .expect("running ip (iproute2) for the test lab");
    assert!(out.status.success(), "ip {args:?} in {}: {}", ns.display(), String::from_utf8_lossy(&out.stderr));
}

/// Turns IPv6 off on every interface of the namespace at `ns`, present and
/// future (an IPv4-only host).
fn disable_ipv6(ns: &Path) {
    for scope in ["all", "default", "lo"] {
        let knob = format!("/proc/sys/net/ipv6/conf/{scope}/disable_ipv6");
        // /proc/sys/net shows the namespace of the process that opens it.
        let out = Command::new("nsenter")
            .arg(format!("--net={}", ns.display()))
            .args(["--", "sh", "-c", &format!("echo 1 > {knob}")])
            .output()
            .expect("nsenter (util-linux) for the test lab");
        assert!(out.status.success(), "writing {knob} in {}: {}", ns.display(), String::from_utf8_lossy(&out.stderr));
    }
}

/// Starts a process holding a new network namespace and returns it with
/// the namespace's path, once the namespace exists.
fn new_namespace() -> (Child, PathBuf) {
    let ours = fs::read_link("/proc/self/ns/net").expect("own netns");
    let holder = Command::new("unshare")
        .args(["--net", "--", "sleep", "infinity"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("unshare (util-linux) for the test lab");
    let path = PathBuf::from(format!("/proc/{}/ns/net", holder.id()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::read_link(&path).map(|l| l == ours).unwrap_or(true) {
        assert!(Instant::now() < deadline, "the lab namespace holder never entered its namespace");
        std::thread::sleep(Duration::from_millis(2));
    }
    ip(&path, &["link", "set", "lo", "up"]);
    (holder, path)
}

fn fakenet_bin() -> PathBuf {
    crate::sibling_bin("lazaret-fakenet")
}

impl NetLab {
    /// Builds the lab and starts its servers; dual-stack unless
    /// [`lab_has_ipv6`] says the run is IPv4-only.
    pub fn new() -> NetLab {
        NetLab::with_ipv6(lab_has_ipv6())
    }

    /// Builds the lab, dual-stack or (`ipv6` false) an IPv4-only host with
    /// IPv6 disabled on every interface, and starts its servers.
    pub fn with_ipv6(ipv6: bool) -> NetLab {
        crate::require_root();
        let tag = crate::random_suffix();
        let log = PathBuf::from(format!("/tmp/lazaret-netlab-{tag}.log"));
        let (host_holder, host) = new_namespace();
        let (world_holder, world) = new_namespace();
        let world_pid = world_holder.id().to_string();
        let mut lab =
            NetLab { holders: vec![host_holder, world_holder], host: host.clone(), world: world.clone(), servers: Vec::new(), log };
        // Created directly inside the lab: the veth never exists in the
        // machine's real namespace.
        if !ipv6 {
            // Before the link exists, so that it never gets even a link-local address.
            disable_ipv6(&host);
        }
        ip(&host, &["link", "add", "wan0", "type", "veth", "peer", "name", "wan0", "netns", &world_pid]);
        ip(&host, &["addr", "add", &format!("{HOST_ADDR}/24"), "dev", "wan0"]);
        if ipv6 {
            ip(&host, &["addr", "add", &format!("{HOST_ADDR_V6}/64"), "dev", "wan0", "nodad"]);
        }
        ip(&host, &["link", "set", "wan0", "up"]);
        ip(&world, &["addr", "add", &format!("{WORLD_GATEWAY}/24"), "dev", "wan0"]);
        ip(&world, &["addr", "add", "2001:db8:1::1/64", "dev", "wan0", "nodad"]);
        ip(&world, &["link", "set", "wan0", "up"]);
        ip(&host, &["route", "add", "default", "via", WORLD_GATEWAY]);
        if ipv6 {
            ip(&host, &["-6", "route", "add", "default", "via", "2001:db8:1::1"]);
        }
        let mut world_addrs: Vec<&str> = vec![PUBLIC, PUBLIC_DENIED, DNS];
        world_addrs.extend(PRIVATE);
        for a in &world_addrs {
            ip(&world, &["addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        for a in [PUBLIC_V6, ULA_V6] {
            ip(&world, &["addr", "add", &format!("{a}/128"), "dev", "lo", "nodad"]);
        }

        let mut serve: Vec<String> = vec!["serve".into(), PORT.to_string()];
        serve.extend(world_addrs.iter().filter(|a| **a != DNS).map(|a| a.to_string()));
        serve.extend([PUBLIC_V6.into(), ULA_V6.into()]);
        lab.start_server(&world, &serve.iter().map(String::as_str).collect::<Vec<_>>(), true);
        lab.start_server(&world, &["dns", DNS, PUBLIC], false);
        // A server on the lab host's own address: the sandbox must not reach it.
        let port = PORT.to_string();
        let host_server: &[&str] = if ipv6 { &["serve", &port, HOST_ADDR, HOST_ADDR_V6] } else { &["serve", &port, HOST_ADDR] };
        lab.start_server(&host, host_server, false);
        lab
    }

    /// Starts `lazaret-fakenet ARGS` in the world namespace (ended with the
    /// lab) and waits for it to be ready.
    pub fn start_world_server(&mut self, args: &[&str]) {
        let world = self.world.clone();
        self.start_server(&world, args, false);
    }

    /// Adds a namespace joined directly to the world by a veth pair
    /// (`eth0` inside, address `addr/24`, the world side `gateway/24`),
    /// deleted with the lab. Returns its path. For a sandbox with no
    /// sidecar in between (benchmarks).
    pub fn direct_namespace(&mut self, addr: &str, gateway: &str) -> PathBuf {
        let (holder, path) = new_namespace();
        let pid = holder.id().to_string();
        self.holders.push(holder);
        ip(&self.world, &["link", "add", "direct0", "type", "veth", "peer", "name", "eth0", "netns", &pid]);
        ip(&path, &["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
        ip(&path, &["link", "set", "eth0", "up"]);
        ip(&self.world, &["addr", "add", &format!("{gateway}/24"), "dev", "direct0"]);
        ip(&self.world, &["link", "set", "direct0", "up"]);
        ip(&path, &["route", "add", "default", "via", gateway]);
        path
    }

    fn start_server(&mut self, ns: &Path, args: &[&str], logged: bool) {
        let out = if logged { Stdio::from(fs::File::create(&self.log).expect("lab log")) } else { Stdio::piped() };
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", ns.display()))
            .arg("--")
            .arg(fakenet_bin())
            .args(args)
            .stdout(out)
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting lazaret-fakenet");
        if logged {
            self.servers.push(child);
            self.wait_log("ready");
        } else {
            let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
            assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"), "fake server {args:?} did not start");
            self.servers.push(child);
        }
    }

    /// Waits until the UDP log contains `needle` (fails after 30 s).
    pub fn wait_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains(needle) {
                return text;
            }
            assert!(Instant::now() < deadline, "the world never logged {needle:?}; log: {text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `ip ARGS` in the lab's world namespace (e.g. to give it one
    /// more address); panics on failure.
    pub fn world_ip(&self, args: &[&str]) {
        ip(&self.world, args);
    }

    /// Runs `ip ARGS` in the lab host namespace (e.g. to give the host an
    /// address while a Domain runs); panics on failure.
    pub fn host_ip(&self, args: &[&str]) {
        ip(&self.host, args);
    }

    /// Links of the lab host namespace (names).
    pub fn host_links(&self) -> Vec<String> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.host.display()))
            .args(["--", "ip", "-o", "link", "show"])
            .output()
            .expect("ip link");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().split('@').next().unwrap_or("").to_string()))
            .collect()
    }
}

impl Default for NetLab {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
        // The namespaces (and their veths) go with their last holder.
        for h in &mut self.holders {
            let _ = h.kill();
            let _ = h.wait();
        }
        let _ = fs::remove_file(&self.log);
    }
}
