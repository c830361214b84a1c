//! A test helper that runs inside the sandbox (copied into the workspace by
//! the escalation tests and the bench). Built here against glibc; the test
//! image is Debian, so it runs there too (not in the no-libc image, which
//! only ever runs the real `lazaret-escalate`).
//!
//! `lazaret-escprobe hostile`: talks to the coordinator's escalation
//! listener (`LAZARET_ESCALATE_ADDR`) the way a hostile agent would, with
//! the session's credentials in its environment (which only the test hook
//! `LAZARET_TEST_SESSION_CREDENTIALS=env` puts there): no
//! client certificate, a certificate of a self-made CA (carrying this
//! session's own name), a replayed request ID, oversized, malformed and
//! out-of-order frames, and requests that fail validation. Every hostile
//! request asks for `touch WORKSPACE/pwned-CASE` (the test's rule allows
//! `touch` with any arguments), so a request that wrongly ran leaves a file.
//! Prints one line per case: `case NAME: refused (...)`, `case NAME:
//! connection error (...)` or `case NAME: ACCEPTED (...)`; and for the
//! replay's first (valid) request `case replay-first: completed N`.
//!
//! `lazaret-escprobe interrupt SIGNAL -- CMD...`: spawns CMD (with default
//! signal dispositions: a shell's background job would have SIGINT
//! ignored), waits for a line on stdin, sends CMD SIGNAL (`INT`, `TERM`,
//! `HUP`), waits and prints `status=N`.
//!
//! `lazaret-escprobe time N -- CMD...`: runs CMD N times one after the other
//! and prints each run's wall time in microseconds, one per line, or
//! `failed I STATUS` for a run that did not exit 0.
//!
//! `lazaret-escprobe requests N -- CMD...`: makes N escalation requests of
//! CMD one after the other from this one process, through the Escalation
//! Client's own code (`lazaret_protocol::client`, as `lazaret-escalate`
//! runs it: a fresh request ID, a new connection to the session's broker,
//! which makes a new TLS connection with a full handshake, the request,
//! its output and result), and prints each request's wall time in
//! microseconds, or `failed I CODE`: the round trip without the client
//! process's start. CMD's output goes to this process's stdout, so use a
//! silent command (`true`). `lazaret-escprobe requests N PREFIX -- CMD...`
//! does the same with `PREFIX-I` appended to request I's argv (so each
//! request is told apart on the host and in its output).
//!
//! `lazaret-escprobe steal`: what one session's agent can take of the
//! others' escalation identity. For every other process: whether its
//! environment is readable and holds a session key (`environ-key PID`),
//! and if so whether the coordinator accepts a request made with it
//! (`stolen-key PID: SEEN`, asking for `touch WORKSPACE/pwned-key-PID`);
//! every escalation broker named in a readable environment other than its
//! own is asked for `touch WORKSPACE/pwned-broker-PID`
//! (`foreign-broker PID: SEEN`); and its own broker for `true`
//! (`own-broker: SEEN`). Then `done`.
//!
//! `lazaret-escprobe present CERT KEY NAME`: asks the coordinator, over its
//! own TLS connection, for `touch WORKSPACE/NAME` with the certificate and
//! key in the files CERT and KEY (the Domain's address and CA are the
//! session's, as for `hostile`); prints `seen: SEEN`.
//!
//! `lazaret-escprobe concurrent N PREFIX -- CMD...`: starts N copies of
//! `CMD... PREFIX-I` at once, waits for all and prints `PREFIX-I exit=S
//! out=STDOUT` per child (stdout with newlines as `\n`), then `wall_us=T`.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lazaret_protocol::escalation::{
    ClientFrame, ENV_ADDR, ENV_CA, ENV_CERT, ENV_KEY, ESCALATION_VERSION, EscalationRequest, KIND_CONTROL, KIND_STDOUT, MAX_ARGV_BYTES,
    MAX_CONTROL, Outcome, ServerFrame, read_server, write_client,
};
use lazaret_protocol::session::ENV_BROKER;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("hostile") => hostile(),
        Some("interrupt") => interrupt(&args[1..]),
        Some("time") => time(&args[1..]),
        Some("concurrent") => concurrent(&args[1..]),
        Some("requests") => requests(&args[1..]),
        Some("steal") => steal(),
        Some("present") => present(&args[1..]),
        _ => {
            eprintln!(
                "usage: lazaret-escprobe hostile | steal | present CERT KEY NAME | interrupt SIGNAL -- CMD... | time N -- CMD... | requests N [PREFIX] -- CMD... | concurrent N PREFIX -- CMD..."
            );
            2
        }
    };
    std::process::exit(code);
}

/// The command after `--` in `args` (at `at`), or a usage error.
fn command_after_dashes(args: &[String], at: usize) -> Result<&[String], String> {
    match args.get(at) {
        Some(d) if d == "--" && args.len() > at + 1 => Ok(&args[at + 1..]),
        _ => Err("expected -- CMD...".into()),
    }
}

fn interrupt(args: &[String]) -> i32 {
    let Some(signal) = args.first() else {
        eprintln!("interrupt SIGNAL -- CMD...");
        return 2;
    };
    let cmd = match command_after_dashes(args, 1) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let signal = match signal.as_str() {
        "INT" => nix::sys::signal::Signal::SIGINT,
        "TERM" => nix::sys::signal::Signal::SIGTERM,
        "HUP" => nix::sys::signal::Signal::SIGHUP,
        other => {
            eprintln!("unknown signal {other}");
            return 2;
        }
    };
    let mut child = match Command::new(&cmd[0]).args(&cmd[1..]).stdin(Stdio::null()).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("spawning {}: {e}", cmd[0]);
            return 1;
        }
    };
    // The go-ahead is a line on stdin (a file the host creates meanwhile
    // may be cached away by the sandbox's file system).
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).is_err() || line.is_empty() {
        eprintln!("no go-ahead on stdin");
    }
    if let Ok(Some(status)) = child.try_wait() {
        println!("exited-early status={}", code_of(status));
        return 1;
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    if let Err(e) = nix::sys::signal::kill(pid, signal) {
        eprintln!("kill: {e}");
    }
    match child.wait() {
        Ok(status) => {
            println!("status={}", code_of(status));
            0
        }
        Err(e) => {
            eprintln!("wait: {e}");
            1
        }
    }
}

fn code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn time(args: &[String]) -> i32 {
    let Some(n) = args.first().and_then(|n| n.parse::<usize>().ok()) else {
        eprintln!("time N -- CMD...");
        return 2;
    };
    let cmd = match command_after_dashes(args, 1) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let mut out = std::io::stdout().lock();
    for i in 0..n {
        let t = Instant::now();
        let status = Command::new(&cmd[0]).args(&cmd[1..]).stdin(Stdio::null()).stdout(Stdio::null()).status();
        let us = t.elapsed().as_micros();
        match status {
            Ok(s) if s.success() => {
                let _ = writeln!(out, "{us}");
            }
            Ok(s) => {
                let _ = writeln!(out, "failed {i} {}", code_of(s));
            }
            Err(e) => {
                eprintln!("run {i}: {e}");
                return 1;
            }
        }
    }
    0
}

fn requests(args: &[String]) -> i32 {
    use lazaret_protocol::client::{self, Signals};
    let Some(n) = args.first().and_then(|n| n.parse::<usize>().ok()) else {
        eprintln!("requests N [PREFIX] -- CMD...");
        return 2;
    };
    let prefix = args.get(1).filter(|a| *a != "--");
    let cmd = match command_after_dashes(args, if prefix.is_some() { 2 } else { 1 }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let (broker, workspace) = match (std::env::var(ENV_BROKER), std::env::current_dir()) {
        (Ok(b), Ok(w)) => (b, w.to_string_lossy().into_owned()),
        _ => {
            eprintln!("requests: {ENV_BROKER} or the current directory is missing");
            return 1;
        }
    };
    let signals = match Signals::block() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("requests: cannot block signals: {e}");
            return 1;
        }
    };
    for i in 0..n {
        let t = Instant::now();
        // Everything a client process does after parsing its command line.
        let id = match client::request_id() {
            Ok(id) => id,
            Err(e) => {
                eprintln!("requests: {e}");
                return 1;
            }
        };
        let request = EscalationRequest {
            version: ESCALATION_VERSION,
            id,
            argv: cmd.iter().cloned().chain(prefix.map(|p| format!("{p}-{i}"))).collect(),
            cwd: workspace.clone(),
            justification: String::new(),
            timeout_secs: None,
        };
        let code = client::escalate(&broker, &signals, request);
        let us = t.elapsed().as_micros();
        let mut out = std::io::stdout().lock();
        let _ = if code == 0 { writeln!(out, "{us}") } else { writeln!(out, "failed {i} {code}") };
    }
    0
}

fn concurrent(args: &[String]) -> i32 {
    let (Some(n), Some(prefix)) = (args.first().and_then(|n| n.parse::<usize>().ok()), args.get(1)) else {
        eprintln!("concurrent N PREFIX -- CMD...");
        return 2;
    };
    let cmd = match command_after_dashes(args, 2) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let t = Instant::now();
    let mut children = Vec::new();
    for i in 0..n {
        let token = format!("{prefix}-{i}");
        match Command::new(&cmd[0]).args(&cmd[1..]).arg(&token).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn() {
            Ok(c) => children.push((token, Some(c))),
            Err(e) => {
                eprintln!("spawning {token}: {e}");
                children.push((token, None));
            }
        }
    }
    let mut out = std::io::stdout().lock();
    for (token, child) in children {
        let Some(child) = child else {
            let _ = writeln!(out, "{token} exit=spawn-failed out=");
            continue;
        };
        match child.wait_with_output() {
            Ok(o) => {
                let shown = String::from_utf8_lossy(&o.stdout).replace('\n', "\\n");
                let _ = writeln!(out, "{token} exit={} out={shown}", code_of(o.status));
                if !o.status.success() {
                    eprintln!("{token}: {}", String::from_utf8_lossy(&o.stderr).trim_end());
                }
            }
            Err(e) => {
                let _ = writeln!(out, "{token} exit=wait-failed({e}) out=");
            }
        }
    }
    let _ = writeln!(out, "wall_us={}", t.elapsed().as_micros());
    0
}

// ---------------------------------------------------------------------------
// Hostile clients.

/// What a case saw.
enum Seen {
    /// A `Refused` result.
    Refused(String),
    /// The connection failed or closed without a result.
    ConnectionError(String),
    /// Anything that means the coordinator went along with it.
    Accepted(String),
    /// A `Completed` result (for the valid requests of a case).
    Completed(i32),
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seen::Refused(r) => write!(f, "refused ({})", one_line(r)),
            Seen::ConnectionError(e) => write!(f, "connection error ({})", one_line(e)),
            Seen::Accepted(what) => write!(f, "ACCEPTED ({})", one_line(what)),
            Seen::Completed(s) => write!(f, "completed {s}"),
        }
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

struct Env {
    addr: SocketAddr,
    ca: String,
    cert: String,
    key: String,
    workspace: String,
}

/// The session's credentials, from this process's environment: the
/// coordinator puts them there only under the test hook
/// `LAZARET_TEST_SESSION_CREDENTIALS=env` (otherwise only the session's
/// broker has them).
fn env() -> Result<Env, String> {
    let var = |n: &str| {
        std::env::var(n).map_err(|_| format!("{n} is not set (the test hook LAZARET_TEST_SESSION_CREDENTIALS=env puts it there)"))
    };
    let addr = var(ENV_ADDR)?.parse().map_err(|e| format!("{ENV_ADDR}: {e}"))?;
    let workspace = std::env::current_dir().map_err(|e| e.to_string())?.to_string_lossy().into_owned();
    Ok(Env { addr, ca: var(ENV_CA)?, cert: var(ENV_CERT)?, key: var(ENV_KEY)?, workspace })
}

/// The environment of process `pid`, if this process may read it.
fn environ_of(pid: i32) -> Option<Vec<(String, String)>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter_map(|entry| {
                let entry = String::from_utf8_lossy(entry);
                let (k, v) = entry.split_once('=')?;
                Some((k.to_owned(), v.to_owned()))
            })
            .collect(),
    )
}

/// Asks the broker `name` (`@NAME`) to run `argv` and reports what came back.
fn through_broker(name: &str, argv: Vec<String>, workspace: &str) -> Seen {
    use std::os::linux::net::SocketAddrExt;
    let Some(abstract_name) = name.strip_prefix('@') else { return Seen::ConnectionError(format!("not @NAME: {name}")) };
    let sock = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())
        .and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a));
    let mut sock = match sock {
        Ok(s) => s,
        Err(e) => return Seen::ConnectionError(format!("connect: {e}")),
    };
    // As lazaret-escalate does: the kernel then tells the broker who sends.
    if let Err(e) = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::PassCred, &true) {
        return Seen::ConnectionError(format!("SO_PASSCRED: {e}"));
    }
    let _ = sock.set_read_timeout(Some(Duration::from_secs(60)));
    let request = EscalationRequest {
        version: ESCALATION_VERSION,
        id: random_id(),
        argv,
        cwd: workspace.to_owned(),
        justification: "steal test".into(),
        timeout_secs: Some(60),
    };
    if let Err(e) = write_client(&mut sock, &ClientFrame::Request(request)) {
        return Seen::ConnectionError(format!("write: {e}"));
    }
    outcome(&mut sock)
}

/// See the module documentation.
fn present(args: &[String]) -> i32 {
    let [cert, key, name] = args else {
        eprintln!("present CERT KEY NAME");
        return 2;
    };
    let (cert, key) = match (std::fs::read_to_string(cert), std::fs::read_to_string(key)) {
        (Ok(c), Ok(k)) => (c, k),
        _ => {
            eprintln!("present: cannot read {cert} or {key}");
            return 1;
        }
    };
    let env = match env() {
        Ok(e) => Env { cert, key, ..e },
        Err(e) => {
            eprintln!("present: {e}");
            return 1;
        }
    };
    let seen = match client_config(&env.ca, Some((&env.cert, &env.key))) {
        Ok(config) => send_frame(&env, config, &ClientFrame::Request(request(&env, &random_id(), name))),
        Err(e) => Seen::ConnectionError(format!("unusable credentials: {e}")),
    };
    println!("seen: {seen}");
    0
}

/// See the module documentation.
fn steal() -> i32 {
    let me = std::process::id() as i32;
    let workspace = match std::env::current_dir() {
        Ok(w) => w.to_string_lossy().into_owned(),
        Err(e) => {
            eprintln!("steal: {e}");
            return 1;
        }
    };
    let own_broker = std::env::var(ENV_BROKER).ok();
    let mut pids: Vec<i32> =
        std::fs::read_dir("/proc").map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()).unwrap_or_default();
    pids.sort_unstable();
    let mut brokers_tried = Vec::new();
    for pid in pids.into_iter().filter(|p| *p != me) {
        let Some(vars) = environ_of(pid) else { continue };
        let var = |n: &str| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        if let (Some(key), Some(cert), Some(ca), Some(addr)) = (var(ENV_KEY), var(ENV_CERT), var(ENV_CA), var(ENV_ADDR)) {
            println!("environ-key {pid}");
            let seen = match (addr.parse(), client_config(&ca, Some((&cert, &key)))) {
                (Ok(addr), Ok(config)) => {
                    let env = Env { addr, ca, cert, key, workspace: workspace.clone() };
                    send_frame(&env, config, &ClientFrame::Request(request(&env, &random_id(), &format!("pwned-key-{pid}"))))
                }
                _ => Seen::ConnectionError("unusable credentials".into()),
            };
            println!("stolen-key {pid}: {seen}");
        }
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default() {
            use std::os::unix::fs::OpenOptionsExt;
            let opened = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(fd.path());
            let mut content = Vec::new();
            if let Ok(file) = opened {
                let _ = file.take(1 << 16).read_to_end(&mut content);
            }
            if content.windows(11).any(|w| w == b"PRIVATE KEY") {
                println!("fd-key {pid} {}", fd.file_name().to_string_lossy());
            }
        }
        if let Some(broker) = var(ENV_BROKER).filter(|b| Some(b) != own_broker.as_ref() && !brokers_tried.contains(b)) {
            brokers_tried.push(broker.clone());
            let seen = through_broker(&broker, vec!["touch".into(), format!("{workspace}/pwned-broker-{pid}")], &workspace);
            println!("foreign-broker {pid}: {seen}");
        }
    }
    match own_broker {
        Some(b) => println!("own-broker: {}", through_broker(&b, vec!["touch".into(), format!("{workspace}/own-broker-ok")], &workspace)),
        None => println!("own-broker: none"),
    }
    println!("done");
    0
}

fn certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())
}

/// A TLS 1.3 client configuration trusting `ca`, presenting `identity`
/// (certificate chain PEM, PKCS#8 key PEM) or no certificate.
fn client_config(ca: &str, identity: Option<(&str, &str)>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    for c in certs(ca)? {
        roots.add(c).map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let key = PrivatePkcs8KeyDer::from_pem_slice(key.as_bytes()).map_err(|e| e.to_string())?;
            builder.with_client_auth_cert(certs(cert)?, PrivateKeyDer::Pkcs8(key)).map_err(|e| e.to_string())?
        }
    };
    Ok(Arc::new(config))
}

type Tls = StreamOwned<ClientConnection, TcpStream>;

fn connect(env: &Env, config: Arc<ClientConfig>) -> Result<Tls, String> {
    let name = ServerName::IpAddress(env.addr.ip().into());
    let conn = ClientConnection::new(config, name).map_err(|e| e.to_string())?;
    let sock = TcpStream::connect_timeout(&env.addr, Duration::from_secs(10)).map_err(|e| format!("connect: {e}"))?;
    sock.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    sock.set_write_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    Ok(StreamOwned::new(conn, sock))
}

fn random_id() -> String {
    let mut b = [0u8; 16];
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn request(env: &Env, id: &str, file: &str) -> EscalationRequest {
    EscalationRequest {
        version: ESCALATION_VERSION,
        id: id.to_string(),
        argv: vec!["touch".into(), format!("{}/{file}", env.workspace)],
        cwd: env.workspace.clone(),
        justification: "hostile test".into(),
        timeout_secs: Some(60),
    }
}

/// Reads frames up to the result or an error. Any frame before the result
/// (status, output) means the request got past verification, so a refusal
/// or error after one counts as accepted.
fn outcome(stream: &mut impl Read) -> Seen {
    let mut before = Vec::new();
    loop {
        match read_server(stream) {
            Ok(ServerFrame::Result(r)) => {
                return match r.outcome {
                    Outcome::Completed { exit_status } => Seen::Completed(exit_status),
                    Outcome::Refused { reason } if before.is_empty() => Seen::Refused(reason),
                    other => Seen::Accepted(format!("{other:?} after {before:?}")),
                };
            }
            Ok(other) => before.push(format!("{other:?}").chars().take(80).collect::<String>()),
            Err(e) if before.is_empty() => return Seen::ConnectionError(e.to_string()),
            Err(e) => return Seen::Accepted(format!("{e} after {before:?}")),
        }
    }
}

/// Connects with `config`, writes `bytes` (raw, already framed), reads the answer.
fn send_raw(env: &Env, config: Arc<ClientConfig>, bytes: &[u8]) -> Seen {
    let mut tls = match connect(env, config) {
        Ok(t) => t,
        Err(e) => return Seen::ConnectionError(e),
    };
    if let Err(e) = tls.write_all(bytes).and_then(|_| tls.flush()) {
        return Seen::ConnectionError(format!("write: {e}"));
    }
    outcome(&mut tls)
}

fn send_frame(env: &Env, config: Arc<ClientConfig>, frame: &ClientFrame) -> Seen {
    let mut bytes = Vec::new();
    if let Err(e) = write_client(&mut bytes, frame) {
        return Seen::ConnectionError(format!("encoding: {e}"));
    }
    send_raw(env, config, &bytes)
}

fn framed(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![kind];
    v.extend((body.len() as u32).to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// A CA of our own and a client certificate from it that carries the real
/// certificate's URI name (this session's) and common name.
fn self_made_identity(real_cert: &str) -> Result<(String, String, String), String> {
    let der = certs(real_cert)?.into_iter().next().ok_or("no certificate in the session's PEM")?;
    let parsed = webpki::EndEntityCert::try_from(&der).map_err(|e| format!("{e:?}"))?;
    let uris: Vec<String> = parsed.valid_uri_names().map(str::to_owned).collect();
    let session = uris.first().and_then(|u| u.rsplit('/').next()).unwrap_or("session").to_string();
    let ca_key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "Lazaret Domain CA");
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(|e| e.to_string())?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params.distinguished_name.push(rcgen::DnType::CommonName, session);
    for uri in &uris {
        params.subject_alt_names.push(rcgen::SanType::URI(uri.clone().try_into().map_err(|e: rcgen::Error| e.to_string())?));
    }
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    let cert = params.signed_by(&key, &issuer).map_err(|e| e.to_string())?;
    Ok((cert.pem(), key.serialize_pem(), ca_cert.pem()))
}

fn report(case: &str, seen: &Seen) {
    println!("case {case}: {seen}");
}

fn hostile() -> i32 {
    let env = match env() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("hostile: {e}");
            return 1;
        }
    };
    let valid = match client_config(&env.ca, Some((&env.cert, &env.key))) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hostile: the session's own credentials: {e}");
            return 1;
        }
    };

    // No client certificate at all.
    let seen = match client_config(&env.ca, None) {
        Ok(c) => send_frame(&env, c, &ClientFrame::Request(request(&env, &random_id(), "pwned-no-cert"))),
        Err(e) => Seen::ConnectionError(e),
    };
    report("no-cert", &seen);

    // A self-made CA's certificate naming this very session.
    let seen = match self_made_identity(&env.cert) {
        Ok((cert, key, own_ca)) => {
            // Trust the real CA for the server (so the handshake gets as far
            // as the client certificate); the chain offered includes our CA.
            let chain = format!("{cert}{own_ca}");
            match client_config(&env.ca, Some((&chain, &key))) {
                Ok(c) => send_frame(&env, c, &ClientFrame::Request(request(&env, &random_id(), "pwned-self-ca"))),
                Err(e) => Seen::ConnectionError(e),
            }
        }
        Err(e) => Seen::ConnectionError(format!("making the certificate: {e}")),
    };
    report("self-ca", &seen);

    // A replayed request ID: the first use is valid and runs, the second is refused.
    let id = random_id();
    let first = send_frame(&env, valid.clone(), &ClientFrame::Request(request(&env, &id, "replay-first")));
    report("replay-first", &first);
    let seen = send_frame(&env, valid.clone(), &ClientFrame::Request(request(&env, &id, "pwned-replay")));
    report("replay", &seen);

    // Oversized: a control frame one byte over the limit (the body sent
    // too, as far as the coordinator reads it), and one claiming 4 GiB.
    let mut big = vec![KIND_CONTROL];
    big.extend(((MAX_CONTROL + 1) as u32).to_be_bytes());
    big.extend(std::iter::repeat_n(b' ', MAX_CONTROL + 1));
    report("oversized-frame", &send_raw(&env, valid.clone(), &big));
    report("huge-length", &send_raw(&env, valid.clone(), &[KIND_CONTROL, 0xff, 0xff, 0xff, 0xff]));
    let mut long = request(&env, &random_id(), "pwned-long-argv");
    long.argv.push("x".repeat(MAX_ARGV_BYTES));
    // Sent as a raw frame: write_client would refuse to encode it.
    let body = serde_json::to_vec(&ClientFrame::Request(long)).unwrap_or_default();
    report("argv-too-long", &send_raw(&env, valid.clone(), &framed(KIND_CONTROL, &body)));

    // Malformed.
    report("not-json", &send_raw(&env, valid.clone(), &framed(KIND_CONTROL, b"{\"type\":\"Request\",")));
    report(
        "unknown-type",
        &send_raw(&env, valid.clone(), &framed(KIND_CONTROL, b"{\"type\":\"Run\",\"cmd\":\"touch pwned-unknown-type\"}")),
    );
    report("unknown-kind", &send_raw(&env, valid.clone(), &framed(9, b"{}")));
    report("output-frame", &send_raw(&env, valid.clone(), &framed(KIND_STDOUT, b"touch pwned-output-frame")));
    report("cancel-first", &send_frame(&env, valid.clone(), &ClientFrame::Cancel));
    report("cut-short", &{
        let mut bytes = Vec::new();
        let _ = write_client(&mut bytes, &ClientFrame::Request(request(&env, &random_id(), "pwned-cut-short")));
        bytes.truncate(bytes.len() - 3);
        // Then half-close: the coordinator sees the frame end early.
        match connect(&env, valid.clone()) {
            Ok(mut tls) => {
                let _ = tls.write_all(&bytes).and_then(|_| tls.flush());
                tls.conn.send_close_notify();
                let _ = tls.flush();
                outcome(&mut tls)
            }
            Err(e) => Seen::ConnectionError(e),
        }
    });
    let mut bad = request(&env, &random_id(), "pwned-bad-version");
    bad.version = ESCALATION_VERSION + 1;
    report("bad-version", &send_frame(&env, valid.clone(), &ClientFrame::Request(bad)));
    let mut bad = request(&env, &random_id(), "pwned-bad-id");
    bad.id = bad.id.to_uppercase();
    report("bad-id", &send_frame(&env, valid.clone(), &ClientFrame::Request(bad)));
    let mut bad = request(&env, &random_id(), "pwned-relative-cwd");
    bad.cwd = "relative".into();
    report("relative-cwd", &send_frame(&env, valid.clone(), &ClientFrame::Request(bad)));
    let mut bad = request(&env, &random_id(), "pwned-nul");
    bad.argv.push("a\0b".into());
    let body = serde_json::to_vec(&ClientFrame::Request(bad)).unwrap_or_default();
    report("nul-argument", &send_raw(&env, valid.clone(), &framed(KIND_CONTROL, &body)));

    // And a valid request afterwards still runs.
    let last = send_frame(&env, valid, &ClientFrame::Request(request(&env, &random_id(), "valid-after")));
    report("valid-after", &last);
    0
}
