//! End-to-end tests: real components built from `plugins/`, real files, real processes.

mod bad_input;
mod cli;
mod plugins;
mod runtime;
mod wordcount;
