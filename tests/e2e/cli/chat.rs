//! `keel chat` through a pseudo-terminal.
