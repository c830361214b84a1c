//! Developer, workspace and Domain identity (being written).
