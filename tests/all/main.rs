//! End-to-end tests: real components built from `plugins/`, real files, real processes.

mod admission;
mod at_least_once;
mod bad_input;
mod checkpoints;
mod cli;
mod cluster;
mod compat;
mod dashboard;
mod deploy;
mod docs;
mod edges;
mod event_time;
mod exactly_once;
mod exit_status;
mod failpoints;
mod graphs;
mod guest_time;
mod host_memory;
mod kafka;
mod languages;
mod plugins;
mod runtime;
mod sandbox;
mod server;
mod server_clients;
mod wordcount;
