//! Profile state: agent state kept per (developer, profile) in the Storage
//! Root and bound into every Domain of that profile at the same place in
//! the agent's home (a profile's `profile_state = ["~/.claude"]`), so that
//! one login serves every checkout.
//!
//! Layout: `STORE/home/REL` for the entry `~/REL`, where `STORE` is the
//! (developer, profile) directory the caller names. Everything above each
//! entry's directory is root's and never visible in a sandbox; the entry
//! directory itself is the agent's and everything in it is
//! attacker-controlled. Host-side code only creates directories here
//! (`openat2` beneath the store, no symlink followed), changes the entry
//! directory's own owner and mode through an fd, and removes the whole
//! store with a removal that never follows a symlink.

use std::os::fd::AsFd;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::error::MountError;
use crate::safe_path;

/// The file-name endings an entry may not have: entries are directories,
/// and these name files that their programs replace by rename (which a bind
/// of a single file does not survive).
const FILE_ENDINGS: &[&str] = &[".json", ".toml", ".yaml", ".yml", ".ini", ".conf", ".cfg"];

/// Why a `profile_state` entry is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// The entry does not start with `~/`.
    #[error("{0:?} is not in the agent's home: write it as ~/PATH")]
    NotInHome(String),
    /// `~/` alone, or only `.` components.
    #[error("{0:?} names the agent's home itself, not a directory in it")]
    WholeHome(String),
    /// A `..` component.
    #[error("{0:?} contains `..`")]
    DotDot(String),
    /// A NUL character.
    #[error("{0:?} contains a NUL character")]
    Nul(String),
    /// A name that looks like a single file.
    #[error("{0:?} looks like a file; profile state entries are directories")]
    LooksLikeFile(String),
}

/// One entry: a directory of the agent's home, relative to it (`.claude`
/// for `~/.claude`). Displayed as written, `~/REL`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateEntry {
    rel: PathBuf,
}

impl StateEntry {
    /// Parses `~/REL`: normalised (no `.`, no doubled `/`), no `..`, not
    /// the home itself, not a name with a file ending such as `.json`.
    pub fn parse(text: &str) -> Result<StateEntry, EntryError> {
        if text.contains('\0') {
            return Err(EntryError::Nul(text.to_string()));
        }
        let Some(rest) = text.strip_prefix("~/") else {
            return Err(EntryError::NotInHome(text.to_string()));
        };
        let mut rel = PathBuf::new();
        for component in Path::new(rest).components() {
            match component {
                Component::Normal(name) => rel.push(name),
                Component::CurDir => {}
                Component::ParentDir => return Err(EntryError::DotDot(text.to_string())),
                Component::RootDir | Component::Prefix(_) => return Err(EntryError::NotInHome(text.to_string())),
            }
        }
        let Some(name) = rel.file_name() else {
            return Err(EntryError::WholeHome(text.to_string()));
        };
        let name = name.to_string_lossy().to_ascii_lowercase();
        if FILE_ENDINGS.iter().any(|ending| name.ends_with(ending)) {
            return Err(EntryError::LooksLikeFile(text.to_string()));
        }
        Ok(StateEntry { rel })
    }

    /// The path relative to the agent's home.
    pub fn rel(&self) -> &Path {
        &self.rel
    }

    /// Where the entry appears for an agent whose home is `home`.
    pub fn in_home(&self, home: &Path) -> PathBuf {
        home.join(&self.rel)
    }

    /// Where the entry is kept in the (developer, profile) directory `store`.
    pub fn storage(&self, store: &Path) -> PathBuf {
        store.join("home").join(&self.rel)
    }

    /// Whether the two entries are the same directory or one holds the other.
    pub fn overlaps(&self, other: &StateEntry) -> bool {
        self.rel.starts_with(&other.rel) || other.rel.starts_with(&self.rel)
    }
}

impl std::fmt::Display for StateEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "~/{}", self.rel.display())
    }
}

/// Makes each entry's directory exist in `store` (a trusted, root-owned
/// directory: the caller made it), the directories above it root's, the
/// entry directory itself owned by `uid:gid` with mode 0700 (fixed on every
/// start: a profile whose `user` changed still gets a directory its agent
/// can write). Nothing is followed: a symlink anywhere on the way is
/// refused. Returns each entry's host directory, in order.
pub fn prepare(store: &Path, entries: &[StateEntry], uid: u32, gid: u32) -> Result<Vec<PathBuf>, MountError> {
    let root = safe_path::open_root_dir(store)?;
    let mut dirs = Vec::new();
    for entry in entries {
        let rel = Path::new("home").join(&entry.rel);
        safe_path::ensure_dir_beneath(root.as_fd(), &rel)?;
        let dir = safe_path::open_beneath(root.as_fd(), &rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        let st = safe_path::stat(dir.as_fd())?;
        if st.st_uid != uid || st.st_gid != gid {
            nix::unistd::fchown(&dir, Some(uid.into()), Some(gid.into())).map_err(|errno| MountError::sys("fchown", &rel, errno))?;
        }
        if st.st_mode & 0o7777 != 0o700 {
            nix::sys::stat::fchmod(&dir, Mode::from_bits_truncate(0o700)).map_err(|errno| MountError::sys("fchmod", &rel, errno))?;
        }
        dirs.push(entry.storage(store));
    }
    Ok(dirs)
}

/// Removes the store and everything in it without following any symlink
/// the agent left there (`std::fs::remove_dir_all` opens each directory
/// `O_NOFOLLOW` and unlinks relative to it). Returns whether there was
/// anything to remove. `store` itself must be a trusted path: a symlink at
/// its last component is refused.
pub fn remove(store: &Path) -> Result<bool, MountError> {
    match std::fs::symlink_metadata(store) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(MountError::io("inspect", store, e)),
        Ok(meta) if !meta.file_type().is_dir() => {
            return Err(MountError::refused(
                store,
                "expected a directory Lazaret made, found a symlink or another kind of file; remove it by hand",
            ));
        }
        Ok(_) => {}
    }
    std::fs::remove_dir_all(store).map_err(|e| MountError::io("remove", store, e))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn entries_are_directories_of_the_home() {
        let entry = StateEntry::parse("~/.config//opencode/.").expect("valid");
        assert_eq!(entry.rel(), Path::new(".config/opencode"));
        assert_eq!(entry.to_string(), "~/.config/opencode");
        assert_eq!(entry.in_home(Path::new("/home/a")), Path::new("/home/a/.config/opencode"));
        assert_eq!(entry.storage(Path::new("/s/p")), Path::new("/s/p/home/.config/opencode"));
        assert!(matches!(StateEntry::parse("/root/.claude"), Err(EntryError::NotInHome(_))));
        assert!(matches!(StateEntry::parse(".claude"), Err(EntryError::NotInHome(_))));
        assert!(matches!(StateEntry::parse("~"), Err(EntryError::NotInHome(_))));
        assert!(matches!(StateEntry::parse("~/"), Err(EntryError::WholeHome(_))));
        assert!(matches!(StateEntry::parse("~/./"), Err(EntryError::WholeHome(_))));
        assert!(matches!(StateEntry::parse("~//etc"), Err(EntryError::NotInHome(_))));
        assert!(matches!(StateEntry::parse("~/a/../../etc"), Err(EntryError::DotDot(_))));
        assert!(matches!(StateEntry::parse("~/.claude.json"), Err(EntryError::LooksLikeFile(_))));
        assert!(matches!(StateEntry::parse("~/a\0"), Err(EntryError::Nul(_))));
        let a = StateEntry::parse("~/.config").expect("valid");
        assert!(a.overlaps(&entry) && entry.overlaps(&a) && a.overlaps(&a));
        assert!(!StateEntry::parse("~/.configx").expect("valid").overlaps(&a));
    }

    #[test]
    fn remove_refuses_a_symlinked_store_and_keeps_what_links_inside_point_to() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("keep"), b"x").expect("keep");
        let store = dir.path().join("store");
        std::fs::create_dir_all(store.join("home/.x")).expect("store");
        std::os::unix::fs::symlink(&outside, store.join("home/.x/link")).expect("link");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&store, &link).expect("store link");
        assert!(remove(&link).is_err(), "a symlinked store is refused");
        assert!(remove(&store).expect("removed"));
        assert!(!store.exists() && outside.join("keep").exists(), "nothing behind the link was removed");
        assert!(!remove(&store).expect("absent"));
    }

    #[test]
    fn prepare_makes_the_entry_directories_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let me = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let entries = [StateEntry::parse("~/.config/tool").expect("valid"), StateEntry::parse("~/.fake").expect("valid")];
        let dirs = prepare(dir.path(), &entries, me.0, me.1).expect("prepared");
        assert_eq!(dirs, [dir.path().join("home/.config/tool"), dir.path().join("home/.fake")]);
        for d in &dirs {
            let meta = std::fs::symlink_metadata(d).expect("made");
            assert!(meta.is_dir() && meta.mode() & 0o7777 == 0o700 && meta.uid() == me.0);
        }
        // A symlink on the way is refused, not followed.
        std::fs::remove_dir(dir.path().join("home/.fake")).expect("rm");
        std::os::unix::fs::symlink("/etc", dir.path().join("home/.fake")).expect("link");
        assert!(prepare(dir.path(), &entries, me.0, me.1).is_err());
    }
}
