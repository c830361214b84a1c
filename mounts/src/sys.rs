//! The syscall layer: the only place in this crate that talks to the kernel's
//! mount machinery, and the only place with `unsafe` code.
//!
//! Every function here works on the *calling thread's* mount namespace. Call
//! [`enter_private_mount_namespace`] first (on the coordinator's main thread,
//! before spawning threads; threads spawned afterwards inherit it) so that no
//! mount made by Lazaret is visible in the host's mount table and every one of
//! them disappears when the process exits.
//!
//! Mounts from file descriptors ([`bind_mount_fd`]) use the new mount API
//! (`open_tree(OPEN_TREE_CLONE)` + `mount_setattr` + `move_mount`, Linux >=
//! 5.12): the clone is made read-only *before* it is attached, so a read-only
//! bind is never writable, not even briefly, and no path is resolved again
//! after the fds were opened.

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

use crate::error::MountError;

/// `open_tree(2)` flag: make a detached copy of the mount (include/uapi/linux/mount.h).
const OPEN_TREE_CLONE: libc::c_uint = 1;
/// `move_mount(2)` flag: the source is the fd itself (empty path).
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
/// `move_mount(2)` flag: the target is the fd itself (empty path).
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
/// `mount_setattr(2)` attribute: read-only.
const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// `struct mount_attr` from include/uapi/linux/mount.h (`MOUNT_ATTR_SIZE_VER0`).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Moves the calling thread into a new mount namespace whose mounts are all
/// private (`unshare(CLONE_NEWNS)` then `mount("", "/", MS_REC|MS_PRIVATE)`).
///
/// Only the calling thread changes namespace; threads it spawns later inherit
/// the new one. Call it while the process is single-threaded (or on a
/// dedicated thread that does all mount work). Nothing mounted afterwards
/// propagates to the host, and the kernel drops every such mount when the
/// last thread of the namespace exits.
pub fn enter_private_mount_namespace() -> Result<(), MountError> {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).map_err(|e| MountError::sys("unshare(CLONE_NEWNS)", "/", e))?;
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(|e| MountError::sys("mount(MS_REC|MS_PRIVATE)", "/", e))
}

/// Mounts a fresh procfs at /proc (nosuid, nodev, noexec): for a process
/// that has just entered new PID and mount namespaces, so that /proc shows
/// its own PID namespace.
pub fn mount_proc() -> Result<(), MountError> {
    nix::mount::mount(Some("proc"), "/proc", Some("proc"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None::<&str>)
        .map_err(|e| MountError::sys("mount(proc)", "/proc", e))
}

/// Mounts an overlayfs at `target` with the given lower layers (first one is
/// the top-most lower layer), upper and work directories.
///
/// Paths containing `,`, `:` or `\` (the separators of overlayfs' option
/// string) are refused rather than escaped: every path given here is made by
/// Lazaret itself under trusted directories, so such a character means a
/// misconfigured storage or image path. `index=off` is passed so that an
/// upper layer made over an older image can still be mounted over a new one
/// (State Anchor's keep-on-digest-change behaviour).
pub fn mount_overlay(lower: &[&Path], upper: &Path, work: &Path, target: &Path) -> Result<(), MountError> {
    if lower.is_empty() {
        return Err(MountError::refused(target, "an overlay needs at least one lower directory"));
    }
    let mut lowerdir = Vec::new();
    for (index, layer) in lower.iter().enumerate() {
        if index > 0 {
            lowerdir.push(b':');
        }
        lowerdir.extend_from_slice(overlay_option_path(layer)?);
    }
    let mut options = b"lowerdir=".to_vec();
    options.extend_from_slice(&lowerdir);
    options.extend_from_slice(b",upperdir=");
    options.extend_from_slice(overlay_option_path(upper)?);
    options.extend_from_slice(b",workdir=");
    options.extend_from_slice(overlay_option_path(work)?);
    options.extend_from_slice(b",index=off");
    nix::mount::mount(Some("overlay"), target, Some("overlay"), MsFlags::empty(), Some(OsStr::from_bytes(&options)))
        .map_err(|e| MountError::sys("mount overlay", target, e))
}

/// Returns the bytes of `path` if it can appear in an overlayfs option string.
fn overlay_option_path(path: &Path) -> Result<&[u8], MountError> {
    let bytes = path.as_os_str().as_bytes();
    if !path.is_absolute() {
        return Err(MountError::refused(path, "overlay layer paths must be absolute"));
    }
    if bytes.iter().any(|b| matches!(b, b',' | b':' | b'\\')) {
        return Err(MountError::refused(
            path,
            "overlay layer paths may not contain ',', ':' or '\\'; move the storage root or image to a plainer path",
        ));
    }
    Ok(bytes)
}

/// Bind-mounts `source` onto `target` (non-recursive `MS_BIND`), then, when
/// `readonly`, remounts it `MS_BIND|MS_REMOUNT|MS_RDONLY`.
///
/// Both paths are resolved by the kernel with the usual symlink following:
/// use it only for trusted paths (run directory, Domain Root). For anything
/// inside a workspace use [`bind_mount_fd`].
pub fn bind_mount(source: &Path, target: &Path, readonly: bool) -> Result<(), MountError> {
    nix::mount::mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| MountError::sys("bind mount", target, e))?;
    if readonly {
        let remount = nix::mount::mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        );
        if let Err(errno) = remount {
            // Never leave a writable bind behind when a read-only one was asked for.
            let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH);
            return Err(MountError::sys("read-only remount", target, errno));
        }
    }
    Ok(())
}

/// Bind-mounts the file or directory `source` refers to onto the one `target`
/// refers to, both given as (typically `O_PATH | O_NOFOLLOW`) fds.
///
/// Uses the new mount API: `open_tree(source, OPEN_TREE_CLONE)` makes a
/// detached, non-recursive copy of the source, `mount_setattr` makes it
/// read-only when asked (before it is visible anywhere), and `move_mount`
/// attaches it on top of `target`. No path is resolved, so a workspace that
/// changes under our feet cannot redirect the mount.
pub fn bind_mount_fd(source: BorrowedFd<'_>, target: BorrowedFd<'_>, readonly: bool) -> Result<(), MountError> {
    let tree = open_tree_clone(source)?;
    if readonly {
        set_mount_readonly(tree.as_fd())?;
    }
    move_mount_onto(tree.as_fd(), target)
}

/// Unmounts `target` (never following a symlink at its last component);
/// `detach` makes it a lazy unmount (`MNT_DETACH`).
pub fn unmount(target: &Path, detach: bool) -> Result<(), MountError> {
    let mut flags = MntFlags::UMOUNT_NOFOLLOW;
    if detach {
        flags |= MntFlags::MNT_DETACH;
    }
    nix::mount::umount2(target, flags).map_err(|e| MountError::sys("umount", target, e))
}

/// The empty path used with `AT_EMPTY_PATH`-style flags.
const EMPTY_PATH: &CStr = c"";

/// `open_tree(fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH)`.
fn open_tree_clone(source: BorrowedFd<'_>) -> Result<OwnedFd, MountError> {
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
    // SAFETY: open_tree takes an fd, a NUL-terminated path (a static empty C
    // string here) and flags; it reads nothing else from our memory.
    let ret = unsafe { libc::syscall(libc::SYS_open_tree, source.as_raw_fd(), EMPTY_PATH.as_ptr(), flags) };
    if ret < 0 {
        return Err(MountError::sys("open_tree", fd_path(source), Errno::last()));
    }
    let raw = libc::c_int::try_from(ret).map_err(|_| MountError::sys("open_tree", fd_path(source), Errno::EBADF))?;
    // SAFETY: on success open_tree returns a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `mount_setattr(tree, "", AT_EMPTY_PATH, {attr_set: MOUNT_ATTR_RDONLY})`.
fn set_mount_readonly(tree: BorrowedFd<'_>) -> Result<(), MountError> {
    let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
    // SAFETY: `attr` is a valid, initialised `struct mount_attr` that lives
    // for the whole call and whose exact size is passed; the path is a static
    // empty C string.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            EMPTY_PATH.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret < 0 {
        return Err(MountError::sys("mount_setattr(RDONLY)", fd_path(tree), Errno::last()));
    }
    Ok(())
}

/// `move_mount(tree, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH)`.
fn move_mount_onto(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> Result<(), MountError> {
    // SAFETY: move_mount takes two fds, two NUL-terminated paths (static
    // empty C strings) and flags; it keeps no pointer after returning.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            EMPTY_PATH.as_ptr(),
            target.as_raw_fd(),
            EMPTY_PATH.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if ret < 0 {
        return Err(MountError::sys("move_mount", fd_path(target), Errno::last()));
    }
    Ok(())
}

/// The path the kernel currently reports for an fd (for error messages only:
/// never resolved again).
pub(crate) fn fd_path(fd: BorrowedFd<'_>) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_else(|_| format!("fd {}", fd.as_raw_fd()).into())
}

/// Whether the user `uid`/`gid` with supplementary `groups` may access
/// `path` with `mode` (`libc::R_OK | libc::W_OK | libc::X_OK` bits), decided
/// by the kernel itself: permission bits, ACLs, every directory on the way,
/// LSMs and read-only mounts included.
///
/// A fresh thread drops to those ids with the *raw* `setgroups`,
/// `setresgid` and `setresuid` system calls, which (unlike the libc
/// wrappers, which broadcast to every thread) change only that thread's
/// credentials; moving all three uids away from 0 also clears its
/// capabilities. It then calls `access(2)` (real ids = the dropped ones) and
/// exits, so no code ever runs on it with the changed credentials afterwards.
/// `Ok(Err(errno))` is a refusal (`EACCES`, `ENOENT`, ...); `Err` means the
/// check itself could not be made.
pub fn access_as(path: &Path, uid: u32, gid: u32, groups: &[u32], mode: libc::c_int) -> std::io::Result<Result<(), Errno>> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::other("path contains NUL"))?;
    let groups: Vec<libc::gid_t> = groups.to_vec();
    let worker = std::thread::Builder::new().name("access-as".into()).spawn(move || -> std::io::Result<Result<(), Errno>> {
        // SAFETY: raw system calls with plain integer arguments and, for
        // setgroups, a pointer to `groups.len()` live gid_t values. They only
        // change this thread's credentials (see above); the thread ends when
        // this closure returns.
        let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len() as libc::size_t, groups.as_ptr()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(nix::unistd::access(c_path.as_c_str(), nix::unistd::AccessFlags::from_bits_truncate(mode)))
    })?;
    worker.join().map_err(|_| std::io::Error::other("the access-check thread panicked"))?
}

// ---------------------------------------------------------------------------
// Workspace Guard: fanotify, file handles and xattrs (see crate::guard).
// ---------------------------------------------------------------------------

/// `fanotify_init(flags, event_f_flags)`: a new fanotify group.
pub fn fanotify_init(flags: libc::c_uint, event_f_flags: libc::c_uint) -> Result<OwnedFd, Errno> {
    // SAFETY: plain integer arguments; on success the kernel returns a new
    // fd that nothing else owns.
    let ret = unsafe { libc::fanotify_init(flags, event_f_flags) };
    if ret < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `ret` is a fresh fd owned by us (see above).
    Ok(unsafe { OwnedFd::from_raw_fd(ret) })
}

/// `fanotify_mark(group, flags, mask, dirfd, path)` with `path` relative to
/// `dirfd` (`None`: the object `dirfd` itself, i.e. a NULL path).
pub fn fanotify_mark(
    group: BorrowedFd<'_>,
    flags: libc::c_uint,
    mask: u64,
    dirfd: BorrowedFd<'_>,
    path: Option<&CStr>,
) -> Result<(), Errno> {
    let path_ptr = path.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: both fds are valid for the call; `path_ptr` is NULL or points
    // to a NUL-terminated string that outlives the call.
    let ret = unsafe { libc::fanotify_mark(group.as_raw_fd(), flags, mask, dirfd.as_raw_fd(), path_ptr) };
    if ret < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// `open_by_handle_at(mount_fd, handle, flags)` for a handle reported by
/// fanotify (`handle_type` and the opaque `handle` bytes). Needs
/// CAP_DAC_READ_SEARCH.
pub fn open_by_handle_at(mount_fd: BorrowedFd<'_>, handle_type: i32, handle: &[u8], flags: libc::c_int) -> Result<OwnedFd, Errno> {
    let handle_bytes = u32::try_from(handle.len()).map_err(|_| Errno::EINVAL)?;
    // struct file_handle { u32 handle_bytes; int handle_type; unsigned char f_handle[]; },
    // built in a u32-aligned buffer.
    let header_words = 2;
    let mut buffer = vec![0u32; header_words + handle.len().div_ceil(4)];
    buffer[0] = handle_bytes;
    buffer[1] = handle_type as u32;
    for (index, byte) in handle.iter().enumerate() {
        let word = header_words + index / 4;
        let mut bytes = buffer[word].to_ne_bytes();
        bytes[index % 4] = *byte;
        buffer[word] = u32::from_ne_bytes(bytes);
    }
    // SAFETY: `buffer` holds a complete `struct file_handle` (header plus
    // `handle_bytes` bytes), suitably aligned, live for the call; the kernel
    // reads at most that much. On success it returns a new fd we own.
    let ret = unsafe { libc::open_by_handle_at(mount_fd.as_raw_fd(), buffer.as_mut_ptr().cast::<libc::file_handle>(), flags) };
    if ret < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fresh fd (see above).
    Ok(unsafe { OwnedFd::from_raw_fd(ret) })
}

/// Whether the file `fd` refers to has the extended attribute `name`
/// (`fgetxattr` with a zero-size buffer). `fd` must be a real (not
/// `O_PATH`) fd.
pub fn has_xattr(fd: BorrowedFd<'_>, name: &CStr) -> Result<bool, Errno> {
    // SAFETY: a size-0 query: the kernel writes nothing to the (NULL)
    // buffer; `name` is NUL-terminated and outlives the call.
    let ret = unsafe { libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), std::ptr::null_mut(), 0) };
    if ret >= 0 {
        return Ok(true);
    }
    match Errno::last() {
        Errno::ENODATA | Errno::ENOTSUP => Ok(false),
        errno => Err(errno),
    }
}

/// `getxattrat(2)`'s number (Linux 6.13): the same on every architecture,
/// as it was allocated after the syscall tables were unified.
const SYS_GETXATTRAT: libc::c_long = 464;

/// `struct xattr_args` (include/uapi/linux/xattr.h, `XATTR_ARGS_SIZE_VER0`).
#[repr(C)]
struct XattrArgs {
    value: u64,
    size: u32,
    flags: u32,
}

/// Whether `getxattrat(2)` is known to be missing (set after its first
/// `ENOSYS`, so that old kernels pay for the probe once).
static NO_GETXATTRAT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the entry `name` of the directory `dir` has the extended
/// attribute `attr`, never following a symlink: `getxattrat(dir, name,
/// AT_SYMLINK_NOFOLLOW)` with a zero-size buffer, one system call and no
/// file opened (`dir` may be an `O_PATH` fd). An empty `name` asks about
/// `dir` itself (`AT_EMPTY_PATH`; the kernel then wants a real fd, not an
/// `O_PATH` one: `EBADF`). `Err(ENOSYS)` on kernels before 6.13 (callers
/// fall back to [`has_xattr`] on an opened file).
pub fn has_xattr_at(dir: BorrowedFd<'_>, name: &OsStr, attr: &CStr) -> Result<bool, Errno> {
    if NO_GETXATTRAT.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(Errno::ENOSYS);
    }
    let c_name = std::ffi::CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
    let flags = libc::AT_SYMLINK_NOFOLLOW | if name.is_empty() { libc::AT_EMPTY_PATH } else { 0 };
    let mut args = XattrArgs { value: 0, size: 0, flags: 0 };
    // SAFETY: `c_name` and `attr` are NUL-terminated and outlive the call;
    // `args` is a live `struct xattr_args` of the size passed, with a NULL
    // value buffer of size 0, so the kernel only returns the value's size
    // and writes nothing to user memory.
    let ret = unsafe {
        libc::syscall(
            SYS_GETXATTRAT,
            dir.as_raw_fd(),
            c_name.as_ptr(),
            flags as libc::c_uint,
            attr.as_ptr(),
            std::ptr::addr_of_mut!(args),
            std::mem::size_of::<XattrArgs>(),
        )
    };
    if ret >= 0 {
        return Ok(true);
    }
    match Errno::last() {
        Errno::ENODATA | Errno::ENOTSUP => Ok(false),
        Errno::ENOSYS => {
            NO_GETXATTRAT.store(true, std::sync::atomic::Ordering::Relaxed);
            Err(Errno::ENOSYS)
        }
        errno => Err(errno),
    }
}

/// Removes the extended attribute `name` from the file `fd` refers to
/// (`fremovexattr`); an attribute that is already gone is not an error.
pub fn remove_xattr(fd: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let ret = unsafe { libc::fremovexattr(fd.as_raw_fd(), name.as_ptr()) };
    if ret == 0 {
        return Ok(());
    }
    match Errno::last() {
        Errno::ENODATA => Ok(()),
        errno => Err(errno),
    }
}

/// `fstatfs(fd).f_fsid` as fanotify reports it (two `i32`s, native order).
pub fn fsid(fd: BorrowedFd<'_>) -> Result<[u8; 8], Errno> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `st` is a writable `struct statfs` for the kernel to fill.
    let ret = unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) };
    if ret < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fstatfs succeeded, so the struct is initialised (and it was
    // zeroed before anyway).
    let st = unsafe { st.assume_init() };
    // SAFETY: `fsid_t` is two plain i32s (`__val`), private in libc's
    // definition; reading its 8 bytes is reading plain integers.
    let raw: [u8; 8] = unsafe { std::mem::transmute::<libc::fsid_t, [u8; 8]>(st.f_fsid) };
    Ok(raw)
}

/// Closes a raw fd the kernel handed us inside a data buffer (a fanotify
/// event's `fd` field, which is never set for the file-handle groups the
/// guard uses; closed defensively so it cannot leak).
pub fn close_raw_fd(fd: libc::c_int) {
    if fd >= 0 {
        // SAFETY: the kernel created this fd for us in the event just read;
        // nothing else refers to it, so taking ownership and dropping it
        // closes it exactly once.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }
}

/// Takes ownership of an fd the kernel handed us inside a data buffer (a
/// fanotify permission event's `fd`, which must stay open until the event
/// is answered).
pub fn own_raw_fd(fd: libc::c_int) -> OwnedFd {
    // SAFETY: the kernel created this fd for us in the event just read;
    // nothing else refers to it, so it is owned (and closed) exactly once.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `ioctl(FIONREAD)`: how many bytes of events wait in a fanotify group's
/// queue.
pub fn queued_bytes(group: BorrowedFd<'_>) -> Result<u64, Errno> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the pointer, which is valid for
    // the call.
    let ret = unsafe { libc::ioctl(group.as_raw_fd(), libc::FIONREAD, &mut n as *mut libc::c_int) };
    if ret < 0 {
        return Err(Errno::last());
    }
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Reads the first entries of the directory `dir` (`getdents64`) and
/// throws them away: the read takes the directory's inode lock, so it
/// returns only after a rename holding that lock has finished, its
/// fsnotify events queued included (the gate's use).
pub fn pass_directory_lock(dir: BorrowedFd<'_>) -> Result<(), Errno> {
    let mut buffer = [0u8; 512];
    // SAFETY: getdents64 writes at most `buffer.len()` bytes to the
    // buffer, which is valid and writable for the call.
    let ret = unsafe { libc::syscall(libc::SYS_getdents64, dir.as_raw_fd(), buffer.as_mut_ptr(), buffer.len()) };
    if ret < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// Sets the extended attribute `name` of `path` (not following a symlink
/// at its last component: `lsetxattr`). Used by tests and tools to plant
/// file capabilities; the guard itself only reads and removes them.
pub fn set_xattr_nofollow(path: &Path, name: &CStr, value: &[u8]) -> Result<(), Errno> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: `c_path` and `name` are NUL-terminated and `value` is a live
    // buffer of `value.len()` bytes, all outliving the call.
    let ret = unsafe { libc::lsetxattr(c_path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if ret < 0 {
        return Err(Errno::last());
    }
    Ok(())
}
