//! Host configuration (being written).
