//! lazaret-runtime (skeleton; filled in by its own work).
