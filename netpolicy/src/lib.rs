//! lazaret-netpolicy (skeleton; filled in by its own work).
