//! lazaret-tests (skeleton; filled in by its own work).
