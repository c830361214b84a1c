//! Turns a rootfs directory into a tar stream, so that directory imports go
//! through the same hardened extractor as every archive.
//!
//! Symlinks are archived as symlinks (never followed); files are opened with
//! `O_NOFOLLOW`; hard links between regular files are kept; device nodes,
//! FIFOs and sockets are skipped. Entries are sorted by name so the stream
//! (and so the image digest) is deterministic for a given tree.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

/// Starts a thread that writes `root` as a tar stream; returns the read end and
/// the thread, whose result must be checked after the stream was consumed (a
/// failing producer may otherwise look like a short, valid archive).
pub(crate) fn spawn_tar_of_dir(root: PathBuf) -> io::Result<(File, JoinHandle<io::Result<()>>)> {
    let (reader, writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // A larger pipe means far fewer context switches for a big tree;
    // best effort, the default size also works.
    let _ = nix::fcntl::fcntl(&writer, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
    let (reader, writer) = (File::from(reader), File::from(writer));
    let handle = std::thread::Builder::new().name("lazaret-dir-tar".into()).spawn(move || {
        let mut builder = tar::Builder::new(BufWriter::with_capacity(256 * 1024, writer));
        builder.follow_symlinks(false);
        let mut walker = Walker { builder: &mut builder, links: HashMap::new() };
        let root_meta = std::fs::symlink_metadata(&root)?;
        walker.append_dir(Path::new("."), &root_meta)?;
        walker.walk(&root, Path::new(""))?;
        builder.into_inner()?.into_inner().map_err(|e| e.into_error())?;
        Ok(())
    })?;
    Ok((reader, handle))
}

struct Walker<'a, W: io::Write> {
    builder: &'a mut tar::Builder<W>,
    /// (device, inode) of multiply-linked files already archived, and their path.
    links: HashMap<(u64, u64), PathBuf>,
}

impl<W: io::Write> Walker<'_, W> {
    fn walk(&mut self, dir: &Path, rel: &Path) -> io::Result<()> {
        let mut names: Vec<_> = std::fs::read_dir(dir)?.map(|entry| entry.map(|e| e.file_name())).collect::<io::Result<_>>()?;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for name in names {
            let path = dir.join(&name);
            let rel_path = rel.join(&name);
            let meta = std::fs::symlink_metadata(&path)?;
            let file_type = meta.file_type();
            if file_type.is_dir() {
                self.append_dir(&rel_path, &meta)?;
                self.walk(&path, &rel_path)?;
            } else if file_type.is_symlink() {
                let target = std::fs::read_link(&path)?;
                let mut header = header_for(&meta, tar::EntryType::Symlink);
                self.builder.append_link(&mut header, &rel_path, &target)?;
            } else if file_type.is_file() {
                self.append_file(&path, &rel_path, &meta)?;
            }
            // Device nodes, FIFOs and sockets are skipped, as the extractor would.
        }
        Ok(())
    }

    fn append_dir(&mut self, rel: &Path, meta: &std::fs::Metadata) -> io::Result<()> {
        let mut header = header_for(meta, tar::EntryType::Directory);
        self.builder.append_data(&mut header, rel, io::empty())
    }

    fn append_file(&mut self, path: &Path, rel: &Path, meta: &std::fs::Metadata) -> io::Result<()> {
        let key = (meta.dev(), meta.ino());
        if meta.nlink() > 1 {
            if let Some(first) = self.links.get(&key) {
                let mut header = header_for(meta, tar::EntryType::Link);
                return self.builder.append_link(&mut header, rel, first);
            }
            self.links.insert(key, rel.to_path_buf());
        }
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)?;
        let opened = file.metadata()?;
        if (opened.dev(), opened.ino()) != key {
            return Err(io::Error::other(format!("{} changed while importing", path.display())));
        }
        let mut header = header_for(meta, tar::EntryType::Regular);
        header.set_size(meta.len());
        let exact = ExactLength { inner: file, remaining: meta.len(), path: path.to_path_buf() };
        self.builder.append_data(&mut header, rel, exact)
    }
}

fn header_for(meta: &std::fs::Metadata, kind: tar::EntryType) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(meta.mode() & 0o7777);
    header.set_uid(u64::from(meta.uid()));
    header.set_gid(u64::from(meta.gid()));
    header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    header.set_size(0);
    header
}

/// Yields exactly `remaining` bytes of a file, failing if it shrank meanwhile
/// (a short read would desynchronise the tar stream).
struct ExactLength {
    inner: File,
    remaining: u64,
    path: PathBuf,
}

impl Read for ExactLength {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::other(format!("{} shrank while importing", self.path.display())));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}
