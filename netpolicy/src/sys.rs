//! The namespace system calls of the crate, in one place. Everything else
//! talks to the kernel over netlink (rtnetlink, nftables) or `/proc/sys`.
//!
//! Both calls change the namespace of the *calling thread* only; callers run
//! them on a dedicated thread (see [`crate::topology::Netns`]). The crate has
//! no `unsafe` code: nix wraps both calls safely.

use std::os::fd::BorrowedFd;

use nix::sched::CloneFlags;

/// `unshare(CLONE_NEWNET)`: moves the calling thread into a new, empty
/// network namespace.
pub(crate) fn unshare_network_namespace() -> nix::Result<()> {
    nix::sched::unshare(CloneFlags::CLONE_NEWNET)
}

/// `setns(fd, CLONE_NEWNET)`: moves the calling thread into the network
/// namespace `fd` (an `ns/net` file) refers to.
pub(crate) fn enter_network_namespace(fd: BorrowedFd<'_>) -> nix::Result<()> {
    nix::sched::setns(fd, CloneFlags::CLONE_NEWNET)
}
