//! PIDs that runsc records. (Orphaned runsc processes are reaped by PID 1 of
//! the Domain's PID namespace, see [`crate::pidns`].)

use std::path::Path;

use nix::unistd::Pid;

/// Reads a PID written by `runsc --pid-file`.
pub fn read_pid_file(path: &Path) -> std::io::Result<Pid> {
    let text = std::fs::read_to_string(path)?;
    let pid: i32 = text
        .trim()
        .parse()
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} holds no PID: {text:?}", path.display())))?;
    if pid <= 1 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} holds PID {pid}", path.display())));
    }
    Ok(Pid::from_raw(pid))
}
