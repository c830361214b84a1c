//! A session's terminal side: copies between the developer's terminal (in
//! raw mode, restored on every exit path) and the agent's PTY master,
//! forwards signals as messages, and returns the agent's exit status.
//! Without a terminal the agent has the client's own stdio and this only
//! waits for the exit.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

use lazaret_protocol::wire::{self, ClientMessage, CoordinatorMessage};
use lazaret_runtime::signals::Signals;
use lazaret_runtime::terminal::{sync_window_size, RawModeGuard};
use lazaret_runtime::ExitStatus;

use crate::layout::DomainDir;
use crate::LAZARET_FAILED;

use super::control::wait_unlocked;
use super::ClientError;

/// How long a client waits for a Domain to finish going down.
const DOWN_LIMIT: Duration = Duration::from_secs(60);

/// Serves the session until the coordinator reports the agent's exit.
pub(super) fn attach(stream: &UnixStream, master: Option<OwnedFd>, signals: &mut Signals, dir: &DomainDir) -> Result<ExitStatus, ClientError> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let raw = match &master {
        Some(_) => Some(RawModeGuard::enter(stdin.as_fd()).map_err(ClientError::errno("setting the terminal to raw mode"))?),
        None => None,
    };
    if let Some(m) = &master {
        sync_window_size(stdin.as_fd(), m.as_fd());
        let _ = nix::fcntl::fcntl(m, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
    }
    let mut master_open = master.is_some();
    let mut input_open = master.is_some();
    let mut to_master: Vec<u8> = Vec::new();
    let mut exit: Option<(i32, bool)> = None;
    let mut terminations = 0u32;
    let mut buf = vec![0u8; 16 * 1024];
    let mut out = stream;
    loop {
        let mut fds = vec![PollFd::new(signals.fd(), PollFlags::POLLIN)];
        let sock_idx = fds.len();
        if exit.is_none() {
            fds.push(PollFd::new(stream.as_fd(), PollFlags::POLLIN));
        }
        let master_idx = fds.len();
        if let (Some(m), true) = (&master, master_open) {
            let mut f = PollFlags::POLLIN;
            if !to_master.is_empty() {
                f |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(m.as_fd(), f));
        }
        let input_idx = fds.len();
        if input_open && master_open && to_master.len() < 64 * 1024 {
            fds.push(PollFd::new(stdin.as_fd(), PollFlags::POLLIN));
        }
        let timeout = if exit.is_some() { PollTimeout::from(100u16) } else { PollTimeout::NONE };
        let ready = match poll(&mut fds, timeout) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(ClientError::errno("waiting for terminal events")(e)),
            Ok(n) => n,
        };
        if exit.is_some() && (ready == 0 || !master_open) {
            break;
        }
        let revents = |i: usize| fds.get(i).and_then(|f| f.revents()).unwrap_or(PollFlags::empty());
        let sig_ready = revents(0).contains(PollFlags::POLLIN);
        let sock_ev = if exit.is_none() { revents(sock_idx) } else { PollFlags::empty() };
        let master_ev = if master_open && master.is_some() { revents(master_idx) } else { PollFlags::empty() };
        let input_ev = if fds.len() > input_idx { revents(input_idx) } else { PollFlags::empty() };
        drop(fds);
        if sig_ready {
            while let Some(sig) = signals.next_pending() {
                match sig {
                    Signal::SIGWINCH => {
                        if let Some(m) = &master {
                            sync_window_size(stdin.as_fd(), m.as_fd());
                        }
                    }
                    // In raw mode the terminal sends no INT/QUIT; a hangup
                    // or a signal from another process ends the agent too.
                    Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT => {
                        terminations += 1;
                        let signal = if terminations == 1 { sig as i32 } else { libc::SIGKILL };
                        let _ = wire::write_message(&mut out, &ClientMessage::Signal { signal });
                    }
                    _ => {}
                }
            }
        }
        if sock_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            match wire::read_message::<CoordinatorMessage>(&mut out) {
                Ok(CoordinatorMessage::Exit { status, domain_down }) => {
                    exit = Some((status, domain_down));
                    if !master_open {
                        break;
                    }
                }
                Ok(CoordinatorMessage::Notice { text }) => {
                    if raw.is_some() {
                        eprint!("\r\nlazaret: {text}\r\n");
                    } else {
                        eprintln!("lazaret: {text}");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    drop(raw);
                    return Err(ClientError::ConnectionLost { source: e, log: dir.log() });
                }
            }
        }
        if let Some(m) = &master {
            if master_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                match nix::unistd::read(m.as_fd(), &mut buf) {
                    Ok(0) | Err(Errno::EIO) => master_open = false,
                    Ok(n) => write_all(stdout.as_fd(), &buf[..n]),
                    Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                    Err(_) => master_open = false,
                }
            }
            if master_open && master_ev.contains(PollFlags::POLLOUT) && !to_master.is_empty() {
                match nix::unistd::write(m.as_fd(), &to_master) {
                    Ok(n) => {
                        to_master.drain(..n);
                    }
                    Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                    Err(_) => to_master.clear(),
                }
            }
        }
        if input_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            match nix::unistd::read(stdin.as_fd(), &mut buf) {
                Ok(0) => input_open = false,
                Ok(n) => to_master.extend_from_slice(&buf[..n]),
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => input_open = false,
            }
        }
        if exit.is_some() && !master_open {
            break;
        }
    }
    drop(raw);
    let (status, domain_down) = exit.unwrap_or((LAZARET_FAILED, false));
    if domain_down {
        wait_unlocked(&dir.lock(), DOWN_LIMIT);
    }
    Ok(ExitStatus(status))
}

fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(0) => return,
            Ok(n) => data = &data[n..],
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                let mut p = [PollFd::new(fd, PollFlags::POLLOUT)];
                let _ = poll(&mut p, PollTimeout::from(1000u16));
            }
            Err(_) => return,
        }
    }
}

