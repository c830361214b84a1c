//! `lazaret-escalate` against an in-process stand-in for the coordinator: a
//! rustls TLS 1.3 server with client authentication, speaking the escalation
//! channel, in a network namespace each test makes for itself (so nothing
//! leaves it). The client runs, as in a sandbox, under
//! `lazaret-session-init`, its session's broker, which gets the session's
//! credentials on its descriptor `session::CREDENTIALS_FD` and makes the
//! TLS connection. Needs root for the namespace; the tests that need no
//! network (usage, missing environment) run without.
//!
//! Run: `cargo test -p lazaret-protocol --features client --test escalate_client`

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use lazaret_protocol::escalation::{
    ClientFrame, ESCALATION_VERSION, EscalationRequest, EscalationResult, Outcome, ServerFrame, exit, read_client, write_server,
};
use lazaret_protocol::session::{CREDENTIALS_FD, ENV_BROKER, SessionCredentials};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection, StreamOwned};

const BIN: &str = env!("CARGO_BIN_EXE_lazaret-escalate");
const SESSION_INIT: &str = env!("CARGO_BIN_EXE_lazaret-session-init");
/// No single client run in these tests may take longer.
const CLIENT_LIMIT: Duration = Duration::from_secs(30);

type Tls = StreamOwned<ServerConnection, TcpStream>;

// ---------------------------------------------------------------------------
// Certificates

struct Ca {
    pem: String,
    der: CertificateDer<'static>,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("ca key")).expect("ca cert");
    Ca { pem: issuer.pem(), der: issuer.der().clone(), issuer }
}

/// A leaf certificate for `san` signed by `ca`: (DER, PEM, PKCS#8 key DER, key PEM).
fn leaf(ca: &Ca, san: &str, usage: ExtendedKeyUsagePurpose) -> (CertificateDer<'static>, String, Vec<u8>, String) {
    let key = KeyPair::generate().expect("leaf key");
    let mut params = CertificateParams::new(vec![san.to_owned()]).expect("leaf params");
    params.distinguished_name.push(DnType::CommonName, san);
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, &ca.issuer).expect("leaf cert");
    (cert.der().clone(), cert.pem(), key.serialize_der(), key.serialize_pem())
}

/// What the client gets in its environment, and the server's side.
struct Pki {
    domain_ca: Ca,
    client_cert_pem: String,
    client_cert_der: CertificateDer<'static>,
    client_key_pem: String,
    server: Arc<ServerConfig>,
}

/// A Domain CA, a session certificate from it, and a server certificate for
/// 127.0.0.1 from `server_ca` (the Domain CA itself unless another is given).
fn pki(server_ca: Option<&Ca>) -> Pki {
    let domain_ca = ca("test Domain CA");
    let (client_cert_der, client_cert_pem, _, client_key_pem) = leaf(&domain_ca, "session-1", ExtendedKeyUsagePurpose::ClientAuth);
    let (server_der, _, server_key, _) = leaf(server_ca.unwrap_or(&domain_ca), "127.0.0.1", ExtendedKeyUsagePurpose::ServerAuth);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(domain_ca.der.clone()).expect("root");
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().expect("verifier");
    let server = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![server_der], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key)))
        .expect("server config");
    Pki { domain_ca, client_cert_pem, client_cert_der, client_key_pem, server: Arc::new(server) }
}

// ---------------------------------------------------------------------------
// Namespace, server and client plumbing

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "the escalate_client tests make network namespaces and need root: run them as root");
}

/// Runs `f` on a thread of its own in a new network namespace with only
/// `lo`, up. Sockets it opens and processes it starts stay in that
/// namespace, which disappears with them.
fn in_netns<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    require_root();
    thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare has no memory preconditions; CLONE_NEWNET on
            // this thread affects only this thread and what it starts.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
            loopback_up();
            f()
        })
        .join()
        .expect("namespace thread panicked")
    })
}

fn loopback_up() {
    // SAFETY: a plain socket call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: ifreq is plain data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `ifr` is a valid ifreq naming "lo"; the ioctls read and write
    // only it; the union member used for flags is the one these ioctls use.
    unsafe {
        assert_eq!(libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr), 0, "SIOCGIFFLAGS");
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        assert_eq!(libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr), 0, "SIOCSIFFLAGS: {}", std::io::Error::last_os_error());
        libc::close(fd);
    }
}

/// Accepts one connection on a TLS server and runs `script` on it, on a
/// thread of its own (in the caller's namespace).
fn serve<T: Send + 'static>(
    config: Arc<ServerConfig>,
    script: impl FnOnce(&mut Tls) -> Result<T, String> + Send + 'static,
) -> (SocketAddr, thread::JoinHandle<Result<T, String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let handle = thread::spawn(move || {
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + CLIENT_LIMIT;
        let sock = loop {
            match listener.accept() {
                Ok((sock, _)) => break sock,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(format!("accept: {e}")),
            }
        };
        sock.set_nonblocking(false).map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(CLIENT_LIMIT)).map_err(|e| e.to_string())?;
        let conn = ServerConnection::new(config).map_err(|e| e.to_string())?;
        let mut tls = StreamOwned::new(conn, sock);
        script(&mut tls)
    });
    (addr, handle)
}

/// The credentials of a session whose coordinator is at `addr`, on a
/// socket whose other end has them all (as the coordinator passes them).
fn credentials_socket(pki: &Pki, addr: SocketAddr) -> OwnedFd {
    let credentials = SessionCredentials {
        addr: addr.to_string(),
        ca: pki.domain_ca.pem.clone(),
        cert: pki.client_cert_pem.clone(),
        key: pki.client_key_pem.clone(),
    };
    let (mut ours, theirs) = UnixStream::pair().expect("socketpair");
    ours.write_all(&serde_json::to_vec(&credentials).expect("json")).expect("writing the credentials");
    theirs.into()
}

/// `program args` as a session's agent: under `lazaret-session-init` with
/// the session's credentials, with no other environment, in `/`.
fn command_in_session(pki: &Pki, addr: SocketAddr, program: &str, args: &[&str]) -> Command {
    let credentials = credentials_socket(pki, addr);
    let mut cmd = Command::new(SESSION_INIT);
    cmd.args(["--credentials", "--"])
        .arg(program)
        .args(args)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: dup2 and fcntl are async-signal-safe and touch only
    // descriptors; the socket stays open in this closure until the Command
    // is dropped.
    unsafe {
        cmd.pre_exec(move || {
            let fd = credentials.as_raw_fd();
            // The socket is close-on-exec. Already numbered CREDENTIALS_FD
            // (likely when tests run side by side), dup2 would do nothing
            // and exec would close it: clear the flag instead.
            let rc = if fd == CREDENTIALS_FD { libc::fcntl(fd, libc::F_SETFD, 0) } else { libc::dup2(fd, CREDENTIALS_FD) };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

fn client(pki: &Pki, addr: SocketAddr, args: &[&str]) -> Command {
    command_in_session(pki, addr, BIN, args)
}

/// Waits for `child`, collecting its output, killing it past the limit.
fn finish(mut child: Child, mut stdout_so_far: Vec<u8>) -> Output {
    let out = child.stdout.take();
    let err = child.stderr.take();
    let out_thread = thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut out) = out {
            let _ = out.read_to_end(&mut buf);
        }
        buf
    });
    let err_thread = thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut err) = err {
            let _ = err.read_to_end(&mut buf);
        }
        buf
    });
    let deadline = Instant::now() + CLIENT_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lazaret-escalate did not exit within {CLIENT_LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    stdout_so_far.extend(out_thread.join().expect("stdout reader"));
    Output { status, stdout: stdout_so_far, stderr: err_thread.join().expect("stderr reader") }
}

fn run(mut cmd: impl std::borrow::BorrowMut<Command>) -> Output {
    finish(cmd.borrow_mut().spawn().expect("spawn lazaret-escalate"), Vec::new())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn expect_request(tls: &mut Tls) -> Result<EscalationRequest, String> {
    match read_client(tls).map_err(|e| format!("reading the request: {e}"))? {
        ClientFrame::Request(request) => Ok(request),
        other => Err(format!("expected a request, got {other:?}")),
    }
}

fn send(tls: &mut Tls, frame: ServerFrame) -> Result<(), String> {
    write_server(tls, &frame).map_err(|e| format!("writing {frame:?}: {e}"))
}

fn result(outcome: Outcome, truncated: bool) -> ServerFrame {
    ServerFrame::Result(EscalationResult { outcome, truncated })
}

// ---------------------------------------------------------------------------
// Tests

#[test]
fn streams_binary_output_exactly_and_exits_with_the_host_status() {
    let pki = pki(None);
    let client_der = pki.client_cert_der.clone();
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let sent = big.clone();
    let (out, request) = in_netns(|| {
        let (addr, server) = serve(pki.server.clone(), move |tls| {
            let request = expect_request(tls)?;
            let peer = tls.conn.peer_certificates().map(<[_]>::to_vec);
            if peer.as_deref() != Some(std::slice::from_ref(&client_der)) {
                return Err(format!("the client did not authenticate with the session certificate: {peer:?}"));
            }
            send(tls, ServerFrame::Status("waiting for the developer".into()))?;
            send(tls, ServerFrame::Stdout(sent))?;
            send(tls, ServerFrame::Stderr(b"\x00err\xff\n".to_vec()))?;
            send(tls, ServerFrame::Stdout(b"tail".to_vec()))?;
            send(tls, result(Outcome::Completed { exit_status: 3 }, false))?;
            Ok(request)
        });
        let out = run(client(
            &pki,
            addr,
            &[
                "--justification",
                "push the fix",
                "--timeout",
                "30",
                "--cwd",
                "work/./x/../y",
                "--",
                "git",
                "push",
                "--force",
                "an arg with spaces",
                "ünïcode",
            ],
        ));
        (out, server.join().expect("server thread"))
    });
    let request = request.expect("server");
    assert_eq!(request.validate(), Ok(()));
    assert_eq!(request.version, ESCALATION_VERSION);
    assert_eq!(request.argv, ["git", "push", "--force", "an arg with spaces", "ünïcode"]);
    assert_eq!(request.cwd, "/work/y");
    assert_eq!(request.justification, "push the fix");
    assert_eq!(request.timeout_secs, Some(30));
    let mut expected = big;
    expected.extend_from_slice(b"tail");
    assert!(out.stdout == expected, "stdout differs ({} bytes, expected {})", out.stdout.len(), expected.len());
    // The status line is not shown: stderr is not a terminal.
    assert_eq!(out.stderr, b"\x00err\xff\n", "stderr: {}", stderr(&out));
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn request_ids_are_fresh_random_hex() {
    let pki = pki(None);
    let ids = in_netns(|| {
        let mut ids = Vec::new();
        for _ in 0..2 {
            let (addr, server) = serve(pki.server.clone(), |tls| {
                let request = expect_request(tls)?;
                send(tls, result(Outcome::Completed { exit_status: 0 }, false))?;
                Ok((request.id, request.cwd))
            });
            let out = run(client(&pki, addr, &["true"]));
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            ids.push(server.join().expect("server thread").expect("server"));
        }
        ids
    });
    // The default working directory is the client's own (the test runs it in /).
    assert_eq!(ids[0].1, "/");
    assert_eq!(ids[0].0.len(), 32);
    assert_ne!(ids[0].0, ids[1].0);
}

#[test]
fn each_outcome_has_its_code_and_one_line() {
    let cases: Vec<(Outcome, bool, i32, &str)> = vec![
        (Outcome::Completed { exit_status: 0 }, true, 0, "lazaret-escalate: output was truncated by Lazaret's limit\n"),
        (
            Outcome::Denied { reason: "rule \"no-push\"\nsays no\x1b[31m".into() },
            false,
            exit::DENIED,
            "lazaret-escalate: denied: rule \"no-push\"\\nsays no\\e[31m\n",
        ),
        (Outcome::TimedOut, false, exit::TIMED_OUT, "lazaret-escalate: timed out\n"),
        (Outcome::Cancelled, false, exit::CANCELLED, "lazaret-escalate: cancelled\n"),
        (Outcome::Failed { reason: "git: not found".into() }, false, exit::FAILED, "lazaret-escalate: failed: git: not found\n"),
        (
            Outcome::Refused { reason: "replayed request ID".into() },
            false,
            exit::UNAVAILABLE,
            "lazaret-escalate: unavailable: refused: replayed request ID\n",
        ),
        (
            Outcome::Completed { exit_status: 256 },
            false,
            exit::FAILED,
            "lazaret-escalate: failed: Lazaret reported exit status 256, which is not 0-255\n",
        ),
    ];
    let pki = pki(None);
    in_netns(|| {
        for (outcome, truncated, code, line) in cases {
            let frame = result(outcome.clone(), truncated);
            let (addr, server) = serve(pki.server.clone(), move |tls| {
                expect_request(tls)?;
                send(tls, frame)
            });
            let out = run(client(&pki, addr, &["--", "git", "push"]));
            server.join().expect("server thread").expect("server");
            assert_eq!(stderr(&out), line, "{outcome:?}");
            assert_eq!(out.status.code(), Some(code), "{outcome:?}");
            assert!(out.stdout.is_empty());
        }
    });
}

/// Spawns the client, waits until its stdout shows `marker` (so output is
/// streamed before the Result), then sends it `signal`.
fn signal_mid_request(signal: libc::c_int, answer_cancel: bool) -> (Output, Result<ClientFrame, String>, Duration) {
    let pki = pki(None);
    in_netns(|| {
        let (addr, server) = serve(pki.server.clone(), move |tls| {
            expect_request(tls)?;
            send(tls, ServerFrame::Stdout(b"started\n".to_vec()))?;
            let next = read_client(tls).map_err(|e| format!("reading the cancellation: {e}"))?;
            if answer_cancel {
                send(tls, result(Outcome::Cancelled, false))?;
            } else {
                // Hold the connection open without answering.
                thread::sleep(Duration::from_secs(8));
            }
            Ok(next)
        });
        let mut child = client(&pki, addr, &["--", "sleep", "1000"]).spawn().expect("spawn");
        let mut stdout = child.stdout.take().expect("stdout");
        let mut seen = Vec::new();
        let mut buf = [0u8; 64];
        while !seen.ends_with(b"started\n") {
            let n = stdout.read(&mut buf).expect("read stdout");
            assert!(n > 0, "stdout closed before the output arrived: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
        child.stdout = Some(stdout);
        let pid = i32::try_from(child.id()).expect("pid");
        let sent_at = Instant::now();
        // SAFETY: kill has no memory preconditions; `pid` is our own child,
        // not yet waited for.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let out = finish(child, seen);
        let took = sent_at.elapsed();
        (out, server.join().expect("server thread"), took)
    })
}

#[test]
fn sigint_mid_request_cancels_and_exits_130() {
    let (out, next, _) = signal_mid_request(libc::SIGINT, true);
    assert_eq!(next, Ok(ClientFrame::Cancel));
    assert_eq!(out.stdout, b"started\n");
    assert_eq!(stderr(&out), "lazaret-escalate: cancelled\n");
    assert_eq!(out.status.code(), Some(exit::CANCELLED));
}

#[test]
fn sigterm_without_an_answer_gives_up_after_the_grace() {
    let (out, next, took) = signal_mid_request(libc::SIGTERM, false);
    assert_eq!(next, Ok(ClientFrame::Cancel));
    assert_eq!(stderr(&out), "lazaret-escalate: cancelled\n");
    assert_eq!(out.status.code(), Some(exit::CANCELLED));
    assert!(took >= Duration::from_secs(4) && took < Duration::from_secs(8), "gave up after {took:?}");
}

#[test]
fn status_lines_are_shown_only_when_stderr_is_a_terminal() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: both out-pointers are valid; null name/termios/winsize are allowed.
    let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty just returned these descriptors; each is owned once.
    let (master, slave) = unsafe { (std::fs::File::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    // openpty's descriptors are inheritable: children other tests start
    // meanwhile would keep the slave open and the reader from its end.
    for fd in [master.as_raw_fd(), slave.as_raw_fd()] {
        // SAFETY: fcntl on a descriptor this test owns.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }, 0, "FD_CLOEXEC: {}", std::io::Error::last_os_error());
    }
    // Read as it comes; reading the master ends with EIO once the last
    // slave descriptor is closed.
    let reader = thread::spawn(move || {
        let mut shown = Vec::new();
        let _ = (&master).read_to_end(&mut shown);
        shown
    });
    let pki = pki(None);
    let out = in_netns(|| {
        let (addr, server) = serve(pki.server.clone(), |tls| {
            expect_request(tls)?;
            send(tls, ServerFrame::Status("waiting for the developer\x1b[2J".into()))?;
            send(tls, ServerFrame::Stderr(b"host stderr\n".to_vec()))?;
            send(tls, result(Outcome::Completed { exit_status: 0 }, false))
        });
        let mut cmd = client(&pki, addr, &["--", "git", "push"]);
        cmd.stderr(Stdio::from(slave));
        let child = cmd.spawn().expect("spawn");
        // The child has the terminal now; the parent's copy must close so
        // the master sees the end.
        drop(cmd);
        let out = finish(child, Vec::new());
        server.join().expect("server thread").expect("server");
        out
    });
    assert_eq!(out.status.code(), Some(0));
    let shown = reader.join().expect("terminal reader");
    let shown = String::from_utf8_lossy(&shown);
    assert_eq!(shown, "lazaret-escalate: waiting for the developer\\e[2J\r\nhost stderr\r\n");
}

#[test]
fn a_closed_stdout_cancels_and_exits_141() {
    let pki = pki(None);
    let (out, next) = in_netns(|| {
        let (addr, server) = serve(pki.server.clone(), |tls| {
            expect_request(tls)?;
            send(tls, ServerFrame::Stdout(b"nobody reads this".to_vec()))?;
            read_client(tls).map_err(|e| format!("reading the cancellation: {e}"))
        });
        let mut child = client(&pki, addr, &["--", "git", "log"]).spawn().expect("spawn");
        // Close the read end before any output can arrive.
        drop(child.stdout.take());
        let out = finish(child, Vec::new());
        (out, server.join().expect("server thread"))
    });
    assert_eq!(next.expect("server"), ClientFrame::Cancel);
    assert_eq!(stderr(&out), "");
    assert_eq!(out.status.code(), Some(141));
}

#[test]
fn a_server_certificate_from_another_ca_is_refused() {
    let other = ca("someone else's CA");
    let pki = pki(Some(&other));
    let (out, served) = in_netns(|| {
        let (addr, server) = serve(pki.server.clone(), |tls| expect_request(tls).map(|_| ()));
        let out = run(client(&pki, addr, &["--", "git", "push"]));
        (out, server.join().expect("server thread"))
    });
    assert!(served.is_err(), "the server got a request over an untrusted certificate");
    let err = stderr(&out);
    assert!(err.starts_with("lazaret-escalate: unavailable: TLS with Lazaret failed: ") && err.contains("UnknownIssuer"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(out.status.code(), Some(exit::UNAVAILABLE));
}

#[test]
fn a_client_certificate_from_another_ca_is_refused_by_the_server() {
    let mut pki = pki(None);
    let other = ca("someone else's CA");
    let (_, cert_pem, _, key_pem) = leaf(&other, "session-1", ExtendedKeyUsagePurpose::ClientAuth);
    pki.client_cert_pem = cert_pem;
    pki.client_key_pem = key_pem;
    let (out, served) = in_netns(|| {
        let (addr, server) = serve(pki.server.clone(), |tls| expect_request(tls).map(|_| ()));
        let out = run(client(&pki, addr, &["--", "git", "push"]));
        (out, server.join().expect("server thread"))
    });
    assert!(served.is_err(), "the server accepted a foreign client certificate");
    let err = stderr(&out);
    assert!(err.starts_with("lazaret-escalate: unavailable: TLS with Lazaret failed: "), "{err}");
    assert_eq!(out.status.code(), Some(exit::UNAVAILABLE));
}

#[test]
fn a_connection_closed_without_a_result_is_unavailable() {
    let pki = pki(None);
    let out = in_netns(|| {
        let (addr, server) = serve(pki.server.clone(), |tls| {
            expect_request(tls)?;
            send(tls, ServerFrame::Stdout(b"partial".to_vec()))
            // Dropped without a Result (and without close_notify).
        });
        let out = run(client(&pki, addr, &["--", "git", "push"]));
        server.join().expect("server thread").expect("server");
        out
    });
    assert_eq!(out.stdout, b"partial");
    assert_eq!(stderr(&out), "lazaret-escalate: unavailable: lost the connection to Lazaret\n");
    assert_eq!(out.status.code(), Some(exit::UNAVAILABLE));
}

#[test]
fn nobody_listening_is_unavailable() {
    let pki = pki(None);
    let out = in_netns(|| {
        let addr = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port");
        run(client(&pki, addr, &["--", "git", "push"]))
    });
    let err = stderr(&out);
    assert!(err.starts_with("lazaret-escalate: unavailable: cannot reach Lazaret at 127.0.0.1:"), "{err}");
    assert_eq!(out.status.code(), Some(exit::UNAVAILABLE));
}

/// The static build (scripts/build-escalate.sh; a no-op when already
/// built, or `LAZARET_ESCALATE_STATIC_BIN` names it) in a root that holds
/// nothing but the binary: no C library, no /etc, no /dev.
fn static_binary() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("LAZARET_ESCALATE_STATIC_BIN") {
        return path.into();
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/build-escalate.sh");
    // Only the variables a developer's shell would have: the ones cargo sets
    // for a test (LD_LIBRARY_PATH, CARGO_*) change build-script fingerprints
    // and would make every run rebuild from scratch.
    let mut cmd = Command::new("bash");
    cmd.arg(script).env_clear().stderr(Stdio::inherit());
    for keep in ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN", "CARGO_TARGET_DIR"] {
        if let Some(value) = std::env::var_os(keep) {
            cmd.env(keep, value);
        }
    }
    let out = cmd.output().expect("run build-escalate.sh");
    assert!(out.status.success(), "build-escalate.sh failed");
    let path = String::from_utf8(out.stdout).expect("path");
    path.trim_end().into()
}

/// A directory removed on drop.
struct TempRoot(std::path::PathBuf);

impl Drop for TempRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_static_binary_works_in_a_root_without_libc() {
    require_root();
    let bin = static_binary();
    let root = TempRoot(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("escalate-root-{}", std::process::id())));
    std::fs::create_dir_all(&root.0).expect("root");
    std::fs::copy(&bin, root.0.join("lazaret-escalate")).expect("copy the binary");
    let entries: Vec<_> = std::fs::read_dir(&root.0).expect("read root").collect();
    assert_eq!(entries.len(), 1, "the root holds more than the binary");
    let pki = pki(None);
    let (out, request) = in_netns(|| {
        let (addr, server) = serve(pki.server.clone(), |tls| {
            let request = expect_request(tls)?;
            send(tls, ServerFrame::Stdout(b"out\x00".to_vec()))?;
            send(tls, ServerFrame::Stderr(b"err".to_vec()))?;
            send(tls, result(Outcome::Completed { exit_status: 5 }, false))?;
            Ok(request)
        });
        // chroot(8) runs outside, then execs the binary inside the empty root.
        let root = root.0.to_str().expect("root path");
        let chrooted = command_in_session(&pki, addr, "/usr/sbin/chroot", &[root, "/lazaret-escalate", "--", "git", "push"]);
        let out = run(chrooted);
        (out, server.join().expect("server thread"))
    });
    assert_eq!(request.expect("server").argv, ["git", "push"]);
    assert_eq!(out.stdout, b"out\x00", "stderr: {}", stderr(&out));
    assert_eq!(out.stderr, b"err");
    assert_eq!(out.status.code(), Some(5));
}

#[test]
fn missing_environment_is_unavailable() {
    let out = run(Command::new(BIN).args(["--", "git", "push"]).env_clear().stdout(Stdio::piped()).stderr(Stdio::piped()));
    assert_eq!(stderr(&out), "lazaret-escalate: unavailable: not inside a Lazaret session (LAZARET_ESCALATE_SOCKET is not set)\n");
    assert_eq!(out.status.code(), Some(exit::UNAVAILABLE));
    let nobody = format!("@lazaret-escalate/nobody-{}", std::process::id());
    for (value, says) in [
        (nobody.as_str(), "cannot reach this session's escalation broker: "),
        ("/tmp/x", "LAZARET_ESCALATE_SOCKET is not an abstract socket name"),
    ] {
        let out = run(Command::new(BIN)
            .args(["--", "git", "push"])
            .env_clear()
            .env(ENV_BROKER, value)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()));
        let err = stderr(&out);
        assert!(err.starts_with(&format!("lazaret-escalate: unavailable: {says}")) && err.lines().count() == 1, "{value}: {err}");
        assert_eq!(out.status.code(), Some(exit::UNAVAILABLE));
    }
}

/// A process that is not of the broker's session (here: not a descendant
/// of its `lazaret-session-init`) is refused, and the coordinator never
/// hears of it; the session's own process is served.
#[test]
fn the_broker_serves_only_its_own_sessions_processes() {
    let pki = pki(None);
    in_netns(|| {
        let outsider_port = TcpListener::bind("127.0.0.1:0").expect("bind");
        outsider_port.set_nonblocking(true).expect("nonblocking");
        let addr = outsider_port.local_addr().expect("addr");
        let mut session = command_in_session(&pki, addr, "/bin/sh", &["-c", "echo \"$LAZARET_ESCALATE_SOCKET\"; exec sleep 30"])
            .spawn()
            .expect("spawning the session");
        let mut line = String::new();
        std::io::BufReader::new(session.stdout.take().expect("stdout")).read_line(&mut line).expect("the broker's name");
        let broker = line.trim_end().to_owned();
        assert!(broker.starts_with("@lazaret-escalate/"), "{broker:?}");
        // The same client, started by this test, not by the session.
        let out = run(Command::new(BIN)
            .args(["--", "touch", "/tmp/pwned"])
            .env_clear()
            .env(ENV_BROKER, &broker)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()));
        let _ = session.kill();
        let _ = session.wait();
        assert_eq!(
            stderr(&out),
            "lazaret-escalate: unavailable: refused: the escalation broker serves only processes of its own session\n"
        );
        assert_eq!(out.status.code(), Some(exit::UNAVAILABLE));
        assert!(outsider_port.accept().is_err(), "the broker connected to the coordinator for an outsider");
    });
}

#[test]
fn usage_errors_exit_64_with_one_line() {
    for args in [&[][..], &["--timeout", "0", "--", "ls"], &["--bogus", "ls"], &["--cwd"], &["--"]] {
        let out = run(Command::new(BIN).args(args).env_clear().stdout(Stdio::piped()).stderr(Stdio::piped()));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(exit::USAGE), "{args:?}: {err}");
        assert!(err.starts_with("lazaret-escalate: ") && err.lines().count() == 1, "{args:?}: {err}");
    }
    let out = run(Command::new(BIN).arg("--help").env_clear().stdout(Stdio::piped()).stderr(Stdio::piped()));
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for code in [exit::USAGE, exit::UNAVAILABLE, exit::DENIED, exit::TIMED_OUT, exit::FAILED, exit::CANCELLED, 141] {
        assert!(help.contains(&format!("\n  {code} ")), "--help does not document exit code {code}:\n{help}");
    }
}

/// A session whose agent prints the broker's name, then waits for a line
/// on its stdin and runs `lazaret-escalate -- git push`: the session, the
/// broker's name and the agent's stdin (write a line to make the request).
fn session_waiting_to_escalate(pki: &Pki, addr: SocketAddr) -> (Child, String, std::process::ChildStdin) {
    let script = "echo \"$LAZARET_ESCALATE_SOCKET\"; read go; exec \"$0\" -- git push";
    let mut session =
        command_in_session(pki, addr, "/bin/sh", &["-c", script, BIN]).stdin(Stdio::piped()).spawn().expect("spawning the session");
    let mut stdout = session.stdout.take().expect("stdout");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") {
        let n = stdout.read(&mut byte).expect("the broker's name");
        assert!(n > 0, "the session ended before naming its broker");
        line.push(byte[0]);
    }
    session.stdout = Some(stdout);
    let broker = String::from_utf8(line).expect("name").trim_end().to_owned();
    assert!(broker.starts_with("@lazaret-escalate/"), "{broker:?}");
    let stdin = session.stdin.take().expect("stdin");
    (session, broker, stdin)
}

/// A connection to the broker `name` (`@NAME`) from this test: not of the
/// broker's session.
fn connect_to_broker(name: &str) -> UnixStream {
    use std::os::linux::net::SocketAddrExt;
    let abstract_name = name.strip_prefix('@').expect("an abstract name");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).expect("address");
    UnixStream::connect_addr(&addr).expect("connecting to the broker")
}

/// Sends one byte on `sock` with `fds` attached (SCM_RIGHTS).
fn send_byte_with_fds(sock: &UnixStream, fds: &[std::os::fd::RawFd]) {
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut byte = [b'x'];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds CMSG_SPACE(payload) zeroed, aligned
    // bytes: the first header and its data fit; `msg`, `iov` and `byte`
    // live across sendmsg.
    let sent = unsafe {
        let header = libc::CMSG_FIRSTHDR(&raw const msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(header), payload);
        libc::sendmsg(sock.as_raw_fd(), &raw const msg, 0)
    };
    assert_eq!(sent, 1, "sendmsg: {}", std::io::Error::last_os_error());
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the broker's descriptors").count()
}

/// Waits for a session started by [`session_waiting_to_escalate`] and
/// checks that its request reached the coordinator and was answered.
fn expect_escalation_served(session: Child, server: thread::JoinHandle<Result<EscalationRequest, String>>) {
    let out = finish(session, Vec::new());
    let request = server.join().expect("server thread");
    assert_eq!(request.expect("server").argv, ["git", "push"], "{}", stderr(&out));
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
}

fn answer_with_7(tls: &mut Tls) -> Result<EscalationRequest, String> {
    let request = expect_request(tls)?;
    send(tls, result(Outcome::Completed { exit_status: 7 }, false))?;
    Ok(request)
}

/// Descriptors another session passes with its first bytes are closed,
/// refused or not: the broker cannot be made to run out of them.
#[test]
fn descriptors_passed_to_the_broker_are_closed() {
    let pki = pki(None);
    in_netns(|| {
        let (addr, server) = serve(pki.server.clone(), answer_with_7);
        let (session, broker, mut go) = session_waiting_to_escalate(&pki, addr);
        let null = std::fs::File::open("/dev/null").expect("/dev/null");
        let hostile = |count: usize| {
            let mut sock = connect_to_broker(&broker);
            send_byte_with_fds(&sock, &vec![null.as_raw_fd(); count]);
            // The broker answers (or closes) once it has read them.
            let mut answer = Vec::new();
            let _ = sock.read_to_end(&mut answer);
        };
        hostile(4);
        let before = open_descriptors(session.id());
        for round in 0..100 {
            // Some that fit the broker's buffer, some that do not.
            hostile(if round % 2 == 0 { 4 } else { 40 });
        }
        let after = open_descriptors(session.id());
        assert!(after <= before + 1, "the broker went from {before} to {after} open descriptors");
        writeln!(go, "go").expect("starting the request");
        expect_escalation_served(session, server);
    });
}

/// Connections that never send anything (another session's) do not keep
/// the session's own requests out.
#[test]
fn idle_connections_do_not_keep_the_session_out() {
    let pki = pki(None);
    in_netns(|| {
        let (addr, server) = serve(pki.server.clone(), answer_with_7);
        let (session, broker, mut go) = session_waiting_to_escalate(&pki, addr);
        let idle: Vec<UnixStream> = (0..80).map(|_| connect_to_broker(&broker)).collect();
        // Let the broker accept them all.
        thread::sleep(Duration::from_millis(300));
        writeln!(go, "go").expect("starting the request");
        expect_escalation_served(session, server);
        drop(idle);
    });
}
