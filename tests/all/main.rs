//! End-to-end tests: real components built from `plugins/`, real files, real processes.

mod bad_input;
mod checkpoints;
mod cli;
mod event_time;
mod plugins;
mod runtime;
mod sandbox;
mod server;
mod wordcount;
