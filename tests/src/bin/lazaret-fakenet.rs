//! The fake internet's servers for the network tests. It runs inside a
//! network namespace the test created (`nsenter --net=...`) and is ended by
//! the test, by PID.
//!
//! - `serve PORT ADDR...`: on each address, a TCP server that greets with
//!   `hello from ADDR` and a UDP server that answers `ping` with `pong from
//!   ADDR`; every UDP datagram received is logged on stdout as
//!   `udp ADDR <- SRC: PAYLOAD`.
//! - `bulk PORT ADDR`: reads a byte count line and sends that many bytes
//!   (for throughput benchmarks).
//! - `dns ADDR ANSWER`: a DNS server on ADDR:53 answering every A query
//!   with ANSWER.
//! - `dns ADDR ANSWER TTL LOG`: the same with TTL seconds, over UDP and
//!   TCP, appending `dns NAME` (`dns-tcp NAME`) to the file LOG for every
//!   query it receives (so a test can tell which names reached it).
//! - `dns ADDR ANSWER TTL LOG ANSWER6`: the same, answering AAAA queries
//!   with ANSWER6 too (the others answer AAAA with no records).

#![forbid(unsafe_code)]

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::{Arc, Mutex};

/// Binds, waiting up to 3 s while the address is not usable yet: the
/// kernel can answer EADDRNOTAVAIL for an IPv6 address added an instant
/// before (seen under load on the lab's loopback addresses).
fn bind_when_ready<T>(bind: impl Fn() -> std::io::Result<T>) -> std::io::Result<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match bind() {
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let mut handles = Vec::new();
    match args.first().map(String::as_str) {
        Some("serve") if args.len() >= 3 => {
            let port: u16 = args[1].parse().expect("PORT");
            for a in &args[2..] {
                let ip: IpAddr = a.parse().expect("ADDR");
                let tcp =
                    bind_when_ready(|| TcpListener::bind(SocketAddr::new(ip, port))).unwrap_or_else(|e| panic!("tcp {ip}:{port}: {e}"));
                handles.push(std::thread::spawn(move || {
                    for conn in tcp.incoming().flatten() {
                        let mut conn = conn;
                        let _ = writeln!(conn, "hello from {ip}");
                    }
                }));
                let udp = bind_when_ready(|| UdpSocket::bind(SocketAddr::new(ip, port))).unwrap_or_else(|e| panic!("udp {ip}:{port}: {e}"));
                let out = out.clone();
                handles.push(std::thread::spawn(move || {
                    let mut buf = [0u8; 2048];
                    while let Ok((n, from)) = udp.recv_from(&mut buf) {
                        let payload = String::from_utf8_lossy(&buf[..n]).into_owned();
                        if let Ok(mut o) = out.lock() {
                            let _ = writeln!(o, "udp {ip} <- {}: {payload}", from.ip());
                            let _ = o.flush();
                        }
                        if payload.starts_with("ping") {
                            let _ = udp.send_to(format!("pong from {ip}").as_bytes(), from);
                        }
                    }
                }));
            }
        }
        Some("bulk") if args.len() == 3 => {
            // Reads a byte count line, sends that many bytes, closes.
            let ip: IpAddr = args[2].parse().expect("ADDR");
            let port: u16 = args[1].parse().expect("PORT");
            let tcp = bind_when_ready(|| TcpListener::bind(SocketAddr::new(ip, port))).unwrap_or_else(|e| panic!("bulk {ip}:{port}: {e}"));
            handles.push(std::thread::spawn(move || {
                for conn in tcp.incoming().flatten() {
                    std::thread::spawn(move || {
                        let mut conn = conn;
                        let mut line = String::new();
                        let mut reader = std::io::BufReader::new(conn.try_clone().expect("clone"));
                        if std::io::BufRead::read_line(&mut reader, &mut line).is_err() {
                            return;
                        }
                        let mut left: u64 = line.trim().parse().unwrap_or(0);
                        let chunk = vec![0x5au8; 64 * 1024];
                        while left > 0 {
                            let n = left.min(chunk.len() as u64) as usize;
                            if conn.write_all(&chunk[..n]).is_err() {
                                return;
                            }
                            left -= n as u64;
                        }
                    });
                }
            }));
        }
        Some("dns") if args.len() == 5 || args.len() == 6 => {
            let ip: IpAddr = args[1].parse().expect("ADDR");
            let answer: Ipv4Addr = args[2].parse().expect("ANSWER");
            let answer6: Option<Ipv6Addr> = args.get(5).map(|a| a.parse().expect("ANSWER6"));
            let ttl: u32 = args[3].parse().expect("TTL");
            let log = Arc::new(Mutex::new(std::fs::OpenOptions::new().create(true).append(true).open(&args[4]).expect("LOG")));
            let note = move |log: &Mutex<std::fs::File>, kind: &str, query: &[u8]| {
                if let Ok((_, question)) = lazaret_netpolicy::dnswire::parse_query(query) {
                    let mut file = log.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = writeln!(file, "{kind} {}", question.name);
                }
            };
            let udp = bind_when_ready(|| UdpSocket::bind(SocketAddr::new(ip, 53))).unwrap_or_else(|e| panic!("dns {ip}:53: {e}"));
            let tcp = bind_when_ready(|| TcpListener::bind(SocketAddr::new(ip, 53))).unwrap_or_else(|e| panic!("dns tcp {ip}:53: {e}"));
            let udp_log = log.clone();
            handles.push(std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while let Ok((n, from)) = udp.recv_from(&mut buf) {
                    note(&udp_log, "dns", &buf[..n]);
                    if let Some(reply) = dns_answer_ttl(&buf[..n], answer, answer6, ttl) {
                        let _ = udp.send_to(&reply, from);
                    }
                }
            }));
            handles.push(std::thread::spawn(move || {
                use std::io::Read;
                for mut conn in tcp.incoming().flatten() {
                    let mut length = [0u8; 2];
                    if conn.read_exact(&mut length).is_err() {
                        continue;
                    }
                    let mut query = vec![0; usize::from(u16::from_be_bytes(length))];
                    if conn.read_exact(&mut query).is_err() {
                        continue;
                    }
                    note(&log, "dns-tcp", &query);
                    if let Some(reply) = dns_answer_ttl(&query, answer, answer6, ttl) {
                        let _ = conn.write_all(&[&(reply.len() as u16).to_be_bytes()[..], &reply].concat());
                    }
                }
            }));
        }
        Some("dns") if args.len() == 3 => {
            let ip: IpAddr = args[1].parse().expect("ADDR");
            let answer: Ipv4Addr = args[2].parse().expect("ANSWER");
            let udp = bind_when_ready(|| UdpSocket::bind(SocketAddr::new(ip, 53))).unwrap_or_else(|e| panic!("dns {ip}:53: {e}"));
            handles.push(std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while let Ok((n, from)) = udp.recv_from(&mut buf) {
                    if let Some(reply) = dns_answer(&buf[..n], answer) {
                        let _ = udp.send_to(&reply, from);
                    }
                }
            }));
        }
        _ => {
            eprintln!("usage: lazaret-fakenet serve PORT ADDR... | bulk PORT ADDR | dns ADDR ANSWER");
            std::process::exit(2);
        }
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    for h in handles {
        let _ = h.join();
    }
}

/// A response to a standard query: the question echoed, and for type A one
/// answer with `answer` (TTL 60); other types get an empty answer section.
fn dns_answer(query: &[u8], answer: Ipv4Addr) -> Option<Vec<u8>> {
    dns_answer_ttl(query, answer, None, 60)
}

/// [`dns_answer`] with the answer's TTL, and AAAA queries answered with
/// `answer6` when given.
fn dns_answer_ttl(query: &[u8], answer: Ipv4Addr, answer6: Option<Ipv6Addr>, ttl: u32) -> Option<Vec<u8>> {
    if query.len() < 12 {
        return None;
    }
    // Skip the question name.
    let mut i = 12;
    while i < query.len() && query[i] != 0 {
        i += 1 + query[i] as usize;
    }
    let qend = i + 5; // zero byte + QTYPE + QCLASS
    if qend > query.len() {
        return None;
    }
    let qtype = u16::from_be_bytes([query[i + 1], query[i + 2]]);
    let is_a = qtype == 1;
    let aaaa = answer6.filter(|_| qtype == 28);
    let mut r = Vec::with_capacity(qend + 28);
    r.extend_from_slice(&query[0..2]); // ID
    r.extend_from_slice(&[0x81, 0x80]); // response, RD, RA, no error
    r.extend_from_slice(&[0, 1, 0, u8::from(is_a || aaaa.is_some()), 0, 0, 0, 0]);
    r.extend_from_slice(&query[12..qend]);
    if is_a {
        r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
        r.extend_from_slice(&ttl.to_be_bytes());
        r.extend_from_slice(&[0, 4]);
        r.extend_from_slice(&answer.octets());
    }
    if let Some(address) = aaaa {
        r.extend_from_slice(&[0xc0, 0x0c, 0, 28, 0, 1]);
        r.extend_from_slice(&ttl.to_be_bytes());
        r.extend_from_slice(&[0, 16]);
        r.extend_from_slice(&address.octets());
    }
    Some(r)
}
