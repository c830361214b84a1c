//! Network namespaces held as file descriptors, and running code inside them.
//!
//! `setns`/`unshare` change only the calling thread, and a netlink socket
//! belongs to the namespace of the thread that opened it. So every operation
//! here runs on a fresh, dedicated OS thread that enters the namespace, does
//! its work (with a current-thread tokio runtime for rtnetlink) and exits.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;

use super::TopologyError;

/// A network namespace, kept alive by an open `/proc/.../ns/net` descriptor.
/// A namespace created by [`Netns::create`] disappears (with its veths and
/// routes) once the last descriptor and the last process inside it are gone.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
}

pub(super) fn thread_result<R>(joined: std::thread::Result<Result<R, TopologyError>>) -> Result<R, TopologyError> {
    joined.map_err(|_| TopologyError::ThreadPanicked)?
}

impl Netns {
    /// Creates a new, empty network namespace (loopback down) from a dedicated thread.
    pub fn create() -> Result<Netns, TopologyError> {
        let joined = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    crate::sys::unshare_network_namespace()
                        .map_err(|errno| TopologyError::Namespace { action: "unshare(CLONE_NEWNET)", errno })?;
                    Netns::of_current_thread()
                })
                .join()
        });
        thread_result(joined)
    }

    /// The namespace of the calling thread.
    pub fn of_current_thread() -> Result<Netns, TopologyError> {
        let file = File::open("/proc/thread-self/ns/net")
            .map_err(|source| TopologyError::Io { action: "open /proc/thread-self/ns/net".into(), source })?;
        Ok(Netns { fd: file.into() })
    }

    /// Wraps a descriptor of a `ns/net` file (e.g. received from a caller).
    pub fn from_fd(fd: OwnedFd) -> Netns {
        Netns { fd }
    }

    /// A second descriptor for the same namespace.
    pub fn try_clone(&self) -> Result<Netns, TopologyError> {
        let fd = self.fd.try_clone().map_err(|source| TopologyError::Io { action: "duplicate namespace descriptor".into(), source })?;
        Ok(Netns { fd })
    }

    /// A path naming this namespace while this process keeps the descriptor
    /// open (`/proc/<pid>/fd/<n>`), e.g. for runsc's OCI `network` namespace path.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), self.fd.as_raw_fd()))
    }

    /// The namespace's inode number, which identifies it while it exists.
    pub fn inode(&self) -> Result<u64, TopologyError> {
        let stat = nix::sys::stat::fstat(self.fd.as_fd()).map_err(|errno| TopologyError::Namespace { action: "fstat namespace", errno })?;
        Ok(stat.st_ino)
    }

    /// Runs `work` on a dedicated thread that has entered this namespace.
    pub fn run<R: Send>(&self, work: impl FnOnce() -> Result<R, TopologyError> + Send) -> Result<R, TopologyError> {
        let joined = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    crate::sys::enter_network_namespace(self.fd.as_fd())
                        .map_err(|errno| TopologyError::Namespace { action: "setns(CLONE_NEWNET)", errno })?;
                    work()
                })
                .join()
        });
        thread_result(joined)
    }

    /// Runs an rtnetlink job inside this namespace (dedicated thread,
    /// current-thread runtime, socket opened after entering the namespace).
    pub fn netlink<R: Send>(
        &self,
        job: impl AsyncFnOnce(rtnetlink::Handle) -> Result<R, TopologyError> + Send,
    ) -> Result<R, TopologyError> {
        self.run(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .map_err(|source| TopologyError::Io { action: "start netlink runtime".into(), source })?;
            runtime.block_on(async move {
                let (connection, handle, _) =
                    rtnetlink::new_connection().map_err(|source| TopologyError::Io { action: "open rtnetlink socket".into(), source })?;
                let driver = tokio::spawn(connection);
                let result = job(handle).await;
                driver.abort();
                result
            })
        })
    }
}

impl AsFd for Netns {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
