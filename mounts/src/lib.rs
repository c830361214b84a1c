//! lazaret-mounts (skeleton; filled in by its own work).
