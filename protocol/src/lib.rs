//! lazaret-protocol (skeleton; filled in by its own work).
