//! End-to-end tests of Sluice.
