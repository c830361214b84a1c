//! lazaret-oci (skeleton; filled in by its own work).
